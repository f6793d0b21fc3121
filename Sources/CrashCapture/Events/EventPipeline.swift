internal import CCrashCapture
internal import CCrashFileFormat
internal import CrashFileFormat
internal import Foundation
internal import Synchronization

/// An event waiting for the writer: captured on the caller's thread, serialized off it.
struct PendingEvent: Sendable {
    var name: String
    var properties: [String: PropertyValue]
    var timeMilliseconds: Int64
    var method: String
    var eventID: String?
    var extra: String?
}

/// Who the events are about: the distinct id, and the login id when one is set.
struct DistinctIdentity: Sendable, Equatable {
    var distinctID: String
    var loginID: String?
}

/// What track() and login() hand the writer, in calling order.
enum Queued: Sendable {
    case event(PendingEvent)
    /// Events queued after this carry these ids.
    case identity(DistinctIdentity)
}

/// track() → in-memory queue → one background writer that serializes and inserts in batches
/// → SQLite store → uploader. track() never touches the disk or the network.
/// `@unchecked`: the queues are behind their shard locks, the counters are atomics, the login
/// id is behind `lock`, and `counter`/`written` are touched only on the writer queue.
final class EventPipeline: @unchecked Sendable {
    struct Identity {
        var sessionID: String
        var appVersion: String
        var staticProperties: String
        /// Events start with this distinct id (until a login or logout says otherwise).
        var distinctID: String
    }

    let store: EventStore
    let identity: Identity
    let uploader: Uploader?
    /// Beyond this many events waiting for the writer, track() drops (and counts) instead of
    /// growing memory without bound or blocking the caller.
    let maximumPending: Int

    /// track() appends to one of several queues, picked by thread, so callers on different
    /// threads rarely meet on a lock; a global sequence number keeps the order they were called in.
    private final class Shard: @unchecked Sendable {  // `items` only under `lock`
        let lock = NSLock()
        var items: [(sequence: UInt64, item: Queued)] = []
    }

    private static let shardBits = 3
    private let shards = (0..<(1 << EventPipeline.shardBits)).map { _ in Shard() }
    private let pending = Atomic<Int>(0)
    private let dropped = Atomic<Int>(0)
    private let drainScheduled = Atomic<Bool>(false)
    private let sequence = Atomic<UInt64>(0)
    private let lock = NSLock()
    /// Events numbered so far (their ids); the writer's alone.
    private var counter: UInt64 = 0
    private var loginID: String?
    /// The identity of the events the writer is serializing now; the writer's alone.
    private var written: DistinctIdentity
    private let writer = DispatchQueue(label: "CrashCapture.writer", qos: .utility)
    private var ended = false

    init(store: EventStore, identity: Identity, uploader: Uploader?, maximumPending: Int = 1_000_000) {
        self.store = store
        self.identity = identity
        self.uploader = uploader
        self.maximumPending = maximumPending
        written = DistinctIdentity(distinctID: identity.distinctID, loginID: nil)
    }

    func enqueue(_ event: PendingEvent) { enqueue(.event(event)) }

    private func enqueue(_ item: Queued) {
        // The limit counts every queue together, however the calling threads spread over them.
        // A change of identity is never dropped: it would mislabel every event after it.
        let full = pending.wrappingAdd(1, ordering: .relaxed).oldValue >= maximumPending
        if full, case .event = item {
            pending.wrappingSubtract(1, ordering: .relaxed)
            dropped.wrappingAdd(1, ordering: .relaxed)
            return
        }
        let order = sequence.wrappingAdd(1, ordering: .relaxed).newValue
        let shard = shards[Self.shardIndex()]
        shard.lock.lock()
        shard.items.append((order, item))
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

    /// Events tracked from now on carry `distinctID` (the login id, or the anonymous id after a
    /// logout). It is queued like an event, so events tracked before it keep the old ids however
    /// late the writer gets to them.
    func setLoginID(_ id: String?, distinctID: String) {
        lock.lock()
        loginID = id
        lock.unlock()
        enqueue(.identity(DistinctIdentity(distinctID: distinctID, loginID: id)))
    }

    /// Waits until every event tracked before this call is in the store.
    func flushToStore() {
        writer.sync { self.drain() }
    }

    var droppedBeforeStore: Int { dropped.load(ordering: .relaxed) }

    private func drain() {
        // Cleared before the queues are emptied: an event added after this schedules another drain.
        drainScheduled.store(false, ordering: .sequentiallyConsistent)
        var batch: [(sequence: UInt64, item: Queued)] = []
        for shard in shards {
            shard.lock.lock()
            batch += shard.items
            shard.items.removeAll(keepingCapacity: true)
            shard.lock.unlock()
        }
        guard !batch.isEmpty else { return }
        pending.wrappingSubtract(batch.count, ordering: .relaxed)
        batch.sort { $0.sequence < $1.sequence }
        // Events, and the stretches of them that share one identity (and so one shared text).
        var events: [PendingEvent] = []
        events.reserveCapacity(batch.count)
        var stretches: [(range: Range<Int>, shared: String)] = []
        let pid = getpid()
        var start = 0
        for (_, item) in batch {
            switch item {
            case .event(let event): events.append(event)
            case .identity(let identity):
                if events.count > start { stretches.append((start..<events.count, sharedText(written, pid: pid))) }
                written = identity
                start = events.count
            }
        }
        if events.count > start { stretches.append((start..<events.count, sharedText(written, pid: pid))) }
        guard !events.isEmpty else { return }
        let first = counter
        counter += UInt64(events.count)
        let ordered = events
        // One event's row; ids are fixed width, so they sort in the order they were made and the
        // unique index appends.
        let row: @Sendable (Int) -> (id: String, payload: String) = { index in
            let event = ordered[index]
            let id = event.eventID ?? self.identity.sessionID + "-" + Self.padded(first + UInt64(index) + 1)
            return (id, self.serialize(event, id: id))
        }
        // A large drain goes in as a pipeline of transactions: while one chunk is inserted on this
        // thread, the next is serialized on another core. Order is kept: chunks go in one by one.
        let chunks = stretches.flatMap { stretch in
            stride(from: stretch.range.lowerBound, to: stretch.range.upperBound, by: Self.chunkSize).map {
                (range: $0..<min(stretch.range.upperBound, $0 + Self.chunkSize), shared: stretch.shared)
            }
        }
        var rows = chunks[0].range.map(row)
        for (index, chunk) in chunks.enumerated() {
            let next = Box<[(id: String, payload: String)]>([])
            let serializing = DispatchGroup()
            if index + 1 < chunks.count {
                let following = chunks[index + 1].range
                DispatchQueue.global(qos: .utility).async(group: serializing) { next.value = following.map(row) }
            }
            do {
                try store.insert(rows, context: chunk.shared)
                uploader?.noteInserted()
            } catch {
                CrashCapture.logger.error("could not store \(rows.count) events: \(error)")
            }
            serializing.wait()
            rows = next.value
        }
    }

    /// Events per insert transaction when a drain is large.
    static let chunkSize = 8192

    static func padded(_ number: UInt64) -> String {
        let digits = String(number)
        return String(repeating: "0", count: max(0, 12 - digits.utf8.count)) + digits
    }

    /// An event's own part: name, time, id, method and properties. The marker stands for the rest
    /// (`sharedText`), which the store keeps once and puts back on every read.
    func serialize(_ event: PendingEvent, id: String) -> String {
        var json = "{\"type\":\"track\",\"event\":"
        json.reserveCapacity(192)
        JSONText.appendQuoted(event.name, to: &json)
        json +=
            ",\"time\":\(event.timeMilliseconds),\"event_id\":\"\(id)\",\"lib\":{\"$lib_method\":\"\(event.method)\","
        json += EventStore.contextMarker
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

    /// What every event of this session (and login) has in common, from the middle of `lib` to
    /// the middle of `properties`: most of each event's bytes, so it is stored once, not per row.
    func sharedText(_ ids: DistinctIdentity, pid: Int32) -> String {
        var json = "\"$lib\":\"\(CCF_LIB_NAME)\",\"$lib_version\":\"\(CrashCapture.version)\",\"$app_version\":"
        JSONText.appendQuoted(identity.appVersion, to: &json)
        json += "},\"distinct_id\":"
        JSONText.appendQuoted(ids.distinctID, to: &json)
        if let login = ids.loginID { json += ",\"login_id\":" + JSONText.quoted(login) }
        json += ",\"session_id\":\"\(identity.sessionID)\",\"properties\":{"
        if !identity.staticProperties.isEmpty { json += identity.staticProperties + "," }
        json += "\"$pid\":\(pid)"
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
