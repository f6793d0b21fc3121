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

struct RunResult {
    var signal: Int32?
    var exitCode: Int32?
    var stdout: String
    var stderr: String
    var seconds: Double
    var timedOut: Bool
}

/// Runs a program to its end (or kills it after `timeout` seconds) and says how it ended.
func run(
    _ path: String, _ arguments: [String] = [], environment: [String: String] = [:], timeout: Double = 60,
    inheritEnvironment: Bool = true
) throws -> RunResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: path)
    process.arguments = arguments
    var env = inheritEnvironment ? ProcessInfo.processInfo.environment : [:]
    // A crash test must see the crash it asked for, not one inherited from the test runner.
    env.removeValue(forKey: "CRASHCAPTURE_DIR")
    env.removeValue(forKey: "LD_PRELOAD")
    for (key, value) in environment { env[key] = value }
    process.environment = env
    // Files, not pipes: a crashing child's output must never block on a full pipe.
    let outputDirectory = makeTemporaryDirectory("output")
    defer { try? FileManager.default.removeItem(atPath: outputDirectory) }
    FileManager.default.createFile(atPath: outputDirectory + "/stdout", contents: nil)
    FileManager.default.createFile(atPath: outputDirectory + "/stderr", contents: nil)
    let stdoutHandle = try FileHandle(forWritingTo: URL(fileURLWithPath: outputDirectory + "/stdout"))
    let stderrHandle = try FileHandle(forWritingTo: URL(fileURLWithPath: outputDirectory + "/stderr"))
    process.standardOutput = stdoutHandle
    process.standardError = stderrHandle
    process.standardInput = FileHandle.nullDevice
    let finished = DispatchSemaphore(value: 0)
    process.terminationHandler = { _ in finished.signal() }
    let start = Date()
    try process.run()
    var timedOut = false
    if finished.wait(timeout: .now() + timeout) == .timedOut {
        timedOut = true
        kill(process.processIdentifier, SIGKILL)
        finished.wait()
    }
    try? stdoutHandle.close()
    try? stderrHandle.close()
    let stdoutData = FileManager.default.contents(atPath: outputDirectory + "/stdout") ?? Data()
    let stderrData = FileManager.default.contents(atPath: outputDirectory + "/stderr") ?? Data()
    let seconds = Date().timeIntervalSince(start)
    let signaled = process.terminationReason == .uncaughtSignal
    return RunResult(
        signal: signaled ? process.terminationStatus : nil, exitCode: signaled ? nil : process.terminationStatus,
        stdout: String(decoding: stdoutData, as: UTF8.self), stderr: String(decoding: stderrData, as: UTF8.self),
        seconds: seconds, timedOut: timedOut)
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
    let modules = report.modules
    var images: [String: ELFImage] = [:]
    var names: [String] = []
    for (index, frame) in report.frames.prefix(count).enumerated() {
        guard let moduleIndex = frame.module, moduleIndex < modules.count, let offset = frame.offset else {
            names.append("?")
            continue
        }
        let path = modules[moduleIndex].path
        if images[path] == nil { images[path] = try? ELFImage(path: path) }
        // Return addresses point after the call; step back into it for all but the first frame.
        let address = index == 0 ? offset : offset - 1
        if let (symbol, _) = images[path]?.symbol(containing: address) {
            names.append(Demangler.demangle(symbol.name))
        } else {
            names.append((path as NSString).lastPathComponent)
        }
    }
    return names
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
