import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

/// `crashcap watch` as a sidecar: from a crashed process's death to its $AppCrashed being
/// committed at the collector (loopback), one crash at a time.
func watchBenchmark(runs: Int) throws {
    let directory = temporaryDirectory()
    let collector = try IngestCollector(port: 0, databasePath: temporaryDirectory() + "/collector.sqlite")
    let watch = try ChildProcess(
        path: buildDirectory + "/crashcap", arguments: ["watch", directory, "--upload", collector.url],
        environment: ProcessInfo.processInfo.environment)
    guard watch.waitForOutput("watching") else { throw CrashCaptureError.io("crashcap watch did not start") }
    var latencies: [Double] = []
    for run in 0..<runs {
        _ = try timedRun(
            buildDirectory + "/crash-sample-c", ["null-read"],
            ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        let died = monotonic()
        let wanted = run + 1
        while (try collector.store!.events(limit: 100_000).filter { $0.payload.contains("\"$AppCrashed\"") }.count)
            < wanted
        {
            if Double(monotonic() - died) / 1e9 > 30 {
                throw CrashCaptureError.io("crash \(run) not delivered in 30 s")
            }
            usleep(2000)
        }
        latencies.append(Double(monotonic() - died) / 1e6)
    }
    kill(watch.pid, SIGTERM)
    _ = watch.wait(timeout: 10)
    collector.stop()
    let stats = Statistics(latencies)
    print("## crashcap watch: process death to $AppCrashed committed at the collector (\(runs) crashes, ms)\n")
    print("| median | p90 | max |")
    print("|---|---|---|")
    print("| \(format(stats.median, 1)) | \(format(stats.percentile(0.9), 1)) | \(format(stats.percentile(1), 1)) |")
}
