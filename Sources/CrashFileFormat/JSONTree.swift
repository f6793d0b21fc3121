internal import Foundation

/// Parses JSON text into the tree `JSONSerialization` gives (String, NSNumber, NSNull, `[Any]`,
/// `[String: Any]`), as strictly as RFC 8259 asks (UTF-8 only, no trailing commas, which
/// Foundation on Linux lets through). Foundation's parser was the largest part of a replay
/// (`perf record -g crashcap-bench replay`).
public enum JSONTree: Sendable {
    public struct Failure: Error, Sendable, CustomStringConvertible {
        public let offset: Int
        public let reason: String
        public var description: String { "invalid JSON at byte \(offset): \(reason)" }
    }

    /// Deeper nesting than a crash record or an event has is refused rather than recursed into.
    public static let maximumDepth = 256

    /// The value of a whole JSON text (any value at the top, as with `.fragmentsAllowed`).
    /// `uniqueTopLevelKeys`: a key that appears twice in the outermost object is an error
    /// rather than the last one winning (a record whose `event` is named twice says two things).
    public static func parse<Bytes: Collection<UInt8>>(_ text: Bytes, uniqueTopLevelKeys: Bool = false) throws -> Any {
        let parsed = try text.withContiguousStorageIfAvailable {
            try parse(buffer: $0, uniqueTopLevelKeys: uniqueTopLevelKeys)
        }
        return try parsed
            ?? Array(text).withUnsafeBufferPointer { try parse(buffer: $0, uniqueTopLevelKeys: uniqueTopLevelKeys) }
    }

    /// The object a JSON text holds, or nil when it is not valid JSON or not an object.
    /// `keepingAsText`: the values of that key in objects that deep (the outermost object is 1)
    /// are checked and kept as their text (`Encoded`), to be read one at a time with
    /// `materialized`: a stored crash's threads' frames, as dictionaries all at once, take
    /// several times the memory of the whole text.
    public static func object<Bytes: Collection<UInt8>>(
        _ text: Bytes, uniqueTopLevelKeys: Bool = false, keepingAsText: (key: String, depth: Int)? = nil
    ) -> [String: Any]? {
        let parsed = text.withContiguousStorageIfAvailable {
            try? parse(buffer: $0, uniqueTopLevelKeys: uniqueTopLevelKeys, keepingAsText: keepingAsText)
        }
        return
            (parsed
            ?? Array(text).withUnsafeBufferPointer {
                try? parse(buffer: $0, uniqueTopLevelKeys: uniqueTopLevelKeys, keepingAsText: keepingAsText)
            }) as? [String: Any]
    }

    /// A value as `parse` gives it, whether it was kept as text or not.
    public static func materialized(_ value: Any?) -> Any? {
        guard let encoded = value as? Encoded else { return value }
        return try? parse(encoded.bytes)
    }

    private static func parse(
        buffer: UnsafeBufferPointer<UInt8>, uniqueTopLevelKeys: Bool, keepingAsText: (key: String, depth: Int)? = nil
    ) throws -> Any {
        var reader = Reader(bytes: buffer)
        reader.uniqueTopLevelKeys = uniqueTopLevelKeys
        reader.keepingAsText = keepingAsText
        reader.skipSpace()
        let value = try reader.value(depth: 0)
        reader.skipSpace()
        guard reader.index == buffer.count else { throw reader.fail("data after the value") }
        return value
    }

    private struct Reader {
        let bytes: UnsafeBufferPointer<UInt8>
        var index = 0
        var uniqueTopLevelKeys = false
        var keepingAsText: (key: String, depth: Int)?
        /// Reused for every string with escapes.
        var scratch: [UInt8] = []
        /// The members of the objects being read, innermost last.
        var members: [(String, Any)] = []

        init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

        func fail(_ reason: String) -> Failure { Failure(offset: index, reason: reason) }

        mutating func skipSpace() {
            while index < bytes.count {
                switch bytes[index] {
                case 0x20, 0x0a, 0x0d, 0x09: index += 1
                default: return
                }
            }
        }

        mutating func value(depth: Int) throws -> Any {
            guard index < bytes.count else { throw fail("unexpected end") }
            switch bytes[index] {
            case UInt8(ascii: "\""): return try string()
            case UInt8(ascii: "{"): return try object(depth: depth + 1)
            case UInt8(ascii: "["): return try array(depth: depth + 1)
            case UInt8(ascii: "t"): return try literal("true", NSNumber(value: true))
            case UInt8(ascii: "f"): return try literal("false", NSNumber(value: false))
            case UInt8(ascii: "n"): return try literal("null", NSNull())
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try number()
            default: throw fail("unexpected character")
            }
        }

        mutating func literal(_ word: StaticString, _ value: Any) throws -> Any {
            let count = word.utf8CodeUnitCount
            guard index + count <= bytes.count,
                memcmp(bytes.baseAddress! + index, word.utf8Start, count) == 0
            else { throw fail("unknown literal") }
            index += count
            return value
        }

        mutating func object(depth: Int) throws -> [String: Any] {
            guard depth <= maximumDepth else { throw fail("nested too deeply") }
            index += 1
            skipSpace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
                index += 1
                return [:]
            }
            // Members are gathered first so the dictionary is made once at its final size:
            // growing it member by member rehashed every key several times.
            let first = members.count
            defer { members.removeSubrange(first...) }
            while true {
                skipSpace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw fail("expected a key") }
                let key = try string()
                skipSpace()
                guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
                index += 1
                skipSpace()
                if let kept = keepingAsText, depth == kept.depth, key == kept.key {
                    let start = index
                    _ = try value(depth: depth)
                    members.append((key, Encoded(text: UnsafeBufferPointer(rebasing: bytes[start..<index]))))
                } else {
                    members.append((key, try value(depth: depth)))
                }
                if try closes(UInt8(ascii: "}")) { break }
            }
            var object = [String: Any](minimumCapacity: members.count - first)
            for (key, value) in members[first...] {
                if object.updateValue(value, forKey: key) != nil, uniqueTopLevelKeys, depth == 1 {
                    throw fail("the key \"\(key)\" appears twice")
                }
            }
            return object
        }

        mutating func array(depth: Int) throws -> [Any] {
            guard depth <= maximumDepth else { throw fail("nested too deeply") }
            index += 1
            var array: [Any] = []
            skipSpace()
            if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
                index += 1
                return array
            }
            while true {
                skipSpace()
                array.append(try value(depth: depth))
                if try closes(UInt8(ascii: "]")) { return array }
            }
        }

        /// After a member: false when a comma says another follows, true at `close`.
        mutating func closes(_ close: UInt8) throws -> Bool {
            skipSpace()
            guard index < bytes.count else { throw fail("unterminated object or array") }
            let byte = bytes[index]
            index += 1
            if byte == UInt8(ascii: ",") { return false }
            if byte == close { return true }
            index -= 1
            throw fail("expected ',' or '\(Character(UnicodeScalar(close)))'")
        }

        mutating func string() throws -> String {
            index += 1
            let start = index
            while index < bytes.count {
                let byte = bytes[index]
                if byte == UInt8(ascii: "\"") {
                    let text = try validated(UnsafeBufferPointer(rebasing: bytes[start..<index]), at: start)
                    index += 1
                    return text
                }
                if byte == UInt8(ascii: "\\") { return try escapedString(from: start) }
                guard byte >= 0x20 else { throw fail("control character in a string") }
                index += 1
            }
            throw fail("unterminated string")
        }

        /// The slow path: a string with escapes, decoded into `scratch`.
        mutating func escapedString(from start: Int) throws -> String {
            scratch.removeAll(keepingCapacity: true)
            scratch.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<index]))
            while index < bytes.count {
                let byte = bytes[index]
                if byte == UInt8(ascii: "\"") {
                    index += 1
                    return try scratch.withUnsafeBufferPointer { try validated($0, at: start) }
                }
                guard byte >= 0x20 else { throw fail("control character in a string") }
                guard byte == UInt8(ascii: "\\") else {
                    scratch.append(byte)
                    index += 1
                    continue
                }
                guard index + 1 < bytes.count else { throw fail("unterminated string") }
                let escape = bytes[index + 1]
                index += 2
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): scratch.append(escape)
                case UInt8(ascii: "b"): scratch.append(0x08)
                case UInt8(ascii: "f"): scratch.append(0x0c)
                case UInt8(ascii: "n"): scratch.append(0x0a)
                case UInt8(ascii: "r"): scratch.append(0x0d)
                case UInt8(ascii: "t"): scratch.append(0x09)
                case UInt8(ascii: "u"): try appendEscapedScalar()
                default:
                    index -= 2
                    throw fail("bad escape")
                }
            }
            throw fail("unterminated string")
        }

        /// `\uXXXX`, or a surrogate pair of two; a lone surrogate is not text and is refused.
        mutating func appendEscapedScalar() throws {
            var scalar = try hexUnit()
            if (0xd800..<0xdc00).contains(scalar) {
                guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"),
                    bytes[index + 1] == UInt8(ascii: "u")
                else { throw fail("lone surrogate") }
                index += 2
                let low = try hexUnit()
                guard (0xdc00..<0xe000).contains(low) else { throw fail("lone surrogate") }
                scalar = 0x10000 + ((scalar - 0xd800) << 10) + (low - 0xdc00)
            } else if (0xdc00..<0xe000).contains(scalar) {
                throw fail("lone surrogate")
            }
            guard let unicode = Unicode.Scalar(scalar) else { throw fail("bad \\u escape") }
            scratch.append(contentsOf: UTF8.encode(unicode)!)
        }

        mutating func hexUnit() throws -> UInt32 {
            guard index + 4 <= bytes.count else { throw fail("bad \\u escape") }
            var unit: UInt32 = 0
            for byte in UnsafeBufferPointer(rebasing: bytes[index..<index + 4]) {
                let digit: UInt8
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
                default: throw fail("bad \\u escape")
                }
                unit = unit << 4 | UInt32(digit)
            }
            index += 4
            return unit
        }

        func validated(_ utf8: UnsafeBufferPointer<UInt8>, at offset: Int) throws -> String {
            // ASCII, the usual case, needs no validation: checked eight bytes at a time.
            let raw = UnsafeRawBufferPointer(utf8)
            var position = 0
            var high: UInt64 = 0
            while position + 8 <= raw.count {
                high |= raw.loadUnaligned(fromByteOffset: position, as: UInt64.self)
                position += 8
            }
            while position < raw.count {
                high |= UInt64(raw[position])
                position += 1
            }
            if high & 0x8080_8080_8080_8080 == 0 { return String(decoding: utf8, as: UTF8.self) }
            guard let text = String(validating: utf8, as: UTF8.self) else {
                throw Failure(offset: offset, reason: "a string is not UTF-8")
            }
            return text
        }

        /// Integers that fit Int64 (then UInt64) stay integers, as Foundation keeps them;
        /// anything else is a Double.
        mutating func number() throws -> NSNumber {
            let start = index
            var negative = false
            if bytes[index] == UInt8(ascii: "-") {
                negative = true
                index += 1
            }
            guard index < bytes.count, isDigit(bytes[index]) else { throw fail("bad number") }
            if bytes[index] == UInt8(ascii: "0") {
                index += 1
            } else {
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            let integerEnd = index
            var fractional = false
            if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
                fractional = true
                index += 1
                guard index < bytes.count, isDigit(bytes[index]) else { throw fail("bad number") }
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            if index < bytes.count, bytes[index] | 0x20 == UInt8(ascii: "e") {
                fractional = true
                index += 1
                if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                    index += 1
                }
                guard index < bytes.count, isDigit(bytes[index]) else { throw fail("bad number") }
                while index < bytes.count, isDigit(bytes[index]) { index += 1 }
            }
            if !fractional, let integer = integerValue(digits: (negative ? start + 1 : start)..<integerEnd) {
                if negative {
                    if integer <= UInt64(Int64.max) { return NSNumber(value: -Int64(integer)) }
                    if integer == UInt64(Int64.max) + 1 { return NSNumber(value: Int64.min) }
                } else {
                    return integer <= UInt64(Int64.max) ? NSNumber(value: Int64(integer)) : NSNumber(value: integer)
                }
            }
            let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
            guard let double = Double(text), double.isFinite else { throw Failure(offset: start, reason: "bad number") }
            return NSNumber(value: double)
        }

        func integerValue(digits: Range<Int>) -> UInt64? {
            var value: UInt64 = 0
            for byte in UnsafeBufferPointer(rebasing: bytes[digits]) {
                let (times, overflowA) = value.multipliedReportingOverflow(by: 10)
                let (sum, overflowB) = times.addingReportingOverflow(UInt64(byte - UInt8(ascii: "0")))
                if overflowA || overflowB { return nil }
                value = sum
            }
            return value
        }

        func isDigit(_ byte: UInt8) -> Bool { byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") }
    }
}

extension JSONTree {
    /// JSON text written already, copied as it is where it stands in a tree: a large part of a
    /// tree (a thread's named frames) kept as its text instead of as dictionaries, which take
    /// many times the memory.
    public struct Encoded: Sendable {
        public let bytes: [UInt8]
        public init(_ value: Any, sortedKeys: Bool = false) {
            var out: [UInt8] = []
            JSONTree.write(value, to: &out, sortedKeys: sortedKeys)
            bytes = out.withUnsafeBufferPointer { Array($0) }  // a copy with no more room than the text takes
        }

        init(text: UnsafeBufferPointer<UInt8>) { bytes = Array(text) }
    }

    /// JSON text for a tree as `parse` or JSONSerialization gives it (String, NSNumber, NSNull,
    /// arrays, dictionaries) or as Swift builds it (Bool, Int, Int64, UInt64, Double); anything
    /// else is written as null. Written into bytes: appending to a String piece by piece was most
    /// of a replay's encoding time.
    /// With `sortedKeys`, every object's keys in the order of their UTF-8 bytes, so that the
    /// same tree is always the same text.
    public static func encode(_ value: Any, sortedKeys: Bool = false) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(4096)
        write(value, to: &out, sortedKeys: sortedKeys)
        return String(decoding: out, as: UTF8.self)
    }

    /// `drain`, when given, takes what is in `out` (and empties it) whenever a MiB has gathered
    /// between two members: a large tree written out as it goes, never held whole as text.
    /// The text of a tree as `encode` writes it, in bytes that take no more room than the text:
    /// measured first, then written once into place. A large crash's event is tens of MB, and
    /// growing the bytes as they come held up to twice that, and a String of them once more.
    public static func encodedBytes(_ value: Any) -> [UInt8] {
        var size = 0
        var measuring: [UInt8] = []
        write(value, to: &measuring) {
            size += $0.count; $0.removeAll(keepingCapacity: true)
        }
        var out: [UInt8] = []
        out.reserveCapacity(size + measuring.count)
        write(value, to: &out)
        return out
    }

    public static func write(
        _ value: Any, to out: inout [UInt8], sortedKeys: Bool = false, drain: ((inout [UInt8]) -> Void)? = nil
    ) {
        // Dispatch on the exact type first: a failed `as?` from one of these to another goes
        // through the runtime's bridging (a dictionary made into an NSDictionary just to fail
        // to be an NSNumber), which was most of the encoding time.
        let kind = type(of: value)
        if kind == String.self {
            writeString(value as! String, to: &out)
        } else if kind == [String: Any].self {
            writeObject(value as! [String: Any], to: &out, sortedKeys: sortedKeys, drain: drain)
        } else if kind == [Any].self {
            writeArray(value as! [Any], to: &out, sortedKeys: sortedKeys, drain: drain)
        } else if kind is NSNumber.Type {
            writeNumber(value, to: &out)
        } else if kind == NSNull.self {
            out.append(contentsOf: "null".utf8)
        } else if kind == Encoded.self {
            out.append(contentsOf: (value as! Encoded).bytes)
        } else if let text = value as? String {
            writeString(text, to: &out)
        } else if let object = value as? [String: Any] {
            writeObject(object, to: &out, sortedKeys: sortedKeys, drain: drain)
        } else if let list = value as? [Any] {
            writeArray(list, to: &out, sortedKeys: sortedKeys, drain: drain)
        } else {
            writeNumber(value, to: &out)
        }
    }

    static func writeObject(
        _ object: [String: Any], to out: inout [UInt8], sortedKeys: Bool, drain: ((inout [UInt8]) -> Void)?
    ) {
        out.append(UInt8(ascii: "{"))
        var first = true
        func member(_ key: String, _ element: Any) {
            if !first { out.append(UInt8(ascii: ",")) }
            first = false
            writeString(key, to: &out)
            out.append(UInt8(ascii: ":"))
            write(element, to: &out, sortedKeys: sortedKeys, drain: drain)
            if let drain, out.count >= 1 << 20 { drain(&out) }
        }
        if sortedKeys {
            // Foundation's sortedKeys compares with a locale, which was most of the time of
            // `crashcap show --json` on a large report.
            for key in object.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
                member(key, object[key]!)
            }
        } else {
            for (key, element) in object { member(key, element) }
        }
        out.append(UInt8(ascii: "}"))
    }

    static func writeArray(_ list: [Any], to out: inout [UInt8], sortedKeys: Bool, drain: ((inout [UInt8]) -> Void)?) {
        out.append(UInt8(ascii: "["))
        for (index, element) in list.enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            write(element, to: &out, sortedKeys: sortedKeys, drain: drain)
            if let drain, out.count >= 1 << 20 { drain(&out) }
        }
        out.append(UInt8(ascii: "]"))
    }

    static func writeNumber(_ value: Any, to out: inout [UInt8]) {
        func append(_ text: String) { out.append(contentsOf: text.utf8) }
        // Each type is tested before any cast: `as? Bool` on an NSNumber bridges.
        let kind = type(of: value)
        if kind is NSNumber.Type {
            let number = value as! NSNumber
            switch UInt8(bitPattern: number.objCType.pointee) {
            case UInt8(ascii: "c"), UInt8(ascii: "B"): append(number.boolValue ? "true" : "false")
            case UInt8(ascii: "d"), UInt8(ascii: "f"):
                append(number.doubleValue.isFinite ? "\(number.doubleValue)" : "null")
            case UInt8(ascii: "Q"), UInt8(ascii: "L"), UInt8(ascii: "I"): append(String(number.uint64Value))
            default: append(String(number.int64Value))
            }
        } else if kind == Bool.self {
            append(value as! Bool ? "true" : "false")
        } else if kind == Int.self {
            append(String(value as! Int))
        } else if kind == Int64.self {
            append(String(value as! Int64))
        } else if kind == UInt64.self {
            append(String(value as! UInt64))
        } else if kind == Double.self {
            let number = value as! Double
            append(number.isFinite ? "\(number)" : "null")
        } else {
            append("null")
        }
    }

    /// A JSON string: runs of bytes that need no escape are copied whole.
    public static func writeString(_ text: String, to out: inout [UInt8]) {
        var text = text
        text.withUTF8 { bytes in
            out.append(UInt8(ascii: "\""))
            var runStart = 0
            for (index, byte) in bytes.enumerated() where byte < 0x20 || byte == 0x22 || byte == 0x5c || byte == 0x7f {
                out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart..<index]))
                runStart = index + 1
                switch byte {
                case 0x22: out += [0x5c, 0x22]
                case 0x5c: out += [0x5c, 0x5c]
                case 0x0a: out += [0x5c, 0x6e]
                case 0x0d: out += [0x5c, 0x72]
                case 0x09: out += [0x5c, 0x74]
                default:
                    let hex = Array("0123456789abcdef".utf8)
                    out += [0x5c, 0x75, 0x30, 0x30, hex[Int(byte >> 4)], hex[Int(byte & 0xf)]]
                }
            }
            out.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[runStart...]))
            out.append(UInt8(ascii: "\""))
        }
    }
}
