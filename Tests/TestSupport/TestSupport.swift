internal import CrashCapture
package import CrashFileFormat
internal import CrashSymbolication
package import Foundation
package import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

/// Where the built samples and the package live, seen from the test binary.
package enum Paths {
    package static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent()
        .deletingLastPathComponent().path

    package static let buildDirectory: String = {
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().path
        if FileManager.default.fileExists(atPath: exe + "/crash-sample-swift") { return exe }
        return packageRoot + "/.build/debug"
    }()

    package static var swiftSample: String { buildDirectory + "/crash-sample-swift" }
    package static var cSample: String { buildDirectory + "/crash-sample-c" }
    package static var crashcap: String { buildDirectory + "/crashcap" }
    package static var preloadLibrary: String { packageRoot + "/.build/lib/libCrashCapturePreload.so" }
    package static var cLibraryDirectory: String { packageRoot + "/.build/lib" }
}

package typealias RunResult = ChildProcess.Outcome

package typealias Child = ChildProcess

extension ClickHouseServer {
    /// A server in a temporary folder of the tests'.
    package convenience init() throws {
        try self.init(directory: makeTemporaryDirectory("clickhouse"))
    }
}

extension ChildProcess {
    /// The tests' children: started with a clean signal mask (ChildProcess), and without the
    /// capture settings of the test runner's own environment, so a crash test sees the crash
    /// it asked for.
    package convenience init(
        _ path: String, _ arguments: [String] = [], environment: [String: String] = [:], inheritEnvironment: Bool = true
    ) throws {
        try self.init(
            path: path, arguments: arguments,
            environment: Self.testEnvironment(environment, inheritEnvironment: inheritEnvironment))
    }

    package static func testEnvironment(_ environment: [String: String], inheritEnvironment: Bool) -> [String: String] {
        var env = inheritEnvironment ? ProcessInfo.processInfo.environment : [:]
        env.removeValue(forKey: "CRASHCAPTURE_DIR")
        env.removeValue(forKey: "LD_PRELOAD")
        env.removeValue(forKey: "CRASHCAPTURE_SERVER_URL")
        for (key, value) in environment { env[key] = value }
        return env
    }
}

/// Runs a program to its end (or kills it after `timeout` seconds) and says how it ended.
package func run(
    _ path: String, _ arguments: [String] = [], environment: [String: String] = [:], timeout: Double = 60,
    inheritEnvironment: Bool = true
) throws -> RunResult {
    try ChildProcess.run(
        path: path, arguments: arguments,
        environment: ChildProcess.testEnvironment(environment, inheritEnvironment: inheritEnvironment),
        timeout: timeout)
}

/// Like `run`, and also the program's peak resident memory in bytes. Taken by GNU time, which
/// forks before it execs: our own spawn shares the test's memory until the exec, and the
/// kernel would count the test's peak as the child's.
package func runMeasuringMemory(
    _ path: String, _ arguments: [String], timeout: Double = 60
) throws -> (result: RunResult, peakBytes: Int) {
    let report = NSTemporaryDirectory() + "crashcapture-maxrss-\(UUID().uuidString)"
    defer { unlink(report) }
    let result = try run("/usr/bin/time", ["-f", "%M", "-o", report, path] + arguments, timeout: timeout)
    let text = try String(contentsOfFile: report, encoding: .utf8)
    guard let kilobytes = text.split(separator: "\n").last.flatMap({ Int($0) }) else {
        throw TestFailure("GNU time wrote no figure: \(text)")
    }
    return (result, kilobytes * 1024)
}

package func makeTemporaryDirectory(_ label: String = "cc") -> String {
    let path = NSTemporaryDirectory() + "crashcapture-tests-\(label)-\(UUID().uuidString)"
    try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    chmod(path, 0o700)
    TemporaryDirectories.shared.add(path)
    return path
}

/// Every directory the tests made, removed when the test process exits: a full run made about
/// 300 of them and left 1.2 GB (crash files, stores, built samples) in the temp directory.
final class TemporaryDirectories: @unchecked Sendable {
    static let shared = TemporaryDirectories()
    private let lock = NSLock()
    private var paths: [String] = []
    private var registered = false

    func add(_ path: String) {
        lock.lock()
        defer { lock.unlock() }
        paths.append(path)
        if !registered {
            registered = true
            atexit { TemporaryDirectories.shared.removeAll() }
        }
    }

    func removeAll() {
        lock.lock()
        let all = paths
        paths = []
        lock.unlock()
        for path in all {
            // A test may have made a folder read-only, or left a FIFO: open it up first.
            _ = try? FileManager.default.setAttributes([.posixPermissions: 0o700], ofItemAtPath: path)
            if let walker = FileManager.default.enumerator(atPath: path) {
                for case let name as String in walker {
                    var info = stat()
                    if lstat(path + "/" + name, &info) == 0, info.st_mode & S_IFMT == S_IFDIR {
                        chmod(path + "/" + name, 0o700)
                    }
                }
            }
            try? FileManager.default.removeItem(atPath: path)
        }
    }
}

package func crashFiles(in directory: String) -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter {
        $0.hasSuffix("." + CrashFileLayout.fileExtension)
    }.sorted().map { directory + "/" + $0 }
}

package func reports(in directory: String) throws -> [CrashReport] {
    try crashFiles(in: directory).map { try CrashReport(path: $0) }
}

/// Names of the first `count` frames, resolved with each module's own symbol table.
package func frameNames(_ report: CrashReport, count: Int = 12) -> [String] {
    Symbolicator().symbolicate(report).prefix(count).map { $0.function ?? $0.module }
}

/// The checks every captured crash must pass: one valid $AppCrashed, exactly one $AppEnd,
/// no damage, and the expected signal.
package func verifiedReport(in directory: String, signal: String) throws -> CrashReport {
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

/// Every event in a capture directory's store, each read back whole as JSON.
package func storedEvents(in directory: String) throws -> [[String: Any]] {
    let store = try EventStore(path: directory + "/events.sqlite")
    return try store.events(limit: 10_000_000).map {
        guard let event = try JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any] else {
            throw TestFailure("a stored event is not a JSON object: \($0.payload.prefix(200))")
        }
        return event
    }
}

package struct TestFailure: Error, CustomStringConvertible {
    package let description: String
    package init(_ description: String) { self.description = description }
}

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// `crashcap collect` as a real server process, for the duration of one test.
/// `@unchecked`: every property is a constant, and the child process is itself Sendable.
package final class CollectorProcess: @unchecked Sendable {
    package let child: Child
    package let url: String
    package let base: String
    package let database: String

    /// Stores into SQLite (`database`), or into ClickHouse at `clickHouse` when given.
    package init(_ arguments: [String] = [], clickHouse: String? = nil) throws {
        database = clickHouse == nil ? makeTemporaryDirectory("collector") + "/collected.sqlite" : ""
        let store = clickHouse.map { ["--clickhouse", $0] } ?? ["--db", database]
        child = try Child(Paths.crashcap, ["collect", "--port", "0"] + store + arguments)
        guard child.waitForOutput("listening on"), let range = child.stdout.range(of: "http://") else {
            throw TestFailure("collector did not start: \(child.stdout) \(child.stderr)")
        }
        url = String(child.stdout[range.lowerBound...]).trimmingCharacters(in: .whitespacesAndNewlines)
        base = String(url.dropLast(3))
    }

    package func get(_ path: String) throws -> (Int, Data) {
        try request("GET", path, body: nil)
    }

    package func request(_ method: String, _ path: String, body: Data?) throws -> (Int, Data) {
        var request = URLRequest(url: URL(string: base + path)!, timeoutInterval: 10)
        request.httpMethod = method
        request.httpBody = body
        let done = DispatchSemaphore(value: 0)
        let result = ResponseBox()
        URLSession.shared.dataTask(with: request) { data, response, _ in
            result.set((response as? HTTPURLResponse)?.statusCode ?? 0, data ?? Data())
            done.signal()
        }.resume()
        if done.wait(timeout: .now() + 15) == .timedOut { throw TestFailure("no response to \(method) \(path)") }
        return result.get()
    }

    /// Every stored event, in arrival order.
    package func events() throws -> [[String: Any]] {
        let (status, data) = try get("/events")
        guard status == 200 else { throw TestFailure("GET /events: \(status)") }
        return String(decoding: data, as: UTF8.self).split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }
}

/// The answer a URLSession completion hands back to the waiting test.
private final class ResponseBox: @unchecked Sendable {  // every access holds `lock`
    private let lock = NSLock()
    private var value: (Int, Data) = (0, Data())
    func set(_ status: Int, _ data: Data) { lock.withLock { value = (status, data) } }
    func get() -> (Int, Data) { lock.withLock { value } }
}
