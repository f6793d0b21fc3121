internal import CZlib
package import CrashCapture
internal import CrashFileFormat
package import Foundation

/// The collector's side of the wire format: a request body checked, unpacked and validated.
extension WireFormat {
    /// Parses and verifies a request body; returns the events as JSON objects, in order.
    /// Every way a body can be wrong is an error naming what is wrong.
    package static func decode(body: Data, maximumInflated: Int = 64 << 20) throws -> [[String: Any]] {
        try decodeWithText(body: body, maximumInflated: maximumInflated).map(\.object)
    }

    /// What the collector stores: each event's id and its own JSON text as it arrived, after a
    /// strict validation of the whole batch. Every way a body can be wrong is an error.
    package static func decodeEvents(body: Data, maximumInflated: Int = 64 << 20) throws -> [(id: String, text: String)]
    {
        let (bytes, events) = try scan(body: body, maximumInflated: maximumInflated)
        return try events.enumerated().map { index, event in
            guard let id = event.eventID, !id.isEmpty else {
                throw CrashCaptureError.corrupt("event \(index) has no event_id")
            }
            guard event.hasEventName, event.hasProperties else {
                throw CrashCaptureError.corrupt("event \(index) lacks event or properties")
            }
            // Validated by the scanner already; from a buffer, String takes its fast path.
            return (id, bytes[event.text].withUnsafeBufferPointer { String(decoding: $0, as: UTF8.self) })
        }
    }

    /// Like `decode`, with each event's own JSON text as it arrived.
    package static func decodeWithText(body: Data, maximumInflated: Int = 64 << 20) throws -> [(
        object: [String: Any], text: String
    )] {
        let (bytes, events) = try scan(body: body, maximumInflated: maximumInflated)
        return try events.enumerated().map { index, event in
            let text = Data(bytes[event.text])
            guard let object = try JSONSerialization.jsonObject(with: text) as? [String: Any] else {
                throw CrashCaptureError.corrupt("element \(index) is not an object")
            }
            return (object, String(decoding: text, as: UTF8.self))
        }
    }

    /// The batch validated by the scanner: the JSON bytes and where each event is in them.
    private static func scan(body: Data, maximumInflated: Int) throws -> ([UInt8], [JSONScanner.Event]) {
        let bytes = [UInt8](try jsonPayload(body: body, maximumInflated: maximumInflated))
        do {
            return (bytes, try JSONScanner.events(in: bytes))
        } catch let failure as JSONScanner.Failure {
            throw CrashCaptureError.corrupt("data_list is not a JSON array of objects: \(failure)")
        }
    }

    /// The form fields checked (crc over data_list), base64 and gzip undone: the JSON text.
    package static func jsonPayload(body: Data, maximumInflated: Int) throws -> Data {
        let bytes = [UInt8](body)
        // A well-formed body is ASCII (the rest is %-escaped); anything else must at least be UTF-8.
        if bytes.contains(where: { $0 >= 0x80 }), String(validating: bytes, as: UTF8.self) == nil {
            throw CrashCaptureError.corrupt("body is not UTF-8")
        }
        var fields: [String: [UInt8]] = [:]
        for pair in bytes.split(separator: UInt8(ascii: "&")) {
            let equals = pair.firstIndex(of: UInt8(ascii: "=")) ?? pair.endIndex
            guard equals < pair.endIndex, let key = formUnescape(pair[..<equals]),
                let name = String(validating: key, as: UTF8.self), let value = formUnescape(pair[(equals + 1)...]),
                value.allSatisfy({ $0 < 0x80 }) || String(validating: value, as: UTF8.self) != nil
            else {
                throw CrashCaptureError.corrupt(
                    "malformed form field \"\(String(decoding: pair.prefix(40), as: UTF8.self))\"")
            }
            fields[name] = value
        }
        guard let dataList = fields["data_list"] else { throw CrashCaptureError.corrupt("no data_list field") }
        guard let crcField = fields["crc"] else { throw CrashCaptureError.corrupt("no crc field") }
        guard let crc = Int32(String(decoding: crcField, as: UTF8.self)) else {
            throw CrashCaptureError.corrupt("crc is not a 32-bit integer")
        }
        let hash =
            dataList.allSatisfy { $0 < 0x80 }
            ? javaHashCode(ascii: dataList) : javaHashCode(String(decoding: dataList, as: UTF8.self))
        guard crc == hash else { throw CrashCaptureError.corrupt("crc mismatch: data_list was altered") }
        guard let packed = Data(base64Encoded: Data(dataList)) else {
            throw CrashCaptureError.corrupt("data_list is not base64")
        }
        switch fields["gzip"].map({ String(decoding: $0, as: UTF8.self) }) ?? "0" {
        case "1": return try gunzip(packed, maximumBytes: maximumInflated)
        case "0": return packed
        default: throw CrashCaptureError.corrupt("gzip must be 0 or 1")
        }
    }

    /// `+` is a space and %XX a byte; nil for a % not followed by two hex digits.
    package static func formUnescape(_ bytes: ArraySlice<UInt8>) -> [UInt8]? {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var index = bytes.startIndex
        while index < bytes.endIndex {
            let byte = bytes[index]
            if byte == UInt8(ascii: "%") {
                guard index + 2 < bytes.endIndex, let high = hexValue(bytes[index + 1]),
                    let low = hexValue(bytes[index + 2])
                else { return nil }
                out.append(high << 4 | low)
                index += 3
            } else {
                out.append(byte == UInt8(ascii: "+") ? UInt8(ascii: " ") : byte)
                index += 1
            }
        }
        return out
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    /// Inflates a gzip stream, refusing to grow past `maximumBytes` (a small body cannot
    /// make us allocate without bound).
    package static func gunzip(_ data: Data, maximumBytes: Int) throws -> Data {
        var stream = z_stream()
        guard czlib_inflate_init_gzip(&stream) == Z_OK else { throw CrashCaptureError.corrupt("inflateInit failed") }
        defer { inflateEnd(&stream) }
        var output = Data()
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        try data.withUnsafeBytes { (input: UnsafeRawBufferPointer) in
            stream.next_in = UnsafeMutablePointer(
                mutating: input.bindMemory(to: Bytef.self).baseAddress ?? UnsafePointer(bitPattern: 1)!)
            stream.avail_in = uInt(input.count)
            while true {
                let status = chunk.withUnsafeMutableBufferPointer { buffer -> Int32 in
                    stream.next_out = buffer.baseAddress
                    stream.avail_out = uInt(buffer.count)
                    return inflate(&stream, Z_NO_FLUSH)
                }
                let produced = chunk.count - Int(stream.avail_out)
                output.append(contentsOf: chunk[0..<produced])
                if output.count > maximumBytes {
                    throw CrashCaptureError.corrupt("inflated data exceeds \(maximumBytes) bytes")
                }
                if status == Z_STREAM_END { return }
                if status != Z_OK {
                    throw CrashCaptureError.corrupt("data_list is not valid gzip (zlib status \(status))")
                }
                if produced == 0 && stream.avail_in == 0 { throw CrashCaptureError.corrupt("gzip stream is truncated") }
            }
        }
        return output
    }
}
