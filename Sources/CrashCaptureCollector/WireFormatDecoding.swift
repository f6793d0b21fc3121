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

    /// The record types of the Sensors Analytics data model; `detail_set` and `detail_delete`
    /// are the detail records (a `schema` and an `id`) of the Java SDK's 3.x schema API.
    package static let recordTypes: Set<String> = [
        "track", "track_signup", "track_id_bind", "track_id_unbind", "profile_set", "profile_set_once",
        "profile_increment", "profile_append", "profile_unset", "profile_delete", "item_set", "item_delete",
        "detail_set", "detail_delete",
    ]

    /// What the collector stores: each record's de-duplication key and its own JSON text as it
    /// arrived, after a strict validation of the whole batch. The key is the strongest the
    /// record carries: our `event_id`; else the Sensors SDKs' `_track_id` with its distinct_id
    /// and time; else a 64-bit hash of the record's text (a record sent twice byte for byte is
    /// stored once, and so are two records that are the same to the byte). Every way a body
    /// can be wrong is an error.
    package static func decodeEvents(body: Data, maximumInflated: Int = 64 << 20) throws -> [(id: String, text: String)]
    {
        try decodeBatch(body: body, maximumInflated: maximumInflated, clickHouseRows: false, receivedMilliseconds: 0)
            .events
    }

    /// A batch as `decodeEvents` gives it, and, for a collector that stores into ClickHouse,
    /// as the rows of its table (`JSONEachRow`), made here, off the thread that stores.
    package struct DecodedBatch: Sendable {
        package var events: [(id: String, text: String)]
        package var clickHouseRows: [UInt8]?
        /// Its crash and hang events, for the ClickHouse crash browser's sums.
        var crashKeys: [ClickHouseRows.CrashKey] = []
    }

    package static func decodeBatch(
        body: Data, maximumInflated: Int = 64 << 20, clickHouseRows: Bool, receivedMilliseconds: Int64
    ) throws -> DecodedBatch {
        try scan(body: body, maximumInflated: maximumInflated) { bytes, events in
            let kept = try events.enumerated().map { index, event in try stored(event, index: index, in: bytes) }
            guard clickHouseRows else { return DecodedBatch(events: kept, clickHouseRows: nil) }
            let rows = ClickHouseRows.rows(
                events, ids: kept.map(\.id), in: bytes, receivedMilliseconds: receivedMilliseconds)
            return DecodedBatch(
                events: kept, clickHouseRows: rows,
                crashKeys: ClickHouseRows.crashKeys(events, ids: kept.map(\.id), in: bytes))
        }
    }

    /// The longest event name taken, in bytes (the Sensors rules' 100).
    static let maximumEventName = 100

    private static func stored(_ event: JSONScanner.Event, index: Int, in bytes: UnsafeBufferPointer<UInt8>) throws
        -> (id: String, text: String)
    {
        guard let typeToken = event.type, let type = JSONScanner.decodedString(typeToken, in: bytes) else {
            throw CrashCaptureError.corrupt("record \(index) has no type")
        }
        guard recordTypes.contains(type) else {
            throw CrashCaptureError.corrupt("record \(index) has an unknown type \"\(type)\"")
        }
        if type.hasPrefix("track"), type != "track_id_bind", type != "track_id_unbind", !event.hasEventName {
            throw CrashCaptureError.corrupt("record \(index) (\(type)) has no event name")
        }
        if !type.hasSuffix("_delete"), !event.hasProperties {
            throw CrashCaptureError.corrupt("record \(index) (\(type)) lacks properties")
        }
        // `time` is milliseconds since the epoch: a whole number, not below 0. Every SDK sends it;
        // a record without one could not be placed in any time range.
        guard let time = event.time else {
            throw CrashCaptureError.corrupt("record \(index) (\(type)) has no time")
        }
        let digits = UnsafeBufferPointer(rebasing: bytes[time])
        guard !digits.isEmpty, digits.count <= 16, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else {
            throw CrashCaptureError.corrupt(
                "record \(index) has a bad time \(JSONScanner.text(time, in: bytes).prefix(40)): milliseconds "
                    + "since the epoch, a whole number of at most 16 digits")
        }
        // Whose it is: every event and profile record names its user (an item or detail record
        // names its item instead). The SDKs refuse an empty one before sending.
        // A number is taken as its text, as the SDKs' own servers take it.
        if type.hasPrefix("track") || type.hasPrefix("profile") {
            let token = event.distinctID.map { UnsafeBufferPointer(rebasing: bytes[$0]) }
            let isNumber = token.map { !$0.isEmpty && ($0[0] == UInt8(ascii: "-") || ($0[0] >= 0x30 && $0[0] <= 0x39)) }
            let isText = event.distinctID.flatMap { JSONScanner.decodedString($0, in: bytes) }.map { !$0.isEmpty }
            guard isNumber == true || isText == true else {
                throw CrashCaptureError.corrupt(
                    "record \(index) (\(type)) has no distinct_id (a non-empty string, or a number)")
            }
        }
        // An event name is a name: at most 100 bytes, no control character (an ESC would reach
        // every terminal and log that shows it).
        if let nameToken = event.eventName, event.hasEventName {
            guard let name = JSONScanner.decodedString(nameToken, in: bytes) else {
                throw CrashCaptureError.corrupt("record \(index) has an unreadable event name")
            }
            if name.utf8.count > maximumEventName {
                throw CrashCaptureError.corrupt(
                    "record \(index) has an event name of \(name.utf8.count) bytes; at most \(maximumEventName)")
            }
            if name.unicodeScalars.contains(where: { $0.value < 0x20 || (0x7f...0x9f).contains($0.value) }) {
                throw CrashCaptureError.corrupt("record \(index) has a control character in its event name")
            }
        }
        // Validated by the scanner already; from a buffer, String takes its fast path.
        let record = UnsafeBufferPointer(rebasing: bytes[event.text])
        let text = String(decoding: record, as: UTF8.self)
        if let token = event.eventID, let id = JSONScanner.decodedString(token, in: bytes), !id.isEmpty {
            return (id, text)
        }
        if let track = event.trackID {
            let distinctID = event.distinctID.map { JSONScanner.text($0, in: bytes) } ?? ""
            let time = event.time.map { JSONScanner.text($0, in: bytes) } ?? ""
            return ("sa-track:\(JSONScanner.text(track, in: bytes)):\(distinctID):\(time)", text)
        }
        return ("sa-content:" + fnv1a(record), text)
    }

    static func fnv1a(_ bytes: UnsafeBufferPointer<UInt8>) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in bytes {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        let hex = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }

    /// Like `decode`, with each event's own JSON text as it arrived.
    package static func decodeWithText(body: Data, maximumInflated: Int = 64 << 20) throws -> [(
        object: [String: Any], text: String
    )] {
        try scan(body: body, maximumInflated: maximumInflated) { bytes, events in
            try events.enumerated().map { index, event in
                let text = Data(UnsafeBufferPointer(rebasing: bytes[event.text]))
                guard let object = try JSONSerialization.jsonObject(with: text) as? [String: Any] else {
                    throw CrashCaptureError.corrupt("element \(index) is not an object")
                }
                return (object, String(decoding: text, as: UTF8.self))
            }
        }
    }

    /// The batch validated by the scanner: `use` gets the JSON bytes, where they are, and
    /// where each event is in them.
    private static func scan<T>(
        body: Data, maximumInflated: Int, _ use: (UnsafeBufferPointer<UInt8>, [JSONScanner.Event]) throws -> T
    ) throws -> T {
        let (payload, single) = try jsonPayload(body: body, maximumInflated: maximumInflated)
        return try payload.withUnsafeBytes { raw in
            let bytes = raw.bindMemory(to: UInt8.self)
            let events: [JSONScanner.Event]
            do {
                events = try JSONScanner.events(in: bytes, single: single)
            } catch let failure as JSONScanner.Failure {
                throw CrashCaptureError.corrupt(
                    single
                        ? "data is not a JSON object: \(failure)"
                        : "data_list is not a JSON array of objects: \(failure)")
            }
            return try use(bytes, events)
        }
    }

    /// Fields a client may repeat (the last counts): none of them carries or describes the data.
    static let repeatable: Set<String> = ["project", "token", "instant_event", "ext"]

    /// The form fields of a request body (or a query string), each unescaped. A field given
    /// twice is refused, but for `repeatable` ones.
    package static func formFields(_ bytes: [UInt8]) throws -> [String: [UInt8]] {
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
            // Two of the fields that carry or describe the data: which counts would be a guess (one
            // was silently ignored), so neither does.
            if fields[name] != nil, repeatable.contains(name) == false {
                throw CrashCaptureError.corrupt("form field \"\(name)\" given twice")
            }
            fields[name] = value
        }
        return fields
    }

    /// The form fields checked, base64 and gzip undone: the JSON text, and whether it is one
    /// record (`data`, the Sensors SDKs' single-record form and the web SDK's beacon) or a
    /// batch (`data_list`). `crc` (the Java hash of the field) is checked when present; `gzip`
    /// is 1, 0 or absent (0); a field that is not base64 but JSON text is taken as it is.
    package static func jsonPayload(body: Data, maximumInflated: Int) throws -> (json: Data, single: Bool) {
        var fields = try formFields([UInt8](body))
        // The web SDK's beacon carries its checksum inside `ext` ("crc=123").
        if fields["crc"] == nil, let ext = fields["ext"], let inner = try? formFields(ext), let crc = inner["crc"] {
            fields["crc"] = crc
        }
        let single = fields["data_list"] == nil
        guard let value = fields["data_list"] ?? fields["data"] else {
            throw CrashCaptureError.corrupt("no data_list or data field")
        }
        if let crcField = fields["crc"], !crcField.isEmpty {
            guard let crc = Int32(String(decoding: crcField, as: UTF8.self)) else {
                throw CrashCaptureError.corrupt("crc is not a 32-bit integer")
            }
            let hash =
                value.allSatisfy { $0 < 0x80 }
                ? javaHashCode(ascii: value) : javaHashCode(String(decoding: value, as: UTF8.self))
            guard crc == hash else { throw CrashCaptureError.corrupt("crc mismatch: the data was altered") }
        }
        let field = single ? "data" : "data_list"
        let gzip = fields["gzip"].map { String(decoding: $0, as: UTF8.self) } ?? "0"
        let packed: Data
        if let first = value.first(where: { $0 != 0x20 }), first == UInt8(ascii: "{") || first == UInt8(ascii: "[") {
            packed = Data(value)
        } else {
            // A client that left base64's '+' unescaped sent what form decoding made a space;
            // one that broke the base64 into lines (MIME's CR LF every 76) sent line ends.
            let base64 = value.compactMap { byte -> UInt8? in
                byte == 0x20 ? UInt8(ascii: "+") : byte == 0x0d || byte == 0x0a ? nil : byte
            }
            guard let decoded = Data(base64Encoded: Data(base64)) else {
                throw CrashCaptureError.corrupt("\(field) is neither base64 nor JSON text")
            }
            packed = decoded
        }
        switch gzip {
        case "1": return (try gunzip(packed, maximumBytes: maximumInflated), single)
        case "0", "": return (packed, single)
        case "9":
            // The iOS SDK's encryption option: the payload is sealed with the server's key.
            throw CrashCaptureError.corrupt(
                "gzip=9 marks an encrypted batch, which this collector cannot decrypt: turn encryption off in the SDK")
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
    /// make us allocate without bound). Through an uninitialised staging buffer into `Data`,
    /// reserved for about ten times the input (what upload batches inflate to): no 64 KiB to
    /// clear for every batch, and growth by `realloc`, which for large sizes moves pages
    /// rather than copying them, so a bomb holds the limit and not twice it.
    package static func gunzip(_ data: Data, maximumBytes: Int) throws -> Data {
        var stream = z_stream()
        guard czlib_inflate_init_gzip(&stream) == Z_OK else { throw CrashCaptureError.corrupt("inflateInit failed") }
        defer { inflateEnd(&stream) }
        var output = Data(capacity: min(maximumBytes, data.count * 12))
        try withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 64 << 10) { chunk in
            try data.withUnsafeBytes { (input: UnsafeRawBufferPointer) in
                stream.next_in = UnsafeMutablePointer(
                    mutating: input.bindMemory(to: Bytef.self).baseAddress ?? UnsafePointer(bitPattern: 1)!)
                stream.avail_in = uInt(input.count)
                while true {
                    stream.next_out = chunk.baseAddress
                    stream.avail_out = uInt(chunk.count)
                    let status = inflate(&stream, Z_NO_FLUSH)
                    let produced = chunk.count - Int(stream.avail_out)
                    if output.count + produced > maximumBytes {
                        throw CrashCaptureError.corrupt("inflated data exceeds \(maximumBytes) bytes")
                    }
                    output.append(chunk.baseAddress!, count: produced)
                    // A gzip file may hold several members, one after another (RFC 1952 2.2):
                    // each is read, none dropped.
                    if status == Z_STREAM_END {
                        if stream.avail_in == 0 { return }
                        guard inflateReset(&stream) == Z_OK else {
                            throw CrashCaptureError.corrupt("data_list is not valid gzip (a member cannot be read)")
                        }
                        continue
                    }
                    if status != Z_OK {
                        throw CrashCaptureError.corrupt("data_list is not valid gzip (zlib status \(status))")
                    }
                    if produced == 0 && stream.avail_in == 0 {
                        throw CrashCaptureError.corrupt("gzip stream is truncated")
                    }
                }
            }
        }
        return output
    }
}
