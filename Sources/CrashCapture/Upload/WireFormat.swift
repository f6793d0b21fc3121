internal import CZlib
package import Foundation

/// The Sensors Analytics ingest format: `POST` form body
/// `crc=<Java String.hashCode of data_list>&gzip=1&data_list=<base64(gzip(JSON array))>`.
/// The uploader encodes; the collector (module CrashCaptureCollector) decodes.
package enum WireFormat {
    package static let contentType = "application/x-www-form-urlencoded"

    /// Java's `String.hashCode()`: `s[0]*31^(n-1) + … + s[n-1]` over UTF-16 units, 32-bit wrapping.
    package static func javaHashCode(_ text: String) -> Int32 {
        var hash: Int32 = 0
        for unit in text.utf16 { hash = hash &* 31 &+ Int32(unit) }
        return hash
    }

    /// The same over ASCII text (base64), where each byte is one UTF-16 unit. Over a buffer,
    /// not any sequence: a generic function is not specialized for the collector's module,
    /// where stepping through a sequence's iterator was a sixth of the event loop's time.
    package static func javaHashCode(ascii bytes: UnsafeRawBufferPointer) -> Int32 {
        var hash: Int32 = 0
        for byte in bytes { hash = hash &* 31 &+ Int32(byte) }
        return hash
    }

    package static func javaHashCode(ascii bytes: [UInt8]) -> Int32 {
        bytes.withUnsafeBytes { javaHashCode(ascii: $0) }
    }

    /// The request body for a batch of event JSON objects, in order. `member` (`"key":value`),
    /// when given, is added to every object as it goes out.
    package static func encode(events: [String], addingToEach member: String? = nil, level: Int32 = 6) throws -> Data {
        let added = member.map { Array("\($0)}".utf8) } ?? []
        var array: [UInt8] = [UInt8(ascii: "[")]
        array.reserveCapacity(events.reduce(2) { $0 + $1.utf8.count + added.count + 2 })
        for (index, event) in events.enumerated() {
            if index > 0 { array.append(UInt8(ascii: ",")) }
            array.append(contentsOf: event.utf8)
            if !added.isEmpty, array.last == UInt8(ascii: "}") {
                array.removeLast()
                if array.last != UInt8(ascii: "{") { array.append(UInt8(ascii: ",")) }
                array += added
            }
        }
        array.append(UInt8(ascii: "]"))
        let dataList = try gzip(Data(array), level: level).base64EncodedData()
        // Over the buffer's bytes, not through Data's iterator: a third of the encoding's time
        // went to stepping through it byte by byte (`crashcap-bench decode`).
        return dataList.withUnsafeBytes { (base64: UnsafeRawBufferPointer) in
            var body = [UInt8]("crc=\(javaHashCode(ascii: base64))&gzip=1&data_list=".utf8)
            body.reserveCapacity(body.count + base64.count + base64.count / 8)
            formEscape(base64, into: &body)
            return Data(body)
        }
    }

    /// application/x-www-form-urlencoded: letters, digits and `-._*` as they are, the rest %XX.
    static func formEscape(_ bytes: some Sequence<UInt8>, into out: inout [UInt8]) {
        let hex: StaticString = "0123456789ABCDEF"
        for byte in bytes {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "*"):
                out.append(byte)
            default:
                out.append(UInt8(ascii: "%"))
                out.append(hex.utf8Start[Int(byte >> 4)])
                out.append(hex.utf8Start[Int(byte & 15)])
            }
        }
    }

    package static func formEscape(_ text: String) -> String {
        var out: [UInt8] = []
        formEscape(text.utf8, into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    package static func gzip(_ data: Data, level: Int32 = 6) throws -> Data {
        var stream = z_stream()
        guard czlib_deflate_init_gzip(&stream, level) == Z_OK else {
            throw CrashCaptureError.corrupt("deflateInit failed")
        }
        defer { deflateEnd(&stream) }
        var output = Data(count: Int(deflateBound(&stream, UInt(data.count))) + 32)
        let written: Int = try data.withUnsafeBytes { (input: UnsafeRawBufferPointer) in
            try output.withUnsafeMutableBytes { (out: UnsafeMutableRawBufferPointer) in
                stream.next_in = UnsafeMutablePointer(
                    mutating: input.bindMemory(to: Bytef.self).baseAddress ?? UnsafePointer(bitPattern: 1)!)
                stream.avail_in = uInt(input.count)
                stream.next_out = out.bindMemory(to: Bytef.self).baseAddress
                stream.avail_out = uInt(out.count)
                guard deflate(&stream, Z_FINISH) == Z_STREAM_END else {
                    throw CrashCaptureError.corrupt("deflate failed")
                }
                return Int(stream.total_out)
            }
        }
        output.count = written
        return output
    }

}
