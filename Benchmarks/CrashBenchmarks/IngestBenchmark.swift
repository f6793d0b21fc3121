import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport
import TestSupport

#if canImport(Glibc)
    import Glibc
#endif

/// The collector's ingest under wrk, the HTTP load generator: `connections` keep-alive
/// connections (4 unless `--connections N`), each POSTing ready-made batches of 50 gzip'd
/// events of about 700 bytes (the Python clients' shape below), every batch with ids of its
/// own, for `seconds`. `collector`: another build's
/// `crashcap` to run instead of this one's collector (`--collector PATH`), to compare the two.
/// `clickHouse`: the collector stores into ClickHouse at this URL instead of SQLite, an INSERT
/// waiting `linger` for more uploads while many clients upload.
@discardableResult
func ingestUnderWrk(
    seconds: Int, connections: Int, collector other: String?, clickHouse: String? = nil,
    linger: Duration = IngestCollector.Limits().clickHouseLinger
) throws -> Double {
    let directory = temporaryDirectory()
    let url: String
    let storedCount: () throws -> Int
    let stop: () -> Void
    let pid: pid_t
    var inserts: () -> (inserts: Int, uploads: Int) = { (0, 0) }
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
        let storage: IngestCollector.Storage =
            clickHouse.map { .clickHouse(URL(string: $0)!) } ?? .sqlite(path: directory + "/collector.sqlite")
        var limits = IngestCollector.Limits()
        limits.clickHouseLinger = linger
        let collector = try IngestCollector(port: 0, storage: storage, limits: limits)
        url = collector.url
        pid = getpid()
        inserts = { collector.clickHouseInserts }
        storedCount = { try collector.storedCount() }
        stop = { collector.stop() }
    }
    // Enough bodies that none is sent twice at 400,000 events/s.
    // wrk's threads: one a connection up to 4, then 4 sharing the connections, each thread
    // sending its own file of bodies in turn on all of its connections.
    let threads = min(connections, 4)
    let perConnection = max(1000, seconds * 400_000 / threads / 50)
    let pad = String(repeating: "p", count: 600)
    DispatchQueue.concurrentPerform(iterations: threads) { connection in
        var lines: [UInt8] = []
        for batch in 0..<perConnection {
            let events = (0..<50).map {
                #"{"type":"track","distinct_id":"bench","time":1700000000000,"event_id":"wrk\#(connection)-\#(batch)-\#($0)","event":"bench_event","properties":{"pad":"\#(pad)","index":\#($0)}}"#
            }
            lines += try! WireFormat.encode(events: events)
            lines.append(UInt8(ascii: "\n"))
        }
        guard FileManager.default.createFile(atPath: directory + "/bodies\(connection).txt", contents: Data(lines))
        else {
            fatalError("cannot write wrk's bodies into \(directory)")
        }
    }
    let script =
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path + "/ingest.lua"
    let cpuBefore = threadCPUSeconds(pid)
    let report = try ChildProcess.run(
        path: "/usr/bin/env",
        arguments: [
            "wrk", "-t\(threads)", "-c\(connections)", "-d\(seconds)s", "--latency", "-s", script, url, "--",
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
    let (insertCount, uploadsInserted) = inserts()
    stop()
    // What this round wrote (a gigabyte of SQLite and WAL, say) goes before the next round
    // starts, not while it runs: the next round measures its own store, not this one's writeback.
    try? FileManager.default.removeItem(atPath: directory)
    sync()
    // CPU an event by the collector's threads: its event loop, its thread pools (SQLite's; the
    // decoders' stay idle for batches this small), and the rest of the process (checkpoints,
    // on libdispatch's threads).
    func perEvent(_ include: (String) -> Bool) -> String {
        let used = cpuAfter.filter { include($0.key) }.reduce(0.0) { $0 + $1.value - (cpuBefore[$1.key] ?? 0) }
        return format(used / Double(max(1, stored)) * 1e6, 2)
    }
    let store = clickHouse == nil ? "SQLite" : "ClickHouse"
    let waiting = clickHouse == nil ? "" : ", an INSERT waiting up to \(linger) for more"
    print(
        "## Ingest under wrk into \(store)\(waiting): \(connections) connections, batches of 50, gzip, loopback (\(other ?? "this build"))\n"
    )
    print(
        "| events stored | rate | request p50 | p99 | refused | CPU µs an event: event loop / \(store) thread / the rest |"
    )
    print("|---|---|---|---|---|---|")
    print(
        "| \(stored) | \(format(Double(stored) / seconds, 0)) events/s | \(field("50%")) | \(field("99%")) | \(refused) | \(perEvent { $0.hasPrefix("NIO-ELT") }) / \(perEvent { $0.hasPrefix("TP-") }) / \(perEvent { !$0.hasPrefix("NIO-ELT") && !$0.hasPrefix("TP-") }) |"
    )
    if insertCount > 0 {
        print("\nINSERTs: \(insertCount), uploads in each: \(format(Double(uploadsInserted) / Double(insertCount), 1))")
    }
    print("")
    return Double(stored) / seconds
}

/// The collector storing into ClickHouse (a server of the benchmark's own, Debian's
/// clickhouse-server) beside the same collector storing into SQLite, in one run: the rate
/// under wrk of each, then two collectors on one ClickHouse table, every event sent through
/// both (4 Python clients, two a collector, the two pairs with the same event ids): the
/// table must hold each event once.
func ingestClickHouse(seconds: Int, connections: [Int], batches: Int) throws {
    let directory = temporaryDirectory()
    let server = try ClickHouseServer(directory: directory + "/clickhouse")
    // A database of its own for every round, never a table dropped and made again: the files
    // of a dropped table are deleted while the next round runs, and ext4 then takes longer to
    // allocate the inodes of every new part (the round after a drop ran at half the rate).
    func database(_ name: String) -> String { server.url + "?database=" + name }
    var summary: [String] = []
    for count in connections {
        var sqliteRates: [Double] = []
        var clickHouseRates: [Double] = []
        for round in 1...2 {
            print("### \(count) connections, round \(round)\n")
            sqliteRates.append(try ingestUnderWrk(seconds: seconds, connections: count, collector: nil))
            clickHouseRates.append(
                try ingestUnderWrk(
                    seconds: seconds, connections: count, collector: nil, clickHouse: database("wrk_\(count)_\(round)"))
            )
        }
        summary.append(
            "\(count) connections: ClickHouse \(clickHouseRates.map { format($0, 0) }.joined(separator: " / ")) events/s against SQLite \(sqliteRates.map { format($0, 0) }.joined(separator: " / "))"
        )
        // The reference for the wait before an INSERT, which only many clients set off.
        if count >= 8 {
            print("### \(count) connections, no wait before an INSERT (the reference)\n")
            let unwaited = try ingestUnderWrk(
                seconds: seconds, connections: count, collector: nil, clickHouse: database("wrk_\(count)_nowait"),
                linger: .zero)
            summary.append("\(count) connections, no wait before an INSERT: ClickHouse \(format(unwaited, 0)) events/s")
        }
    }
    let collectors = try (0..<2).map { _ in
        try IngestCollector(port: 0, storage: .clickHouse(URL(string: database("crashcap"))!))
    }
    let script =
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path
        + "/upload_baseline.py"
    let start = Date()
    let clients = try (0..<4).map { index in
        try ChildProcess(
            path: "/usr/bin/env",
            arguments: ["python3", script, collectors[index % 2].url, "\(batches)", "client\(index / 2)"],
            environment: ProcessInfo.processInfo.environment)
    }
    for client in clients { _ = client.wait(timeout: 600) }
    let elapsed = Date().timeIntervalSince(start)
    let failed = clients.filter { $0.exitCode != 0 }.map(\.stderr)
    for collector in collectors { collector.stop() }
    func number(_ sql: String) throws -> Int {
        Int(try server.query(sql, database: "crashcap").trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
    }
    let rows = try number("SELECT count() FROM events")
    let distinct = try number("SELECT uniqExact(event_id) FROM events")
    let final = try number("SELECT count() FROM events FINAL")
    let expected = 2 * batches * 50
    print("## Two collectors, one ClickHouse table, every event sent through both\n")
    print(
        "| events sent (each twice) | rows written | distinct events | rows read with FINAL | lost | duplicated | client failures | time |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print(
        "| \(expected) | \(rows) | \(distinct) | \(final) | \(expected - distinct) | \(final - distinct) | \(failed.count) | \(format(elapsed, 1)) s |"
    )
    print("")
    print("In the same run, two rounds each:\n")
    for line in summary { print("- " + line) }
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
    let received = collector.store!.count
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
