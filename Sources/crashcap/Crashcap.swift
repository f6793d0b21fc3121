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
        subcommands: [Harness.self, Show.self, Replay.self, Upload.self, Watch.self, Collect.self, Symbols.self]
    )

    /// The library's diagnostics (a damaged store moved aside, say) go to stderr, as the
    /// CLI's own messages do.
    static func main() {
        LoggingSystem.bootstrap(StreamLogHandler.standardError)
        // libdebuginfod waits 90 s for a server that does not answer, with no bound on a
        // download's size or time; a replay should not. Before any thread reads the environment.
        Symbolicator.boundNetworkLookups()
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
    /// Arguments reach Swift decoded as UTF-8, invalid bytes replaced by U+FFFD: such a path
    /// names another file than the one meant, so it is refused (usage error) rather than used.
    static func requireUTF8Path(_ path: String) throws {
        guard path.unicodeScalars.contains("\u{FFFD}") else { return }
        throw fail(
            "\(CaptureFile.printable(path)) is not valid UTF-8 (or holds U+FFFD); crashcap takes UTF-8 paths: "
                + "rename it, or reach it through a UTF-8 link", code: 64)
    }

    static func fail(_ message: String, code: Int32 = 1) -> ExitCode {
        FileHandle.standardError.write(Data(("crashcap: " + message + "\n").utf8))
        return ExitCode(code)
    }
}
