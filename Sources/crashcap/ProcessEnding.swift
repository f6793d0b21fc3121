import CrashCapture
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

extension ChildProcess.Outcome {
    /// How the child ended, in the harness's words: "SIGSEGV", "exit 0", "timeout".
    var ending: String {
        if timedOut { return "timeout" }
        if let signal { return signalName(signal) }
        return "exit \(exitCode ?? -1)"
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
