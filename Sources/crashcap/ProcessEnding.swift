import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

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

func signalName(_ signal: Int32) -> String { SignalNames.name(of: signal) }
