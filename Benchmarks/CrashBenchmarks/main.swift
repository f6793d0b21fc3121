// crashcap-bench: the figures in the README, measured on this machine. Run through
// Benchmarks/run.sh, which builds everything in release mode first.
//
//   crashcap-bench crash [--runs N]     handler time, whole-process cost, install cost
//   (pipeline, replay, symbolicate, journal, writer, track: see the usage line at the end)
import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

let buildDirectory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().path

struct Statistics {
    let values: [Double]
    init(_ values: [Double]) { self.values = values.sorted() }
    func percentile(_ p: Double) -> Double {
        guard !values.isEmpty else { return .nan }
        return values[min(values.count - 1, Int((Double(values.count - 1) * p).rounded()))]
    }
    var median: Double { percentile(0.5) }
}

func format(_ value: Double, _ digits: Int = 3) -> String { String(format: "%.\(digits)f", value) }

/// Spawns a program with a clean signal mask, waits with waitpid, and returns its wall time in
/// ms and the signal that ended it. (Foundation's Process polls for the child's end, adding ~50 ms.)
func timedRun(_ path: String, _ arguments: [String], _ environment: [String: String]) throws -> (
    ms: Double, signal: Int32?
) {
    var env = ProcessInfo.processInfo.environment
    env.removeValue(forKey: "CRASHCAPTURE_DIR")
    for (key, value) in environment { env[key] = value }
    let start = DispatchTime.now().uptimeNanoseconds
    let pid = try CleanSpawn.spawn(
        path, arguments: arguments, environment: env, stdout: "/dev/null", stderr: "/dev/null")
    var wait: Int32 = 0
    while waitpid(pid, &wait, 0) < 0 && errno == EINTR {}
    let ms = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6
    let signaled = (wait & 0x7f) != 0 && (wait & 0x7f) != 0x7f
    return (ms, signaled ? wait & 0x7f : nil)
}

/// From the moment the program says it crashes (`crash-at-ns`, CLOCK_MONOTONIC, on stdout) to its
/// death as the parent sees it: the crash alone, without the program's start.
func timedCrash(_ path: String, _ arguments: [String], _ environment: [String: String]) throws -> (
    ms: Double, signal: Int32?
) {
    var env = ProcessInfo.processInfo.environment
    env.removeValue(forKey: "CRASHCAPTURE_DIR")
    for (key, value) in environment { env[key] = value }
    env["CRASH_SAMPLE_CRASH_TIME"] = "1"
    let output = temporaryDirectory() + "/stdout"
    let pid = try CleanSpawn.spawn(path, arguments: arguments, environment: env, stdout: output, stderr: "/dev/null")
    var wait: Int32 = 0
    while waitpid(pid, &wait, 0) < 0 && errno == EINTR {}
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    let died = Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
    let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
    guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("crash-at-ns ") }),
        let crashed = Int64(line.dropFirst("crash-at-ns ".count))
    else { throw CrashCaptureError.io("\(path) printed no crash-at-ns: \(text.prefix(200))") }
    let signaled = (wait & 0x7f) != 0 && (wait & 0x7f) != 0x7f
    return (Double(died - crashed) / 1e6, signaled ? wait & 0x7f : nil)
}

/// Every directory made, removed when the benchmarks end: a pipeline run writes hundreds of
/// megabytes, and left behind they would slow the next run's disk.
nonisolated(unsafe) var temporaryDirectories: [String] = []

/// Events shaped like a tracked one as the store keeps it (about 700 bytes), ids in order.
func syntheticEvents(_ count: Int) -> [(id: String, payload: String)] {
    let pad = String(repeating: "0123456789", count: 22)
    return (0..<count).map { index in
        let id = "bench-" + String(format: "%012d", index)
        return (
            id,
            #"{"type":"track","event":"bench_event","time":1795460217041,"event_id":"\#(id)","lib":{"$lib_method":"code","$lib":"CrashCapture","$lib_version":"0.1.0"},"distinct_id":"d-1234567890","properties":{"$app_name":"bench","$app_version":"1.0","$os":"Linux","$os_version":"6.1","$model":"x86_64","$manufacturer":"QEMU","$lib":"CrashCapture","tier":"bench","$session_id":"0d9c0a3e-6a34-4b9f-a0d5-1c8b34d9e2a7","index":\#(index),"label":"row-\#(index)","flag":true,"pad":"\#(pad)"}}"#
        )
    }
}

func temporaryDirectory() -> String {
    let path = NSTemporaryDirectory() + "crashcap-bench-\(UUID().uuidString)"
    try! FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    temporaryDirectories.append(path)
    return path
}

/// What making a report durable costs on this disk with no handler at all: `bytes` written over
/// blocks already on the disk (as install's zeros are, once written back), then fdatasync, each
/// after 100 ms of work as the crash benchmark's settled runs do. No handler can be faster.
func flushFloor(directory: String, runs: Int, bytes: Int) throws -> [Double] {
    let path = directory + "/floor"
    let fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    guard fd >= 0 else { throw CrashCaptureError.io("cannot create \(path): \(String(cString: strerror(errno)))") }
    defer {
        close(fd)
        unlink(path)
    }
    let page = [UInt8](repeating: 0x5a, count: 65536)
    guard pwrite(fd, page, page.count, 0) == page.count, fsync(fd) == 0 else {
        throw CrashCaptureError.io("cannot write \(path): \(String(cString: strerror(errno)))")
    }
    sync()
    var times: [Double] = []
    for _ in 0..<runs {
        let workUntil = DispatchTime.now().uptimeNanoseconds + 100_000_000
        while DispatchTime.now().uptimeNanoseconds < workUntil {}
        let start = DispatchTime.now().uptimeNanoseconds
        guard pwrite(fd, page, bytes, 0) == bytes, fdatasync(fd) == 0 else {
            throw CrashCaptureError.io("cannot write \(path): \(String(cString: strerror(errno)))")
        }
        times.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
    }
    return times
}

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

/// Runs a program to its end and returns its stdout.
func output(_ path: String, _ arguments: [String], _ environment: [String: String]) throws -> String {
    try ChildProcess.run(
        path: path, arguments: arguments,
        environment: ProcessInfo.processInfo.environment.merging(environment) { $1 }, timeout: 60
    ).stdout
}

/// Timings gathered by several threads; `@unchecked`: `nanoseconds` is written only under `lock`.
final class Samples: @unchecked Sendable {
    private let lock = NSLock()
    private(set) var nanoseconds: [Double] = []
    func add(_ values: [Double]) {
        lock.lock()
        nanoseconds += values
        lock.unlock()
    }
}

/// User and system time of this process so far.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    let total = [usage.ru_utime, usage.ru_stime].map { Double($0.tv_sec) + Double($0.tv_usec) / 1e6 }
    return total[0] + total[1]
}

func monotonic() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// track() from 4 threads into SQLite, per-call latency on the caller's thread, against one
/// insert per transaction; then upload of a full store to the local collector.
/// One run of 4 threads calling track(): the callers' latencies and rate, and the rate into SQLite.
struct TrackRun {
    var count = 0
    var dropped = 0
    var journalBytesPerEvent = 0.0
    var trackingRate = 0.0
    var sustainedRate = 0.0
    var latency = Statistics([])
    var storeBytesPerEvent = 0
}

func trackRun(events: Int, configuration: CrashCapture.Configuration, threads: Int = 4) throws -> TrackRun {
    try CrashCapture.install(configuration)
    defer { CrashCapture.uninstall() }
    // Let the writer fault the journal's pages in first, as it does right after install.
    CrashCapture.flush(timeout: 0)
    let perThread = events / threads
    let samples = Samples()
    let start = monotonic()
    DispatchQueue.concurrentPerform(iterations: threads) { thread in
        var local = [Double]()
        local.reserveCapacity(perThread)
        for index in 0..<perThread {
            let before = monotonic()
            try! CrashCapture.track(
                "bench_event", properties: ["thread": .int(thread), "index": .int(index), "screen": "checkout"])
            local.append(Double(monotonic() - before))
        }
        samples.add(local)
    }
    let tracked = monotonic()
    CrashCapture.flush(timeout: 0)
    let stored = monotonic()
    let store = CrashCapture.eventStore!
    var run = TrackRun()
    run.count = store.count
    run.dropped = CrashCapture.droppedBeforeStore
    run.journalBytesPerEvent = Double(CrashCapture.journalUsage?.reserved ?? 0) / Double(max(1, events))
    run.latency = Statistics(samples.nanoseconds)
    run.trackingRate = Double(events - run.dropped) / (Double(tracked - start) / 1e9)
    run.sustainedRate = Double(run.count) / (Double(stored - start) / 1e9)
    let fileBytes = ["", "-wal"].compactMap {
        (try? FileManager.default.attributesOfItem(atPath: store.path + $0)[.size] as? Int) ?? nil
    }.reduce(0, +)
    run.storeBytesPerEvent = fileBytes / max(1, run.count)
    return run
}

func pipelineBenchmarks(events: Int) throws {
    let directory = temporaryDirectory()
    let configuration = CrashCapture.Configuration(
        directory: directory, appName: "bench", appVersion: "1.0", staticProperties: ["tier": "bench"],
        storeLimits: .init(maximumEvents: events * 2, maximumBytes: 4 << 30), trackLifecycle: false)
    let installStart = monotonic()
    try CrashCapture.install(configuration)
    let firstInstall = Double(monotonic() - installStart) / 1e6
    CrashCapture.uninstall()
    try? FileManager.default.removeItem(atPath: directory + "/events.sqlite")
    // A journal that holds the whole burst whatever the writer does: the pipeline's own rates;
    // then the default journal, into the store the figures below use.
    var large = configuration
    large.directory = temporaryDirectory()
    large.journalBytes = 128 << 20
    let run = try trackRun(events: events, configuration: large)
    let whole = try trackRun(events: events, configuration: configuration)
    let latency = run.latency
    let rate = run.sustainedRate
    print(
        "## track() from 4 threads (\(events) events, a \(large.journalBytes >> 20) MiB journal that holds them all)\n")
    print("| | value |")
    print("|---|---|")
    print("| into the journal (callers' view: first call to last return) | \(format(run.trackingRate, 0)) events/s |")
    print("| sustained, first call to last event committed in SQLite | \(format(rate, 0)) events/s |")
    print("| events dropped before the store (journal full) | \(run.dropped) |")
    print("| journal bytes per event | \(format(run.journalBytesPerEvent, 0)) |")
    print("| store file size per event (database and WAL) | \(run.storeBytesPerEvent) bytes |")
    print(
        "| track() call, median / p99 / p99.9 | \(format(latency.median / 1000, 2)) / \(format(latency.percentile(0.99) / 1000, 2)) / \(format(latency.percentile(0.999) / 1000, 2)) µs |"
    )
    var alone = configuration
    alone.directory = temporaryDirectory()
    let oneThread = try trackRun(events: events / 4, configuration: alone, threads: 1)
    print(
        "| one thread alone (\(events / 4) events): track() median / p99 / p99.9 | \(format(oneThread.latency.median / 1000, 2)) / \(format(oneThread.latency.percentile(0.99) / 1000, 2)) / \(format(oneThread.latency.percentile(0.999) / 1000, 2)) µs |"
    )
    print(
        "| the same with the default \(configuration.journalBytes >> 20) MiB journal: into the journal / into SQLite / p99 / dropped | \(format(whole.trackingRate, 0)) / \(format(whole.sustainedRate, 0)) events/s / \(format(whole.latency.percentile(0.99) / 1000, 2)) µs / \(whole.dropped) |"
    )
    let store = try EventStore(path: directory + "/events.sqlite")

    let writerRate = try writerAlone(events: events, directory: directory)
    print("| the writer alone: journal rows into SQLite, transactions of 8,192 | \(format(writerRate, 0)) events/s |")

    // The reference SDKs insert one event per transaction.
    let payloads = try store.events(limit: 3000).map(\.payload)
    let single = try EventStore(path: directory + "/single.sqlite")
    let singleStart = monotonic()
    for (index, payload) in payloads.enumerated() { try single.insert([("single-\(index)", payload)]) }
    let singleRate = Double(payloads.count) / (Double(monotonic() - singleStart) / 1e9)
    print("| one insert per transaction (\(payloads.count) events) | \(format(singleRate, 0)) events/s |")
    print("\nbatched writer / one insert per transaction: \(format(rate / singleRate, 1))x\n")
    let uploadPayloads = try store.events(limit: min(run.count, 50_000)).map { ($0.eventID, $0.payload) }
    // The whole Swift install, crash path and event store, on the caller's thread: into a new
    // directory, and again over the store just filled.
    let reinstallStart = monotonic()
    try CrashCapture.install(configuration)
    let fullInstall = Double(monotonic() - reinstallStart) / 1e6
    CrashCapture.uninstall()
    print("| CrashCapture.install(), new directory and empty store | \(format(firstInstall, 2)) ms |")
    print("| CrashCapture.install() over a store of \(store.count) events | \(format(fullInstall, 2)) ms |\n")

    try uploadBenchmark(payloads: uploadPayloads, directory: directory)
}

/// Upload: a store full of events, sent in batches of 50 to the collector over loopback, in
/// `rounds` rounds, each into a new collector and from a new store: one upload of 50,000
/// events takes half a second, and on this 2-core machine one round differs from the next by
/// as much as 10 %, so the figure is the rounds' median.
func uploadBenchmark(payloads uploadPayloads: [(String, String)], directory: String, rounds: Int = 5) throws {
    var rates: [Double] = []
    var cores: [Double] = []
    var sentLine = ""
    var failedAttempts = 0
    var last: IngestCollector?
    for round in 1...max(1, rounds) {
        last?.stop()
        let collector = try IngestCollector(port: 0, databasePath: directory + "/collector-\(round).sqlite")
        last = collector
        let uploadStore = try EventStore(path: directory + "/upload-\(round).sqlite")
        try uploadStore.insert(uploadPayloads)
        // The track() run's and this insert's writes reach the disk first, not during the upload.
        sync()
        let pending = uploadStore.count
        let uploader = try Uploader(
            endpoint: URL(string: collector.url)!, store: uploadStore, options: UploadOptions())
        let uploadStart = monotonic()
        let cpuStart = processCPUSeconds()
        uploader.flushNow(deadline: Date().addingTimeInterval(600))
        let uploadSeconds = Double(monotonic() - uploadStart) / 1e9
        cores.append((processCPUSeconds() - cpuStart) / uploadSeconds)
        let received = collector.store.count
        rates.append(Double(received) / uploadSeconds)
        sentLine =
            "| events sent, last round | \(pending - uploadStore.count) of \(pending) (collector holds \(received)) |"
        failedAttempts += uploader.statistics.failedAttempts
    }
    guard let collector = last else { return }
    defer { collector.stop() }
    let rate = Statistics(rates)
    print("## Upload to the local collector (loopback, gzip, batches of 50)\n")
    print("| | value |")
    print("|---|---|")
    print(sentLine)
    print(
        "| rate, median of \(rates.count) rounds | \(format(rate.median, 0)) events/s (rounds: "
            + rates.map { format($0, 0) }.joined(separator: ", ") + ") |")
    print("| failed attempts, all rounds | \(failedAttempts) |")
    print("| CPU, uploader and collector together (of 2 cores) | \(format(Statistics(cores).median, 2)) cores busy |")
    // One request alone, without the store on either side: what the HTTP round trip costs.
    let requestStore = try EventStore(path: directory + "/request.sqlite")
    try requestStore.insert(Array(uploadPayloads.prefix(50)))
    let uploader = try Uploader(endpoint: URL(string: collector.url)!, store: requestStore, options: UploadOptions())
    if let batch = try requestStore.claimBatch(limit: 50) {
        let body = try WireFormat.encode(events: batch.events.map(\.payload))
        var verify = 0.0
        var request = 0.0
        for _ in 0..<100 {
            let a = monotonic()
            _ = try WireFormat.decodeEvents(body: body)
            let b = monotonic()
            _ = uploader.send(batch, timeout: 10)
            let c = monotonic()
            verify += Double(b - a) / 1e6
            request += Double(c - b) / 1e6
        }
        print(
            "| one request (batch already stored there: nothing written) | \(format(request / 100, 2)) ms, of which the collector's checks \(format(verify / 100, 2)) ms |"
        )
    }
    // The same collector behind a plain keep-alive client, with the ingest benchmark's padded
    // events (300 batches): what it and loopback allow for events that are cheap to check.
    let script =
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
        + "/upload_baseline.py"
    let baseline = try output("/usr/bin/env", ["python3", script, collector.url], [:])
        .trimmingCharacters(in: .whitespacesAndNewlines)
    print("| python3 http.client, keep-alive, same collector, 300 batches of padded events | \(baseline) events/s |")
    // The yardstick for the uploader: a plain keep-alive client sending the very bodies the
    // uploader sends (the same events, encoded once beforehand), as many requests, each round
    // into a new collector. What is left between the two is the uploader's own doing.
    var bodies: [UInt8] = []
    let flushTime = "\"_flush_time\":\(Int64(Date().timeIntervalSince1970 * 1000))"
    for start in stride(from: 0, to: uploadPayloads.count, by: 50) {
        let events = uploadPayloads[start..<min(start + 50, uploadPayloads.count)].map(\.1)
        bodies += try WireFormat.encode(events: events, addingToEach: flushTime)
        bodies.append(UInt8(ascii: "\n"))
    }
    let bodiesPath = directory + "/upload-bodies.txt"
    guard FileManager.default.createFile(atPath: bodiesPath, contents: Data(bodies)) else {
        throw CrashCaptureError.io("cannot write \(bodiesPath)")
    }
    var plainRates: [Double] = []
    for round in 1...max(1, rounds) {
        let fresh = try IngestCollector(port: 0, databasePath: directory + "/plain-\(round).sqlite")
        defer { fresh.stop() }
        let rate = try output(
            "/usr/bin/env", ["python3", script, fresh.url, "--bodies", bodiesPath, "\(uploadPayloads.count)"], [:])
        plainRates.append(Double(rate.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0)
        guard fresh.store.count == uploadPayloads.count else {
            throw CrashCaptureError.io("the plain client stored \(fresh.store.count) of \(uploadPayloads.count) events")
        }
    }
    print(
        "| python3 http.client, keep-alive, the uploader's own bodies (all of them), a new collector each round: median of \(plainRates.count) | \(format(Statistics(plainRates).median, 0)) events/s (rounds: "
            + plainRates.map { format($0, 0) }.joined(separator: ", ") + ") |")
}

/// The collector's ingest under wrk, the HTTP load generator: `connections` keep-alive
/// connections (4 unless `--connections N`), each POSTing ready-made batches of 50 gzip'd
/// events of about 700 bytes (the Python clients' shape below), every batch with ids of its
/// own, for `seconds`. `collector`: another build's
/// `crashcap` to run instead of this one's collector (`--collector PATH`), to compare the two.
func ingestUnderWrk(seconds: Int, connections: Int, collector other: String?) throws {
    let directory = temporaryDirectory()
    let url: String
    let storedCount: () throws -> Int
    let stop: () -> Void
    let pid: pid_t
    if let other {
        let child = try ChildProcess(
            path: other, arguments: ["collect", "--port", "0", "--db", directory + "/collector.sqlite"],
            environment: ProcessInfo.processInfo.environment)
        guard child.waitForOutput("listening on"), let range = child.stdout.range(of: "http://") else {
            throw CrashCaptureError.io("\(other) collect did not start: \(child.stderr)")
        }
        url = String(child.stdout[range.lowerBound...]).trimmingCharacters(in: .whitespacesAndNewlines)
        pid = child.pid
        storedCount = {
            let health = try output("/usr/bin/env", ["curl", "-s", String(url.dropLast(3)) + "/health"], [:])
            let digits = health.split(separator: ":").last?.filter(\.isNumber) ?? ""
            return Int(digits) ?? -1
        }
        stop = {
            kill(child.pid, SIGTERM)
            _ = child.wait(timeout: 10)
        }
    } else {
        let collector = try IngestCollector(port: 0, databasePath: directory + "/collector.sqlite")
        url = collector.url
        pid = getpid()
        storedCount = { collector.store.count }
        stop = { collector.stop() }
    }
    // Enough bodies that none is sent twice at 400,000 events/s.
    let perConnection = max(1000, seconds * 400_000 / connections / 50)
    let pad = String(repeating: "p", count: 600)
    DispatchQueue.concurrentPerform(iterations: connections) { connection in
        var lines: [UInt8] = []
        for batch in 0..<perConnection {
            let events = (0..<50).map {
                #"{"type":"track","event_id":"wrk\#(connection)-\#(batch)-\#($0)","event":"bench_event","properties":{"pad":"\#(pad)","index":\#($0)}}"#
            }
            lines += try! WireFormat.encode(events: events)
            lines.append(UInt8(ascii: "\n"))
        }
        FileManager.default.createFile(atPath: directory + "/bodies\(connection).txt", contents: Data(lines))
    }
    let script =
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path + "/ingest.lua"
    let cpuBefore = threadCPUSeconds(pid)
    let report = try ChildProcess.run(
        path: "/usr/bin/env",
        arguments: [
            "wrk", "-t\(connections)", "-c\(connections)", "-d\(seconds)s", "--latency", "-s", script, url, "--",
            directory + "/bodies",
        ],
        environment: ProcessInfo.processInfo.environment, timeout: Double(seconds + 120))
    guard report.exitCode == 0 else { throw CrashCaptureError.io("wrk failed: \(report.stderr)") }
    func field(_ label: String) -> String {
        report.stdout.split(separator: "\n").first { $0.trimmingCharacters(in: .whitespaces).hasPrefix(label) }
            .map { $0.trimmingCharacters(in: .whitespaces).dropFirst(label.count).trimmingCharacters(in: .whitespaces) }
            ?? "?"
    }
    let requests = report.stdout.split(separator: "\n").first { $0.contains("requests in") }.map {
        $0.trimmingCharacters(in: .whitespaces).split(separator: " ")
    }
    let seconds = Double(requests?[3].dropLast(2) ?? "") ?? Double(seconds)
    let cpuAfter = threadCPUSeconds(pid)
    let stored = try storedCount()
    let refused = report.stdout.contains("Non-2xx") ? field("Non-2xx or 3xx responses:") : "0"
    stop()
    // CPU an event by the collector's threads: its event loop, its thread pools (SQLite's; the
    // decoders' stay idle for batches this small), and the rest of the process (checkpoints,
    // on libdispatch's threads).
    func perEvent(_ include: (String) -> Bool) -> String {
        let used = cpuAfter.filter { include($0.key) }.reduce(0.0) { $0 + $1.value - (cpuBefore[$1.key] ?? 0) }
        return format(used / Double(max(1, stored)) * 1e6, 2)
    }
    print("## Ingest under wrk: \(connections) connections, batches of 50, gzip, loopback (\(other ?? "this build"))\n")
    print(
        "| events stored | rate | request p50 | p99 | refused | CPU µs an event: event loop / SQLite / the rest (checkpoints) |"
    )
    print("|---|---|---|---|---|---|")
    print(
        "| \(stored) | \(format(Double(stored) / seconds, 0)) events/s | \(field("50%")) | \(field("99%")) | \(refused) | \(perEvent { $0.hasPrefix("NIO-ELT") }) / \(perEvent { $0.hasPrefix("TP-") }) / \(perEvent { !$0.hasPrefix("NIO-ELT") && !$0.hasPrefix("TP-") }) |"
    )
    print("")
}

/// CPU seconds each thread of a process has used, by thread name (threads of one name added).
func threadCPUSeconds(_ pid: pid_t) -> [String: Double] {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
    let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
    var seconds: [String: Double] = [:]
    for task in tasks {
        guard let name = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/comm", encoding: .utf8),
            let stat = try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { continue }
        // Fields after the name: state is the first; utime and stime are the 12th and 13th.
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { continue }
        seconds[name.trimmingCharacters(in: .newlines), default: 0] += (user + system) / ticks
    }
    return seconds
}

/// The collector's ingest: 4 plain keep-alive clients at once (Python's http.client, each its
/// own process), batches of 50 gzip'd events of about 700 bytes, over loopback.
func ingestBenchmark(batches: Int) throws {
    let collector = try IngestCollector(port: 0, databasePath: temporaryDirectory() + "/collector.sqlite")
    let script =
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
        + "/upload_baseline.py"
    let clients = try (0..<4).map { index in
        try ChildProcess(
            path: "/usr/bin/env", arguments: ["python3", script, collector.url, "\(batches)", "client\(index)"],
            environment: ProcessInfo.processInfo.environment)
    }
    for client in clients { _ = client.wait(timeout: 600) }
    // Each client prepares its bodies first (gzip, base64) and then times its requests: the
    // rate is over the span from the first client's first request to the last one's last.
    var latencies: [Double] = []
    var starts: [Double] = []
    var ends: [Double] = []
    for client in clients {
        let fields = client.stdout.split(separator: " ").compactMap {
            Double($0.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        guard fields.count > 2 else { throw CrashCaptureError.io("an ingest client failed: \(client.stderr)") }
        starts.append(fields[0])
        ends.append(fields[1])
        latencies += fields.dropFirst(2)
    }
    let seconds = ends.max()! - starts.min()!
    let received = collector.store.count
    collector.stop()
    let stats = Statistics(latencies)
    print("## Ingest: 4 concurrent clients, batches of 50, gzip, loopback\n")
    print("| events stored | rate (first request to last answer) | request p50 | p99 |")
    print("|---|---|---|---|")
    print(
        "| \(received) of \(4 * batches * 50) | \(format(Double(received) / seconds, 0)) events/s | \(format(stats.median, 2)) ms | \(format(stats.percentile(0.99), 2)) ms |"
    )
}

/// The collector's peak memory (VmHWM) under the hostile clients of the HTTP tests: 200 idle
/// connections, 64 slow ones, four 1 GiB gzip bombs.
func collectorMemory() throws {
    let collector = try ChildProcess(
        path: buildDirectory + "/crashcap",
        arguments: [
            "collect", "--port", "0", "--db", temporaryDirectory() + "/hostile.sqlite", "--header-timeout", "3",
        ],
        environment: ProcessInfo.processInfo.environment)
    guard collector.waitForOutput("listening on"), let range = collector.stdout.range(of: "http://") else {
        throw CrashCaptureError.io("collector did not start")
    }
    let address = collector.stdout[range.upperBound...].split(separator: "/").first.map(String.init) ?? ""
    func peak() -> String {
        let status = (try? String(contentsOfFile: "/proc/\(collector.pid)/status", encoding: .utf8)) ?? ""
        return status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }.map {
            String($0.dropFirst(6)).trimmingCharacters(in: .whitespaces)
        } ?? "?"
    }
    let before = peak()
    let script =
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
        + "/hostile_clients.py"
    let answers = try output("/usr/bin/env", ["python3", script, address, "3.5"], [:])
        .trimmingCharacters(in: .whitespacesAndNewlines)
    let after = peak()
    kill(collector.pid, SIGTERM)
    print("## Collector memory under hostile clients (200 idle, 64 slow, four 1 GiB gzip bombs)\n")
    print("| peak before | peak after | the bombs' answers |")
    print("|---|---|---|")
    print("| \(before) | \(after) | \(answers) |")
}

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
        while (try collector.store.events(limit: 100_000).filter { $0.payload.contains("\"$AppCrashed\"") }.count)
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

/// The writer's half alone: rows shaped as the journal hands them over, into a new store.
func writerAlone(events: Int, directory: String) throws -> Double {
    unlink(directory + "/writer.sqlite")
    unlink(directory + "/writer.sqlite-wal")
    let rows = (0..<events).map { index -> ([UInt8], [UInt8]) in
        let id = "0123456789abcdef0123456789abcdef-" + String(1_000_000_000_000 + index).dropFirst()
        let payload =
            "{\"type\":\"track\",\"event\":\"bench_event\",\"time\":1795394899135,\"event_id\":\"\(id)\",\"lib\":{\"$lib_method\":\"code\",\u{1},\"thread\":\(index % 4),\"index\":\(index),\"screen\":\"checkout\"}}"
        return (Array(id.utf8), Array(payload.utf8))
    }
    let writerStore = try EventStore(
        path: directory + "/writer.sqlite", limits: .init(maximumEvents: events * 2, maximumBytes: 4 << 30))
    let writerStart = monotonic()
    for chunk in stride(from: 0, to: rows.count, by: 8192) {
        let part = rows[chunk..<min(rows.count, chunk + 8192)]
        try withRawRows(Array(part)) { raw in
            _ = try writerStore.insert(
                raw: raw, context: "\"$lib\":\"x\"},\"properties\":{\"$pid\":1",
                mark: .init(sessionID: "bench", position: UInt64(chunk), distinctID: "d", loginID: nil))
        }
    }
    let writerRate = Double(rows.count) / (Double(monotonic() - writerStart) / 1e9)
    return writerRate
}

/// Hands `rows` to `body` as the raw byte views the journal's writer binds.
func withRawRows(_ rows: [([UInt8], [UInt8])], _ body: ([EventStore.RawRow]) throws -> Void) throws {
    var raw: [EventStore.RawRow] = []
    var pinned: [UnsafeMutableRawBufferPointer] = []
    defer { pinned.forEach { $0.deallocate() } }
    for (id, payload) in rows {
        let idCopy = UnsafeMutableRawBufferPointer.allocate(byteCount: id.count, alignment: 1)
        idCopy.copyBytes(from: id)
        let payloadCopy = UnsafeMutableRawBufferPointer.allocate(byteCount: payload.count, alignment: 1)
        payloadCopy.copyBytes(from: payload)
        pinned += [idCopy, payloadCopy]
        raw.append((UnsafeRawBufferPointer(idCopy), UnsafeRawBufferPointer(payloadCopy)))
    }
    try body(raw)
}

/// The journal seen from the next start, and what keeping a session's last-alive time costs.
func journalBenchmarks(idleSeconds: Int) throws {
    let sample = buildDirectory + "/crash-sample-swift"
    // A full default journal: a storm killed long after the ring first filled, its header then
    // told that nothing was stored, so the next start reads every entry the ring holds.
    let directory = temporaryDirectory()
    let ackFile = directory + ".ack"
    let storm = try ChildProcess(
        path: sample, arguments: ["pipeline-storm"],
        environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_ACK_FILE": ackFile])
    _ = storm.waitForOutput("ready")
    usleep(1_500_000)
    kill(storm.pid, SIGKILL)
    _ = storm.wait(timeout: 20)
    unlink(ackFile)
    let name = try FileManager.default.contentsOfDirectory(atPath: directory).first {
        SessionFile.isSessionFileName($0)
    }!
    let path = directory + "/" + name
    let fd = open(path, O_RDWR)
    var reserved: UInt64 = 0
    _ = pread(fd, &reserved, 8, 80)
    var ring: UInt64 = 0
    _ = pread(fd, &ring, 8, 16)
    var unconsumed = reserved > ring ? reserved - ring : 0
    _ = pwrite(fd, &unconsumed, 8, 88)
    close(fd)
    try? FileManager.default.removeItem(atPath: directory + "/events.sqlite")
    let store = try EventStore(path: directory + "/events.sqlite")
    let recovery = SessionRecovery(replayer: CrashReplayer(directory: directory, store: store))
    let start = monotonic()
    let result = recovery.recover(path)
    let seconds = Double(monotonic() - start) / 1e9
    print("## The journal at the next start\n")
    print("| | value |")
    print("|---|---|")
    print("| default journal size | \(ring >> 20) MiB (\(Int(ring) / 1024) KiB on disk, reserved at install) |")
    print(
        "| recovering a full journal: \(result.importedEvents) events imported, session closed (\(result.endReason ?? "-")) | \(format(seconds * 1000, 1)) ms |"
    )

    // An installed app that does nothing: the writer's 2 s timer is the only thing that wakes.
    let idle = try ChildProcess(
        path: sample, arguments: ["pipeline-wait"],
        environment: ["CRASHCAPTURE_DIR": temporaryDirectory(), "CRASH_SAMPLE_EVENTS": "0"])
    _ = idle.waitForOutput("ready")
    sleep(3)
    let before = (
        cpu: processCPUNanoseconds(idle.pid), switches: contextSwitches(idle.pid), threads: threadCount(idle.pid)
    )
    sleep(UInt32(idleSeconds))
    let after = (
        cpu: processCPUNanoseconds(idle.pid), switches: contextSwitches(idle.pid), threads: threadCount(idle.pid)
    )
    kill(idle.pid, SIGKILL)
    _ = idle.wait(timeout: 20)
    let cpuPerHour = Double(after.cpu - before.cpu) / 1e9 * 3600 / Double(idleSeconds)
    print(
        "| idle app, \(idleSeconds) s: context switches of all its threads (the 2 s timer wakes libdispatch's timer thread, then the writer) | \(format(Double(after.switches - before.switches) / Double(idleSeconds), 2)) per second |"
    )
    print(
        "| idle app: CPU per idle hour, all its threads | \(format(cpuPerHour * 1000, 0)) ms |"
    )
    print(
        "| idle app: threads before / after (no thread of the journal's own) | \(before.threads) / \(after.threads) |\n"
    )
}

func procStat(_ pid: Int32) -> [Substring] {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = text.lastIndex(of: ")")
    else { return [] }
    return text[text.index(after: close)...].split(separator: " ")
}

/// Nanoseconds on a CPU, all threads together (/proc/PID/task/*/schedstat, first field).
func processCPUNanoseconds(_ pid: Int32) -> Int {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
    return tasks.reduce(0) { total, task in
        let text = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/schedstat", encoding: .utf8)) ?? ""
        return total + (Int(text.split(separator: " ").first ?? "") ?? 0)
    }
}

func threadCount(_ pid: Int32) -> Int {
    (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task").count) ?? 0
}

/// Voluntary and involuntary context switches of every thread: each wake-up is at least one.
func contextSwitches(_ pid: Int32) -> Int {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
    return tasks.reduce(0) { total, task in
        let status = (try? String(contentsOfFile: "/proc/\(pid)/task/\(task)/status", encoding: .utf8)) ?? ""
        return total
            + status.split(separator: "\n").filter { $0.contains("ctxt_switches") }.reduce(0) {
                $0 + (Int($1.split(separator: "\t").last ?? "") ?? 0)
            }
    }
}

/// Replay of many crash files (64-frame stacks) into a store, and symbolication throughput.
func replayBenchmarks(files: Int) throws {
    let sample = buildDirectory + "/crash-sample-c"
    let source = temporaryDirectory()
    _ = try timedRun(sample, ["deep-stack-64"], ["CRASHCAPTURE_DIR": source, "SWIFT_BACKTRACE": "enable=no"])
    guard
        let template = try FileManager.default.contentsOfDirectory(atPath: source).first(where: { $0.hasSuffix(".ccr") }
        )
    else { throw CrashCaptureError.io("the sample left no crash file") }
    let contents = try CrashFileReader.read(path: source + "/" + template)
    let report = CrashReport(path: template, contents: contents)
    guard let session = report.session?["session_id"] as? String,
        let time = (report.events.first?["time"] as? NSNumber)?.int64Value
    else { throw CrashCaptureError.corrupt("no session or time") }
    print("## Replay (\(files) crash files, \(report.frames.count) frames each)\n")
    print("| | time |")
    print("|---|---|")
    // One crash site crashing at every start (all but the first five imported compact), and
    // crashes two hours apart (every stack kept: the most work per file).
    for (label, spacing) in [("a crash loop (one site, one time)", Int64(0)), ("crashes 2 h apart", 7_200_000)] {
        let directory = temporaryDirectory()
        // Copies of one real crash, each under its own session id (so its own event ids), re-framed.
        for index in 0..<files {
            let fresh = String(format: "%032x", index + 1)
            var file = [UInt8]()
            for record in contents.records {
                let payload = Array(
                    String(decoding: record.payload, as: UTF8.self).replacingOccurrences(of: session, with: fresh)
                        .replacingOccurrences(of: "\"time\":\(time)", with: "\"time\":\(time + Int64(index) * spacing)")
                        .utf8)
                var header = [UInt8]("CCR1".utf8)
                for value in [record.type.rawValue, UInt32(payload.count)] {
                    header += [
                        UInt8(value & 0xff), UInt8(value >> 8 & 0xff), UInt8(value >> 16 & 0xff), UInt8(value >> 24),
                    ]
                }
                let crc = CRC32.update(CRC32.update(0, header[4..<12]), payload)
                header += [UInt8(crc & 0xff), UInt8(crc >> 8 & 0xff), UInt8(crc >> 16 & 0xff), UInt8(crc >> 24)]
                file += header + payload
            }
            let path = directory + "/crash-\(fresh).ccr"
            try Data(file).write(to: URL(fileURLWithPath: path))
            // The rest of the space a crash file reserves reads as zeros.
            truncate(path, 256 * 1024)
        }
        // Crash files reach replay already on disk (the handler fdatasyncs them): the copies are
        // flushed before timing, or their writeback would be timed as replay.
        sync()
        let store = try EventStore(
            path: directory + "/events.sqlite", limits: .init(maximumEvents: files * 4, maximumBytes: 8 << 30))
        let start = monotonic()
        let summary = CrashReplayer(directory: directory, store: store).replayAll()
        let seconds = Double(monotonic() - start) / 1e9
        for file in summary.files where file.outcome != .imported {
            print("not imported: \(file.path): \(file.outcome.rawValue) \(file.problems)")
        }
        let compact = try store.events(limit: files * 4).filter { $0.payload.contains("\"crash_compact\":true") }.count
        print(
            "| \(label): \(summary.count(.imported)) imported, \(summary.importedEvents) events, \(compact) compact "
                + "| \(format(seconds, 2)) s (\(format(Double(files) / seconds, 0)) files/s) |")
    }

    // Symbolication: first frame of each module reads its image; after that, lookups only.
    let symbolicator = Symbolicator()
    let firstStart = monotonic()
    _ = symbolicator.symbolicate(report)
    let first = Double(monotonic() - firstStart) / 1e6
    let rounds = 2000
    let warmStart = monotonic()
    var named = 0
    for _ in 0..<rounds { named += symbolicator.symbolicate(report).filter { $0.function != nil }.count }
    let warm = Double(monotonic() - warmStart) / 1e9
    let frames = Double(rounds * report.frames.count)
    print(
        "| symbolication, first report (reads \(Set(report.frames.compactMap(\.module)).count) modules) | \(format(first, 1)) ms |"
    )
    print(
        "| symbolication after that | \(format(frames / warm, 0)) frames/s (\(named / rounds) of \(report.frames.count) frames named) |"
    )
}

let arguments = Array(CommandLine.arguments.dropFirst())
let command = arguments.first ?? "crash"

/// The value of `--name N`, or the default.
func option(_ name: String, default value: Int) -> Int {
    guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return value }
    return Int(arguments[index + 1]) ?? value
}

defer { for path in temporaryDirectories { try? FileManager.default.removeItem(atPath: path) } }

switch command {
case "crash":
    try crashBenchmarks(runs: option("--runs", default: 50))
case "pipeline":
    try pipelineBenchmarks(events: option("--events", default: 400_000))
case "replay":
    try replayBenchmarks(files: option("--files", default: 10_000))
case "symbolicate":
    try symbolicationBenchmarks(units: option("--units", default: 9))
case "track":
    // One thread calling track(), for profiling its cost alone.
    let configuration = CrashCapture.Configuration(
        directory: temporaryDirectory(), appName: "bench", appVersion: "1.0", staticProperties: ["tier": "bench"],
        trackLifecycle: false, journalBytes: 256 << 20)
    let run = try trackRun(events: option("--events", default: 1_000_000), configuration: configuration, threads: 1)
    print(
        "track() alone: median \(format(run.latency.median / 1000, 2)) µs, p99 \(format(run.latency.percentile(0.99) / 1000, 2)) µs"
    )
case "writer":
    let directory = temporaryDirectory()
    for _ in 0..<option("--runs", default: 5) {
        print(
            "writer alone: \(format(try writerAlone(events: option("--events", default: 200_000), directory: directory), 0)) events/s"
        )
    }
case "journal":
    try journalBenchmarks(idleSeconds: option("--idle-seconds", default: 30))
case "watch":
    try watchBenchmark(runs: option("--runs", default: 30))
case "upload":
    // The upload alone, for profiling: the events of a track() run, then the collector.
    let directory = temporaryDirectory()
    let configuration = CrashCapture.Configuration(
        directory: directory, appName: "bench", appVersion: "1.0", staticProperties: ["tier": "bench"],
        trackLifecycle: false, journalBytes: 128 << 20)
    let count = option("--events", default: 50_000)
    _ = try trackRun(events: count, configuration: configuration)
    let payloads = try EventStore(path: directory + "/events.sqlite").events(limit: count).map {
        ($0.eventID, $0.payload)
    }
    try uploadBenchmark(payloads: payloads, directory: directory, rounds: option("--rounds", default: 5))
case "claim":
    // The uploader's store alone: finish the last batch and claim the next, in one
    // transaction, until the store is empty (what the uploader does while a request is out).
    let count = option("--events", default: 50_000)
    var samples: [Double] = []
    // Each call's own time too: one in twenty also deletes the delivered rows in bulk.
    var typical: [Double] = []
    var slowest: [Double] = []
    for _ in 0..<option("--runs", default: 3) {
        let store = try EventStore(path: temporaryDirectory() + "/upload.sqlite")
        try store.insert(syntheticEvents(count))
        sync()
        let start = monotonic()
        var batch = try store.completeAndClaim(nil, limit: 50)
        var calls: [Double] = []
        while let claimed = batch {
            let before = monotonic()
            batch = try store.completeAndClaim(claimed, limit: 50)
            calls.append(Double(monotonic() - before) / 1000)
        }
        samples.append(Double(monotonic() - start) / 1000 / Double(calls.count))
        calls.sort()
        typical.append(Statistics(calls).median)
        slowest.append(Statistics(Array(calls.suffix(max(1, calls.count / 20)))).median)
    }
    print("## The uploader's store: complete a batch of 50 and claim the next (\(count) events, µs a batch)\n")
    print("| runs: mean a batch | median call | median of the slowest 5 % (with the bulk delete) |")
    print("|---|---|---|")
    print(
        "| \(samples.map { format($0, 0) }.joined(separator: ", ")) | "
            + "\(typical.map { format($0, 0) }.joined(separator: ", ")) | "
            + "\(slowest.map { format($0, 0) }.joined(separator: ", ")) |")
case "decode":
    // The collector's checks alone (form, base64, gzip, the JSON scan), on a batch shaped like
    // the ingest benchmark's (50 events, each a 600-byte string) and on one of 50 tracked events.
    let padded = (0..<50).map {
        #"{"type":"track","event_id":"d-\#($0)","event":"bench_event","properties":{"pad":""#
            + String(repeating: "p", count: 600) + #"","index":\#($0)}}"#
    }
    let directory = temporaryDirectory()
    let configuration = CrashCapture.Configuration(
        directory: directory, appName: "bench", appVersion: "1.0", staticProperties: ["tier": "bench"],
        trackLifecycle: false)
    _ = try trackRun(events: 200, configuration: configuration)
    let tracked = try EventStore(path: directory + "/events.sqlite").events(limit: 50).map(\.payload)
    for (name, events) in [("50 events of one 600-byte string", padded), ("50 tracked events", tracked)] {
        let body = try WireFormat.encode(events: events)
        var samples: [Double] = []
        for _ in 0..<option("--rounds", default: 3000) {
            let start = monotonic()
            _ = try WireFormat.decodeEvents(body: body)
            samples.append(Double(monotonic() - start) / 1000)
        }
        let statistics = Statistics(samples)
        print("\(name): median \(format(statistics.median, 1)) µs, p90 \(format(statistics.percentile(0.9), 1)) µs")
        // The uploader's side of the same batch: the body it builds while the previous request is out.
        for level: Int32 in [1, 6] {
            var encodeSamples: [Double] = []
            for _ in 0..<option("--rounds", default: 3000) {
                let start = monotonic()
                _ = try WireFormat.encode(events: events, level: level)
                encodeSamples.append(Double(monotonic() - start) / 1000)
            }
            let encoded = try WireFormat.encode(events: events, level: level).count
            print(
                "  encoded by the uploader, gzip level \(level): median \(format(Statistics(encodeSamples).median, 1)) µs, \(encoded) bytes"
            )
        }
    }
case "ingest":
    let other = arguments.firstIndex(of: "--collector").flatMap { $0 + 1 < arguments.count ? arguments[$0 + 1] : nil }
    try ingestUnderWrk(
        seconds: option("--seconds", default: 3), connections: max(1, option("--connections", default: 4)),
        collector: other)
    if other != nil { break }
    try ingestBenchmark(batches: option("--batches", default: 500))
    print("")
    try collectorMemory()
default:
    FileHandle.standardError.write(
        "usage: crashcap-bench crash [--runs N] | pipeline [--events N] | replay [--files N] | symbolicate [--units N] | journal [--idle-seconds N] | writer [--runs N] | track [--events N] | upload [--events N] | claim [--events N] [--runs N] | decode [--rounds N] | watch [--runs N] | ingest [--seconds N] [--connections N] [--batches N] [--collector PATH]\n"
            .data(using: .utf8)!)
    exit(64)
}
