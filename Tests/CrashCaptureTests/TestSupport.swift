import CrashCapture
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Where the built samples and the package live, seen from the test binary.
enum Paths {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    static let buildDirectory: String = {
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().path
        if FileManager.default.fileExists(atPath: exe + "/crash-sample-swift") { return exe }
        return packageRoot + "/.build/debug"
    }()

    static var swiftSample: String { buildDirectory + "/crash-sample-swift" }
    static var cSample: String { buildDirectory + "/crash-sample-c" }
    static var crashcap: String { buildDirectory + "/crashcap" }
    static var preloadLibrary: String { packageRoot + "/.build/lib/libCrashCapturePreload.so" }
    static var cLibraryDirectory: String { packageRoot + "/.build/lib" }
}

typealias RunResult = ChildProcess.Outcome

typealias Child = ChildProcess

extension ChildProcess {
    /// The tests' children: started with a clean signal mask (ChildProcess), and without the
    /// capture settings of the test runner's own environment, so a crash test sees the crash
    /// it asked for.
    convenience init(
        _ path: String, _ arguments: [String] = [], environment: [String: String] = [:], inheritEnvironment: Bool = true
    ) throws {
        try self.init(
            path: path, arguments: arguments,
            environment: Self.testEnvironment(environment, inheritEnvironment: inheritEnvironment))
    }

    static func testEnvironment(_ environment: [String: String], inheritEnvironment: Bool) -> [String: String] {
        var env = inheritEnvironment ? ProcessInfo.processInfo.environment : [:]
        env.removeValue(forKey: "CRASHCAPTURE_DIR")
        env.removeValue(forKey: "LD_PRELOAD")
        env.removeValue(forKey: "CRASHCAPTURE_SERVER_URL")
        for (key, value) in environment { env[key] = value }
        return env
    }
}

/// Runs a program to its end (or kills it after `timeout` seconds) and says how it ended.
func run(
    _ path: String, _ arguments: [String] = [], environment: [String: String] = [:], timeout: Double = 60,
    inheritEnvironment: Bool = true
) throws -> RunResult {
    try ChildProcess.run(
        path: path, arguments: arguments,
        environment: ChildProcess.testEnvironment(environment, inheritEnvironment: inheritEnvironment),
        timeout: timeout)
}

func makeTemporaryDirectory(_ label: String = "cc") -> String {
    let path = NSTemporaryDirectory() + "crashcapture-tests-\(label)-\(UUID().uuidString)"
    try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    chmod(path, 0o700)
    return path
}

func crashFiles(in directory: String) -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter {
        $0.hasSuffix("." + CrashFileFormat.fileExtension)
    }.sorted().map { directory + "/" + $0 }
}

func reports(in directory: String) throws -> [CrashReport] {
    try crashFiles(in: directory).map { try CrashReport(path: $0) }
}

/// Names of the first `count` frames, resolved with each module's own symbol table.
func frameNames(_ report: CrashReport, count: Int = 12) -> [String] {
    Symbolicator().symbolicate(report).prefix(count).map { $0.function ?? $0.module }
}

/// The checks every captured crash must pass: one valid $AppCrashed, exactly one $AppEnd,
/// no damage, and the expected signal.
func verifiedReport(in directory: String, signal: String) throws -> CrashReport {
    let all = try reports(in: directory)
    guard all.count == 1 else { throw TestFailure("expected 1 crash file in \(directory), found \(all.count)") }
    let report = all[0]
    guard report.problems.isEmpty else { throw TestFailure("crash file problems: \(report.problems)") }
    guard report.crashedEvents.count == 1 else { throw TestFailure("\(report.crashedEvents.count) $AppCrashed") }
    guard report.endEvents.count == 1 else { throw TestFailure("\(report.endEvents.count) $AppEnd") }
    guard report.signalName == signal else {
        throw TestFailure("signal \(report.signalName ?? "none"), expected \(signal)")
    }
    return report
}

struct TestFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
