import CZlib
import Foundation

/// The Sensors Analytics ingest format: `POST` form body
/// `crc=<Java String.hashCode of data_list>&gzip=1&data_list=<base64(gzip(JSON array))>`.
public enum WireFormat {
    /// Java's `String.hashCode()`: `s[0]*31^(n-1) + … + s[n-1]` over UTF-16 units, 32-bit wrapping.
    public static func javaHashCode(_ text: String) -> Int32 {
        var hash: Int32 = 0
        for unit in text.utf16 { hash = hash &* 31 &+ Int32(unit) }
        return hash
    }

    /// The request body for a batch of event JSON objects, in order.
    public static func encode(events: [String]) throws -> Data {
        let array = "[" + events.joined(separator: ",") + "]"
        let dataList = try gzip(Data(array.utf8)).base64EncodedString()
        let body = "crc=\(javaHashCode(dataList))&gzip=1&data_list=" + formEscape(dataList)
        return Data(body.utf8)
    }

    /// Parses and verifies a request body; returns the events as JSON objects, in order.
    /// Every way a body can be wrong is an error naming what is wrong.
    public static func decode(body: Data, maximumInflated: Int = 64 << 20) throws -> [[String: Any]] {
        try decodeWithText(body: body, maximumInflated: maximumInflated).map(\.object)
    }

    /// What the collector stores: each event's id and its own JSON text as it arrived, after a
    /// strict validation of the whole batch. Every way a body can be wrong is an error.
    public static func decodeEvents(body: Data, maximumInflated: Int = 64 << 20) throws -> [(id: String, text: String)]
    {
        let (bytes, events) = try scan(body: body, maximumInflated: maximumInflated)
        return try events.enumerated().map { index, event in
            guard let id = event.eventID, !id.isEmpty else { throw WireError("event \(index) has no event_id") }
            guard event.hasEventName, event.hasProperties else {
                throw WireError("event \(index) lacks event or properties")
            }
            return (id, String(decoding: bytes[event.text], as: UTF8.self))
        }
    }

    /// Like `decode`, with each event's own JSON text as it arrived.
    public static func decodeWithText(body: Data, maximumInflated: Int = 64 << 20) throws -> [(
        object: [String: Any], text: String
    )] {
        let (bytes, events) = try scan(body: body, maximumInflated: maximumInflated)
        return try events.enumerated().map { index, event in
            let text = Data(bytes[event.text])
            guard let object = try JSONSerialization.jsonObject(with: text) as? [String: Any] else {
                throw WireError("element \(index) is not an object")
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
            throw WireError("data_list is not a JSON array of objects: \(failure)")
        }
    }

    /// The form fields checked (crc over data_list), base64 and gzip undone: the JSON text.
    static func jsonPayload(body: Data, maximumInflated: Int) throws -> Data {
        guard let text = String(data: body, encoding: .utf8) else { throw WireError("body is not UTF-8") }
        var fields: [String: String] = [:]
        for pair in text.split(separator: "&", omittingEmptySubsequences: true) {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.count == 2, let key = formUnescape(String(parts[0])), let value = formUnescape(String(parts[1]))
            else { throw WireError("malformed form field \"\(pair.prefix(40))\"") }
            fields[key] = value
        }
        guard let dataList = fields["data_list"] else { throw WireError("no data_list field") }
        guard let crcText = fields["crc"] else { throw WireError("no crc field") }
        guard let crc = Int32(crcText) else { throw WireError("crc is not a 32-bit integer") }
        guard crc == javaHashCode(dataList) else { throw WireError("crc mismatch: data_list was altered") }
        guard let packed = Data(base64Encoded: dataList) else { throw WireError("data_list is not base64") }
        switch fields["gzip"] ?? "0" {
        case "1": return try gunzip(packed, maximumBytes: maximumInflated)
        case "0": return packed
        default: throw WireError("gzip must be 0 or 1")
        }
    }

    static let formSafe: CharacterSet = {
        var safe = CharacterSet.alphanumerics
        safe.insert(charactersIn: "-._*")
        return safe
    }()

    static func formEscape(_ text: String) -> String {
        text.addingPercentEncoding(withAllowedCharacters: formSafe) ?? text
    }

    static func formUnescape(_ text: String) -> String? {
        text.replacingOccurrences(of: "+", with: " ").removingPercentEncoding
    }

    public static func gzip(_ data: Data, level: Int32 = 6) throws -> Data {
        var stream = z_stream()
        guard czlib_deflate_init_gzip(&stream, level) == Z_OK else { throw WireError("deflateInit failed") }
        defer { deflateEnd(&stream) }
        var output = Data(count: Int(deflateBound(&stream, UInt(data.count))) + 32)
        let written: Int = try data.withUnsafeBytes { (input: UnsafeRawBufferPointer) in
            try output.withUnsafeMutableBytes { (out: UnsafeMutableRawBufferPointer) in
                stream.next_in = UnsafeMutablePointer(
                    mutating: input.bindMemory(to: Bytef.self).baseAddress ?? UnsafePointer(bitPattern: 1)!)
                stream.avail_in = uInt(input.count)
                stream.next_out = out.bindMemory(to: Bytef.self).baseAddress
                stream.avail_out = uInt(out.count)
                guard deflate(&stream, Z_FINISH) == Z_STREAM_END else { throw WireError("deflate failed") }
                return Int(stream.total_out)
            }
        }
        output.count = written
        return output
    }

    /// Inflates a gzip stream, refusing to grow past `maximumBytes` (a small body cannot
    /// make us allocate without bound).
    public static func gunzip(_ data: Data, maximumBytes: Int) throws -> Data {
        var stream = z_stream()
        guard czlib_inflate_init_gzip(&stream) == Z_OK else { throw WireError("inflateInit failed") }
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
                if output.count > maximumBytes { throw WireError("inflated data exceeds \(maximumBytes) bytes") }
                if status == Z_STREAM_END { return }
                if status != Z_OK { throw WireError("data_list is not valid gzip (zlib status \(status))") }
                if produced == 0 && stream.avail_in == 0 { throw WireError("gzip stream is truncated") }
            }
        }
        return output
    }
}

public struct WireError: Error, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}
