import CrashCapture
import Foundation
import Testing

@testable import CrashCaptureCollector

/// The rows the collector sends to ClickHouse, checked without a server: each row is JSON,
/// its properties and the rest of the record are one record again, whatever the member order.
@Suite struct ClickHouseRowsTests {
    static func rows(_ records: [String]) throws -> [[String: Any]] {
        let body = Data(
            ("data_list=" + "[\(records.joined(separator: ","))]".addingPercentEncoding(
                withAllowedCharacters: .alphanumerics)!)
                .utf8)
        let batch = try WireFormat.decodeBatch(
            body: body, clickHouseRows: true, receivedMilliseconds: 1_764_000_000_000)
        let text = String(decoding: try #require(batch.clickHouseRows), as: UTF8.self)
        return try text.split(separator: "\n").map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any])
        }
    }

    @Test func propertiesAndTheRestMakeTheRecordAgain() throws {
        let records = [
            #"{"properties":{"a":1},"type":"track","distinct_id":"u","time":1700000000000,"event":"first","event_id":"1"}"#,
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event":"last","event_id":"2","properties":{"a":2}}"#,
            #"{ "type" : "track" , "properties" : { "a" : 3 } , "event" : "middle", "event_id":"3", "time" : 1700000000000, "distinct_id" : "u" }"#,
            #"{"type":"track","distinct_id":"u","time":1700000000000,"event":"quoted \"\\ \u00e9","event_id":"4","properties":{"text":"line\nbreak \"q\" \\ \u0001"}}"#,
        ]
        let rows = try Self.rows(records)
        #expect(rows.count == records.count)
        for (row, original) in zip(rows, records) {
            let payload = try #require(row["payload"] as? String)
            let properties = try #require(row["properties"] as? String)
            #expect(!payload.contains("\"properties\""), "\(payload)")
            let whole = ClickHouseRows.record(payload: payload, properties: properties)
            let rebuilt = try JSONSerialization.jsonObject(with: Data(whole.utf8)) as? NSDictionary
            let expected = try JSONSerialization.jsonObject(with: Data(original.utf8)) as? NSDictionary
            #expect(rebuilt == expected, "\(whole)")
        }
        #expect(rows[3]["event"] as? String == "quoted \"\\ \u{e9}")
    }

    @Test func columnsComeFromTheRecordAndItsProperties() throws {
        let rows = try Self.rows([
            #"{"type":"track","event":"$AppCrashed","event_id":"c1","distinct_id":42,"time":1764000000123,"session_id":"s1","properties":{"$app_name":"shop","$app_version":"2.0","crash_fingerprint":"abc","crash_title":"SIGSEGV in f()","nested":{"$app_name":"not this"}}}"#,
            #"{"type":"item_set","item_type":"book","item_id":"b1","time":1764000000124,"properties":{"plan":"pro"}}"#,
        ])
        #expect(rows[0]["event_id"] as? String == "c1")
        #expect(rows[0]["distinct_id"] as? String == "42", "a number as its text")
        #expect((rows[0]["time"] as? NSNumber)?.int64Value == 1_764_000_000_123)
        #expect((rows[0]["event_time"] as? NSNumber)?.int64Value == 1_764_000_000)
        #expect(rows[0]["app_name"] as? String == "shop")
        #expect(rows[0]["app_version"] as? String == "2.0")
        #expect(rows[0]["crash_fingerprint"] as? String == "abc")
        #expect(rows[0]["crash_title"] as? String == "SIGSEGV in f()")
        #expect(rows[0]["session_id"] as? String == "s1")
        #expect(rows[1]["distinct_id"] as? String == "", "an item names no user")
        #expect((rows[1]["time"] as? NSNumber)?.int64Value == 1_764_000_000_124)
        #expect((rows[1]["received_at"] as? NSNumber)?.int64Value == 1_764_000_000)
    }
}
