internal import CrashFileFormat
package import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Starts a program with no signal blocked and every signal at its default action, whatever
/// the calling thread had. Dispatch worker threads block most signals, and Foundation's
/// Process passes that mask on: a crash sample (or a server a test wants to stop with
/// SIGTERM) started from such a thread would not behave as it does when a person starts it.
package enum CleanSpawn {
    /// Returns the child's pid; stdin, stdout and stderr go to the given files.
    package static func spawn(
        _ path: String, arguments: [String], environment: [String: String], stdin: String = "/dev/null",
        stdout: String, stderr: String
    ) throws -> pid_t {
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, stdin, O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, stdout, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, stderr, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        var all = sigset_t()
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var pid: pid_t = 0
        let status = posix_spawn(&pid, path, &actions, &attributes, argv, envp)
        guard status == 0 else {
            throw CrashCaptureError.io("cannot run \(path)", path: path, errno: status)
        }
        return pid
    }
}

/// A child started with `CleanSpawn`, its stdout and stderr captured in files, waited for with
/// a deadline. Used by `crashcap harness`, the benchmarks' helpers and the tests.
/// `@unchecked`: the exit status is the one mutable field, written by `wait` on the thread
/// that owns the child; other threads only read the immutable paths and pid.
package final class ChildProcess: @unchecked Sendable {
    package let pid: pid_t
    package let started = Date()
    /// Where stdout and stderr go, removed with the object.
    package let outputDirectory: String
    package var stdoutPath: String { outputDirectory + "/stdout" }
    package var stderrPath: String { outputDirectory + "/stderr" }
    private var status: Int32?

    package init(path: String, arguments: [String], environment: [String: String]) throws {
        outputDirectory = NSTemporaryDirectory() + "crashcapture-child-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: outputDirectory, withIntermediateDirectories: true)
        do {
            pid = try CleanSpawn.spawn(
                path, arguments: arguments, environment: environment, stdout: outputDirectory + "/stdout",
                stderr: outputDirectory + "/stderr")
        } catch {
            try? FileManager.default.removeItem(atPath: outputDirectory)
            throw error
        }
    }

    deinit {
        if status == nil {
            kill(pid, SIGKILL)
            _ = wait(timeout: 10)
        }
        try? FileManager.default.removeItem(atPath: outputDirectory)
    }

    package var stdout: String { Self.contents(of: stdoutPath) }
    package var stderr: String { Self.contents(of: stderrPath) }

    private static func contents(of path: String) -> String {
        String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self)
    }

    /// Waits for the end; false when `timeout` seconds pass first.
    package func wait(timeout: Double) -> Bool {
        if status != nil { return true }
        let deadline = Date().addingTimeInterval(timeout)
        var raw: Int32 = 0
        repeat {
            let done = waitpid(pid, &raw, WNOHANG)
            if done == pid {
                status = raw
                return true
            }
            if done < 0 && errno != EINTR { return false }
            usleep(500)
        } while Date() < deadline
        return false
    }

    /// Waits for the end, killing the child with SIGKILL at the deadline; true if it was killed.
    package func waitOrKill(timeout: Double) -> Bool {
        if wait(timeout: timeout) { return false }
        kill(pid, SIGKILL)
        _ = wait(timeout: 10)
        return true
    }

    /// Waits until stdout contains `text`; false on timeout.
    package func waitForOutput(_ text: String, timeout: Double = 20) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if stdout.contains(text) { return true }
            usleep(2000)
        }
        return false
    }

    /// The signal that ended it, if one did.
    package var signal: Int32? {
        guard let status, status & 0x7f != 0, status & 0x7f != 0x7f else { return nil }
        return status & 0x7f
    }

    /// Its exit status, if it exited.
    package var exitCode: Int32? {
        guard let status, status & 0x7f == 0 else { return nil }
        return (status >> 8) & 0xff
    }
}

extension ChildProcess {
    /// How a child run to its end went.
    package struct Outcome: Sendable {
        package var signal: Int32?
        package var exitCode: Int32?
        package var stdout: String
        package var stderr: String
        package var seconds: Double
        package var timedOut: Bool
    }

    /// Runs a program to its end, killing it after `timeout` seconds. `whileRunning` gets the
    /// child as soon as it runs (to signal it from outside, say).
    package static func run(
        path: String, arguments: [String] = [], environment: [String: String], timeout: Double,
        whileRunning: ((ChildProcess) -> Void)? = nil
    ) throws -> Outcome {
        let child = try ChildProcess(path: path, arguments: arguments, environment: environment)
        whileRunning?(child)
        let timedOut = child.waitOrKill(timeout: timeout)
        return Outcome(
            signal: child.signal, exitCode: child.exitCode, stdout: child.stdout, stderr: child.stderr,
            seconds: Date().timeIntervalSince(child.started), timedOut: timedOut)
    }
}
