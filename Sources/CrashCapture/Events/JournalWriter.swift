internal import Foundation

/// Writes an event's journal text straight into a buffer on the caller's stack: the same bytes
/// as `EventPipeline.journalText`, without growing a `String` piece by piece (a third of
/// track()'s time when it did). `overflow` is set when the buffer is too small; the caller then
/// takes the `String` path.
struct JournalWriter {
    private let base: UnsafeMutableRawPointer
    private let capacity: Int
    private(set) var count = 0
    private(set) var overflow = false

    init(_ buffer: UnsafeMutableRawBufferPointer) {
        base = buffer.baseAddress!
        capacity = buffer.count
    }

    var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(start: base, count: count) }

    private mutating func room(_ needed: Int) -> Bool {
        if count + needed > capacity { overflow = true }
        return !overflow
    }

    mutating func append(_ text: StaticString) {
        guard room(text.utf8CodeUnitCount) else { return }
        (base + count).copyMemory(from: text.utf8Start, byteCount: text.utf8CodeUnitCount)
        count += text.utf8CodeUnitCount
    }

    mutating func append(_ byte: UInt8) {
        guard room(1) else { return }
        base.storeBytes(of: byte, toByteOffset: count, as: UInt8.self)
        count += 1
    }

    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        guard room(bytes.count), let source = bytes.baseAddress else { return }
        (base + count).copyMemory(from: source, byteCount: bytes.count)
        count += bytes.count
    }

    mutating func append(_ text: String) {
        var text = text
        text.withUTF8 { append(UnsafeRawBufferPointer($0)) }
    }

    /// Decimal, and at least `width` digits (zeros in front).
    mutating func append(_ number: Int64, width: Int = 1) {
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)  // 24 bytes of scratch
        let magnitude = number.magnitude
        withUnsafeMutableBytes(of: &digits) { scratch in
            var value = magnitude
            var at = scratch.count
            repeat {
                at -= 1
                scratch[at] = UInt8(truncatingIfNeeded: 0x30 + value % 10)
                value /= 10
            } while value > 0 || scratch.count - at < width
            if number < 0 {
                at -= 1
                scratch[at] = 0x2d
            }
            append(UnsafeRawBufferPointer(rebasing: scratch[at...]))
        }
    }

    /// A JSON string; text that needs escapes goes through `JSONText.quoted`.
    mutating func appendQuoted(_ text: String) {
        var text = text
        let plain = text.withUTF8 { utf8 -> Bool in
            for byte in utf8 where byte < 0x20 || byte == 0x22 || byte == 0x5c || byte == 0x7f { return false }
            append(0x22)
            append(UnsafeRawBufferPointer(utf8))
            append(0x22)
            return true
        }
        if !plain { append(JSONText.quoted(text)) }
    }

    mutating func appendValue(_ value: PropertyValue) {
        switch value {
        case .string(let text): appendQuoted(text)
        case .int(let number): append(Int64(number))
        case .double(let number): append("\(number)")
        case .bool(let flag): flag ? append("true") : append("false")
        case .strings(let list):
            append(0x5b)
            for (index, text) in list.enumerated() {
                if index > 0 { append(0x2c) }
                appendQuoted(text)
            }
            append(0x5d)
        }
    }
}
