internal import Foundation

/// A batch's events as the rows of ClickHouse's `events` table, in its `JSONEachRow` input
/// format: one JSON object a line, built from the scanner's ranges while the batch is still
/// in the decoder's hands, so the database thread only sends bytes. A string member of the
/// event is copied as it was written (ClickHouse undoes JSON's escapes, `\u` pairs included);
/// `properties`, and the rest of the record without them (`payload`), become strings of JSON
/// text, escaped once here. The properties are not stored twice: with them in both columns,
/// ClickHouse spent twice the CPU parsing and merging, and a collector took 52,600–59,900
/// events/s where it now takes 118,000–166,000 (`crashcap-bench ingest-clickhouse`, 128
/// connections).
enum ClickHouseRows {
    /// The columns, in the order each row names them; `ClickHouseStore.tableDefinition` makes them.
    static let columns = [
        "event_id", "type", "event", "distinct_id", "time", "event_time", "session_id", "app_name", "app_version",
        "received_at", "crash_fingerprint", "crash_title", "properties", "payload",
    ]

    /// Every event of a scanned batch as a row; `ids` are the collector's de-duplication keys,
    /// `receivedMilliseconds` the time the batch arrived. An event without a time of its own
    /// gets 0 (1970), not the arrival: `event_time` is part of the table's key, and the copies
    /// of one event that arrive at two collectors must have the same key to be merged.
    static func rows(
        _ events: [JSONScanner.Event], ids: [String], in bytes: UnsafeBufferPointer<UInt8>,
        receivedMilliseconds: Int64
    ) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(events.reduce(0) { $0 + 2 * $1.text.count + 256 })
        for (event, id) in zip(events, ids) {
            let time = event.time.flatMap { integer($0, in: bytes) } ?? 0
            out += #"{"event_id":"#.utf8
            quote(Array(id.utf8)[...], into: &out)
            member("type", event.type, in: bytes, into: &out)
            member("event", event.eventName, in: bytes, into: &out)
            member("distinct_id", event.distinctID, in: bytes, into: &out)
            out += #","time":\#(time),"event_time":\#(dateTime(time))"#.utf8
            member("session_id", event.sessionID, in: bytes, into: &out)
            member("app_name", event.columns.appName, in: bytes, into: &out)
            member("app_version", event.columns.appVersion, in: bytes, into: &out)
            out += #","received_at":\#(dateTime(receivedMilliseconds))"#.utf8
            member("crash_fingerprint", event.columns.crashFingerprint, in: bytes, into: &out)
            member("crash_title", event.columns.crashTitle, in: bytes, into: &out)
            out += #","properties":"#.utf8
            out.append(UInt8(ascii: "\""))
            if let properties = event.properties { escape(bytes, properties, into: &out) }
            out += #"","payload":""#.utf8
            for part in withoutProperties(event, in: bytes) { escape(bytes, part, into: &out) }
            out += "\"}\n".utf8
        }
        return out
    }

    /// A crash or hang event's id and the `event_time` that finds it in the table's key.
    typealias CrashKey = (id: String, eventTime: Int64)

    /// The batch's crash and hang events, which the collector adds to the crash browser's sums
    /// once the batch is stored (`ClickHouseCrashIndex`); none in most batches.
    static func crashKeys(_ events: [JSONScanner.Event], ids: [String], in bytes: UnsafeBufferPointer<UInt8>)
        -> [CrashKey]
    {
        zip(events, ids).compactMap { event, id in
            guard let name = event.eventName.flatMap({ JSONScanner.decodedString($0, in: bytes) }),
                name == "$AppCrashed" || name == "$AppHang"
            else { return nil }
            return (id, dateTime(event.time.flatMap { integer($0, in: bytes) } ?? 0))
        }
    }

    /// `,"name":` and the token as a string: a JSON string as it is, any other token as its
    /// text, quoted; nothing (or `null`) as "".
    private static func member(
        _ name: StaticString, _ token: Range<Int>?, in bytes: UnsafeBufferPointer<UInt8>, into out: inout [UInt8]
    ) {
        out += #",""#.utf8
        out += UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount)
        out += #"":"#.utf8
        guard let token, !token.isEmpty, !spellsNull(bytes[token]) else {
            out += #""""#.utf8
            return
        }
        if bytes[token.lowerBound] == UInt8(ascii: "\"") {
            out += bytes[token]
        } else {
            quote(bytes[token], into: &out)
        }
    }

    private static func spellsNull(_ token: Slice<UnsafeBufferPointer<UInt8>>) -> Bool {
        token.count == 4 && token.elementsEqual("null".utf8)
    }

    /// The record's text less its `properties` member and one comma beside it, as one or two
    /// ranges: `{"a":1,"properties":{...},"b":2}` is `{"a":1,` and `"b":2}`.
    static func withoutProperties(_ event: JSONScanner.Event, in bytes: UnsafeBufferPointer<UInt8>) -> [Range<Int>] {
        guard let member = event.propertiesMember else { return [event.text] }
        func isSpace(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x0a || byte == 0x0d || byte == 0x09 }
        var cutStart = member.lowerBound
        var cutEnd = member.upperBound
        var after = cutEnd
        while after < event.text.upperBound, isSpace(bytes[after]) { after += 1 }
        if bytes[after] == UInt8(ascii: ",") {
            cutEnd = after + 1
        } else {
            var before = cutStart - 1
            while before > event.text.lowerBound, isSpace(bytes[before]) { before -= 1 }
            if bytes[before] == UInt8(ascii: ",") { cutStart = before }
        }
        return [event.text.lowerBound..<cutStart, cutEnd..<event.text.upperBound]
    }

    /// The record again from its two columns: the properties as the first member.
    static func record(payload: String, properties: String) -> String {
        guard !properties.isEmpty, let open = payload.firstIndex(of: "{") else { return payload }
        let rest = payload[payload.index(after: open)...]
        let empty = rest.drop { $0 == " " || $0 == "\n" || $0 == "\r" || $0 == "\t" }.first == "}"
        return "{\"properties\":" + properties + (empty ? "" : ",") + rest
    }

    /// Text as a JSON string: quote and backslash escaped, control characters (the whitespace
    /// JSON allows between tokens) as `\u00XX`. The text is UTF-8 already.
    static func quote<Bytes: Collection<UInt8>>(_ text: Bytes, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for byte in text { escape(byte, into: &out) }
        out.append(UInt8(ascii: "\""))
    }

    /// The bytes of `range` escaped as inside a JSON string, eight at a time up to the next
    /// byte that needs it (the scanner's own test for the end of a string).
    static func escape(_ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>, into out: inout [UInt8]) {
        let raw = UnsafeRawBufferPointer(bytes)
        var index = range.lowerBound
        var runStart = index
        while index < range.upperBound {
            if index + 8 <= range.upperBound,
                JSONScanner.stopMask(UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: index, as: UInt64.self)))
                    == 0
            {
                index += 8
                continue
            }
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") || byte < 0x20 {
                out += UnsafeBufferPointer(rebasing: bytes[runStart..<index])
                escape(byte, into: &out)
                runStart = index + 1
            }
            index += 1
        }
        out += UnsafeBufferPointer(rebasing: bytes[runStart..<range.upperBound])
    }

    private static func escape(_ byte: UInt8, into out: inout [UInt8]) {
        let hex: StaticString = "0123456789abcdef"
        switch byte {
        case UInt8(ascii: "\""), UInt8(ascii: "\\"):
            out.append(UInt8(ascii: "\\"))
            out.append(byte)
        case 0..<0x20:
            out += #"\u00"#.utf8
            out.append(hex.utf8Start[Int(byte >> 4)])
            out.append(hex.utf8Start[Int(byte & 15)])
        default: out.append(byte)
        }
    }

    /// A token that is a whole number of milliseconds (what every SDK sends as `time`).
    private static func integer(_ token: Range<Int>, in bytes: UnsafeBufferPointer<UInt8>) -> Int64? {
        guard token.count <= 19 else { return nil }
        return Int64(String(decoding: UnsafeBufferPointer(rebasing: bytes[token]), as: UTF8.self))
    }

    /// Milliseconds as the seconds of a `DateTime`, which holds 1970 to 2106 only.
    static func dateTime(_ milliseconds: Int64) -> Int64 {
        min(max(milliseconds / 1000, 0), Int64(UInt32.max))
    }
}
