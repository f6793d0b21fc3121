import CrashCapture
import CrashFileFormat
import Foundation
import TestSupport
import Testing

@testable import CrashCaptureCollector

@Suite struct JSONScannerTests {
    func events(_ json: String) throws -> [(id: String, text: String)] {
        let data = Data(json.utf8).base64EncodedString()
        let form = "crc=\(WireFormat.javaHashCode(data))&gzip=0&data_list=\(WireFormat.formEscape(data))"
        return try WireFormat.decodeEvents(body: Data(form.utf8))
    }

    /// The eight-bytes-at-a-time string scan stops exactly where the byte-wise one would:
    /// every byte value in every position, and random words (UTF-8 lead bytes included).
    @Test func theWordAtATimeScanStopsAtEveryByteItMust() {
        func stops(_ byte: UInt8) -> Bool { byte < 0x20 || byte == 0x22 || byte == 0x5c }
        for position in 0..<8 {
            for value in 0...255 {
                var bytes = [UInt8](repeating: UInt8(ascii: "a"), count: 8)
                bytes[position] = UInt8(value)
                let word = bytes.withUnsafeBytes { $0.loadUnaligned(as: UInt64.self) }
                #expect((JSONScanner.stopMask(word) != 0) == stops(UInt8(value)), "byte \(value) at \(position)")
            }
        }
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<100_000 {
            let bytes = (0..<8).map { _ in UInt8.random(in: 0...255, using: &generator) }
            let word = bytes.withUnsafeBytes { $0.loadUnaligned(as: UInt64.self) }
            if (JSONScanner.stopMask(word) != 0) != bytes.contains(where: stops) {
                Issue.record("\(bytes) decided wrongly")
                break
            }
        }
    }

    /// The scan jumps to the lowest byte the mask flags: that byte is always the first that
    /// stops it, whatever follows (bytes above a match may be flagged too).
    @Test func theMasksLowestFlagIsTheFirstStoppingByte() {
        func stops(_ byte: UInt8) -> Bool { byte < 0x20 || byte == 0x22 || byte == 0x5c }
        var generator = SystemRandomNumberGenerator()
        let interesting: [UInt8] = [0x00, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x5b, 0x5c, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff]
        for round in 0..<200_000 {
            let bytes = (0..<8).map { _ in
                round % 2 == 0
                    ? UInt8.random(in: 0...255, using: &generator) : interesting.randomElement(using: &generator)!
            }
            let word = bytes.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(as: UInt64.self)) }
            let mask = JSONScanner.stopMask(word)
            let first = bytes.firstIndex(where: stops)
            if (mask == 0 ? nil : mask.trailingZeroBitCount >> 3) != first {
                Issue.record("\(bytes): mask \(String(mask, radix: 16)), first stop \(String(describing: first))")
                break
            }
        }
    }

    @Test func acceptsWhatJSONAllowsAndKeepsTheText() throws {
        let json = """
             [ {"type":"track","distinct_id":"u","time":1700000000000,"event_id":"a\\u0041","event":"x","properties":{"n":-1.5e3,"t":true,"z":null,"l":[[],{}]}} ,
            {"properties":{},"event":"y","event_id":"b","time":1,"distinct_id":"u","type":"track"}]
            """
        let decoded = try events(json)
        #expect(decoded.map(\.id) == ["aA", "b"])
        #expect(
            decoded[1].text
                == "{\"properties\":{},\"event\":\"y\",\"event_id\":\"b\",\"time\":1,\"distinct_id\":\"u\",\"type\":\"track\"}"
        )
    }

    @Test(arguments: [
        "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":{}",
        "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":{}},]",
        "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"n\":01}}]",
        "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\" \"event\":\"x\"}]",
        "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"s\":\"\\q\"}}]",
        "[1]", "{}", "[] x",
        "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"n\":tru}}]",
        "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"n\":0.5e7777777777}}]",
        "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"s\":\"\\udeee\"}}]",
        "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"s\":\"\\ud83d x\"}}]",
        "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":"
            + String(repeating: "[", count: 100)
            + "]}]",
    ])
    func rejectsWhatJSONDoesNot(json: String) {
        #expect(throws: CrashCaptureError.self) { try events(json) }
    }

    @Test func rejectsInvalidUTF8AsTheFuzzerFoundIt() throws {
        for bad: [UInt8] in [
            [0xde, 0xde], [0xff], [0xc0, 0x80], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xe2, 0x82],
        ] {
            let json =
                Array(
                    "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"s\":\""
                        .utf8) + bad
                + Array("\"}}]".utf8)
            let data = Data(json).base64EncodedString()
            let form = "crc=\(WireFormat.javaHashCode(data))&gzip=0&data_list=\(WireFormat.formEscape(data))"
            #expect(throws: CrashCaptureError.self) { try WireFormat.decodeEvents(body: Data(form.utf8)) }
        }
        let fine = try events(
            "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"é€😀\",\"event\":\"x\",\"properties\":{\"p\":\"\\ud83d\\ude00\"}}]"
        )
        #expect(fine.first?.id == "é€😀")
    }

    @Test func aKeyWrittenWithEscapesIsAnotherKey() throws {
        // "event\u005fid" reads as event_id to a JSON parser, but an uploader that escapes the
        // key it names events by is not one of ours: the record has no id, and its text is its key.
        let escaped = try events(
            "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event\\u005fid\":\"a\",\"event\":\"x\",\"properties\":{}}]"
        )
        #expect(escaped.first?.id.hasPrefix("sa-content:") == true)
        let decoded = try events(
            "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\\u00e9\",\"event\":\"x\",\"properties\":{}}]"
        )
        #expect(decoded.map(\.id) == ["a\u{e9}"], "escapes in the value are decoded")
    }

    @Test func namesTheMissingField() {
        for (json, fragment) in [
            ("[{\"event\":\"x\",\"properties\":{}}]", "has no type"),
            ("[{\"type\":\"tracks\",\"event\":\"x\",\"properties\":{}}]", "unknown type"),
            (
                "[{\"type\":\"track\",\"distinct_id\":\"u\",\"time\":1700000000000,\"event_id\":\"a\",\"properties\":{}}]",
                "has no event name"
            ),
            ("[{\"type\":\"profile_set\",\"distinct_id\":\"u\"}]", "lacks properties"),
        ] {
            do {
                _ = try events(json)
                Issue.record("accepted \(json)")
            } catch {
                #expect("\(error)".contains(fragment), "\(error)")
            }
        }
    }

    /// Without our event_id, the Sensors SDKs' _track_id (with distinct_id and time) is the key;
    /// without either, the record's text.
    @Test func theStrongestKeyPresentIsTheKey() throws {
        let records = try events(
            """
            [{"type":"profile_set","distinct_id":"u1","time":5,"_track_id":77,"properties":{"a":1}},
             {"type":"profile_delete","distinct_id":"u1","time":6},
             {"type":"item_set","item_type":"book","item_id":"b1","time":7,"properties":{"p":1}}]
            """)
        #expect(records[0].id == "sa-track:77:\"u1\":5")
        #expect(records[1].id.hasPrefix("sa-content:") && records[2].id.hasPrefix("sa-content:"))
        #expect(records[1].id != records[2].id)
    }
}
