import ArgumentParser
import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

extension Crashcap {
    struct Harness: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Crash every sample under capture and prove each report right.",
            discussion: """
                Each case runs twice in a subprocess, with capture off and on. It passes when both runs end \
                the same way (same signal, no hang), the crash file holds exactly one valid $AppCrashed and \
                one $AppEnd with the expected signal, si_code, message or exception type, the expected \
                function or library is among the top frames, and every other handler that should have run did.
                """)

        @Option(name: .long, help: "Run only cases whose name contains this text (repeatable).")
        var filter: [String] = []

        @Flag(help: "Print the results as JSON instead of a table.")
        var json = false

        @Flag(help: "List the cases and exit.")
        var list = false

        @Option(
            name: .customLong("repeat"),
            help:
                "Run the stress kinds (concurrent crashes, stack overflows) this many times each, captured only, and count misses."
        )
        var repeatCount: Int?

        @Option(help: "Cases run at once (default: the number of cores).")
        var jobs: Int?

        @Option(help: "Seconds before a run counts as hung and is killed.")
        var timeout: Double = 30

        @Option(help: "Where crash-sample-swift and crash-sample-c are (default: next to crashcap).")
        var buildDir: String?

        @Option(help: "Path of libCrashCapturePreload.so (default: found from the build directory).")
        var preload: String?

        func validate() throws {
            if let repeatCount, repeatCount < 1 { throw ValidationError("--repeat must be at least 1") }
            if let jobs, jobs < 1 { throw ValidationError("--jobs must be at least 1") }
            if timeout <= 0 { throw ValidationError("--timeout must be positive") }
        }

        mutating func run() throws {
            var cases = HarnessMatrix.all()
            if !filter.isEmpty { cases = cases.filter { test in filter.contains { test.name.contains($0) } } }
            if repeatCount != nil { cases = cases.filter(\.isStressKind) }
            if list {
                cases.forEach { print($0.name) }
                return
            }
            guard !cases.isEmpty else { throw Crashcap.fail("no case matches \(filter)", code: 64) }
            let environment: HarnessEnvironment
            do {
                environment = try HarnessEnvironment.make(buildDirectory: buildDir, preload: preload, timeout: timeout)
            } catch let failure as CommandFailure {
                throw Crashcap.fail(failure.description, code: failure.code)
            }
            defer { environment.cleanUp() }
            let withoutNIO = cases.filter { $0.needsNIO && !environment.swiftSampleHasNIO }
            if !withoutNIO.isEmpty {
                cases.removeAll { $0.needsNIO && !environment.swiftSampleHasNIO }
                FileHandle.standardError.write(
                    Data(
                        "left out \(withoutNIO.count) case(s) that need SwiftNIO: these samples were built without it\n"
                            .utf8))
                guard !cases.isEmpty else { throw Crashcap.fail("no case left to run", code: 64) }
            }
            let runner = HarnessRunner(environment: environment)
            let workers = jobs ?? ProcessInfo.processInfo.activeProcessorCount
            if let repeatCount {
                try runRepeated(cases, times: repeatCount, runner: runner, workers: workers)
                return
            }
            let results = Self.runAll(cases.map { test in { runner.run(test) } }, workers: workers)
            if json {
                let summary: [String: Any] = [
                    "build": environment.swiftBuildConfiguration, "passed": results.filter(\.passed).count,
                    "failed": results.filter { !$0.passed }.count, "cases": results.map(\.json),
                ]
                let data = try JSONSerialization.data(withJSONObject: summary, options: [.sortedKeys, .prettyPrinted])
                print(String(decoding: data, as: UTF8.self))
            } else {
                printTable(results, build: environment.swiftBuildConfiguration)
            }
            if results.contains(where: { !$0.passed }) { throw ExitCode(1) }
        }

        /// Runs the jobs on `workers` threads, keeping the results in the jobs' order.
        static func runAll<T>(_ jobs: [() -> T], workers: Int) -> [T] {
            let work = ParallelWork(jobs)
            DispatchQueue.concurrentPerform(iterations: min(workers, jobs.count)) { _ in work.drain() }
            return work.results()
        }

        func printTable(_ results: [HarnessResult], build: String) {
            let header = ["case", "signal (off → on)", "report", "chained", "top frame", "handler ms", "result"]
            let rows = results.map { result -> [String] in
                [
                    result.name, "\(result.baseline) → \(result.captured)", result.captureOK ? "ok" : "BAD",
                    result.chained, result.topFrame,
                    result.handlerMilliseconds.map { String(format: "%.2f", $0) } ?? "-",
                    result.passed ? "pass" : "FAIL",
                ]
            }
            var widths = header.map(\.count)
            for row in rows { for (index, cell) in row.enumerated() { widths[index] = max(widths[index], cell.count) } }
            func line(_ cells: [String]) -> String {
                cells.enumerated().map { $1.padding(toLength: widths[$0], withPad: " ", startingAt: 0) }
                    .joined(separator: "  ")
            }
            print(line(header))
            print(line(widths.map { String(repeating: "-", count: $0) }))
            rows.forEach { print(line($0)) }
            let failed = results.filter { !$0.passed }
            print("\n\(results.count - failed.count) passed, \(failed.count) failed (\(build) samples)")
            for result in failed {
                print("\nFAIL \(result.name)")
                result.failures.forEach { print("  - \($0)") }
            }
        }

        func runRepeated(_ cases: [HarnessCase], times: Int, runner: HarnessRunner, workers: Int) throws {
            let jobs = cases.flatMap { test in (0..<times).map { _ in { runner.run(test, repeatCapturedOnly: true) } } }
            let results = Self.runAll(jobs, workers: workers)
            var rows: [[String: Any]] = []
            for test in cases {
                let mine = results.filter { $0.name == test.name }
                let misses = mine.filter { !$0.passed }
                let handler = mine.compactMap(\.handlerMilliseconds).sorted()
                rows.append([
                    "case": test.name, "runs": mine.count, "misses": misses.count,
                    "handler_ms_median": handler.isEmpty ? 0 : handler[handler.count / 2],
                    "first_failure": misses.first?.failures.first ?? "",
                ])
            }
            if json {
                let data = try JSONSerialization.data(withJSONObject: rows, options: [.sortedKeys, .prettyPrinted])
                print(String(decoding: data, as: UTF8.self))
            } else {
                print("case".padding(toLength: 40, withPad: " ", startingAt: 0) + "runs  misses  handler ms (median)")
                for row in rows {
                    let name = (row["case"] as! String).padding(toLength: 40, withPad: " ", startingAt: 0)
                    print(
                        name + "\(row["runs"]!)".padding(toLength: 6, withPad: " ", startingAt: 0)
                            + "\(row["misses"]!)".padding(toLength: 8, withPad: " ", startingAt: 0)
                            + String(format: "%.2f", row["handler_ms_median"] as! Double))
                    if let failure = row["first_failure"] as? String, !failure.isEmpty {
                        print("    first miss: \(failure)")
                    }
                }
            }
            let missed = results.filter { !$0.passed }.count
            if !json { print("\(results.count - missed) passed, \(missed) failed") }
            if missed > 0 { throw ExitCode(1) }
        }
    }
}

/// Jobs taken one at a time by several threads; the lock guards the cursor and the results.
private final class ParallelWork<T>: @unchecked Sendable {
    private let jobs: [() -> T]
    private var done: [T?]
    private var next = 0
    private let lock = NSLock()

    init(_ jobs: [() -> T]) {
        self.jobs = jobs
        done = [T?](repeating: nil, count: jobs.count)
    }

    func drain() {
        while true {
            lock.lock()
            let index = next
            next += 1
            lock.unlock()
            guard index < jobs.count else { return }
            let result = jobs[index]()
            lock.lock()
            done[index] = result
            lock.unlock()
        }
    }

    func results() -> [T] { done.map { $0! } }
}
