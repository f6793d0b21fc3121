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

    @Test func acceptsWhatJSONAllowsAndKeepsTheText() throws {
        let json = """
             [ {"event_id":"a\\u0041","event":"x","properties":{"n":-1.5e3,"t":true,"z":null,"l":[[],{}]}} ,
            {"properties":{},"event":"y","event_id":"b"}]
            """
        let decoded = try events(json)
        #expect(decoded.map(\.id) == ["aA", "b"])
        #expect(decoded[1].text == "{\"properties\":{},\"event\":\"y\",\"event_id\":\"b\"}")
    }

    @Test(arguments: [
        "[{\"event_id\":\"a\",\"event\":\"x\",\"properties\":{}",
        "[{\"event_id\":\"a\",\"event\":\"x\",\"properties\":{}},]",
        "[{\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"n\":01}}]", "[{\"event_id\":\"a\" \"event\":\"x\"}]",
        "[{\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"s\":\"\\q\"}}]", "[1]", "{}", "[] x",
        "[{\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"n\":tru}}]",
        "[{\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"n\":0.5e7777777777}}]",
        "[{\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"s\":\"\\udeee\"}}]",
        "[{\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"s\":\"\\ud83d x\"}}]",
        "[{\"event_id\":\"a\",\"event\":\"x\",\"properties\":" + String(repeating: "[", count: 100) + "]}]",
    ])
    func rejectsWhatJSONDoesNot(json: String) {
        #expect(throws: CrashCaptureError.self) { try events(json) }
    }

    @Test func rejectsInvalidUTF8AsTheFuzzerFoundIt() throws {
        for bad: [UInt8] in [
            [0xde, 0xde], [0xff], [0xc0, 0x80], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80], [0xe2, 0x82],
        ] {
            let json =
                Array("[{\"event_id\":\"a\",\"event\":\"x\",\"properties\":{\"s\":\"".utf8) + bad
                + Array("\"}}]".utf8)
            let data = Data(json).base64EncodedString()
            let form = "crc=\(WireFormat.javaHashCode(data))&gzip=0&data_list=\(WireFormat.formEscape(data))"
            #expect(throws: CrashCaptureError.self) { try WireFormat.decodeEvents(body: Data(form.utf8)) }
        }
        let fine = try events("[{\"event_id\":\"é€😀\",\"event\":\"x\",\"properties\":{\"p\":\"\\ud83d\\ude00\"}}]")
        #expect(fine.first?.id == "é€😀")
    }

    @Test func aKeyWrittenWithEscapesIsAnotherKey() throws {
        // "event\u005fid" reads as event_id to a JSON parser, but an uploader that escapes the
        // key it names events by is not one of ours: the event has no id.
        #expect(throws: CrashCaptureError.self) {
            try events("[{\"event\\u005fid\":\"a\",\"event\":\"x\",\"properties\":{}}]")
        }
        let decoded = try events("[{\"event_id\":\"a\\u00e9\",\"event\":\"x\",\"properties\":{}}]")
        #expect(decoded.map(\.id) == ["a\u{e9}"], "escapes in the value are decoded")
    }

    @Test func namesTheMissingField() {
        #expect(throws: CrashCaptureError.self) { try events("[{\"event\":\"x\",\"properties\":{}}]") }
        do {
            _ = try events("[{\"event_id\":\"a\",\"properties\":{}}]")
        } catch {
            #expect("\(error)".contains("lacks event"))
        }
    }
}
