internal import Foundation

/// A strict, single-pass JSON validator for upload batches: checks the whole grammar (RFC 8259)
/// of an array of objects and returns, per event, its exact text and the three fields the
/// collector needs. Foundation's parser builds a whole object tree to answer the same question,
/// at a fraction of the speed.
struct JSONScanner {
    /// Where an event is, and where the members the collector reads are: each a range of the
    /// scanned bytes (a value's whole token, quotes included), not a string made at once. A
    /// batch's events are copied as they are collected, and ranges copy without reference
    /// counting (strings here were a tenth of the scan's time).
    struct Event {
        var text: Range<Int>
        /// `event_id`, when it is a string.
        var eventID: Range<Int>?
        var hasEventName = false
        var hasProperties = false
        /// The record type ("track", "profile_set", ...), when it is a string.
        var type: Range<Int>?
        /// The Sensors SDKs' own id for a record (`_track_id`, a number).
        var trackID: Range<Int>?
        /// distinct_id and time as they are written (for the de-duplication key without event_id).
        var distinctID: Range<Int>?
        var time: Range<Int>?
        /// The members a ClickHouse row has columns for (`ClickHouseRows`), each a whole token.
        var eventName: Range<Int>?
        var sessionID: Range<Int>?
        var properties: Range<Int>?
        /// The whole `"properties": {...}` member, key included.
        var propertiesMember: Range<Int>?
        var columns = PropertyColumns()
    }

    /// Members of `properties` that become columns of their own.
    struct PropertyColumns {
        var appName: Range<Int>?
        var appVersion: Range<Int>?
        var crashFingerprint: Range<Int>?
        var crashTitle: Range<Int>?
    }

    struct Failure: Error, CustomStringConvertible {
        let offset: Int
        let reason: String
        var description: String { "invalid JSON at byte \(offset): \(reason)" }
    }

    /// Scanned through a buffer pointer: every byte read is bounds-checked by the grammar's own
    /// `index < bytes.count` tests, with no array reference counting on the way.
    private let bytes: UnsafeBufferPointer<UInt8>
    private var index = 0
    /// The top-level keys of the event being scanned (kept between events, emptied for each).
    private var keys: [Range<Int>] = []
    /// The index in `keys` of the last key written with escapes, -1 for none yet.
    private var lastEscapedKey = -1
    /// True while the scan is inside an event's `properties`, whose column members it notes.
    private var inProperties = false
    private var columns = PropertyColumns()
    private static let maximumDepth = 64

    private init(_ bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

    /// The records of a batch (a JSON array of objects) or, with `single`, of one object.
    static func events(in buffer: UnsafeBufferPointer<UInt8>, single: Bool = false) throws -> [Event] {
        if let bad = firstInvalidUTF8(buffer) { throw Failure(offset: bad, reason: "not UTF-8") }
        var scanner = JSONScanner(buffer)
        guard single else { return try scanner.array() }
        scanner.skipSpace()
        let event = try scanner.event()
        scanner.skipSpace()
        guard scanner.index == buffer.count else { throw scanner.fail("data after the object") }
        return [event]
    }

    /// JSON text is UTF-8 (RFC 8259): no stray continuation bytes, overlong forms, surrogates or
    /// code points past U+10FFFF. Returns the offset of the first bad byte.
    static func firstInvalidUTF8(_ bytes: UnsafeBufferPointer<UInt8>) -> Int? {
        var index = 0
        let raw = UnsafeRawBufferPointer(bytes)
        while index < bytes.count {
            // Eight ASCII bytes at a time, the common case.
            if index + 8 <= bytes.count,
                raw.loadUnaligned(fromByteOffset: index, as: UInt64.self) & 0x8080_8080_8080_8080 == 0
            {
                index += 8
                continue
            }
            let lead = bytes[index]
            if lead < 0x80 {
                index += 1
                continue
            }
            let length: Int
            var low: UInt8 = 0x80
            var high: UInt8 = 0xbf
            switch lead {
            case 0xc2...0xdf: length = 2
            case 0xe0:
                length = 3
                low = 0xa0
            case 0xe1...0xec, 0xee...0xef: length = 3
            case 0xed:
                length = 3
                high = 0x9f
            case 0xf0:
                length = 4
                low = 0x90
            case 0xf1...0xf3: length = 4
            case 0xf4:
                length = 4
                high = 0x8f
            default: return index
            }
            guard index + length <= bytes.count else { return index }
            guard bytes[index + 1] >= low && bytes[index + 1] <= high else { return index }
            for offset in 2..<max(2, length) where bytes[index + offset] & 0xc0 != 0x80 { return index }
            index += length
        }
        return nil
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

    /// Consumes `close` when the container is empty.
    private mutating func closesAtOnce(_ close: UInt8) -> Bool {
        skipSpace()
        guard index < bytes.count, bytes[index] == close else { return false }
        index += 1
        return true
    }

    /// After a member: true when a comma says another follows, false at `close`.
    private mutating func another(_ close: UInt8) throws -> Bool {
        skipSpace()
        guard index < bytes.count else { throw fail("unterminated object or array") }
        if bytes[index] == UInt8(ascii: ",") {
            index += 1
            return true
        }
        try expect(close)
        return false
    }

    private mutating func array() throws -> [Event] {
        try expect(UInt8(ascii: "["))
        var events: [Event] = []
        events.reserveCapacity(64)
        if !closesAtOnce(UInt8(ascii: "]")) {
            repeat {
                skipSpace()
                events.append(try event())
            } while try another(UInt8(ascii: "]"))
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
        keys.removeAll(keepingCapacity: true)
        lastEscapedKey = -1
        columns = PropertyColumns()
        var seen: (UInt64, UInt64) = (0, 0)
        if !closesAtOnce(UInt8(ascii: "}")) {
            repeat {
                skipSpace()
                let memberStart = index
                let key = try string()
                try refuseRepeated(key.contents, seen: &seen)
                try expect(UInt8(ascii: ":"))
                skipSpace()
                let valueStart = index
                let first = index < bytes.count ? bytes[index] : 0
                inProperties = !key.escaped && key.contents.count == 10 && spells(key.contents, "properties")
                try value(depth: 1)
                inProperties = false
                // A key written with escapes is taken as some other key.
                if key.escaped { continue }
                let value = valueStart..<index
                let isString = first == UInt8(ascii: "\"")
                switch key.contents.count {
                case 4:
                    if spells(key.contents, "type") {
                        if isString { event.type = value }
                    } else if spells(key.contents, "time") {
                        event.time = value
                    }
                case 5:
                    if spells(key.contents, "event") {
                        event.hasEventName = isString
                        event.eventName = value
                    }
                case 8: if spells(key.contents, "event_id"), isString { event.eventID = value }
                case 9: if spells(key.contents, "_track_id") { event.trackID = value }
                case 10:
                    if spells(key.contents, "properties") {
                        event.hasProperties = first == UInt8(ascii: "{")
                        event.properties = value
                        event.propertiesMember = memberStart..<index
                        event.columns = columns
                    } else if spells(key.contents, "session_id") {
                        event.sessionID = value
                    }
                case 11: if spells(key.contents, "distinct_id") { event.distinctID = value }
                default: break
                }
            } while try another(UInt8(ascii: "}"))
        }
        event.text = start..<index
        return event
    }

    /// An object that names a key twice is refused: JSON readers differ on which value counts,
    /// and de-duplication would read one while the store keeps the other. Keys are compared as
    /// written (one spelled with escapes is another key), by length first.
    /// Nested objects too (`properties` above all): `keys` is a stack, each object's keys above
    /// `from`, the index where that object's keys begin. `seen` is the object's 128-bit filter of
    /// the keys so far (by length and end bytes): only a key that may repeat is compared.
    private mutating func refuseRepeated(_ key: Range<Int>, from start: Int = 0, seen: inout (UInt64, UInt64))
        throws
    {
        let base = bytes.baseAddress!
        let first = key.isEmpty ? 0 : base[key.lowerBound]
        let last = key.isEmpty ? 0 : base[key.upperBound - 1]
        let hash = (UInt64(key.count) &* 31 &+ UInt64(first) &* 7 &+ UInt64(last)) & 127
        let bit = UInt64(1) << (hash & 63)
        let maybe = hash < 64 ? seen.0 & bit != 0 : seen.1 & bit != 0
        if hash < 64 { seen.0 |= bit } else { seen.1 |= bit }
        if maybe {
            for index in start..<keys.count {
                let other = keys[index]
                if other.count == key.count, memcmp(base + other.lowerBound, base + key.lowerBound, key.count) == 0 {
                    let name = String(decoding: UnsafeBufferPointer(rebasing: bytes[key]), as: UTF8.self)
                    throw Failure(offset: key.lowerBound, reason: "key \"\(name)\" twice in one object")
                }
            }
        }
        // A key written with escapes (`\u0065vent`) is the key it decodes to: compared decoded,
        // with every key of the object, and theirs decoded too. Rare, so slow.
        let escaped = memchr(base + key.lowerBound, 0x5c, key.count) != nil
        // Only where this object may hold a key with escapes: its own index is at `start` or above
        // (a stale one from a closed object only costs the slow path).
        if escaped || lastEscapedKey >= start {
            let decoded = Self.decodedString((key.lowerBound - 1)..<(key.upperBound + 1), in: bytes)
            for index in start..<keys.count {
                let other = keys[index]
                guard memchr(base + other.lowerBound, 0x5c, other.count) != nil || escaped else { continue }
                if Self.decodedString((other.lowerBound - 1)..<(other.upperBound + 1), in: bytes) == decoded {
                    let name = String(decoding: UnsafeBufferPointer(rebasing: bytes[key]), as: UTF8.self)
                    throw Failure(offset: key.lowerBound, reason: "key \"\(name)\" twice in one object (as decoded)")
                }
            }
        }
        if escaped { lastEscapedKey = keys.count }
        keys.append(key)
    }

    private mutating func noteColumn(_ key: Range<Int>, _ value: Range<Int>) {
        switch key.count {
        case 9: if spells(key, "$app_name") { columns.appName = value }
        case 11:
            if spells(key, "crash_title") { columns.crashTitle = value }
        case 12: if spells(key, "$app_version") { columns.appVersion = value }
        case 17: if spells(key, "crash_fingerprint") { columns.crashFingerprint = value }
        default: break
        }
    }

    /// Whether the bytes in `range` are `word` (the caller has matched the length).
    private func spells(_ range: Range<Int>, _ word: StaticString) -> Bool {
        memcmp(bytes.baseAddress! + range.lowerBound, word.utf8Start, word.utf8CodeUnitCount) == 0
    }

    private mutating func value(depth: Int) throws {
        guard depth <= Self.maximumDepth else { throw fail("nested deeper than \(Self.maximumDepth)") }
        skipSpace()
        guard index < bytes.count else { throw fail("missing value") }
        switch bytes[index] {
        case UInt8(ascii: "\""): try string()
        case UInt8(ascii: "{"):
            index += 1
            if closesAtOnce(UInt8(ascii: "}")) { return }
            let start = keys.count
            var seen: (UInt64, UInt64) = (0, 0)
            defer { keys.removeLast(keys.count - start) }
            let noting = depth == 1 && inProperties
            inProperties = false
            repeat {
                skipSpace()
                let key = try string()
                try refuseRepeated(key.contents, from: start, seen: &seen)
                try expect(UInt8(ascii: ":"))
                skipSpace()
                let valueStart = index
                try value(depth: depth + 1)
                if noting && !key.escaped { noteColumn(key.contents, valueStart..<index) }
            } while try another(UInt8(ascii: "}"))
        case UInt8(ascii: "["):
            index += 1
            if closesAtOnce(UInt8(ascii: "]")) { return }
            repeat {
                try value(depth: depth + 1)
            } while try another(UInt8(ascii: "]"))
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
        let start = index
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
        var exponent = false
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            exponent = true
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                index += 1
            }
            guard digits() > 0 else { throw fail("bad exponent") }
        }
        // Grammatical, but no double holds it: the analytics downstream could not store it either.
        if exponent || index - start > 17 {
            guard let value = Double(String(decoding: bytes[start..<index], as: UTF8.self)), value.isFinite else {
                throw Failure(offset: start, reason: "number out of range")
            }
        }
    }

    /// A string token: where its contents are (escapes checked, not decoded), and whether it
    /// has any escape.
    @discardableResult
    private mutating func string() throws -> (contents: Range<Int>, escaped: Bool) {
        guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a string") }
        index += 1
        let start = index
        var escaped = false
        let raw = UnsafeRawBufferPointer(bytes)
        while index < bytes.count {
            // Eight bytes at a time, straight to the first that ends the string or escapes: most
            // of a batch is string contents, much of it short keys and values.
            while index + 8 <= bytes.count {
                let stops = Self.stopMask(
                    UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: index, as: UInt64.self)))
                if stops == 0 {
                    index += 8
                    continue
                }
                index += stops.trailingZeroBitCount >> 3
                break
            }
            guard index < bytes.count else { break }
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
                    let unit = try hexUnit(at: index + 1)
                    index += 5
                    // UTF-16 surrogates only in pairs, high then low: a lone one is not text.
                    if (0xdc00...0xdfff).contains(unit) { throw fail("lone low surrogate escape") }
                    if (0xd800...0xdbff).contains(unit) {
                        guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                            bytes[index + 1] == UInt8(ascii: "u"),
                            (0xdc00...0xdfff).contains(try hexUnit(at: index + 2))
                        else { throw fail("lone high surrogate escape") }
                        index += 6
                    }
                default: throw fail("bad escape")
                }
                continue
            }
            if byte == UInt8(ascii: "\"") {
                let contents = start..<index
                index += 1
                return (contents, escaped)
            }
            guard byte >= 0x20 else { throw fail("control character in a string") }
            index += 1
        }
        throw fail("unterminated string")
    }

    /// The bytes a string scan must stop at, a quote, a backslash or a control character (below
    /// 0x20), each marked by its high bit, in a little-endian word. Each test is SWAR's
    /// "has a byte below n": a borrow only runs upward from a byte that matched, so the lowest
    /// bit set is always exact (a byte above it may be flagged wrongly; the scan never looks
    /// past the lowest).
    static func stopMask(_ word: UInt64) -> UInt64 {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        func below(_ value: UInt64, _ limit: UInt64) -> UInt64 { (value &- ones &* limit) & ~value & highs }
        return below(word, 0x20) | below(word ^ (ones &* 0x22), 1) | below(word ^ (ones &* 0x5c), 1)
    }

    /// The four hex digits of a \\u escape starting at `position`.
    private func hexUnit(at position: Int) throws -> UInt32 {
        guard position + 4 <= bytes.count else { throw fail("bad \\u escape") }
        var unit: UInt32 = 0
        for byte in bytes[position..<position + 4] {
            guard byte.isHexDigit else { throw fail("bad \\u escape") }
            unit = unit << 4 | UInt32(byte <= 0x39 ? byte - 0x30 : (byte | 0x20) - 0x57)
        }
        return unit
    }

    /// The value of a string token (quotes included in `range`), escapes decoded.
    /// The string a token spells; nil when the token is not a string (a number, an object).
    static func decodedString(_ range: Range<Int>, in bytes: UnsafeBufferPointer<UInt8>) -> String? {
        guard range.count >= 2, bytes[range.lowerBound] == UInt8(ascii: "\"") else { return nil }
        let inner = UnsafeBufferPointer(rebasing: bytes[(range.lowerBound + 1)..<(range.upperBound - 1)])
        if !inner.contains(UInt8(ascii: "\\")) { return String(decoding: inner, as: UTF8.self) }
        return
            (try? JSONSerialization.jsonObject(
                with: Data(UnsafeBufferPointer(rebasing: bytes[range])), options: .fragmentsAllowed))
            as? String
    }

    /// A token as it is written.
    static func text(_ range: Range<Int>, in bytes: UnsafeBufferPointer<UInt8>) -> String {
        String(decoding: UnsafeBufferPointer(rebasing: bytes[range]), as: UTF8.self)
    }
}

extension UInt8 {
    fileprivate var isHexDigit: Bool {
        (self >= 0x30 && self <= 0x39) || (self >= 0x41 && self <= 0x46) || (self >= 0x61 && self <= 0x66)
    }
}
