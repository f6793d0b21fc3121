import ArgumentParser
import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import Logging
import ProcessSupport

@main
struct Crashcap: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "crashcap",
        abstract: "Capture, check, read and replay crash reports of Linux processes.",
        version: CrashCapture.version,
        subcommands: [Harness.self, Show.self, Replay.self, Upload.self, Collect.self]
    )

    /// The library's diagnostics (a damaged store moved aside, say) go to stderr, as the
    /// CLI's own messages do.
    static func main() {
        LoggingSystem.bootstrap(StreamLogHandler.standardError)
        main(nil)
    }
}

/// Failures with a message for a person and an exit code for a script.
struct CommandFailure: Error, CustomStringConvertible {
    let description: String
    let code: Int32
    init(_ description: String, code: Int32 = 1) {
        self.description = description
        self.code = code
    }
}

extension Crashcap {
    static func fail(_ message: String, code: Int32 = 1) -> ExitCode {
        FileHandle.standardError.write(Data(("crashcap: " + message + "\n").utf8))
        return ExitCode(code)
    }
}
