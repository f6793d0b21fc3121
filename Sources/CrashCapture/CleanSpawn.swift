import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Starts a program with no signal blocked and every signal at its default action, whatever
/// the calling thread had. Dispatch worker threads block most signals, and Foundation's
/// Process passes that mask on: a crash sample (or a server a test wants to stop with
/// SIGTERM) started from such a thread would not behave as it does when a person starts it.
public enum CleanSpawn {
    /// Returns the child's pid; stdin, stdout and stderr go to the given files.
    public static func spawn(
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
            throw CrashCaptureError.io("cannot run \(path): \(String(cString: strerror(status)))")
        }
        return pid
    }
}
