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
        let start = DispatchTime.now().uptimeNanoseconds
        let pid = try CleanSpawn.spawn(
            path, arguments: arguments, environment: environment, stdout: outPath, stderr: errPath)
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
