import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

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
        let received = collector.store!.count
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
        guard fresh.store!.count == uploadPayloads.count else {
            throw CrashCaptureError.io(
                "the plain client stored \(fresh.store!.count) of \(uploadPayloads.count) events")
        }
    }
    print(
        "| python3 http.client, keep-alive, the uploader's own bodies (all of them), a new collector each round: median of \(plainRates.count) | \(format(Statistics(plainRates).median, 0)) events/s (rounds: "
            + plainRates.map { format($0, 0) }.joined(separator: ", ") + ") |")
}
