// crashcap-bench: the figures in the README, measured on this machine. Run through
// Benchmarks/run.sh, which builds everything in release mode first.
//
//   crashcap-bench crash [--runs N]     handler time, whole-process cost, install cost
//   crashcap-bench minidump [--runs N]  the handler with and without the stacks record; export
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

let arguments = Array(CommandLine.arguments.dropFirst())
let command = arguments.first ?? "crash"

/// The value of `--name N`, or the default.
func option(_ name: String, default value: Int) -> Int {
    guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return value }
    return Int(arguments[index + 1]) ?? value
}

/// The value of `--name TEXT`, if given.
func textOption(_ name: String) -> String? {
    guard let index = arguments.firstIndex(of: name), index + 1 < arguments.count else { return nil }
    return arguments[index + 1]
}

defer { for path in temporaryDirectories { try? FileManager.default.removeItem(atPath: path) } }

switch command {
case "crash":
    try crashBenchmarks(runs: option("--runs", default: 50))
case "minidump":
    try minidumpBenchmark(runs: option("--runs", default: 30))
case "defaults":
    try defaultsBurst()
case "swift-install":
    try swiftInstallBenchmark(runs: option("--runs", default: 30))
case "preload":
    try preloadBenchmarks(runs: option("--runs", default: 60), against: textOption("--against"))
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
case "hang":
    try hangBenchmarks(hangs: option("--hangs", default: 24), cpuSeconds: option("--cpu-seconds", default: 20))
case "watch":
    try watchBenchmark(runs: option("--runs", default: 30))
case "upload":
    // The upload alone, for profiling: the events of a track() run, then the collector.
    let (directory, payloads) = try trackedPayloads(option("--events", default: 50_000))
    try uploadBenchmark(payloads: payloads, directory: directory, rounds: option("--rounds", default: 5))
case "otlp":
    // The events of a track() run, sent as OTLP logs and in the Sensors format.
    let (directory, payloads) = try trackedPayloads(option("--events", default: 50_000))
    try otlpBenchmark(payloads: payloads, directory: directory, rounds: option("--rounds", default: 3))
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
        #"{"type":"track","distinct_id":"bench","time":1700000000000,"event_id":"d-\#($0)","event":"bench_event","properties":{"pad":""#
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
case "ingest-clickhouse":
    // A fleet's collector has many clients at once: 128 connections, and the 4 of `ingest`.
    let given = option("--connections", default: 0)
    try ingestClickHouse(
        seconds: option("--seconds", default: 5), connections: given > 0 ? [given] : [4, 128],
        batches: option("--batches", default: 500))
case "browser":
    let store = arguments.firstIndex(of: "--store").flatMap { $0 + 1 < arguments.count ? arguments[$0 + 1] : nil }
    try browserBenchmark(
        events: option("--events", default: 1_000_000), groups: option("--groups", default: 10_000),
        rounds: option("--rounds", default: 10), only: store)
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
        "usage: crashcap-bench crash [--runs N] | minidump [--runs N] | defaults | swift-install [--runs N] | preload [--runs N] [--against OTHER.so] | pipeline [--events N] | replay [--files N] | symbolicate [--units N] | journal [--idle-seconds N] | writer [--runs N] | track [--events N] | upload [--events N] | claim [--events N] [--runs N] | decode [--rounds N] | watch [--runs N] | ingest [--seconds N] [--connections N] [--batches N] [--collector PATH] | ingest-clickhouse [--seconds N] [--connections N] [--batches N] | otlp [--events N] [--rounds N] | hang [--hangs N] [--cpu-seconds N] | browser [--events N] [--groups N] [--rounds N] [--store sqlite|clickhouse]\n"
            .data(using: .utf8)!)
    exit(64)
}
