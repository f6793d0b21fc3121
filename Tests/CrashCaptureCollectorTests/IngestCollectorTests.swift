import CrashCaptureCollector
import CrashFileFormat
import Foundation
import TestSupport
import Testing

@testable import CrashCapture

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

@Suite struct CollectorTests {
    @Test func rejectsMalformedBatchesWithAReason() throws {
        let collector = try CollectorProcess()
        let (status, body) = try collector.request("POST", "/sa", body: Data("crc=1&gzip=1&data_list=abc".utf8))
        #expect(status == 400)
        #expect(String(decoding: body, as: UTF8.self).contains("crc mismatch"))
        let noType = try WireFormat.encode(events: ["{\"event\":\"x\",\"properties\":{}}"])
        let (missing, message) = try collector.request("POST", "/sa", body: noType)
        #expect(missing == 400)
        #expect(String(decoding: message, as: UTF8.self).contains("has no type"))
        #expect(try collector.get("/nowhere").0 == 404)
        #expect(try collector.request("DELETE", "/events", body: nil).0 == 405)
    }

    @Test func faultsApplyToUploadsOnly() throws {
        let collector = try CollectorProcess(["--drop-first", "1", "--fail-first", "1"])
        let batch = String(
            decoding: try WireFormat.encode(events: [
                "{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":{}}"
            ]),
            as: UTF8.self)
        // A plain client, one connection per request: URLSession retries a dropped keep-alive
        // connection on its own, which would hide what the server did.
        let client = """
            import http.client, sys
            host, port = sys.argv[1].split("//")[1].split("/")[0].split(":")
            def ask(method, path, body=None):
                connection = http.client.HTTPConnection(host, int(port), timeout=10)
                try:
                    connection.request(method, path, body)
                    print(method, path, connection.getresponse().status)
                except (http.client.RemoteDisconnected, ConnectionResetError):
                    print(method, path, "dropped")
            ask("GET", "/events"); ask("GET", "/health")
            for _ in range(3): ask("POST", "/sa", sys.argv[2])
            """
        let result = try run("/usr/bin/env", ["python3", "-c", client, collector.url, batch])
        #expect(
            result.stdout
                == "GET /events 200\nGET /health 200\nPOST /sa dropped\nPOST /sa 500\nPOST /sa 200\n",
            "\(result.stderr)")
    }

    /// An event that names a key twice is refused whole: which of the two values counts differs
    /// from one JSON reader to the next, and de-duplication would read one and store the other.
    @Test func refusesAnEventWithAKeyTwice() throws {
        let collector = try CollectorProcess()
        let twice = try WireFormat.encode(events: [
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event_id":"k1","event":"x","properties":{},"event_id":"k2"}"#
        ])
        let (status, body) = try collector.request("POST", "/sa", body: twice)
        #expect(status == 400)
        let reason = (try JSONSerialization.jsonObject(with: body) as? [String: Any])?["error"] as? String ?? ""
        #expect(reason.contains("key \"event_id\" twice"), "\(reason)")
        let other = try WireFormat.encode(events: [
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event_id":"k3","event":"x","properties":{},"lib":{},"lib":{}}"#
        ])
        #expect(try collector.request("POST", "/sa", body: other).0 == 400)
        let nested = try WireFormat.encode(events: [
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event_id":"k4","event":"x","properties":{"a":1,"b":{"c":1},"a":2}}"#
        ])
        #expect(try collector.request("POST", "/sa", body: nested).0 == 400, "a key twice in properties")
        let sameKeyElsewhere = try WireFormat.encode(events: [
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event_id":"k5","event":"x","properties":{"a":{"a":1},"b":[{"a":1},{"a":2}]}}"#
        ])
        let (allowed, _) = try collector.request("POST", "/sa", body: sameKeyElsewhere)
        #expect(allowed == 200, "one key in several objects is no repeat")
        // A genuine k2 later is stored: nothing of the refused batch was.
        let genuine = try WireFormat.encode(events: [
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event_id":"k2","event":"x","properties":{}}"#
        ])
        let (ok, answer) = try collector.request("POST", "/sa", body: genuine)
        #expect(ok == 200)
        #expect(String(decoding: answer, as: UTF8.self) == "{\"inserted\":1,\"duplicates\":0}")
        #expect(try collector.events().count == 2)
    }

    /// What the Sensors format does not allow is refused with 400 and a reason, by the real
    /// server: a key twice however it is spelled, a bad `time`, an event name with a control
    /// character or too long, a repeated form field; every member of a gzip body is read.
    @Test func refusesWhatTheFormatDoesNotAllow() throws {
        let collector = try CollectorProcess()
        func refused(_ record: String, _ fragment: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
            let (status, body) = try collector.request("POST", "/sa", body: try WireFormat.encode(events: [record]))
            let reason = (try? JSONSerialization.jsonObject(with: body) as? [String: Any])?["error"] as? String ?? ""
            #expect(status == 400, "\(record)", sourceLocation: sourceLocation)
            #expect(reason.contains(fragment), "\(reason)", sourceLocation: sourceLocation)
        }
        try refused(
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event":"x","\u0065vent":"y","event_id":"e1","properties":{}}"#,
            "twice")
        try refused(
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event":"x","event_id":"e2","properties":{"a":1,"\u0061":2}}"#,
            "twice")
        try refused(
            #"{"type":"track","distinct_id":"u","event":"x","time":-1,"event_id":"e3","properties":{}}"#, "time")
        try refused(
            #"{"type":"track","distinct_id":"u","event":"x","time":"1700000000000","event_id":"e4","properties":{}}"#,
            "time")
        try refused(
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event":"x\u001b[31m","event_id":"e5","properties":{}}"#,
            "control")
        try refused(#"{"type":"track","distinct_id":"u","event":"x","event_id":"e7","properties":{}}"#, "no time")
        try refused(
            #"{"type":"track","time":1700000000000,"event":"x","event_id":"e8","properties":{}}"#, "distinct_id")
        try refused(
            #"{"type":"profile_set","distinct_id":"","time":1700000000000,"event_id":"e9","properties":{}}"#,
            "distinct_id")
        try refused(
            #"{"type":"track","distinct_id":null,"time":1700000000000,"event":"x","event_id":"e10","properties":{}}"#,
            "distinct_id")
        // An item names its item, not a user: no distinct_id asked of it.
        let item = try WireFormat.encode(events: [
            #"{"type":"item_set","item_type":"book","item_id":"b1","time":1700000000000,"event_id":"i1","properties":{}}"#
        ])
        #expect(try collector.request("POST", "/sa", body: item).0 == 200)
        try refused(
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event":""# + String(repeating: "a", count: 10_000)
                + #"","event_id":"e6","properties":{}}"#,
            "event name")
        // Two data_list fields: one of them would be silently ignored.
        let first = try WireFormat.encode(events: [
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event":"x","event_id":"f1","properties":{}}"#
        ])
        let second = String(decoding: first, as: UTF8.self).components(separatedBy: "&").first {
            $0.hasPrefix("data_list=")
        }!
        let (repeated, reason) = try collector.request("POST", "/sa", body: first + Data(("&" + second).utf8))
        #expect(repeated == 400, "\(String(decoding: reason, as: UTF8.self))")
        // A gzip body of two members: both are read (only the first was, the rest dropped with 200).
        let one = try WireFormat.gzip(
            Data(#"[{"type":"track","distinct_id":"u","time":1700000000000,"event":"x","event_id":"g1","#.utf8))
        let two = try WireFormat.gzip(
            Data(
                #""properties":{}},{"type":"track","distinct_id":"u","time":1700000000000,"event":"x","event_id":"g2","properties":{}}]"#
                    .utf8))
        let body = Data("gzip=1&data_list=\(WireFormat.formEscape((one + two).base64EncodedString()))".utf8)
        let (status, answer) = try collector.request("POST", "/sa", body: body)
        #expect(status == 200, "\(String(decoding: answer, as: UTF8.self))")
        #expect(try collector.events().compactMap { $0["event_id"] as? String } == ["i1", "g1", "g2"])
    }

    @Test func deduplicatesByEventID() throws {
        let collector = try CollectorProcess()
        let batch = try WireFormat.encode(events: [
            "{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":{}}",
            "{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"b\",\"event\":\"x\",\"properties\":{}}",
        ])
        let (_, first) = try collector.request("POST", "/sa", body: batch)
        #expect(String(decoding: first, as: UTF8.self) == "{\"inserted\":2,\"duplicates\":0}")
        let (_, second) = try collector.request("POST", "/sa", body: batch)
        #expect(String(decoding: second, as: UTF8.self) == "{\"inserted\":0,\"duplicates\":2}")
        #expect(try collector.events().count == 2)
    }

    /// Batches that arrive together are committed together: each still gets its own answer,
    /// counting its own rows, and a row sent by several clients at once is stored once.
    @Test func batchesCommittedTogetherAreEachAnsweredForThemselves() throws {
        let collector = try CollectorProcess()
        // 16 clients at once, each sending 8 batches; clients 2k and 2k+1 send the same events.
        let answers = Answers()
        let url = URL(string: collector.url)!
        DispatchQueue.concurrentPerform(iterations: 16) { client in
            for batch in 0..<8 {
                let events = (0..<25).map {
                    #"{"type":"track","distinct_id":"u","time":1700000000000,"event_id":"p\#(client / 2)-\#(batch)-\#($0)","event":"x","properties":{}}"#
                }
                guard let body = try? WireFormat.encode(events: events) else { return answers.add("no body") }
                var request = URLRequest(url: url, timeoutInterval: 10)
                request.httpMethod = "POST"
                request.httpBody = body
                let done = DispatchSemaphore(value: 0)
                URLSession.shared.dataTask(with: request) { data, response, _ in
                    let status = (response as? HTTPURLResponse)?.statusCode ?? 0
                    answers.add(status == 200 ? String(decoding: data ?? Data(), as: UTF8.self) : "HTTP \(status)")
                    done.signal()
                }.resume()
                if done.wait(timeout: .now() + 15) == .timedOut { answers.add("no answer") }
            }
        }
        var inserted = 0
        var duplicates = 0
        for answer in answers.all {
            let counts = try #require(
                try JSONSerialization.jsonObject(with: Data(answer.utf8)) as? [String: Int], "\(answer)")
            #expect(counts["inserted"]! + counts["duplicates"]! == 25, "\(answer)")
            inserted += counts["inserted"]!
            duplicates += counts["duplicates"]!
        }
        #expect(answers.all.count == 128)
        #expect(inserted == 8 * 8 * 25 && duplicates == 8 * 8 * 25)
        let ids = try collector.events().compactMap { $0["event_id"] as? String }
        #expect(ids.count == 1600 && Set(ids).count == 1600)
    }

    /// The official Sensors Analytics Python SDK (installed by the test command): its
    /// single-record form (`data`, gzip, no crc) and its batch form, every record type of the
    /// data model, project and token in the query.
    @Test func theOfficialPythonSDKIsAccepted() throws {
        let collector = try CollectorProcess()
        let client = """
            import sys
            sys.path.insert(0, sys.argv[2])
            import sensorsanalytics
            url = sys.argv[1] + "?project=default&token=secret"
            sa = sensorsanalytics.SensorsAnalytics(sensorsanalytics.DefaultConsumer(url))
            sa.track("u1", "Bought", {"price": 3}, is_login_id=True)
            sa.track_signup("u1", "anon-1")
            sa.profile_set("u1", {"name": "n"}, is_login_id=True)
            sa.profile_set_once("u1", {"first": "x"}, is_login_id=True)
            sa.profile_increment("u1", {"visits": 1}, is_login_id=True)
            sa.profile_append("u1", {"tags": ["a"]}, is_login_id=True)
            sa.profile_unset("u1", ["name"], is_login_id=True)
            sa.profile_delete("u1", is_login_id=True)
            sa.item_set("book", "b1", {"pages": 10})
            sa.item_delete("book", "b1")
            sa.close()
            batch = sensorsanalytics.SensorsAnalytics(sensorsanalytics.BatchConsumer(url, max_size=3))
            for i in range(7):
                batch.track("u2", "Batch", {"i": i})
            batch.close()
            print("sent")
            """
        let result = try run(
            "/usr/bin/env", ["python3", "-c", client, collector.url, Paths.packageRoot + "/.build/python-packages"])
        #expect(result.stdout == "sent\n", "\(result.stderr)")
        let events = try collector.events()
        var types: [String: Int] = [:]
        for event in events { types[event["type"] as? String ?? "?", default: 0] += 1 }
        #expect(
            types == [
                "track": 8, "track_signup": 1, "profile_set": 1, "profile_set_once": 1, "profile_increment": 1,
                "profile_append": 1, "profile_unset": 1, "profile_delete": 1, "item_set": 1, "item_delete": 1,
            ])
        #expect(events.filter { $0["event"] as? String == "Batch" }.count == 7)
    }

    /// What the official Java SDK (3.6.8, `BatchConsumer`) sent for one call of each of its
    /// record methods, in its shape and form, with `lib` and some properties shortened:
    /// `gzip=1`, no `crc`, `_track_id` and no `event_id`, the identity records and the schema
    /// API's detail records.
    @Test func theJavaSDKsBatchIsAccepted() throws {
        let lib = #""lib":{"$lib":"Java","$lib_method":"code","$lib_version":"3.6.8"}"#
        let records = [
            #"{"_track_id":676409829,\#(lib),"distinct_id":"u-batch","time":1795443210461,"type":"track","event":"check_event","properties":{"$lib":"Java","tag":"batch","$lib_version":"3.6.8"}}"#,
            #"{"_track_id":-939320222,\#(lib),"distinct_id":"login-batch","time":1795443210461,"original_id":"u-batch","type":"track_signup","event":"$SignUp","properties":{"$lib":"Java","tag":"batch"}}"#,
            #"{"_track_id":818592734,\#(lib),"distinct_id":"u-batch","time":1795443210462,"type":"profile_set","properties":{"tag":"batch"}}"#,
            #"{"_track_id":-292585991,\#(lib),"distinct_id":"u-batch","time":1795443210462,"type":"profile_set_once","properties":{"tag":"batch"}}"#,
            #"{"_track_id":-394491629,\#(lib),"distinct_id":"u-batch","time":1795443210462,"type":"profile_increment","properties":{"count":1}}"#,
            #"{"_track_id":1027949714,\#(lib),"distinct_id":"u-batch","time":1795443210462,"type":"profile_append","properties":{"list":["x","y"]}}"#,
            #"{"_track_id":347898989,\#(lib),"distinct_id":"u-batch","time":1795443210462,"type":"profile_unset","properties":{"tag":true}}"#,
            #"{"_track_id":1477059470,\#(lib),"distinct_id":"u-batch","time":1795443210462,"type":"profile_delete","properties":{}}"#,
            #"{\#(lib),"item_id":"b-batch","item_type":"book","time":1795443210463,"type":"item_set","properties":{"tag":"batch"}}"#,
            #"{\#(lib),"item_id":"b-batch","item_type":"book","time":1795443210463,"type":"item_delete","properties":{"tag":"batch"}}"#,
            #"{"_track_id":2085143461,"identities":{"$identity_mobile":"1-batch","$identity_email":"batch@x"},\#(lib),"distinct_id":"$identity_mobile+1-batch","time_free":true,"time":1795443210464,"type":"track_id_bind","event":"$BindID","properties":{"$lib":"Java"}}"#,
            #"{"_track_id":1921409705,"identities":{"$identity_mobile":"1-batch"},\#(lib),"distinct_id":"$identity_mobile+1-batch","time_free":true,"time":1795443210464,"type":"track_id_unbind","event":"$UnbindID","properties":{"$lib":"Java"}}"#,
            #"{"schema":"orders","_track_id":770849719,\#(lib),"time":1795443210465,"id":"d-batch","type":"detail_set","version":"2.0","properties":{"tag":"batch"}}"#,
            #"{"schema":"orders","_track_id":1048875429,\#(lib),"time":1795443210466,"id":"d-batch","type":"detail_delete","version":"2.0","properties":{}}"#,
        ]
        // The SDK's HttpConsumer: gzip, base64, form-encoded, and no crc field.
        let dataList = try WireFormat.gzip(Data("[\(records.joined(separator: ","))]".utf8)).base64EncodedString()
        let body = Data("gzip=1&data_list=\(WireFormat.formEscape(dataList))".utf8)
        let collector = try CollectorProcess()
        let (status, answer) = try collector.request("POST", "/sa", body: body)
        #expect(status == 200, "\(String(decoding: answer, as: UTF8.self))")
        let stored = try collector.events()
        #expect(stored.count == records.count)
        #expect(Set(stored.compactMap { $0["type"] as? String }).isSuperset(of: ["detail_set", "detail_delete"]))
        // The SDK sends a failed batch again as it was: nothing is stored twice.
        let (again, _) = try collector.request("POST", "/sa", body: body)
        #expect(again == 200)
        #expect(try collector.events().count == records.count)
    }

    /// A small body is decoded on the event loop only up to 256 KiB inflated; one that inflates
    /// further (here about 1 MiB from a few KiB) is decoded again on a decoder thread and stored.
    @Test func aSmallBodyThatInflatesFarIsStillStored() throws {
        let padding = String(repeating: "z", count: 2000)
        let events = (0..<500).map {
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event_id":"far-\#($0)","event":"e","properties":{"p":"\#(padding)"}}"#
        }
        let body = try WireFormat.encode(events: events)
        #expect(body.count < IngestCollector.bodyDecodedOnLoop)
        let collector = try CollectorProcess()
        let (status, answer) = try collector.request("POST", "/sa", body: body)
        #expect(status == 200, "\(String(decoding: answer, as: UTF8.self))")
        #expect(try collector.events().count == 500)
    }

    /// The web SDK's image beacon: one record in the query, its checksum in `ext`, a GIF back.
    @Test func theWebBeaconIsAccepted() throws {
        let collector = try CollectorProcess()
        let record =
            #"{"type":"track","event":"$pageview","distinct_id":"w1","time":1,"_track_id":5,"properties":{"$url":"x"}}"#
        let data = Data(record.utf8).base64EncodedString()
        let ext = WireFormat.formEscape("crc=\(WireFormat.javaHashCode(data))")
        let (status, body) = try collector.get("/sa.gif?project=default&data=\(WireFormat.formEscape(data))&ext=\(ext)")
        #expect(status == 200 && body.prefix(6) == Data("GIF89a".utf8))
        let (again, _) = try collector.get("/sa.gif?data=\(WireFormat.formEscape(data))")
        #expect(again == 200)
        #expect(try collector.events().count == 1, "the same _track_id, distinct_id and time is stored once")
        let (bad, _) = try collector.get("/sa.gif?data=\(WireFormat.formEscape(data))&ext=crc%3D1")
        #expect(bad == 400)
    }

    @Test func badArgumentsAreClearErrors() throws {
        let busy = try CollectorProcess()
        let port = String(busy.base.split(separator: ":").last!)
        let database = makeTemporaryDirectory("busy") + "/x.db"
        let result = try run(Paths.crashcap, ["collect", "--port", port, "--db", database])
        #expect(result.exitCode == 69)
        #expect(result.stderr.contains("cannot listen"))
        #expect(!FileManager.default.fileExists(atPath: database), "a collector that cannot listen leaves no database")
        let noDB = try run(Paths.crashcap, ["collect"])
        #expect(noDB.exitCode != 0 && noDB.stderr.contains("--db"))
    }
}

private final class Answers: @unchecked Sendable {  // every access holds `lock`
    private let lock = NSLock()
    private var answers: [String] = []
    func add(_ answer: String) { lock.withLock { answers.append(answer) } }
    var all: [String] { lock.withLock { answers } }
}
