import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

func crashBenchmarks(runs: Int) throws {
    // No core files: their cost depends on the machine's core_pattern, not on us.
    var noCore = rlimit(rlim_cur: 0, rlim_max: 0)
    setrlimit(Int32(RLIMIT_CORE.rawValue), &noCore)
    let sample = buildDirectory + "/crash-sample-c"
    let kind = ["deep-stack-64"]
    // install() first, on a quiet disk: the crash runs below leave the journal busy.

    // 1. install(): time, resident memory and threads added, measured inside a fresh process each time.
    var installs: [Double] = []
    var residentAdded: [Double] = []
    var threadsAdded = Set<Int>()
    var stepNames: [String] = []
    var steps: [String: [Double]] = [:]
    let installDirectory = temporaryDirectory()
    for _ in 0..<runs {
        let output = try output(sample, ["measure-install"], ["CRASHCAPTURE_DIR": installDirectory])
        guard let json = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any] else { continue }
        installs.append(((json["install_ns"] as? NSNumber)?.doubleValue ?? .nan) / 1000)
        let before = (json["rss_before_kb"] as? NSNumber)?.doubleValue ?? 0
        let after = (json["rss_after_kb"] as? NSNumber)?.doubleValue ?? 0
        residentAdded.append(after - before)
        // The step names in install's order, as the sample prints them.
        if let stepsStart = output.range(of: "\"steps_ns\":{") {
            for member in output[stepsStart.upperBound...].prefix(while: { $0 != "}" }).split(separator: ",") {
                let pair = member.split(separator: ":")
                guard pair.count == 2, let nanoseconds = Double(pair[1]) else { continue }
                let name = pair[0].trimmingCharacters(in: CharacterSet(charactersIn: "\""))
                if steps[name] == nil { stepNames.append(name) }
                steps[name, default: []].append(nanoseconds / 1000)
            }
        }
        threadsAdded.insert(
            ((json["threads_after"] as? NSNumber)?.intValue ?? 0)
                - ((json["threads_before"] as? NSNumber)?.intValue ?? 0))
    }
    let i = Statistics(installs)
    let r = Statistics(residentAdded)
    print("## install() (\(runs) fresh processes, directory already initialised)\n")
    print("| | median | p90 | max |")
    print("|---|---|---|---|")
    print("| time (µs) | \(format(i.median, 0)) | \(format(i.percentile(0.9), 0)) | \(format(i.percentile(1), 0)) |")
    print(
        "| resident memory added (KiB, incl. the main thread's alt stack pages touched) | \(format(r.median, 0)) | \(format(r.percentile(0.9), 0)) | \(format(r.percentile(1), 0)) |"
    )
    print("\nthreads created by install: \(threadsAdded.sorted())\n")
    if !stepNames.isEmpty {
        print(
            "install()'s steps (µs, median): "
                + stepNames.map { "\($0) \(format(Statistics(steps[$0]!).median, 0))" }.joined(separator: ", ") + "\n")
    }

    // 2. Handler time, fault to report durable, as each report records it: crashing right
    // after install (install's own file writes still to be flushed with the report), and once
    // those writes are on the disk (the sample calls sync() after install, as the kernel's
    // writeback does within about 30 s) and 100 ms of work have passed, as for a process that
    // has run a while.
    let moments: [(String, [String: String])] = [
        ("right after install", [:]),
        ("install's writes on disk, then 100 ms of work", ["CRASH_SAMPLE_SETTLED": "100"]),
    ]
    var frames: [Int] = []
    var breakdown: [(String, [Double])] = []
    print("## Handler time (\(runs) crashes each, ms)\n")
    print(
        "| crash | fault to report durable: median | p90 | max | of which the flush | of which naming | directory flushed too |"
    )
    print("|---|---|---|---|---|---|---|")
    for (moment, environment) in moments {
        var handler: [Double] = []
        var flush: [Double] = []
        var naming: [Double] = []
        var directoryFlushed = Set<Bool>()
        var parts: [[Double]] = Array(repeating: [], count: 6)
        let directory = temporaryDirectory()
        for _ in 0..<runs {
            _ = try timedRun(
                sample, kind,
                environment.merging(["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"]) { $1 })
            for file in try FileManager.default.contentsOfDirectory(atPath: directory) where file.hasSuffix(".ccr") {
                let report = try CrashReport(path: directory + "/" + file)
                if let timing = report.timing {
                    handler.append(Double(timing.handlerNanoseconds) / 1e6)
                    flush.append(Double(timing.fdatasyncNanoseconds) / 1e6)
                    naming.append(Double(timing.publishNanoseconds) / 1e6)
                    directoryFlushed.insert(timing.directoryFlushed)
                    let each = [
                        timing.keptFilesNanoseconds, timing.otherThreadsNanoseconds, timing.unwindNanoseconds,
                        timing.eventsNanoseconds, timing.writeNanoseconds, timing.fdatasyncNanoseconds,
                    ]
                    for (index, value) in each.enumerated() { parts[index].append(Double(value) / 1000) }
                }
                frames.append(report.frames.count)
                try FileManager.default.removeItem(atPath: directory + "/" + file)
            }
        }
        let h = Statistics(handler)
        print(
            "| \(moment) | \(format(h.median)) | \(format(h.percentile(0.9))) | \(format(h.percentile(1))) | "
                + "\(format(Statistics(flush).median)) | \(format(Statistics(naming).median)) | "
                + "\(directoryFlushed.map { $0 ? "yes" : "no" }.sorted().joined(separator: ", ")) |")
        breakdown.append((moment, parts.map { Statistics($0).median }))
    }
    print("\n\(Statistics(frames.map(Double.init)).median) frames a stack\n")
    // Where the time goes, as each report's timing record has it (medians, µs).
    print(
        "| crash | kept process-state files | listing the threads | unwinding | building the events | write | flush |")
    print("|---|---|---|---|---|---|---|")
    for (moment, medians) in breakdown {
        print("| \(moment) | " + medians.map { format($0, 0) }.joined(separator: " | ") + " |")
    }
    print("")
    let floor = Statistics(try flushFloor(directory: temporaryDirectory(), runs: runs, bytes: 8704))
    print(
        "The device's floor, the same disk without any handler: 8.5 KiB (a one-thread report) written over "
            + "blocks already on the disk, then fdatasync, after 100 ms of work: median \(format(floor.median)) ms, "
            + "p10 \(format(floor.percentile(0.1))), p90 \(format(floor.percentile(0.9)))\n")

    // 3. Every thread: the handler with 1, 16, 64 and 256 threads (the others parked in
    // nanosleep), what the other threads took of it, and the crash file's size; right after
    // install and with install's writes on disk.
    print("## Handler time by thread count (\(runs) crashes each, ms)\n")
    print(
        "| threads | median | p90 | other threads' share of the median | handler's own work (handler − flush): median | install's writes on disk: median | p90 | crash file (KiB) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for threads in [1, 16, 64, 256] {
        var row = "| \(threads) |"
        var sizes: [Double] = []
        for (index, (_, environment)) in moments.enumerated() {
            var totals: [Double] = []
            var others: [Double] = []
            var ownWork: [Double] = []
            let directory = temporaryDirectory()
            for _ in 0..<runs {
                _ = try timedRun(
                    sample, ["parked-threads"],
                    environment.merging([
                        "CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no",
                        "CRASH_SAMPLE_THREADS": "\(threads)",
                    ]) { $1 })
                for file in try FileManager.default.contentsOfDirectory(atPath: directory)
                where file.hasSuffix(".ccr") {
                    let contents = try CrashFileReader.read(path: directory + "/" + file)
                    let report = CrashReport(path: file, contents: contents)
                    if let timing = report.timing {
                        totals.append(Double(timing.handlerNanoseconds) / 1e6)
                        others.append(Double(timing.otherThreadsNanoseconds) / 1e6)
                        ownWork.append(Double(timing.handlerNanoseconds - timing.fdatasyncNanoseconds) / 1e6)
                    }
                    sizes.append(Double(contents.records.reduce(0) { $0 + 16 + $1.payload.count }) / 1024)
                    try FileManager.default.removeItem(atPath: directory + "/" + file)
                }
            }
            let t = Statistics(totals)
            row += " \(format(t.median)) | \(format(t.percentile(0.9))) |"
            if index == 0 {
                row +=
                    " \(format(100 * Statistics(others).median / t.median, 0)) % | \(format(Statistics(ownWork).median)) |"
            }
        }
        print(row + " \(format(Statistics(sizes).median, 1)) |")
    }
    print("")

    // 4. Whole-process cost: spawn to death, with and without capture, and the Swift runtime's own.
    print("## Whole-process cost of a crash (\(runs) runs each, ms from spawn to death)\n")
    let medians = try wholeProcessCost(
        sample, kind, runs: runs,
        variants: [
            ("no handler", ["SWIFT_BACKTRACE": "enable=no"], false),
            ("CrashCapture", ["SWIFT_BACKTRACE": "enable=no"], true),
            ("Swift runtime backtracer", ["SWIFT_BACKTRACE": "enable=yes,interactive=no"], false),
            ("CrashCapture + Swift backtracer", ["SWIFT_BACKTRACE": "enable=yes,interactive=no"], true),
        ])
    print(
        "\nCrashCapture / no handler: \(format(medians[1] / medians[0], 2))x; CrashCapture / Swift backtracer: \(format(medians[1] / medians[2], 2))x\n"
    )

    // 5. The same with 16 threads, beside the Swift backtracer showing every thread.
    print("## Whole-process cost of a crash with 16 threads (\(runs) runs each, ms from spawn to death)\n")
    let threaded = try wholeProcessCost(
        sample, ["parked-threads"], runs: runs,
        variants: [
            ("no handler", ["SWIFT_BACKTRACE": "enable=no", "CRASH_SAMPLE_THREADS": "16"], false),
            ("CrashCapture (every thread)", ["SWIFT_BACKTRACE": "enable=no", "CRASH_SAMPLE_THREADS": "16"], true),
            (
                "Swift runtime backtracer, threads=all",
                ["SWIFT_BACKTRACE": "enable=yes,interactive=no,threads=all", "CRASH_SAMPLE_THREADS": "16"], false
            ),
        ])
    print(
        "\nCrashCapture / no handler: \(format(threaded[1] / threaded[0], 2))x; "
            + "CrashCapture / Swift backtracer (threads=all): \(format(threaded[1] / threaded[2], 2))x\n")

    // 6. A Swift program whose Dispatch workers are alive (they block every signal): a Swift
    // null read on a Dispatch queue with 4 workers parked, from the crash to the process's death
    // (parking the workers takes Dispatch a second or more to grow its pool on two cores, which
    // would drown the figure if timed from the spawn).
    print("## Cost of a Swift crash on Dispatch, 4 workers parked (\(runs) runs each, ms from the crash to death)\n")
    let swiftSample = buildDirectory + "/crash-sample-swift"
    let dispatch = ["CRASH_SAMPLE_DISPATCH_WORKERS": "4"]
    let swift = try wholeProcessCost(
        swiftSample, ["swift-null-read", "--context", "dispatch"], runs: runs, timing: timedCrash,
        variants: [
            ("no handler", dispatch.merging(["SWIFT_BACKTRACE": "enable=no"]) { $1 }, false),
            ("CrashCapture", dispatch.merging(["SWIFT_BACKTRACE": "enable=no"]) { $1 }, true),
            (
                "Swift runtime backtracer", dispatch.merging(["SWIFT_BACKTRACE": "enable=yes,interactive=no"]) { $1 },
                false
            ),
        ])
    print(
        "\nCrashCapture adds \(format(swift[1] - swift[0], 2)) ms; the Swift backtracer adds \(format(swift[2] - swift[0], 2)) ms; "
            + "ratio of the added costs: \(format((swift[1] - swift[0]) / (swift[2] - swift[0]), 3))x\n")

}

/// Spawn to death for each variant (name, environment, captured), as a table; the medians in order.
func wholeProcessCost(
    _ sample: String, _ arguments: [String], runs: Int,
    timing: (String, [String], [String: String]) throws -> (ms: Double, signal: Int32?) = timedRun,
    variants: [(String, [String: String], Bool)]
) throws -> [Double] {
    print("| variant | median | p90 | died of |")
    print("|---|---|---|---|")
    var medians: [Double] = []
    for (name, environment, capture) in variants {
        var times: [Double] = []
        var signals = Set<Int32>()
        let directory = temporaryDirectory()
        for _ in 0..<runs {
            var env = environment
            if capture { env["CRASHCAPTURE_DIR"] = directory }
            let (ms, signal) = try timing(sample, arguments, env)
            times.append(ms)
            signals.insert(signal ?? 0)
        }
        try? FileManager.default.removeItem(atPath: directory)
        let stats = Statistics(times)
        medians.append(stats.median)
        print("| \(name) | \(format(stats.median, 2)) | \(format(stats.percentile(0.9), 2)) | \(signals.sorted()) |")
    }
    return medians
}
