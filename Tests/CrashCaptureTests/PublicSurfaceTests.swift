import CrashCapture
import Foundation
import TestSupport
import Testing

/// What an app sees of the SDK stays small and documented: at most 100 `public` or `open`
/// declarations in Sources/CrashCapture, each with a doc comment. What the CLI, benchmarks
/// and tests need across modules uses `package` access instead.
@Suite struct PublicSurfaceTests {
    struct Declaration {
        let file: String
        let line: Int
        let text: String
        let documented: Bool
    }

    static func publicDeclarations() throws -> [Declaration] {
        let root = Paths.packageRoot + "/Sources/CrashCapture"
        let files = try FileManager.default.subpathsOfDirectory(atPath: root).filter { $0.hasSuffix(".swift") }
        var found: [Declaration] = []
        for file in files {
            let lines = try String(contentsOfFile: root + "/" + file, encoding: .utf8).split(
                separator: "\n", omittingEmptySubsequences: false)
            for (index, line) in lines.enumerated() {
                let code = line.trimmingCharacters(in: .whitespaces)
                let words = code.split(separator: " ")
                guard words.contains(where: { $0 == "public" || $0 == "open" }), !code.hasPrefix("//"),
                    words.first.map({ $0 == "public" || $0 == "open" || $0.hasPrefix("@") }) == true
                else { continue }
                var previous = index - 1
                while previous >= 0 && lines[previous].trimmingCharacters(in: .whitespaces).hasPrefix("@") {
                    previous -= 1
                }
                let documented = previous >= 0 && lines[previous].trimmingCharacters(in: .whitespaces).hasPrefix("///")
                found.append(Declaration(file: file, line: index + 1, text: code, documented: documented))
            }
        }
        return found
    }

    @Test func atMostOneHundredPublicDeclarations() throws {
        let declarations = try Self.publicDeclarations()
        #expect(declarations.count <= 100, "\(declarations.count) public declarations")
        #expect(declarations.count >= 20, "the scan found too few to be right: \(declarations.map(\.text))")
    }

    @Test func everyPublicDeclarationHasADocComment() throws {
        let undocumented = try Self.publicDeclarations().filter { !$0.documented && !$0.text.contains(" import ") }
        #expect(undocumented.isEmpty, "\(undocumented.map { "\($0.file):\($0.line) \($0.text)" })")
    }
}

/// The API as a Swift user expects it: every throwing call throws `CrashCaptureError` itself
/// (a `catch` gets its `kind` without a cast), and every time is a `Duration`.
@Suite struct TypedAPITests {
    @Test func errorsAreTypedAndTimesAreDurations() {
        do {
            try CrashCapture.track("9 is no name")
            Issue.record("a bad event name was accepted")
        } catch {
            // `error` is a CrashCaptureError here: this line does not compile otherwise.
            let kind: CrashCaptureError.Kind = error.kind
            #expect(kind == .invalidArgument)
        }
        do {
            try CrashCapture.login("user")
        } catch {
            #expect(error.kind == .notInstalled)
        }
        var options = UploadOptions()
        options.exitFlushTimeout = .milliseconds(500)
        options.retryBaseDelay = .seconds(2)
        #expect(options.exitFlushTimeout < options.retryBaseDelay)
        var configuration = CrashCapture.Configuration(directory: "/x", appName: "a", appVersion: "1")
        configuration.replayBudget = .seconds(1)
        configuration.fullJournalWait = .milliseconds(10)
        CrashCapture.flush(timeout: .zero)
    }
}
