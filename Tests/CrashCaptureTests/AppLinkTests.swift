import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// An app built outside this package against the `CrashCapture` product alone
/// (Examples/MinimalApp, built by Scripts/test.sh): what it links, and that it works.
@Suite struct AppLinkTests {
    static var app: String { Paths.packageRoot + "/.build/minimal-app/debug/minimal-app" }

    func symbols() throws -> String {
        try #require(FileManager.default.fileExists(atPath: Self.app), "no \(Self.app): run Scripts/test.sh")
        let result = try run("/usr/bin/nm", [Self.app])
        try #require(result.exitCode == 0, "nm failed: \(result.stderr)")
        return result.stdout
    }

    @Test func appCarriesTheSDKAndNothingElseOfThePackage() throws {
        let names = try symbols()
        // The SDK is there: the C crash path and the Swift install.
        #expect(names.contains("crashcapture_install"))
        #expect(names.contains("cc_signal_handler"))
        #expect(names.contains("12CrashCapture"))
        // None of the collector, the process spawner, the harness or the test hooks' users.
        for module in ["CrashCaptureCollector", "ProcessSupport", "IngestCollector", "ChildProcess", "CleanSpawn"] {
            #expect(!names.contains(module), "the app links \(module)")
        }
        for harness in ["HarnessRunner", "HarnessMatrix", "ReportRendering", "ProgressBar"] {
            #expect(!names.contains(harness), "the app links \(harness)")
        }
    }

    /// The app's build compiled every source of ours it links and showed no warning: a user's
    /// build prints ours among its own. Scripts/build-minimal-app.sh builds it as a user does
    /// (without our warnings-as-errors), from scratch whenever a source of ours changed.
    @Test func anAppsBuildShowsNoWarningFromOurSources() throws {
        let path = Paths.packageRoot + "/.build/minimal-app/build.log"
        let log = try String(contentsOfFile: path, encoding: .utf8)
        // SwiftPM names a Swift module, or a C file (the crash path's, in CCrashCapture).
        for compiled in ["CrashCapture ", "CrashFileFormat ", "CrashSymbolication ", "CElfutils ", "crash_path.c"] {
            #expect(log.contains("Compiling \(compiled)"), "\(path) is not of a build that compiled \(compiled)")
        }
        let ours = log.split(separator: "\n").filter {
            $0.contains("warning:") && !$0.contains("/.build/minimal-app/checkouts/")
        }
        #expect(ours.isEmpty, "\(ours.count) warning lines in an app's build:\n\(ours.joined(separator: "\n"))")
    }

    @Test func diagnosticsReachTheAppsOwnLogHandler() throws {
        let directory = makeTemporaryDirectory("app-log")
        let result = try run(Self.app, [directory], timeout: 30)
        #expect(result.exitCode == 0, "\(result.stderr)")
        #expect(result.stdout.contains("tracked"))
        #expect(
            result.stderr.contains("app-log [crashcapture] warning: built without HTTP upload"),
            "the library's diagnostic did not go through swift-log: \(result.stderr)")
    }

    @Test func appCrashIsCapturedAndDiesOfItsOwnSignal() throws {
        let directory = makeTemporaryDirectory("app-crash")
        let result = try run(
            Self.app, [directory, "crash"], environment: ["SWIFT_BACKTRACE": "enable=no"], timeout: 30)
        #expect(
            result.signal == SIGSEGV,
            "ended by \(String(describing: result.signal)) / \(String(describing: result.exitCode))")
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.properties["$app_name"] as? String == "minimal-app")
    }

    /// The README's two blocks, built verbatim beside a checkout of another folder name
    /// (Scripts/build-readme-app.sh): the app starts, crashes, dies of its own signal, and the
    /// report is there; the next start imports it.
    @Test func theReadmesSwiftAppWorksAsWritten() throws {
        // The blocks and the command that crashes the app are within the README's first 60 lines.
        let readme = try String(contentsOfFile: Paths.packageRoot + "/README.md", encoding: .utf8)
        let lines = readme.split(separator: "\n", omittingEmptySubsequences: false)
        let crashLine = try #require(lines.firstIndex { $0.hasPrefix("swift build && .build/debug/myapp crash") })
        #expect(crashLine < 60, "the command that crashes the README's app is on line \(crashLine + 1)")
        let app = Paths.packageRoot + "/.build/readme-app/build/debug/myapp"
        try #require(FileManager.default.fileExists(atPath: app), "no \(app): run Scripts/test.sh")
        let directory = makeTemporaryDirectory("readme-app")
        let calm = try run(app, [], environment: ["MYAPP_CRASH_DIR": directory], timeout: 30)
        #expect(calm.exitCode == 0, "\(calm.stdout)\(calm.stderr)")
        #expect(calm.stdout.contains("no crash this time"))
        #expect(!calm.stdout.contains("running without crash capture"), "\(calm.stdout)")
        let crashed = try run(
            app, ["crash"], environment: ["MYAPP_CRASH_DIR": directory, "SWIFT_BACKTRACE": "enable=no"],
            timeout: 30)
        #expect(crashed.signal == SIGSEGV, "ended by \(String(describing: crashed.signal))")
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.properties["$app_name"] as? String == "myapp")
        let next = try run(app, [], environment: ["MYAPP_CRASH_DIR": directory], timeout: 30)
        #expect(next.exitCode == 0)
        #expect(crashFiles(in: directory).isEmpty, "the next start imported the report")
    }
}
