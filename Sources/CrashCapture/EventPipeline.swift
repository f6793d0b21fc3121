import CCrashCapture
import Foundation

/// An event waiting for the writer: captured on the caller's thread, serialized off it.
struct PendingEvent {
    var name: String
    var properties: [String: PropertyValue]
    var timeMilliseconds: Int64
    var method: String
    var eventID: String?
    var extra: String?
}

/// track() → in-memory queue → one background writer that serializes and inserts in batches
/// → SQLite store → uploader. track() never touches the disk or the network.
final class EventPipeline: @unchecked Sendable {
    struct Identity {
        var sessionID: String
        var appVersion: String
        var staticProperties: String
    }

    let store: EventStore
    let identity: Identity
    let uploader: Uploader?
    /// Beyond this many events waiting for the writer, track() drops (and counts) instead of
    /// growing memory without bound or blocking the caller.
    let maximumPending: Int

    private let lock = NSLock()
    private var pending: [PendingEvent] = []
    private var drainScheduled = false
    private var counter: UInt64 = 0
    private var droppedPending = 0
    private var loginID: String?
    private var writeError: Error?
    private let writer = DispatchQueue(label: "CrashCapture.writer", qos: .utility)
    private var ended = false

    init(store: EventStore, identity: Identity, uploader: Uploader?, maximumPending: Int = 1_000_000) {
        self.store = store
        self.identity = identity
        self.uploader = uploader
        self.maximumPending = maximumPending
    }

    func enqueue(_ event: PendingEvent) {
        lock.lock()
        guard pending.count < maximumPending else {
            droppedPending += 1
            lock.unlock()
            return
        }
        pending.append(event)
        let schedule = !drainScheduled
        drainScheduled = true
        lock.unlock()
        if schedule { writer.async { self.drain() } }
    }

    var currentLoginID: String? {
        lock.lock()
        defer { lock.unlock() }
        return loginID
    }

    func setLoginID(_ id: String?) {
        lock.lock()
        loginID = id
        lock.unlock()
    }

    /// Waits until every event tracked before this call is in the store.
    func flushToStore() {
        writer.sync { self.drain() }
    }

    var lastWriteError: Error? {
        lock.lock()
        defer { lock.unlock() }
        return writeError
    }

    var droppedBeforeStore: Int {
        lock.lock()
        defer { lock.unlock() }
        return droppedPending
    }

    private func drain() {
        lock.lock()
        let batch = pending
        pending.removeAll(keepingCapacity: true)
        drainScheduled = false
        let login = loginID
        var first = counter
        counter += UInt64(batch.count)
        lock.unlock()
        guard !batch.isEmpty else { return }
        let distinctID = login ?? CrashCapture.distinctID ?? ""
        var rows: [(id: String, payload: String)] = []
        rows.reserveCapacity(batch.count)
        for event in batch {
            first += 1
            let id = event.eventID ?? "\(identity.sessionID)-\(first)"
            rows.append((id, serialize(event, id: id, distinctID: distinctID, login: login != nil)))
        }
        do {
            try store.insert(rows)
            uploader?.noteInserted()
        } catch {
            lock.lock()
            writeError = error
            lock.unlock()
            FileHandle.standardError.write(Data("CrashCapture: could not store \(rows.count) events: \(error)\n".utf8))
        }
    }

    func serialize(_ event: PendingEvent, id: String, distinctID: String, login: Bool) -> String {
        var json = "{\"type\":\"track\",\"event\":"
        json.reserveCapacity(512 + identity.staticProperties.utf8.count)
        JSONText.appendQuoted(event.name, to: &json)
        json += ",\"time\":\(event.timeMilliseconds),\"distinct_id\":"
        JSONText.appendQuoted(distinctID, to: &json)
        if login { json += ",\"login_id\":" + JSONText.quoted(distinctID) }
        json += ",\"event_id\":\"\(id)\",\"session_id\":\"\(identity.sessionID)\",\"lib\":{\"$lib\":\"CrashCapture\""
        json += ",\"$lib_version\":\"\(CrashCapture.version)\",\"$lib_method\":\"\(event.method)\",\"$app_version\":"
        JSONText.appendQuoted(identity.appVersion, to: &json)
        json += "},\"properties\":{"
        json += identity.staticProperties
        json += ",\"$pid\":\(getpid())"
        if let extra = event.extra { json += "," + extra }
        for (key, value) in event.properties {
            json += ","
            JSONText.appendQuoted(key, to: &json)
            json += ":"
            JSONText.appendValue(value, to: &json)
        }
        json += "}}"
        return json
    }

    /// The session's normal end: $AppEnd, everything into the store, a last bounded upload.
    func end(reason: String, uploadDeadline: Double) {
        lock.lock()
        let first = !ended
        ended = true
        lock.unlock()
        guard first else { return }
        // From here a crash (in a later atexit handler, say) adds no second $AppEnd.
        crashcapture_end_session()
        let elapsed = Double(CrashCapture.monotonicNanoseconds() - crashcapture_start_monotonic_ns()) / 1e9
        enqueue(
            PendingEvent(
                name: "$AppEnd", properties: [:], timeMilliseconds: CrashCapture.wallMilliseconds(),
                method: "autoTrack", eventID: identity.sessionID + "-end",
                extra:
                    "\"$event_duration\":\(String(format: "%.3f", max(0, elapsed))),\"$app_end_reason\":\"\(reason)\""))
        flushToStore()
        uploader?.flushNow(deadline: Date().addingTimeInterval(uploadDeadline))
    }
}

extension JSONText {
    /// Appends a JSON string; the common case (nothing to escape) is a plain append.
    static func appendQuoted(_ text: String, to json: inout String) {
        var plain = true
        for byte in text.utf8 where byte < 0x20 || byte == 0x22 || byte == 0x5c || byte == 0x7f {
            plain = false
            break
        }
        if plain {
            json += "\""
            json += text
            json += "\""
        } else {
            json += quoted(text)
        }
    }

    static func appendValue(_ value: PropertyValue, to json: inout String) {
        switch value {
        case .string(let text): appendQuoted(text, to: &json)
        case .int(let number): json += String(number)
        case .double(let number): json += "\(number)"
        case .bool(let flag): json += flag ? "true" : "false"
        case .strings(let list):
            json += "["
            for (index, text) in list.enumerated() {
                if index > 0 { json += "," }
                appendQuoted(text, to: &json)
            }
            json += "]"
        }
    }
}
