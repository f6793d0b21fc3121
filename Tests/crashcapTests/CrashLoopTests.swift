import CrashCapture
import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A program that crashes at every start, with nobody replaying: the crash directory stays
/// within its bound, the oldest reports are the ones kept, every crash is still counted, and
/// replay does not flood the store with stacks.
@Suite struct CrashLoopTests {
    /// The C sample under the preload library, with the directory's bound from `bound`.
    func crash(_ sample: InlineSample, into directory: String, bound: [String: String]) throws -> RunResult {
        try run(
            sample.unstripped, [],
            environment: bound.merging(["CRASHCAPTURE_DIR": directory, "LD_PRELOAD": Paths.preloadLibrary]) { $1 })
    }

    @Test func twoHundredCrashesInAMinuteStayWithinTheBound() throws {
        let sample = try InlineSample.built(.c)
        let directory = makeTemporaryDirectory("crash-loop")
        var keptPaths: [String] = []
        var notKept = 0
        let start = Date()
        for _ in 0..<200 {
            let result = try crash(sample, into: directory, bound: ["CRASHCAPTURE_MAX_CRASH_FILES": "5"])
            // However the report fares, the process dies of its own signal.
            #expect(result.signal == SIGSEGV)
            if let range = result.stderr.range(of: "; report ") {
                keptPaths.append(String(result.stderr[range.upperBound...].prefix { $0 != "\n" }))
            } else if result.stderr.contains("no report kept: the crash directory is full") {
                notKept += 1
            }
        }
        #expect(Date().timeIntervalSince(start) < 60)
        #expect(keptPaths.count == 5)
        #expect(notKept == 195)
        #expect(Set(crashFiles(in: directory)) == Set(keptPaths), "the first five are the ones kept")

        let replay = try run(Paths.crashcap, ["replay", directory], timeout: 120)
        #expect(replay.exitCode == 0, "\(replay.stderr)")
        let store = try EventStore(path: directory + "/events.sqlite")
        let events = try store.events(limit: 100_000).compactMap {
            try JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any]
        }
        let crashed = events.filter { $0["event"] as? String == "$AppCrashed" }
        let ends = events.filter { $0["event"] as? String == "$AppEnd" }
        #expect(crashed.count == 200, "every crash counted")
        #expect(ends.count == 200, "every session closed")
        let compactNotKept = crashed.filter {
            let properties = $0["properties"] as? [String: Any] ?? [:]
            return properties["crash_not_kept"] as? Bool == true
                && properties["crash_signal_name"] as? String == "SIGSEGV"
                && $0["crash"] == nil
        }
        #expect(compactNotKept.count == 195)
        #expect(crashFiles(in: directory).isEmpty)
        // Replayed again, nothing is imported twice.
        _ = try run(Paths.crashcap, ["replay", directory], timeout: 120)
        #expect(try EventStore(path: directory + "/events.sqlite").count == store.count)
    }

    /// The bound in bytes: once the directory holds any crash or session file past one byte,
    /// the next crash keeps no report.
    @Test func theByteBoundHoldsToo() throws {
        let sample = try InlineSample.built(.c)
        let directory = makeTemporaryDirectory("crash-bytes")
        var kept = 0
        for _ in 0..<3 {
            let result = try crash(sample, into: directory, bound: ["CRASHCAPTURE_MAX_CRASH_BYTES": "1"])
            #expect(result.signal == SIGSEGV)
            if result.stderr.contains("; report ") { kept += 1 }
        }
        #expect(kept == 1)
        #expect(crashFiles(in: directory).count == 1)
    }
}
