import CrashCapture
import CrashCaptureCollector
import Foundation
import ProcessSupport
import TestSupport

#if canImport(Glibc)
    import Glibc
#endif

/// The crash browser's pages over a fleet's worth of crashes (issue #44): `events` crash events in
/// `groups` groups, uploaded through the collector's own route into SQLite and into ClickHouse,
/// then each page asked for `rounds` times, request to last byte (curl's time_total over loopback),
/// beside a plain count of the same store in the same run.
///
/// The events are shaped like a replayed `$AppCrashed` as far as the pages read it (app, version,
/// fingerprint, title, signal, host, OS, context, user) but carry no stacks (about 600 bytes, not
/// the 10 to 40 KiB of a real report); the latest event of the groups whose pages are measured is
/// a real report of the C sample, so those pages render a real one. Groups are Zipf-sized (group
/// n has about 1/n of the top group's events), over 30 days, two apps, three versions each.
func browserBenchmark(events: Int, groups: Int, rounds: Int, only: String? = nil) throws {
    let directory = temporaryDirectory()
    let now = Int64(Date().timeIntervalSince1970 * 1000)
    let weights = (0..<groups).map { 1 / Double($0 + 1) }
    let scale = Double(events) / weights.reduce(0, +)
    var counts = weights.map { max(1, Int($0 * scale)) }
    counts[0] += events - counts.reduce(0, +)
    func fingerprint(_ group: Int) -> String { String(format: "%016llx", UInt64(group) &* 0x9E37_79B9_7F4A_7C15) }

    // A real report to be the latest of the measured groups.
    let sampleDirectory = directory + "/sample"
    try FileManager.default.createDirectory(atPath: sampleDirectory, withIntermediateDirectories: true)
    _ = try TestSupport.run(Paths.cSample, ["threads-parked"], environment: ["CRASHCAPTURE_DIR": sampleDirectory])
    _ = try TestSupport.run(Paths.crashcap, ["replay", sampleDirectory])
    guard
        let real = try storedEvents(in: sampleDirectory).first(where: { $0["event"] as? String == "$AppCrashed" })
    else { throw TestFailure("the sample left no crash") }
    let measured = [0, groups / 2]
    // A page of the list this many groups down (page 100 of 10,000 groups).
    let deep = min(5000, groups / 2)

    func event(_ index: Int, group: Int, within: Int) -> String {
        // Group g appears from (g % 30) days ago on; its events spread evenly to now.
        let firstDay = Int64(30 - group % 30)
        let span = firstDay * 86_400_000
        let time = now - span + span * Int64(within + 1) / Int64(counts[group] + 1)
        let day = (now - time) / 86_400_000
        let version = day >= 20 ? "1.0" : day >= 10 ? "1.1" : "2.0"
        let app = "app-\(group % 2)"
        let signals = ["SIGSEGV", "SIGABRT", "SIGILL", "SIGBUS", "SIGFPE"]
        return
            #"{"type":"track","event":"$AppCrashed","event_id":"b-\#(index)","time":\#(time),"distinct_id":"user-\#(index % 50_000)","lib":{"$lib":"CrashCapture","$lib_version":"0.1.0","$lib_method":"autoTrack"},"properties":{"$app_name":"\#(app)","$app_version":"\#(version)","$hostname":"host-\#(index % 200)","$os":"Linux","$os_version":"6.1.0-\#(index % 3)","crash_fingerprint":"\#(fingerprint(group))","crash_title":"\#(signals[group % 5]) in Module\#(group % 40).function\#(group)(_:)","crash_signal_name":"\#(signals[group % 5])","crash_context":{"region":"eu-\#(index % 3)","build":"b\#(group % 7)"},"crash_handler_ms":0.4}}"#
    }

    let server = try ClickHouseServer(directory: directory + "/clickhouse")
    let stores: [(name: String, storage: IngestCollector.Storage)] = [
        ("SQLite", .sqlite(path: directory + "/collected.sqlite")),
        ("ClickHouse", .clickHouse(URL(string: server.url + "?database=browser")!)),
    ]
    print("## The crash browser over \(events) events in \(groups) groups\n")
    print("load before: \(loadAverage())\n")
    var lines: [String] = []
    for (name, storage) in stores where only.map({ $0.lowercased() == name.lowercased() }) ?? true {
        let collector = try IngestCollector(port: 0, storage: storage)
        let base = "http://127.0.0.1:\(collector.port)"
        // Uploads of 2,000 events, as an SDK's batches arrive (plain form, no gzip).
        let uploadStart = Date()
        var batch: [String] = []
        var index = 0
        func send() throws {
            let body =
                "data_list=" + ("[" + batch.joined(separator: ",") + "]").addingPercentEncoding(
                    withAllowedCharacters: .alphanumerics)!
            let file = directory + "/batch"
            try Data(body.utf8).write(to: URL(fileURLWithPath: file))
            let sent = try TestSupport.run(
                "/usr/bin/curl", ["-s", "-f", "--data-binary", "@" + file, base + "/sa"], timeout: 120)
            guard sent.exitCode == 0 else { throw TestFailure("upload refused: \(sent.stdout) \(sent.stderr)") }
            batch = []
        }
        for group in 0..<groups {
            for within in 0..<counts[group] {
                if measured.contains(group) && within == counts[group] - 1 {
                    var copy = real
                    var properties = copy["properties"] as? [String: Any] ?? [:]
                    properties["crash_fingerprint"] = fingerprint(group)
                    properties["$app_name"] = "app-\(group % 2)"
                    properties["$app_version"] = "2.0"
                    copy["properties"] = properties
                    copy["event_id"] = "b-\(index)"
                    copy["time"] = now - 1000
                    batch.append(String(decoding: try JSONSerialization.data(withJSONObject: copy), as: UTF8.self))
                } else {
                    batch.append(event(index, group: group, within: within))
                }
                index += 1
                if batch.count == 2000 { try send() }
            }
        }
        if !batch.isEmpty { try send() }
        let uploaded = Date().timeIntervalSince(uploadStart)
        // The first page indexes what arrived (SQLite) or is ClickHouse's first read: timed apart.
        let first = try fetch(base + "/")
        let pages: [(String, String)] = [
            ("group list (50 of \(groups), by events)", "/"),
            ("group list, one version", "/?version=2.0"),
            ("group list, last 7 days, text filter", "/?range=7d&q=function1"),
            ("group list, last 7 days", "/?range=7d"),
            ("group list, \(deep) groups deep (keyset)", "/?after=\(counts[deep]):" + fingerprint(deep)),
            ("top group's page (\(counts[0]) events)", "/groups/" + fingerprint(0)),
            ("a middle group's page (\(counts[groups / 2]) events)", "/groups/" + fingerprint(groups / 2)),
            ("the top group's page, last 7 days", "/groups/" + fingerprint(0) + "?range=7d"),
            ("top crashers of 2.0", "/top?app=app-0&version=2.0"),
        ]
        var countTimes: [Double] = []
        for _ in 0..<rounds { countTimes.append(try plainCount(name: name, storage: storage, server: server)) }
        print(
            "### \(name): \(events) events uploaded in \(format(uploaded, 1)) s; first page (indexing) \(format(first.ms, 0)) ms\n"
        )
        print("| page | median ms | p90 ms | max ms | bytes |")
        print("|---|---|---|---|---|")
        for (label, path) in pages {
            var times: [Double] = []
            var bytes = 0
            for _ in 0..<rounds {
                let answer = try fetch(base + path)
                times.append(answer.ms)
                bytes = answer.bytes
            }
            let statistics = Statistics(times)
            print(
                "| \(label) | \(format(statistics.median, 1)) | \(format(statistics.percentile(0.9), 1)) | \(format(statistics.values.last ?? 0, 1)) | \(bytes) |"
            )
            lines.append("\(name) \(label): median \(format(statistics.median, 1)) ms")
        }
        let counted = Statistics(countTimes)
        print(
            "| plain `SELECT count()` of the same store (\(name == "SQLite" ? "in process" : "over HTTP")) | \(format(counted.median, 1)) | \(format(counted.percentile(0.9), 1)) | \(format(counted.values.last ?? 0, 1)) | |\n"
        )
        // What keeping the sums costs as crashes arrive: batches of 2,000 more, each uploaded
        // (ClickHouse indexes them then) and followed by the list (SQLite catches up then).
        var uploads: [Double] = []
        var firstPages: [Double] = []
        for round in 0..<3 {
            for within in 0..<2000 {
                let group = (round * 2000 + within) % groups
                batch.append(
                    event(index, group: group, within: counts[group] - 1)
                        .replacingOccurrences(of: "\"b-\(index)\"", with: "\"more-\(round)-\(within)\""))
                index += 1
            }
            let start = DispatchTime.now().uptimeNanoseconds
            try send()
            uploads.append(Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6)
            firstPages.append(try fetch(base + "/").ms)
        }
        print(
            "2,000 more crashes, three times: their upload \(uploads.map { format($0, 0) }.joined(separator: ", ")) ms, "
                + "then the list \(firstPages.map { format($0, 0) }.joined(separator: ", ")) ms\n")
        collector.stop()
    }
    print("load after: \(loadAverage())")
}

/// One GET, request to last byte, as curl times it.
private func fetch(_ url: String) throws -> (ms: Double, bytes: Int) {
    let answer = try TestSupport.run(
        "/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code} %{time_total} %{size_download}", url],
        timeout: 600)
    let parts = answer.stdout.split(separator: " ")
    guard parts.count == 3, parts[0] == "200", let seconds = Double(parts[1]), let bytes = Int(parts[2]) else {
        throw TestFailure("GET \(url): \(answer.stdout)")
    }
    return (seconds * 1000, bytes)
}

/// `SELECT count()` of the store the pages read: SQLite in this process, ClickHouse over HTTP as the collector asks it.
private func plainCount(name: String, storage: IngestCollector.Storage, server: ClickHouseServer) throws -> Double {
    switch storage {
    case .sqlite(let path):
        let start = DispatchTime.now().uptimeNanoseconds
        let connection = try SQLiteConnection(path: path)
        _ = try connection.scalarInt("SELECT count(*) FROM events")
        return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e6
    default:
        let query = "SELECT count() FROM events".addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
        let answer = try fetch(server.url + "?database=browser&query=" + query)
        return answer.ms
    }
}

private func loadAverage() -> String {
    ((try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8)) ?? "?").split(separator: " ").prefix(3)
        .joined(separator: " ") + " (1, 5, 15 min; 2 cores)"
}
