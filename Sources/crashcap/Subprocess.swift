import CrashCapture
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A child process run to its end with posix_spawn and waitpid, output in files, killed after
/// a time limit. (Foundation's Process adds tens of ms of polling to every wait.)
struct Subprocess {
    struct Outcome {
        var signal: Int32?
        var exitCode: Int32?
        var stdout: String
        var stderr: String
        var milliseconds: Double
        var timedOut: Bool

        var ending: String {
            if timedOut { return "timeout" }
            if let signal { return signalName(signal) }
            return "exit \(exitCode ?? -1)"
        }
    }

    var path: String
    var arguments: [String] = []
    var environment: [String: String] = [:]
    var timeout: Double = 30
    /// Called with the child's pid and stdout path once it runs (to signal it from outside).
    var whileRunning: ((pid_t, String) -> Void)?

    func run() throws -> Outcome {
        let scratch = NSTemporaryDirectory() + "crashcap-run-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        let outPath = scratch + "/stdout"
        let errPath = scratch + "/stderr"
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, errPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        // The child starts with no signal blocked and default dispositions, whatever the
        // spawning thread had: Dispatch worker threads block most signals, and a crash sample
        // that inherited that mask would not die the way it does when a person runs it.
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
        let start = DispatchTime.now().uptimeNanoseconds
        let status = posix_spawn(&pid, path, &actions, &attributes, argv, envp)
        guard status == 0 else {
            throw CrashCaptureError.io("cannot run \(path): \(String(cString: strerror(status)))")
        }
        if let whileRunning { whileRunning(pid, outPath) }
        var wait: Int32 = 0
        var timedOut = false
        let deadline = start + UInt64(timeout * 1e9)
        while true {
            let result = waitpid(pid, &wait, WNOHANG)
            if result == pid { break }
            if result < 0 && errno != EINTR { break }
            if DispatchTime.now().uptimeNanoseconds > deadline && !timedOut {
                timedOut = true
                kill(pid, SIGKILL)
            }
            usleep(500)
        }
        let milliseconds = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6
        let termination = wait & 0x7f
        let signaled = termination != 0 && termination != 0x7f
        let read = { (path: String) in
            String(decoding: FileManager.default.contents(atPath: path) ?? Data(), as: UTF8.self)
        }
        return Outcome(
            signal: signaled ? termination : nil, exitCode: signaled ? nil : (wait >> 8) & 0xff,
            stdout: read(outPath), stderr: read(errPath), milliseconds: milliseconds, timedOut: timedOut)
    }
}

func signalName(_ signal: Int32) -> String {
    switch signal {
    case SIGSEGV: return "SIGSEGV"
    case SIGABRT: return "SIGABRT"
    case SIGBUS: return "SIGBUS"
    case SIGILL: return "SIGILL"
    case SIGFPE: return "SIGFPE"
    case SIGTRAP: return "SIGTRAP"
    case SIGKILL: return "SIGKILL"
    case SIGTERM: return "SIGTERM"
    case SIGINT: return "SIGINT"
    default: return "signal \(signal)"
    }
}
