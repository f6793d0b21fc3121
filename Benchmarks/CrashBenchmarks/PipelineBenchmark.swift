import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

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
    CrashCapture.flush(timeout: .zero)
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
    CrashCapture.flush(timeout: .zero)
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

/// Disk the installed process holds in `directory`: its session file and its crash file, as
/// allocated (st_blocks), not as sized.
func liveProcessDisk(_ directory: String) -> Int {
    ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter {
        $0.hasPrefix("session-") || $0.hasPrefix("crash-")
    }.reduce(0) { total, name in
        var info = stat()
        return total + (stat(directory + "/" + name, &info) == 0 ? Int(info.st_blocks) * 512 : 0)
    }
}

/// #32's figures, every setting at its default: the disk a live process holds, and the store's
/// cap of events from 4 threads as fast as they can (the journal far smaller than the burst).
func defaultsBurst() throws {
    let directory = temporaryDirectory()
    let configuration = CrashCapture.Configuration(
        directory: directory, appName: "bench", appVersion: "1.0", trackLifecycle: false)
    try CrashCapture.install(configuration)
    let disk = liveProcessDisk(directory)
    CrashCapture.uninstall()
    try? FileManager.default.removeItem(atPath: directory + "/events.sqlite")
    let burst = try trackRun(events: 100_000, configuration: configuration)
    var alone = configuration
    alone.directory = temporaryDirectory()
    let oneThread = try trackRun(events: 25_000, configuration: alone, threads: 1)
    print("## With the defaults (\(configuration.journalBytes >> 10) KiB journal)\n")
    print("| | value | target |")
    print("|---|---|---|")
    print("| disk held by a live process (session file and crash file, allocated) | \(disk) bytes | ≤ 2,097,152 |")
    print(
        "| 100,000 events from 4 threads: dropped / in SQLite | \(burst.dropped) / \(burst.count) | 0 / 100,000 |")
    print(
        "| the same: into the journal / into SQLite, events/s | \(format(burst.trackingRate, 0)) / \(format(burst.sustainedRate, 0)) | |"
    )
    print(
        "| the same: track() p99 / p99.9 (waits for room included) | \(format(burst.latency.percentile(0.99) / 1000, 2)) / \(format(burst.latency.percentile(0.999) / 1000, 2)) µs | |"
    )
    print(
        "| one thread, 25,000 events (the writer keeps up): track() median / p99 | \(format(oneThread.latency.median / 1000, 2)) / \(format(oneThread.latency.percentile(0.99) / 1000, 2)) µs | p99 ≤ 3 µs |\n"
    )
}

/// The Swift install() on the caller's thread: into a new directory each time, and again
/// into one that already has its store (each followed by uninstall).
func swiftInstallBenchmark(runs: Int) throws {
    var fresh: [Double] = []
    var again: [Double] = []
    let existing = temporaryDirectory()
    for _ in 0..<runs {
        let directory = temporaryDirectory()
        for (target, samples) in [(directory, 0), (existing, 1)] {
            let configuration = CrashCapture.Configuration(
                directory: target, appName: "bench", appVersion: "1.0", trackLifecycle: false)
            let start = monotonic()
            try CrashCapture.install(configuration)
            let elapsed = Double(monotonic() - start) / 1e6
            CrashCapture.uninstall()
            if samples == 0 { fresh.append(elapsed) } else { again.append(elapsed) }
        }
        try? FileManager.default.removeItem(atPath: directory)
    }
    let (first, second) = (Statistics(fresh), Statistics(again))
    print("## CrashCapture.install() on the caller's thread (\(runs) runs each, ms)\n")
    print("| directory | median | p90 | target |")
    print("|---|---|---|---|")
    print("| new (store created) | \(format(first.median, 2)) | \(format(first.percentile(0.9), 2)) | ≤ 2 |")
    print("| with its store already there | \(format(second.median, 2)) | \(format(second.percentile(0.9), 2)) | |\n")
}

func pipelineBenchmarks(events: Int) throws {
    try defaultsBurst()
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
