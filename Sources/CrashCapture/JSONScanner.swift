import Foundation

/// A strict, single-pass JSON validator for upload batches: checks the whole grammar (RFC 8259)
/// of an array of objects and returns, per event, its exact text and the three fields the
/// collector needs. Foundation's parser builds a whole object tree to answer the same question,
/// at a fraction of the speed.
struct JSONScanner {
    struct Event {
        var text: Range<Int>
        var eventID: String?
        var hasEventName = false
        var hasProperties = false
    }

    struct Failure: Error, CustomStringConvertible {
        let offset: Int
        let reason: String
        var description: String { "invalid JSON at byte \(offset): \(reason)" }
    }

    private let bytes: [UInt8]
    private var index = 0
    private static let maximumDepth = 64

    private init(_ bytes: [UInt8]) { self.bytes = bytes }

    static func events(in bytes: [UInt8]) throws -> [Event] {
        var scanner = JSONScanner(bytes)
        return try scanner.array()
    }

    private func fail(_ reason: String) -> Failure { Failure(offset: index, reason: reason) }

    private mutating func skipSpace() {
        while index < bytes.count,
            bytes[index] == 0x20 || bytes[index] == 0x0a || bytes[index] == 0x0d || bytes[index] == 0x09
        {
            index += 1
        }
    }

    private mutating func expect(_ byte: UInt8) throws {
        skipSpace()
        guard index < bytes.count, bytes[index] == byte else {
            throw fail("expected '\(Character(UnicodeScalar(byte)))'")
        }
        index += 1
    }

    private mutating func array() throws -> [Event] {
        try expect(UInt8(ascii: "["))
        var events: [Event] = []
        skipSpace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
        } else {
            while true {
                skipSpace()
                events.append(try event())
                skipSpace()
                guard index < bytes.count else { throw fail("unterminated array") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                    continue
                }
                try expect(UInt8(ascii: "]"))
                break
            }
        }
        skipSpace()
        guard index == bytes.count else { throw fail("data after the array") }
        return events
    }

    /// One top-level object, noting event_id, event and properties on the way.
    private mutating func event() throws -> Event {
        let start = index
        var event = Event(text: start..<start)
        try expect(UInt8(ascii: "{"))
        skipSpace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
        } else {
            while true {
                skipSpace()
                let key = try string()
                try expect(UInt8(ascii: ":"))
                skipSpace()
                let valueStart = index
                let first = index < bytes.count ? bytes[index] : 0
                try value(depth: 1)
                switch key {
                case "event_id" where first == UInt8(ascii: "\""): event.eventID = decodedString(valueStart..<index)
                case "event": event.hasEventName = first == UInt8(ascii: "\"")
                case "properties": event.hasProperties = first == UInt8(ascii: "{")
                default: break
                }
                skipSpace()
                guard index < bytes.count else { throw fail("unterminated object") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                    continue
                }
                try expect(UInt8(ascii: "}"))
                break
            }
        }
        event.text = start..<index
        return event
    }

    private mutating func value(depth: Int) throws {
        guard depth <= Self.maximumDepth else { throw fail("nested deeper than \(Self.maximumDepth)") }
        skipSpace()
        guard index < bytes.count else { throw fail("missing value") }
        switch bytes[index] {
        case UInt8(ascii: "\""): _ = try string()
        case UInt8(ascii: "{"):
            index += 1
            skipSpace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
                index += 1
                return
            }
            while true {
                skipSpace()
                _ = try string()
                try expect(UInt8(ascii: ":"))
                try value(depth: depth + 1)
                skipSpace()
                guard index < bytes.count else { throw fail("unterminated object") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                    continue
                }
                try expect(UInt8(ascii: "}"))
                return
            }
        case UInt8(ascii: "["):
            index += 1
            skipSpace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
                index += 1
                return
            }
            while true {
                try value(depth: depth + 1)
                skipSpace()
                guard index < bytes.count else { throw fail("unterminated array") }
                if bytes[index] == UInt8(ascii: ",") {
                    index += 1
                    continue
                }
                try expect(UInt8(ascii: "]"))
                return
            }
        case UInt8(ascii: "t"): try literal("true")
        case UInt8(ascii: "f"): try literal("false")
        case UInt8(ascii: "n"): try literal("null")
        default: try number()
        }
    }

    private mutating func literal(_ word: String) throws {
        for byte in word.utf8 {
            guard index < bytes.count, bytes[index] == byte else { throw fail("expected \(word)") }
            index += 1
        }
    }

    private mutating func digits() -> Int {
        let start = index
        while index < bytes.count, bytes[index] >= 0x30, bytes[index] <= 0x39 { index += 1 }
        return index - start
    }

    private mutating func number() throws {
        if index < bytes.count, bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count else { throw fail("bad number") }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else if digits() == 0 {
            throw fail("unexpected character")
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard digits() > 0 else { throw fail("bad fraction") }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                index += 1
            }
            guard digits() > 0 else { throw fail("bad exponent") }
        }
    }

    /// A string's contents (escapes checked, not decoded), returned for keys.
    private mutating func string() throws -> String {
        guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a string") }
        index += 1
        let start = index
        var escaped = false
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\\") {
                escaped = true
                index += 1
                guard index < bytes.count else { break }
                switch bytes[index] {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"), UInt8(ascii: "b"), UInt8(ascii: "f"),
                    UInt8(ascii: "n"), UInt8(ascii: "r"), UInt8(ascii: "t"):
                    index += 1
                case UInt8(ascii: "u"):
                    for offset in 1...4 {
                        guard index + offset < bytes.count, bytes[index + offset].isHexDigit else {
                            throw fail("bad \\u escape")
                        }
                    }
                    index += 5
                default: throw fail("bad escape")
                }
                continue
            }
            if byte == UInt8(ascii: "\"") {
                let text = escaped ? "" : String(decoding: bytes[start..<index], as: UTF8.self)
                index += 1
                return text
            }
            guard byte >= 0x20 else { throw fail("control character in a string") }
            index += 1
        }
        throw fail("unterminated string")
    }

    /// The value of a string token (quotes included in `range`), escapes decoded.
    private func decodedString(_ range: Range<Int>) -> String? {
        let inner = bytes[(range.lowerBound + 1)..<(range.upperBound - 1)]
        if !inner.contains(UInt8(ascii: "\\")) { return String(decoding: inner, as: UTF8.self) }
        return (try? JSONSerialization.jsonObject(with: Data(bytes[range]), options: .fragmentsAllowed)) as? String
    }
}

extension UInt8 {
    fileprivate var isHexDigit: Bool {
        (self >= 0x30 && self <= 0x39) || (self >= 0x41 && self <= 0x46) || (self >= 0x61 && self <= 0x66)
    }
}
