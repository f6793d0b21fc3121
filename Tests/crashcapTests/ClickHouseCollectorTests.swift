import Foundation
import ProcessSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `crashcap collect --clickhouse`: the collector in front, a real ClickHouse server behind it
/// (Debian's clickhouse-server, started by each test on loopback with a configuration of its
/// own), and what arrives read back from ClickHouse with its own SQL.
@Suite(.serialized) struct ClickHouseCollectorTests {
    /// The rows of the table, de-duplicated, as dictionaries.
    static func rows(_ server: ClickHouseServer, _ columns: String, order: String = "time") throws -> [[String: Any]] {
        try server.query(
            "SELECT \(columns) FROM events FINAL ORDER BY \(order) FORMAT JSONEachRow", database: "crashcap"
        )
        .split(separator: "\n").map { try JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any] }
    }

    /// What the official Sensors Python SDK sends: each record a row, its columns filled from
    /// the record, its text kept whole.
    @Test func officialPythonClientsRecordsBecomeRows() throws {
        let server = try ClickHouseServer()
        let collector = try CollectorProcess(clickHouse: server.url + "?database=crashcap")
        let client = """
            import sys
            sys.path.insert(0, sys.argv[2])
            import sensorsanalytics
            sa = sensorsanalytics.SensorsAnalytics(sensorsanalytics.DefaultConsumer(sys.argv[1]))
            sa.track("u1", "Buy", {"$app_name": "shop", "$app_version": "2.1", "item": "caf\\u00e9 \\U0001F600"})
            sa.track_signup("u1", "anon-1")
            sa.profile_set("u1", {"plan": "pro"})
            sa.flush()
            print("sent")
            """
        let sent = try run(
            "/usr/bin/env", ["python3", "-c", client, collector.url, Paths.packageRoot + "/.build/python-packages"])
        #expect(sent.stdout == "sent\n", "\(sent.stderr)")
        let rows = try Self.rows(
            server,
            "type, event, distinct_id, app_name, app_version, time, toUnixTimestamp(event_time) AS seconds, properties, payload"
        )
        #expect(rows.map { $0["type"] as? String } == ["track", "track_signup", "profile_set"], "\(rows)")
        let buy = try #require(rows.first)
        #expect(buy["event"] as? String == "Buy")
        #expect(buy["distinct_id"] as? String == "u1")
        #expect(buy["app_name"] as? String == "shop")
        #expect(buy["app_version"] as? String == "2.1")
        let millis = Int64(buy["time"] as? String ?? "") ?? 0
        #expect(millis > 1_700_000_000_000)
        #expect((buy["seconds"] as? NSNumber)?.int64Value == millis / 1000, "event_time is the event's own second")
        let properties = try JSONSerialization.jsonObject(with: Data((buy["properties"] as? String ?? "").utf8))
        #expect((properties as? [String: Any])?["item"] as? String == "caf\u{e9} \u{1F600}")
        let payload = try #require(
            try JSONSerialization.jsonObject(with: Data((buy["payload"] as? String ?? "").utf8)) as? [String: Any])
        #expect((payload["lib"] as? [String: Any])?["$lib"] as? String == "python", "the rest of the record")
        #expect(payload["properties"] == nil, "the properties are stored once, in their own column")
        #expect(rows[1]["event"] as? String == "$SignUp")
        // The collector's own answers read from ClickHouse too.
        let (status, health) = try collector.get("/health")
        #expect(status == 200 && String(decoding: health, as: UTF8.self).contains("\"events\":3"))
        // GET /events gives each record whole again.
        let served = try collector.events()
        #expect(served.count == 3)
        let record = try #require(served.first { $0["event"] as? String == "Buy" })
        #expect((record["properties"] as? [String: Any])?["item"] as? String == "caf\u{e9} \u{1F600}")
        #expect((record["lib"] as? [String: Any])?["$lib"] as? String == "python")
    }

    /// A crash replayed and uploaded through the collector: its row carries the fingerprint and
    /// title as columns, and the session's other events are rows of that session.
    @Test func aReplayedCrashHasFingerprintAndTitleColumns() throws {
        let server = try ClickHouseServer()
        let collector = try CollectorProcess(clickHouse: server.url + "?database=crashcap")
        let directory = makeTemporaryDirectory("clickhouse-crash")
        let crashed = try run(Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": directory])
        #expect(crashed.signal == SIGABRT)
        let replay = try run(Paths.crashcap, ["replay", directory, "--upload", collector.url], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stderr)")
        let rows = try Self.rows(server, "event, session_id, crash_fingerprint, crash_title")
        #expect(Set(rows.compactMap { $0["event"] as? String }) == ["$AppStart", "$AppCrashed", "$AppEnd"], "\(rows)")
        #expect(Set(rows.compactMap { $0["session_id"] as? String }).count == 1)
        let crash = try #require(rows.first { $0["event"] as? String == "$AppCrashed" })
        #expect((crash["crash_fingerprint"] as? String ?? "").count >= 16, "\(crash)")
        #expect((crash["crash_title"] as? String ?? "").contains("SIGABRT"), "\(crash)")
    }

    /// Two collectors on one table, each batch sent to both and some twice: every event is
    /// there once.
    @Test func twoCollectorsOnOneTableLoseAndDuplicateNothing() throws {
        let server = try ClickHouseServer()
        let collectors = try (0..<2).map { _ in try CollectorProcess(clickHouse: server.url + "?database=crashcap") }
        let batches = 40
        let perBatch = 50
        DispatchQueue.concurrentPerform(iterations: batches) { batch in
            let time = 1_764_000_000_000 + batch * 1000
            let events = (0..<perBatch).map { index in
                #"{"type":"track","event_id":"b\#(batch)-\#(index)","event":"e","distinct_id":"d\#(batch)","time":\#(time),"properties":{"i":\#(index)}}"#
            }
            let body = Data(
                ("data_list=" + "[\(events.joined(separator: ","))]".addingPercentEncoding(
                    withAllowedCharacters: .alphanumerics)!).utf8)
            for collector in collectors + (batch % 3 == 0 ? [collectors[0]] : []) {
                let (status, answer) = (try? collector.request("POST", "/sa", body: body)) ?? (0, Data())
                #expect(status == 200, "\(String(decoding: answer, as: UTF8.self))")
            }
        }
        let total = Int(try server.query("SELECT count() FROM events FINAL", database: "crashcap").trimmed)
        let distinct = Int(try server.query("SELECT uniqExact(event_id) FROM events", database: "crashcap").trimmed)
        #expect(total == batches * perBatch, "every event once")
        #expect(distinct == batches * perBatch, "none lost")
        // After ClickHouse merges the parts, the duplicates are gone from the table itself.
        try server.query("OPTIMIZE TABLE events FINAL", database: "crashcap")
        #expect(Int(try server.query("SELECT count() FROM events", database: "crashcap").trimmed) == batches * perBatch)
    }

    /// Docs/Fleet.md's two-shard setup (the README points there), on two ClickHouse servers on loopback: the shards' own
    /// `events` tables, a `Distributed` table over them sharded by `event_id`, and collectors
    /// writing into it. Every event is on one shard, a duplicate on the same one, and the
    /// Distributed table read with FINAL holds each event once.
    @Test func twoShardDistributedTableAsFleetShows() throws {
        let secondPort = ClickHouseServer.freePort()
        let second = try ClickHouseServer(directory: makeTemporaryDirectory("shard2"), tcpPort: secondPort)
        let firstPort = ClickHouseServer.freePort()
        let first = try ClickHouseServer(
            directory: makeTemporaryDirectory("shard1"), tcpPort: firstPort, clusterShards: [firstPort, secondPort])
        // Each shard's table, made by a collector pointed at it once.
        for server in [first, second] {
            _ = try CollectorProcess(clickHouse: server.url + "?database=crashcap")
        }
        let fleet = try String(contentsOfFile: Paths.packageRoot + "/Docs/Fleet.md", encoding: .utf8)
        let distributed =
            "CREATE TABLE crashcap.events_all AS crashcap.events\n"
            + "    ENGINE = Distributed(crashcap_cluster, crashcap, events, cityHash64(event_id))"
        #expect(fleet.contains(distributed), "Docs/Fleet.md shows this statement")
        try first.query(distributed)
        let collectors = try (0..<2).map { _ in
            try CollectorProcess(clickHouse: first.url + "?database=crashcap&table=events_all")
        }
        let events = 200
        DispatchQueue.concurrentPerform(iterations: events / 20) { batch in
            let records = (0..<20).map { index in
                #"{"type":"track","event_id":"s\#(batch)-\#(index)","event":"e","distinct_id":"d","time":\#(1_764_000_000_000 + index),"properties":{}}"#
            }
            let body = Data(
                ("data_list="
                    + "[\(records.joined(separator: ","))]".addingPercentEncoding(
                        withAllowedCharacters: .alphanumerics)!)
                    .utf8)
            for collector in collectors {
                let (status, answer) = (try? collector.request("POST", "/sa", body: body)) ?? (0, Data())
                #expect(status == 200, "\(String(decoding: answer, as: UTF8.self))")
            }
        }
        let onFirst = Int(try first.query("SELECT uniqExact(event_id) FROM events", database: "crashcap").trimmed) ?? 0
        let onSecond =
            Int(try second.query("SELECT uniqExact(event_id) FROM events", database: "crashcap").trimmed) ?? 0
        #expect(
            onFirst > 0 && onSecond > 0 && onFirst + onSecond == events, "\(onFirst) + \(onSecond): each on one shard")
        #expect(
            Int(try first.query("SELECT count() FROM events_all FINAL", database: "crashcap").trimmed) == events,
            "each event once through the Distributed table")
    }

    /// ClickHouse goes away: uploads are answered 503 with Retry-After and nothing is claimed
    /// stored; when it is back, the same batch is taken.
    @Test func clickHouseGoneAnswers503AndLosesNothing() throws {
        let server = try ClickHouseServer()
        let collector = try CollectorProcess(clickHouse: server.url + "?database=crashcap")
        let body = Data(
            #"data={"type":"track","time":1700000000000,"event_id":"x1","event":"e","distinct_id":"d","properties":{}}"#
                .utf8)
        server.kill()
        let (down, answer) = try collector.request("POST", "/sa", body: body)
        #expect(down == 503, "\(String(decoding: answer, as: UTF8.self))")
        #expect(String(decoding: answer, as: UTF8.self).contains("ClickHouse"))
        try server.start()
        let (up, _) = try collector.request("POST", "/sa", body: body)
        #expect(up == 200)
        #expect(try server.query("SELECT event_id FROM events", database: "crashcap").trimmed == "x1")
    }

    /// Where ClickHouse cannot be reached at start, the collector says so and exits 69;
    /// a URL that is not ClickHouse's is refused with the form it takes; and --db with
    /// --clickhouse is a usage error.
    @Test func badClickHouseSettingsAreClearErrors() throws {
        let unreachable = try run(Paths.crashcap, ["collect", "--port", "0", "--clickhouse", "http://127.0.0.1:1/"])
        #expect(unreachable.exitCode == 69)
        #expect(unreachable.stderr.contains("ClickHouse at http://127.0.0.1:1/"), "\(unreachable.stderr)")
        let notHTTP = try run(Paths.crashcap, ["collect", "--port", "0", "--clickhouse", "tcp://127.0.0.1:9000"])
        #expect(notHTTP.exitCode == 64)
        #expect(notHTTP.stderr.contains("http://127.0.0.1:8123/?database=crashcap"), "\(notHTTP.stderr)")
        let both = try run(
            Paths.crashcap, ["collect", "--port", "0", "--db", "/tmp/x.sqlite", "--clickhouse", "http://127.0.0.1:1/"])
        #expect(both.exitCode == 64)
        #expect(both.stderr.contains("give one store"), "\(both.stderr)")
    }
}

extension String {
    fileprivate var trimmed: String { trimmingCharacters(in: .whitespacesAndNewlines) }
}
