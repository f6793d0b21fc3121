import CCrashCapture
import Foundation
import Synchronization

/// Serialized rows per chunk, written by concurrent workers, each to its own slot.
private final class SerializedChunks: @unchecked Sendable {
    private var slots: [[(id: String, payload: String)]]
    private let lock = NSLock()
    init(count: Int) { slots = Array(repeating: [], count: count) }
    func set(_ index: Int, _ rows: [(id: String, payload: String)]) {
        lock.lock()
        slots[index] = rows
        lock.unlock()
    }
    func joined() -> [(id: String, payload: String)] { slots.flatMap { $0 } }
}

/// An event waiting for the writer: captured on the caller's thread, serialized off it.
struct PendingEvent: Sendable {
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

    /// track() appends to one of several queues, picked by thread, so callers on different
    /// threads rarely meet on a lock; a global sequence number keeps the order they were called in.
    private final class Shard: @unchecked Sendable {
        let lock = NSLock()
        var events: [(sequence: UInt64, event: PendingEvent)] = []
    }

    private static let shardBits = 3
    private let shards = (0..<(1 << EventPipeline.shardBits)).map { _ in Shard() }
    private let pending = Atomic<Int>(0)
    private let dropped = Atomic<Int>(0)
    private let drainScheduled = Atomic<Bool>(false)
    private let sequence = Atomic<UInt64>(0)
    private let lock = NSLock()
    private var counter: UInt64 = 0
    private var loginID: String?
    private let writer = DispatchQueue(label: "CrashCapture.writer", qos: .utility)
    private var ended = false

    init(store: EventStore, identity: Identity, uploader: Uploader?, maximumPending: Int = 1_000_000) {
        self.store = store
        self.identity = identity
        self.uploader = uploader
        self.maximumPending = maximumPending
    }

    func enqueue(_ event: PendingEvent) {
        // The limit counts every queue together, however the calling threads spread over them.
        guard pending.wrappingAdd(1, ordering: .relaxed).oldValue < maximumPending else {
            pending.wrappingSubtract(1, ordering: .relaxed)
            dropped.wrappingAdd(1, ordering: .relaxed)
            return
        }
        let order = sequence.wrappingAdd(1, ordering: .relaxed).newValue
        let shard = shards[Self.shardIndex()]
        shard.lock.lock()
        shard.events.append((order, event))
        shard.lock.unlock()
        if drainScheduled.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged {
            writer.async { self.drain() }
        }
    }

    /// The queue for the calling thread. pthread_t is the address of the thread's control
    /// block, and those of different threads differ only in high bits (they sit a stack apart):
    /// a multiplicative hash spreads all of them over the queues.
    static func shardIndex() -> Int {
        let hash = UInt64(UInt(pthread_self())) &* 0x9E37_79B9_7F4A_7C15
        return Int(truncatingIfNeeded: hash >> UInt64(64 - shardBits))
    }

    /// Runs work on the writer queue, ahead of events tracked after this call.
    func onWriter(_ work: @escaping @Sendable () -> Void) {
        writer.async(execute: work)
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

    var droppedBeforeStore: Int { dropped.load(ordering: .relaxed) }

    private func drain() {
        // Cleared before the queues are emptied: an event added after this schedules another drain.
        drainScheduled.store(false, ordering: .sequentiallyConsistent)
        lock.lock()
        let login = loginID
        lock.unlock()
        var batch: [(sequence: UInt64, event: PendingEvent)] = []
        for shard in shards {
            shard.lock.lock()
            batch += shard.events
            shard.events.removeAll(keepingCapacity: true)
            shard.lock.unlock()
        }
        guard !batch.isEmpty else { return }
        pending.wrappingSubtract(batch.count, ordering: .relaxed)
        batch.sort { $0.sequence < $1.sequence }
        lock.lock()
        var number = counter
        counter += UInt64(batch.count)
        lock.unlock()
        let distinctID = login ?? CrashCapture.distinctID ?? ""
        let pid = getpid()
        // Large drains are serialized on every core; the insert below stays in order.
        let first = number
        let chunks = batch.count >= 4096 ? ProcessInfo.processInfo.activeProcessorCount : 1
        let size = (batch.count + chunks - 1) / chunks
        let parts = SerializedChunks(count: chunks)
        let ordered = batch
        DispatchQueue.concurrentPerform(iterations: chunks) { chunk in
            let range = (chunk * size)..<min(ordered.count, (chunk + 1) * size)
            var rows: [(id: String, payload: String)] = []
            rows.reserveCapacity(range.count)
            for index in range {
                let event = ordered[index].event
                // Fixed width, so ids sort in the order they were made and the unique index appends.
                let id = event.eventID ?? identity.sessionID + "-" + Self.padded(first + UInt64(index) + 1)
                rows.append((id, serialize(event, id: id, distinctID: distinctID, login: login != nil, pid: pid)))
            }
            parts.set(chunk, rows)
        }
        number += UInt64(batch.count)
        let rows = parts.joined()
        do {
            try store.insert(rows, context: identity.staticProperties)
            uploader?.noteInserted()
        } catch {
            FileHandle.standardError.write(Data("CrashCapture: could not store \(rows.count) events: \(error)\n".utf8))
        }
    }

    static func padded(_ number: UInt64) -> String {
        let digits = String(number)
        return String(repeating: "0", count: max(0, 12 - digits.utf8.count)) + digits
    }

    func serialize(_ event: PendingEvent, id: String, distinctID: String, login: Bool, pid: Int32) -> String {
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
        json += EventStore.contextMarker
        json += ",\"$pid\":\(pid)"
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
