import CrashCapture
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

/// Issue #35's figures. The C ones come from `crash-sample-c hang-bench-*` (CrashSamples/C/
/// hang_bench.c), a process of its own that installs the C API and listens to the watchdog; the
/// Swift `beat()` is timed here, in a process with the SDK installed.
func hangBenchmarks(hangs: Int, cpuSeconds: Int) throws {
    func lines(_ mode: String, count: Int) throws -> [String: [Double]] {
        let directory = temporaryDirectory()
        let result = try ChildProcess.run(
            path: buildDirectory + "/crash-sample-c", arguments: [mode],
            environment: ProcessInfo.processInfo.environment.merging(
                ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_HANG_BENCH_COUNT": "\(count)"]
            ) { $1 }, timeout: 600)
        guard result.exitCode == 0 else {
            throw CrashCaptureError.io(
                "crash-sample-c \(mode) ended with status \(result.exitCode.map(String.init) ?? "none"), signal \(result.signal.map(String.init) ?? "none"): \(result.stderr)"
            )
        }
        var values: [String: [Double]] = [:]
        for line in result.stdout.split(separator: "\n") {
            let parts = line.split(separator: " ")
            if parts.count == 2, let value = Double(parts[1]) { values[String(parts[0]), default: []].append(value) }
        }
        return values
    }
    func row(_ name: String, _ values: [Double], _ reference: String, _ target: String) {
        let stats = Statistics(values)
        print(
            "| \(name) | \(format(stats.median, 3)) | \(format(stats.percentile(0.9), 3)) | "
                + "\(format(stats.percentile(1), 3)) | \(reference) | \(target) |")
    }

    print("## Hangs (issue #35)\n")
    print("| measure | median | p90 | max | reference, same run | target |")
    print("|---|---|---|---|---|---|")
    let beat = try lines("hang-bench-beat", count: 0)
    row(
        "C `crashcapture_watch_beat`, ns", beat["beat_ns"] ?? [],
        "a relaxed store of a constant: \(format(Statistics(beat["relaxed_store_ns"] ?? []).median, 3)) ns", "≤ 5")
    let swift = try swiftBeatNanoseconds()
    row(
        "Swift `HangWatch.beat()`, ns", swift.beat,
        "a relaxed store of a constant: \(format(Statistics(swift.store).median, 3)) ns",
        "≤ 5")
    let cpu = try lines("hang-bench-cpu", count: cpuSeconds)
    row(
        "watchdog CPU with 64 watches beaten every ms, % of a core", cpu["watchdog_cpu_percent"] ?? [],
        "a thread that only wakes every 5 ms: \(format(Statistics(cpu["waker_cpu_percent"] ?? []).median, 3)) %",
        "≤ 0.1")
    let reports = try lines("hang-bench-report", count: hangs)
    let flush = Statistics(reports["flush_alone_ms"] ?? []).median
    row(
        "threshold to `$AppHang` on disk, 64 threads, ms", reports["threshold_to_disk_ms"] ?? [],
        "the disk's flush alone: \(format(flush, 3)) ms", "≤ 10")
    row(
        "of which the report: detection to durable, ms", reports["detect_to_disk_ms"] ?? [],
        "the disk's flush alone: \(format(flush, 3)) ms", "")
    row(
        "the longest any thread was held (its stop to its going on), ms", reports["threads_held_ms"] ?? [], "", "≤ 2")
    row(
        "a spinning thread's longest gap during a report, ms", reports["spinner_gap_ms"] ?? [],
        "the same without a hang: \(format(Statistics(reports["spinner_gap_without_hang_ms"] ?? []).median, 3)) ms",
        "≤ 2")
    let failed = (reports["error"] ?? []).filter { $0 != 0 }.count
    print("\n\(hangs) hangs, \(failed) reports not written.")
}

/// `HangWatch.beat()` as an app calls it, through the SDK, against a relaxed store of a constant
/// in the same loop shape: three rounds of 100 million each.
func swiftBeatNanoseconds() throws -> (beat: [Double], store: [Double]) {
    try CrashCapture.install(
        .init(directory: temporaryDirectory(), appName: "bench", appVersion: "1", trackLifecycle: false))
    defer { CrashCapture.uninstall() }
    let watch = CrashCapture.watch(name: "bench", threshold: .seconds(10))
    guard watch.isActive else { throw CrashCaptureError.io("the watch is not checked") }
    let count = 100_000_000
    var beats: [Double] = []
    var stores: [Double] = []
    let word = UnsafeMutablePointer<UInt64>.allocate(capacity: 1)
    defer { word.deallocate() }
    for _ in 0..<3 {
        var start = monotonic()
        for _ in 0..<count { beatOnce(watch) }
        beats.append(Double(monotonic() - start) / Double(count))
        start = monotonic()
        for index in 0..<count { storeOnce(word, UInt64(index)) }
        stores.append(Double(monotonic() - start) / Double(count))
    }
    watch.stop()
    return (beats, stores)
}

@inline(never) func beatOnce(_ watch: HangWatch) { watch.beat() }

@inline(never) func storeOnce(_ word: UnsafeMutablePointer<UInt64>, _ value: UInt64) {
    UnsafeMutableRawPointer(word).storeBytes(of: value, as: UInt64.self)
}
