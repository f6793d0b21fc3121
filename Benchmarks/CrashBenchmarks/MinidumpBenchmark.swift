import CrashFileFormat
import Foundation
import Minidump

#if canImport(Glibc)
    import Glibc
#endif

/// The cost of keeping every thread's stack (the stacks record) in the crash handler, beside the
/// handler without it in the same run (CRASHCAPTURE_STACK_MEMORY=off), runs interleaved so that
/// the machine's load falls on both alike; then the export of a 16-thread crash to a minidump,
/// and the dump's size.
func minidumpBenchmark(runs: Int) throws {
    var noCore = rlimit(rlim_cur: 0, rlim_max: 0)
    setrlimit(Int32(RLIMIT_CORE.rawValue), &noCore)
    let sample = buildDirectory + "/crash-sample-c"
    print("## Handler with and without the stacks record (\(runs) crashes each, interleaved, ms)\n")
    print(
        "| threads | own work (handler − flush), stacks kept: median | p90 | without: median | p90 | copying the stacks: median | writing them: median | stacks record (KiB) | crash file without / with (KiB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    var sixteen: String?
    for threads in [1, 16, 256] {
        var own: [Bool: [Double]] = [true: [], false: []]
        var copying: [Double] = []
        var writing: [Double] = []
        var stacksSize: [Double] = []
        var fileSize: [Bool: [Double]] = [true: [], false: []]
        let directory = temporaryDirectory()
        for run in 0..<(2 * runs) {
            let kept = run % 2 == 0
            var environment = [
                "CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no", "CRASH_SAMPLE_THREADS": "\(threads)",
            ]
            if !kept { environment["CRASHCAPTURE_STACK_MEMORY"] = "off" }
            _ = try timedRun(sample, ["parked-threads"], environment)
            for file in try FileManager.default.contentsOfDirectory(atPath: directory) where file.hasSuffix(".ccr") {
                let path = directory + "/" + file
                let contents = try CrashFileReader.read(path: path)
                let report = CrashReport(path: path, contents: contents)
                let json = contents.records.last(where: { $0.type == .timing })?.json ?? [:]
                // The stacks record is written after the report is durable, outside handler_ns:
                // added back, it is the handler's work all the same.
                let stacksWrite = (json["stacks_write_ns"] as? NSNumber)?.doubleValue ?? 0
                if let timing = report.timing {
                    own[kept]!.append(
                        (Double(timing.handlerNanoseconds - timing.fdatasyncNanoseconds) + stacksWrite) / 1e6)
                }
                if kept {
                    copying.append(((json["stacks_ns"] as? NSNumber)?.doubleValue ?? 0) / 1e6)
                    writing.append(stacksWrite / 1e6)
                }
                if kept, let stacks = contents.stacks { stacksSize.append(Double(stacks.count + 16) / 1024) }
                fileSize[kept]!.append(Double(contents.records.reduce(0) { $0 + 16 + $1.payload.count }) / 1024)
                if kept && threads == 16 && sixteen == nil {
                    sixteen = temporaryDirectory() + "/crash-16-threads.ccr"
                    try FileManager.default.moveItem(atPath: path, toPath: sixteen!)
                } else {
                    try FileManager.default.removeItem(atPath: path)
                }
            }
        }
        let with = Statistics(own[true]!)
        let without = Statistics(own[false]!)
        print(
            "| \(threads) | \(format(with.median)) | \(format(with.percentile(0.9))) | \(format(without.median)) | "
                + "\(format(without.percentile(0.9))) | \(format(Statistics(copying).median)) | "
                + "\(format(Statistics(writing).median)) | "
                + "\(format(Statistics(stacksSize).median, 1)) | \(format(Statistics(fileSize[false]!).median, 1)) / "
                + "\(format(Statistics(fileSize[true]!).median, 1)) |")
    }
    guard let sixteen else { return }
    // Export: read the crash file, build the minidump, write it; in this process, then as the
    // CLI runs it (a process of its own).
    var inProcess: [Double] = []
    var size = 0
    let output = temporaryDirectory()
    for _ in 0..<runs {
        let start = DispatchTime.now().uptimeNanoseconds
        let report = try CrashReport(path: sixteen)
        let dump = MinidumpWriter.write(try MinidumpInput(report: report))
        try Data(dump).write(to: URL(fileURLWithPath: output + "/x.dmp"))
        inProcess.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
        size = dump.count
    }
    var cli: [Double] = []
    for _ in 0..<runs {
        cli.append(
            try timedRun(buildDirectory + "/crashcap", ["export", sixteen, "--minidump", "--output", output], [:]).ms)
    }
    let threads = (try? CrashReport(path: sixteen))?.stacks?.threads.count ?? 0
    print(
        "\nExport of a 16-thread crash (\(threads) threads in its stacks record), \(runs) runs: read, build and write "
            + "in process median \(format(Statistics(inProcess).median)) ms (p90 \(format(Statistics(inProcess).percentile(0.9)))); "
            + "`crashcap export` as a process median \(format(Statistics(cli).median)) ms; the dump "
            + "\(format(Double(size) / 1024, 1)) KiB (\(size) bytes)\n")
}
