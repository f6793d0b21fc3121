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
        subcommands: [
            Harness.self, Show.self, List.self, Export.self, Replay.self, Upload.self, Watch.self, Collect.self,
            Serve.self,
            Symbols.self,
        ]
    )

    /// The library's diagnostics (a damaged store moved aside, say) go to stderr, as the
    /// CLI's own messages do.
    static func main() {
        LoggingSystem.bootstrap(StreamLogHandler.standardError)
        // libdebuginfod waits 90 s for a server that does not answer, with no bound on a
        // download's size or time; a replay should not. Before any thread reads the environment.
        Symbolicator.boundNetworkLookups()
        let arguments = Array(CommandLine.arguments.dropFirst())
        if let first = arguments.first, let suggestion = suggestion(for: first) {
            FileHandle.standardError.write(
                Data(
                    "crashcap: unknown command '\(first)'; did you mean '\(suggestion)'? (crashcap --help lists them)\n"
                        .utf8))
            Foundation.exit(64)
        }
        main(nil)
    }

    /// The subcommand a mistyped first argument was most likely meant to be: within two edits
    /// (or a prefix of one), and only for a word that is no command or option at all.
    static func suggestion(for word: String) -> String? {
        let names = configuration.subcommands.map { $0._commandName } + ["help"]
        guard !word.hasPrefix("-"), !names.contains(word) else { return nil }
        let ranked = names.map { ($0, editDistance(word, $0)) }.sorted { $0.1 < $1.1 }
        guard let best = ranked.first else { return nil }
        return best.1 <= 2 || (word.count >= 3 && best.0.hasPrefix(word)) ? best.0 : nil
    }

    static func editDistance(_ a: String, _ b: String) -> Int {
        let a = Array(a)
        let b = Array(b)
        var row = Array(0...b.count)
        for i in 1...max(1, a.count) where !a.isEmpty {
            var previous = row[0]
            row[0] = i
            for j in 1...max(1, b.count) where !b.isEmpty {
                let saved = row[j]
                row[j] = min(row[j] + 1, row[j - 1] + 1, previous + (a[i - 1] == b[j - 1] ? 0 : 1))
                previous = saved
            }
        }
        return a.isEmpty ? b.count : row[b.count]
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
