internal import CCrashCapture
internal import CCrashFileFormat
internal import CrashFileFormat
internal import Foundation
internal import Synchronization

/// An event as track() hands it over: serialized on the caller's thread into the journal.
struct PendingEvent: Sendable {
    var name: String
    var properties: [String: PropertyValue]
    var timeMilliseconds: Int64
    var method: String
    var eventID: String?
    var extra: String?
    /// The record's type: `track`, or `track_signup` for a login's $SignUp.
    var type = "track"
    /// Members of the record itself, beside `event` (a sign-up's `original_id`).
    var recordMembers: String?
}

/// Who the events are about: the distinct id, and the login id when one is set.
struct DistinctIdentity: Sendable, Equatable {
    var distinctID: String
    var loginID: String?
}

/// track() → journal (a shared mapping of the session file: the event survives any death of
/// the process once track() returns) → one background writer that moves entries into SQLite in
/// transactions → uploader. track() never makes a system call.
/// `@unchecked`: the journal is lock-free (C atomics), the login id is behind `lock`, and
/// `written`, `readPosition` and `scratch` are touched only on the writer queue.
final class EventPipeline: @unchecked Sendable {
    struct Identity: Sendable {
        var sessionID: String
        var appVersion: String
        var staticProperties: String
        /// Events start with this distinct id (until a login or logout says otherwise).
        var distinctID: String
    }

    let store: EventStore
    let identity: Identity
    let uploader: Uploader?
    let journal: OpaquePointer
    private let ownsJournal: Bool
    /// Whether this session tracks $AppStart/$AppEnd.
    let tracksLifecycle: Bool

    private let drainScheduled = Atomic<Bool>(false)
    private let sequence = Atomic<UInt64>(0)
    private let lock = NSLock()
    private var loginID: String?
    /// The identity of the entries the writer reads now; the writer's alone.
    private var written: DistinctIdentity
    /// The next journal position the writer reads; the writer's alone.
    private var readPosition: UInt64
    /// Where an entry that wraps around the ring's end is copied to be read whole.
    private let scratch = UnsafeMutablePointer<CChar>.allocate(capacity: Int(CCF_MAXIMUM_PAYLOAD))
    private let writer = DispatchQueue(label: "CrashCapture.writer", qos: .utility)
    private let pid = getpid()
    /// `<session id>-`: every tracked event's id starts so.
    private let idPrefix: String
    private var aliveTimer: DispatchSourceTimer?
    private var ended = false
    /// How long track() waits for room in a full journal before it drops the event.
    let fullJournalWait: Duration
    private let fullJournalWaitNs: Int64
    private let dropLogged = Atomic<Bool>(false)
    /// Bytes of entries read after which the writer commits, so that the room it gives back
    /// reaches waiting track() callers while it goes on reading.
    private let commitBytes: UInt64

    /// `journal`: the installed session's (nil: a journal of `memoryJournalBytes` in memory,
    /// for tests of the pipeline alone).
    init(
        store: EventStore, identity: Identity, uploader: Uploader?, journal: OpaquePointer? = nil,
        memoryJournalBytes: Int = 1 << 20, tracksLifecycle: Bool = true, fullJournalWait: Duration = .seconds(1)
    ) {
        self.tracksLifecycle = tracksLifecycle
        self.fullJournalWait = fullJournalWait
        let (seconds, attoseconds) = fullJournalWait.components
        // Nanoseconds, saturating: a bound past Int64's nanoseconds is no bound at all.
        let whole = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        let total = whole.partialValue.addingReportingOverflow(attoseconds / 1_000_000_000)
        fullJournalWaitNs = whole.overflow || total.overflow ? Int64.max : max(0, total.partialValue)
        self.store = store
        self.identity = identity
        self.uploader = uploader
        if let journal {
            self.journal = journal
            ownsJournal = false
        } else {
            self.journal = crashcapture_journal_create_in_memory(memoryJournalBytes)!
            ownsJournal = true
        }
        written = DistinctIdentity(distinctID: identity.distinctID, loginID: nil)
        idPrefix = identity.sessionID + "-"
        readPosition = crashcapture_journal_consumed(self.journal)
        commitBytes = max(4096, crashcapture_journal_size(self.journal) / 4)
    }

    deinit {
        aliveTimer?.cancel()
        if ownsJournal { crashcapture_journal_destroy_in_memory(journal) }
        scratch.deallocate()
    }

    /// Once this returns, the event is in the journal, or counted as dropped: the journal stayed
    /// full for `fullJournalWait`, or the event is larger than the whole journal.
    func enqueue(_ event: PendingEvent) {
        let number = event.eventID == nil ? sequence.wrappingAdd(1, ordering: .relaxed).newValue : 0
        // Most events fit a buffer on the stack; a larger one takes the String path.
        let appended = withUnsafeTemporaryAllocation(byteCount: 2048, alignment: 8) { buffer -> Int32? in
            var writer = JournalWriter(buffer)
            write(event, number: number, into: &writer)
            guard !writer.overflow else { return nil }
            return crashcapture_journal_append(
                journal, UInt32(CCF_JOURNAL_EVENT.rawValue), writer.bytes.baseAddress, writer.count, fullJournalWaitNs)
        }
        if let appended {
            noteAppend(appended)
            return
        }
        var text = journalText(event, id: event.eventID ?? idPrefix + Self.padded(number))
        append(UInt32(CCF_JOURNAL_EVENT.rawValue), &text)
    }

    private func noteAppend(_ result: Int32) {
        if result == 0 {
            scheduleDrain()
            return
        }
        guard !dropLogged.exchange(true, ordering: .relaxed) else { return }
        // A forked child's journal is closed on purpose: its drops are counted, not news.
        guard crashcapture_session_journal() != nil || ownsJournal else { return }
        let why =
            result == -2
            ? "the journal (\(crashcapture_journal_size(journal)) bytes) stayed full for \(fullJournalWait): the writer is not keeping up"
            : "the event is larger than the journal (\(crashcapture_journal_size(journal)) bytes), or the session ended"
        CrashCapture.logger.warning(
            "track() dropped an event, counted in droppedBeforeStore (logged once): \(why)")
    }

    /// `journalText`, into a `JournalWriter`.
    func write(_ event: PendingEvent, number: UInt64, into writer: inout JournalWriter) {
        writer.append("{\"type\":\"")
        writer.append(event.type)
        writer.append("\",\"event\":")
        writer.appendQuoted(event.name)
        writer.append(",\"time\":")
        writer.append(event.timeMilliseconds)
        writer.append(",\"event_id\":\"")
        if let id = event.eventID {
            writer.append(id)
        } else {
            writer.append(idPrefix)
            writer.append(Int64(number), width: 12)
        }
        writer.append(0x22)
        if let members = event.recordMembers {
            writer.append(0x2c)
            writer.append(members)
        }
        writer.append(",\"lib\":{\"$lib_method\":\"")
        writer.append(event.method)
        // The same method among the properties, as the official SDKs send it.
        writer.append("\",\u{1},\"$lib_method\":\"")
        writer.append(event.method)
        writer.append(0x22)
        if let extra = event.extra {
            writer.append(0x2c)
            writer.append(extra)
        }
        for (key, value) in event.properties {
            writer.append(0x2c)
            writer.appendQuoted(key)
            writer.append(0x3a)
            writer.appendValue(value)
        }
        writer.append("}}")
    }

    private func append(_ type: UInt32, _ text: inout String) {
        let result = text.withUTF8 {
            crashcapture_journal_append(journal, type, $0.baseAddress, $0.count, fullJournalWaitNs)
        }
        noteAppend(result)
    }

    private func scheduleDrain() {
        // A load first: while a drain is already scheduled (most calls under load), no caller
        // takes the flag's cache line away from the others. The fence orders the entry's commit
        // before that load, as the drain orders its clearing of the flag before its reads, so
        // either the drain sees the entry or this call schedules another.
        atomicMemoryFence(ordering: .sequentiallyConsistent)
        if !drainScheduled.load(ordering: .relaxed),
            drainScheduled.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
        {
            writer.async { self.drain() }
        }
    }

    /// Runs work on the writer queue, ahead of events tracked after this call.
    func onWriter(_ work: @escaping @Sendable () -> Void) {
        writer.async(execute: work)
    }

    /// Faults the journal's pages in off the caller's thread, then refreshes the session's
    /// last-alive time every 2 s (one wake-up, two stores into the mapping).
    func startBackgroundWork() {
        writer.async { crashcapture_journal_prefault(self.journal, Self.prefaultAhead) }
        let timer = DispatchSource.makeTimerSource(queue: writer)
        timer.schedule(deadline: .now() + 2, repeating: 2, leeway: .milliseconds(500))
        timer.setEventHandler {
            crashcapture_session_alive()
            self.drain()
        }
        timer.resume()
        aliveTimer = timer
    }

    var currentLoginID: String? {
        lock.lock()
        defer { lock.unlock() }
        return loginID
    }

    /// Events tracked from now on carry `distinctID` (the login id, or the anonymous id after a
    /// logout). It goes through the journal like an event, so events tracked before it keep
    /// the old ids however late the writer gets to them.
    func setLoginID(_ id: String?, distinctID: String) {
        lock.lock()
        loginID = id
        lock.unlock()
        var text = "{\"distinct_id\":" + JSONText.quoted(distinctID)
        if let id { text += ",\"login_id\":" + JSONText.quoted(id) }
        text += "}"
        append(UInt32(CCF_JOURNAL_IDENTITY.rawValue), &text)
    }

    /// The import of earlier sessions and crash files that install started, on a queue of its
    /// own: a flush waits for it, the exit at most until its bound.
    let replay = DispatchGroup()

    /// Waits until every event tracked before this call is in the store, and the import of
    /// earlier sessions is done.
    func flushToStore() {
        replay.wait()
        writer.sync { self.drain() }
    }

    /// The same, waiting no later than `deadline`: whether everything got there. What did not
    /// stays in the journal and the directory, which the next start imports.
    func flushToStore(until deadline: DispatchTime) -> Bool {
        guard replay.wait(timeout: deadline) == .success else { return false }
        let done = DispatchSemaphore(value: 0)
        writer.async {
            self.drain()
            done.signal()
        }
        return done.wait(timeout: deadline) == .success
    }

    /// Whether everything the journal was given is in the store.
    var journalIsEmpty: Bool { crashcapture_journal_consumed(journal) == crashcapture_journal_reserved(journal) }

    var droppedBeforeStore: Int { Int(crashcapture_journal_dropped(journal)) }

    /// Moves the committed journal entries into the store, in order, in transactions of at most
    /// `chunkSize` events; each transaction also records how far the journal is imported, so a
    /// death at any moment neither loses nor repeats an event.
    private func drain() {
        // Cleared before reading: an entry committed after this schedules another drain.
        drainScheduled.store(false, ordering: .sequentiallyConsistent)
        atomicMemoryFence(ordering: .sequentiallyConsistent)
        var rows: [EventStore.RawRow] = []
        rows.reserveCapacity(Self.chunkSize)
        // Entries that wrap around the ring's end are read through `scratch`: each gets a copy
        // of its own, kept until its transaction ends. The rest are read where they lie.
        var copies: [UnsafeMutableRawBufferPointer] = []
        defer { copies.forEach { $0.deallocate() } }
        var position = readPosition
        var entry = crashcapture_journal_entry()
        var uncommitted: UInt64 = 0
        while crashcapture_journal_read(journal, position, &entry, scratch, Int(CCF_MAXIMUM_PAYLOAD)) == 1 {
            var bytes = UnsafeRawBufferPointer(start: entry.payload, count: Int(entry.length))
            switch entry.type {
            case UInt32(CCF_JOURNAL_EVENT.rawValue):
                if entry.payload == UnsafePointer(scratch) {
                    let copy = UnsafeMutableRawBufferPointer.allocate(byteCount: bytes.count, alignment: 8)
                    copy.copyMemory(from: bytes)
                    copies.append(copy)
                    bytes = UnsafeRawBufferPointer(copy)
                }
                if let id = JournalEntries.idBytes(bytes) { rows.append((id, bytes)) }
            case UInt32(CCF_JOURNAL_IDENTITY.rawValue):
                if let identity = JournalEntries.identity(bytes) {
                    if !rows.isEmpty {
                        guard commit(&rows, upTo: position) else { return }
                    }
                    written = identity
                }
            default: break
            }
            uncommitted += entry.next - position
            position = entry.next
            if rows.count >= Self.chunkSize || uncommitted >= commitBytes {
                guard commit(&rows, upTo: position) else { return }
                uncommitted = 0
            }
        }
        if position != readPosition { _ = commit(&rows, upTo: position) }
    }

    /// Stores `rows` under the current identity and marks the journal imported up to `position`.
    private func commit(_ rows: inout [EventStore.RawRow], upTo position: UInt64) -> Bool {
        let mark = EventStore.JournalMark(
            sessionID: identity.sessionID, position: position, distinctID: written.distinctID,
            loginID: written.loginID)
        do {
            try store.insert(raw: rows, context: sharedText(written, pid: pid), mark: mark)
        } catch {
            // The entries stay in the journal: the next drain, or the next start, stores them.
            CrashCapture.logger.error("could not store \(rows.count) events: \(error)")
            return false
        }
        rows.removeAll(keepingCapacity: true)
        crashcapture_journal_consume(journal, position)
        crashcapture_journal_prefault(journal, Self.prefaultAhead)
        readPosition = position
        crashcapture_session_alive()
        uploader?.noteInserted()
        return true
    }

    /// How far ahead of track() the writer faults the journal's pages in, during its first lap.
    static let prefaultAhead = 8 << 20

    /// Events per insert transaction when a drain is large.
    static let chunkSize = 8192

    static func padded(_ number: UInt64) -> String {
        let digits = String(number)
        return String(repeating: "0", count: max(0, 12 - digits.utf8.count)) + digits
    }

    /// The journal's text for an event: its own part (name, time, id, method and properties).
    /// The marker stands for the rest (`sharedText`), which the store keeps once and puts back
    /// on every read. Names are plain (`[A-Za-z0-9_$]`), so `"event_id"` is found by its text.
    func journalText(_ event: PendingEvent, id: String) -> String {
        var json = "{\"type\":\"" + event.type + "\",\"event\":"
        json.reserveCapacity(224)
        JSONText.appendQuoted(event.name, to: &json)
        json += ",\"time\":"
        json += String(event.timeMilliseconds)
        json += ",\"event_id\":\""
        json += id
        json += "\""
        if let members = event.recordMembers { json += "," + members }
        json += ",\"lib\":{\"$lib_method\":\""
        json += event.method
        json += "\","
        json += EventStore.contextMarker
        json += ",\"$lib_method\":\"" + event.method + "\""
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

    func sharedText(_ ids: DistinctIdentity, pid: Int32) -> String {
        JournalEntries.sharedText(
            ids, sessionID: identity.sessionID, appVersion: identity.appVersion,
            staticProperties: identity.staticProperties, pid: pid)
    }

    /// The session's normal end: $AppEnd, everything into the store, the session file removed
    /// (nothing is left for a later start to pair), a last bounded upload. `exitBound`: the
    /// whole end, store and upload, takes at most this many seconds (at exit, whatever any
    /// queue is doing); the events not stored by then stay in the session file for the next start.
    func end(reason: String, uploadDeadline: Double, exitBound: Double? = nil) {
        let started = DispatchTime.now()
        // Another thread is reporting a crash: this session ends as crashed, not here. Waits
        // (bounded) for the process to die of it, then deletes and records nothing.
        guard crashcapture_crash_in_progress() == 0 else { return }
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
        if let exitBound {
            // A quarter of a second at least: a writer that is merely busy finishes by then.
            let stored = flushToStore(until: started + max(exitBound, 0.25))
            guard stored else { return }
        } else {
            flushToStore()
        }
        if let directory = CrashCapture.state.withLock({ CrashCapture.state.directory }) {
            CrashCapture.noteCleanEnd(directory: directory)
        }
        if journalIsEmpty {
            crashcapture_session_retire()
            try? store.forgetJournal(session: identity.sessionID)
        }
        // At exit, the upload has what is left of the bound.
        let spent = Double(DispatchTime.now().uptimeNanoseconds - started.uptimeNanoseconds) / 1e9
        let uploadSeconds = min(uploadDeadline, (exitBound ?? .infinity) - spent)
        if uploadSeconds > 0 { uploader?.flushNow(deadline: Date().addingTimeInterval(uploadSeconds)) }
    }
}

/// Reading journal entries back, for the writer and for the import of a dead session's journal.
enum JournalEntries {
    static let idKey: [UInt8] = Array(",\"event_id\":\"".utf8)

    /// An event entry's id (the value of its first `"event_id"`) and its stored payload (all of it).
    static func eventRow(_ bytes: UnsafeRawBufferPointer) -> (id: String, payload: String)? {
        guard let id = idBytes(bytes) else { return nil }
        return (String(decoding: id, as: UTF8.self), String(decoding: bytes, as: UTF8.self))
    }

    static func idBytes(_ bytes: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer? {
        // Within the first hundred-odd bytes: after `{"type":"track","event":"<name>","time":<ms>`.
        let key = idKey
        guard bytes.count > key.count else { return nil }
        var start = 0
        search: for at in 0...(bytes.count - key.count) where bytes[at] == key[0] {
            for offset in 1..<key.count where bytes[at + offset] != key[offset] { continue search }
            start = at + key.count
            break
        }
        guard start > 0, let end = bytes[start...].firstIndex(of: 0x22) else { return nil }
        return UnsafeRawBufferPointer(rebasing: bytes[start..<end])
    }

    static func identity(_ bytes: UnsafeRawBufferPointer) -> DistinctIdentity? {
        guard let object = JSONTree.object(bytes),
            let distinctID = object["distinct_id"] as? String
        else { return nil }
        return DistinctIdentity(distinctID: distinctID, loginID: object["login_id"] as? String)
    }

    /// What every event of a session (and login) has in common, from the middle of `lib` to
    /// the middle of `properties`: most of each event's bytes, so it is stored once, not per row.
    static func sharedText(
        _ ids: DistinctIdentity, sessionID: String, appVersion: String, staticProperties: String, pid: Int32
    ) -> String {
        var json = "\"$lib\":\"\(CCF_LIB_NAME)\",\"$lib_version\":\"\(CrashCapture.version)\",\"$app_version\":"
        JSONText.appendQuoted(appVersion, to: &json)
        json += "},\"distinct_id\":"
        JSONText.appendQuoted(ids.distinctID, to: &json)
        if let login = ids.loginID { json += ",\"login_id\":" + JSONText.quoted(login) }
        json += ",\"session_id\":\"\(sessionID)\",\"properties\":{"
        if !staticProperties.isEmpty { json += staticProperties + "," }
        json += "\"$pid\":\(pid)"
        return json
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
