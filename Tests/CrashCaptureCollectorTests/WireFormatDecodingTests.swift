import CrashCaptureCollector
import CrashFileFormat
import Foundation
import TestSupport
import Testing

@testable import CrashCapture

@Suite struct WireFormatTests {
    @Test func javaHashCodeMatchesJava() {
        #expect(WireFormat.javaHashCode("hello") == 99_162_322)
        #expect(WireFormat.javaHashCode("") == 0)
        #expect(WireFormat.javaHashCode("Hello, World!") == 1_498_789_909)
        #expect(WireFormat.javaHashCode(String(repeating: "a", count: 40)) == 1_042_809_472)
    }

    @Test func roundTripsABatch() throws {
        let events = (0..<50).map { "{\"event_id\":\"id\($0)\",\"event\":\"e\",\"properties\":{\"n\":\($0)}}" }
        let body = try WireFormat.encode(events: events)
        let text = String(decoding: body, as: UTF8.self)
        #expect(text.hasPrefix("crc="))
        #expect(text.contains("&gzip=1&data_list="))
        let decoded = try WireFormat.decode(body: body)
        #expect(decoded.map { $0["event_id"] as? String } == (0..<50).map { "id\($0)" })
    }

    @Test func aMemberIsAddedToEveryObjectEvenAnEmptyOne() throws {
        let body = try WireFormat.encode(events: ["{\"a\":1}", "{}"], addingToEach: "\"_flush_time\":7")
        let text = String(
            decoding: try WireFormat.jsonPayload(body: body, maximumInflated: 1 << 20).json, as: UTF8.self)
        #expect(text == "[{\"a\":1,\"_flush_time\":7},{\"_flush_time\":7}]")
    }

    func expectError(_ body: String, _ fragment: String) {
        do {
            _ = try WireFormat.decode(body: Data(body.utf8))
            Issue.record("decoded \(body.prefix(60))")
        } catch {
            #expect("\(error)".contains(fragment), "\(error)")
        }
    }

    @Test func everyMalformedBodyIsAClearError() throws {
        let good = String(decoding: try WireFormat.encode(events: ["{\"event_id\":\"a\"}"]), as: UTF8.self)
        expectError(good.replacingOccurrences(of: "crc=", with: "crc=1"), "crc")
        expectError("gzip=1&data_list=abc", "base64")
        expectError("crc=0&gzip=1", "no data_list or data field")
        expectError("data=" + WireFormat.formEscape(Data("[1]".utf8).base64EncodedString()), "not a JSON object")
        let notBase64 = "!!!"
        expectError("crc=\(WireFormat.javaHashCode(notBase64))&gzip=1&data_list=!!!", "base64")
        let notGzip = Data("hello".utf8).base64EncodedString()
        expectError("crc=\(WireFormat.javaHashCode(notGzip))&gzip=1&data_list=\(notGzip)", "gzip")
        let notArray = try WireFormat.gzip(Data("{\"a\":1}".utf8)).base64EncodedString()
        expectError(
            "crc=\(WireFormat.javaHashCode(notArray))&gzip=1&data_list=\(WireFormat.formEscape(notArray))",
            "not a JSON array")
    }

    @Test func formFieldsAreDecodedByteByByte() throws {
        // Escaping: letters, digits and -._* stay; everything else, multi-byte UTF-8 included, is %XX.
        #expect(WireFormat.formEscape("aZ09-._* +/=é") == "aZ09-._*%20%2B%2F%3D%C3%A9")
        // "+" is a space, %XX a byte (either case), and a % without two hex digits is no field.
        #expect(WireFormat.formUnescape(Array("a+b%41%c3%A9".utf8)[...]) == Array("a bAé".utf8))
        #expect(WireFormat.formUnescape(Array("%4".utf8)[...]) == nil)
        let data = Data("[{\"event_id\":\"a\",\"event\":\"e\",\"properties\":{}}]".utf8).base64EncodedString()
        let crc = WireFormat.javaHashCode(data)
        #expect(
            try WireFormat.decode(body: Data("gzip=0&data_list=\(WireFormat.formEscape(data))&crc=\(crc)".utf8)).count
                == 1)
        expectError("crc=\(crc)&gzip=0&data_list=%zz", "malformed form field")
        expectError("crc=\(crc)&gzip=0&data_list=%4", "malformed form field")
        expectError("crc=\(crc)&gzip=0&data_list", "malformed form field")
        expectError("crc=\(crc)&gzip=0&data_list=%FF", "malformed form field")
        expectError("crc=x&gzip=0&data_list=\(WireFormat.formEscape(data))", "32-bit")
        expectError("crc=\(crc)&gzip=2&data_list=\(WireFormat.formEscape(data))", "gzip must be")
        // The iOS SDK's encrypted form names the option to turn off.
        expectError("crc=\(crc)&gzip=9&data_list=\(WireFormat.formEscape(data))", "encrypted batch")
        // Base64 broken into lines, CR LF or LF alone, checksummed as sent.
        for lineEnd in ["\r\n", "\n"] {
            // Ids that do not compress, so that the base64 runs over several lines.
            let ids = (0..<8).map { _ in UUID().uuidString }
            let zipped = try WireFormat.gzip(
                Data("[{\"event_id\":\"lines\",\"ids\":\"\(ids.joined(separator: ","))\"}]".utf8))
            let lines = zipped.base64EncodedString(options: [.lineLength64Characters])
                .replacingOccurrences(of: "\r\n", with: lineEnd)
            #expect(lines.contains(lineEnd))
            let body = "crc=\(WireFormat.javaHashCode(lines))&gzip=1&data_list=\(WireFormat.formEscape(lines))"
            #expect(try WireFormat.decode(body: Data(body.utf8)).first?["event_id"] as? String == "lines")
        }
        do {
            _ = try WireFormat.decode(body: Data([0x63, 0x72, 0x63, 0x3d, 0xff]))
            Issue.record("a body that is not UTF-8 was decoded")
        } catch {
            #expect("\(error)".contains("not UTF-8"), "\(error)")
        }
    }

    @Test func inflationIsBounded() throws {
        let bomb = try WireFormat.gzip(Data(count: 4 << 20))
        #expect(bomb.count < 10_000)
        #expect(throws: CrashCaptureError.self) { try WireFormat.gunzip(bomb, maximumBytes: 1 << 20) }
        #expect(try WireFormat.gunzip(bomb, maximumBytes: 8 << 20).count == 4 << 20)
    }
}

@Suite struct WireFormatElementTests {
    @Test func eventsKeepTheirOwnTextThroughDecoding() throws {
        let events = [
            "{\"event_id\":\"a\",\"s\":\"comma, bracket ] brace } quote \\\" end\"}",
            "{\"event_id\":\"b\",\"list\":[1,[2],{\"x\":3}]}",
        ]
        let decoded = try WireFormat.decodeWithText(body: try WireFormat.encode(events: events))
        #expect(decoded.map(\.text) == events)
        #expect(decoded.map { $0.object["event_id"] as? String } == ["a", "b"])
    }
}
