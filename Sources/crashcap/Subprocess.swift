import CrashCapture
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A child process run to its end with a clean signal mask, output captured, killed after a
/// time limit. (Foundation's Process adds tens of ms of polling to every wait.)
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
        let child = try ChildProcess(path: path, arguments: arguments, environment: environment)
        whileRunning?(child.pid, child.stdoutPath)
        let timedOut = child.waitOrKill(timeout: timeout)
        return Outcome(
            signal: child.signal, exitCode: child.exitCode, stdout: child.stdout, stderr: child.stderr,
            milliseconds: Date().timeIntervalSince(child.started) * 1000, timedOut: timedOut)
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
