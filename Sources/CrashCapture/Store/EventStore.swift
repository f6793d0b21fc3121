internal import CSQLite
internal import Foundation

/// The on-disk event cache: one SQLite database (WAL) holding events in the order they
/// happened, each under a unique event id, so any import or upload retried after an
/// interruption neither duplicates nor loses an event.
///
/// Thread-safe, hence `@unchecked Sendable`: every operation holds `lock` around the single
/// connection and the counters.
package final class EventStore: @unchecked Sendable {
    package typealias Limits = CrashCapture.StoreLimits

    package struct Event: Sendable, Equatable {
        package let sequence: Int64
        package let eventID: String
        package let payload: String
    }

    /// Rows handed to one upload attempt; they stay in the store until `complete`.
    package struct Batch: Sendable {
        package let token: Int64
        package let events: [Event]
    }

    package struct InsertResult: Sendable, Equatable {
        package var inserted = 0
        package var duplicates = 0
        package var dropped = 0
    }

    /// Application id in the SQLite header ("CCAP"): tells our database from someone else's.
    static let applicationID: Int64 = 0x4343_4150
    static let schemaVersion: Int64 = 2
    /// Stands in a stored payload for the text its session's events share (the `contexts` row:
    /// ids, library, static properties): most of every event's bytes, so each session stores
    /// them once. A raw 0x01 cannot occur in our JSON, where control characters are always escaped.
    package static let contextMarker = "\u{1}"
    /// Every read gives the payload back whole.
    package static let payloadColumn =
        "CASE WHEN context = 0 THEN payload ELSE replace(payload, char(1), (SELECT text FROM contexts WHERE id = context)) END"

    package let path: String
    package let limits: Limits
    /// Set when the file found at `path` was damaged or not ours and was renamed, not deleted.
    package private(set) var movedAside: (path: String, reason: String)?

    var connection: SQLiteConnection!
    let lock = StoreLock()
    var eventCount = 0
    var eventBytes = 0
    /// Every row up to this sequence number was delivered and is no longer counted, but is
    /// still in the table: deleting a batch's rows in the commit that acknowledges it wrote
    /// about fifteen pages into the WAL for each batch of 50, most of the uploader's
    /// store time (`crashcap-bench claim`). The mark is saved with the totals, in that same
    /// commit, so a crash re-sends nothing more than before; the rows go in bulk
    /// (`purgeAcknowledged`) every `purgeRows`, when the queue runs dry, and at open.
    /// Delivered rows are always the oldest, so every newer row's sequence number is larger.
    var acknowledgedThrough: Int64 = 0
    var acknowledgedRows = 0
    static let purgeRows = 1000
    var nextToken: Int64 = 1
    private let checkpointPages: Int
    private let backgroundCheckpoints: Bool
    private var checkpointer: BackgroundCheckpointer?
    /// The batches being uploaded: token → the sequence range the batch spans, no two
    /// overlapping. Kept here, not in the table: a claim then writes nothing (marking the rows
    /// rewrote their pages into the WAL, as much as the delete that follows), and a claim
    /// never outlived its process anyway (the rows went back in line at the next open).
    var inFlight: [Int64: ClosedRange<Int64>] = [:]
    private var insertStatement: SQLiteStatement!
    private var rememberStatement: SQLiteStatement!
    private var seenStatement: SQLiteStatement!

    /// `verifyNow`: read the whole file for damage before returning (SQLite's quick_check,
    /// tens of ms for a full store). The SDK passes false and calls `checkIntegrity()` on its
    /// writer queue instead, off the installing thread; damage that shows at open (not a
    /// database, not ours) is always caught here.
    /// `checkpointPages`: how large the WAL grows (in 4 KiB pages) before it is copied into the
    /// database, with two fsyncs; SQLite's default is 1,000.
    /// `backgroundCheckpoints`: the WAL is copied into the database beside the writer, on
    /// libdispatch's threads and a second connection opened at the first round (see
    /// `BackgroundCheckpointer`); false leaves it to SQLite, in the commit that crosses
    /// `checkpointPages`.
    /// `openInBackground`: a store that does not exist yet is made on another thread, and
    /// whoever uses it first waits until it is (the SDK's install: making a new store, its WAL
    /// and schema, was 1.1 ms of the 2.4 ms an install into a new directory took). A store
    /// that exists is opened here as always, for its damage to show at once.
    package init(
        path: String, limits: Limits = Limits(), verifyNow: Bool = true, checkpointPages: Int = 1000,
        backgroundCheckpoints: Bool = true, openInBackground: Bool = false
    ) throws {
        guard limits.maximumEvents > 0, limits.maximumBytes > 0 else {
            throw CrashCaptureError.invalidArgument("event store limits must be positive")
        }
        self.path = path
        self.limits = limits
        self.checkpointPages = max(1, checkpointPages)
        self.backgroundCheckpoints = backgroundCheckpoints
        if openInBackground && access(path, F_OK) != 0 {
            lock.shutGate()
            DispatchQueue.global(qos: .userInitiated).async { [self] in
                lock.lockPastTheGate()
                defer {
                    lock.unlock()
                    lock.openGate()
                }
                do {
                    connection = try Self.openChecked(path, verify: false)
                    try load()
                } catch {
                    openedReadOnlyAfter(error)
                }
            }
            return
        }
        lock.lock()
        defer { lock.unlock() }
        do {
            connection = try Self.openChecked(path, verify: verifyNow)
        } catch let problem as StoreProblem {
            try startOver(problem)
            return
        }
        try load()
    }

    /// A store that could not be made in the background is an empty store in memory that
    /// refuses every write, so that the events stay in the journal where they are (the writer
    /// logs each refusal) and the next start stores them.
    private func openedReadOnlyAfter(_ error: Error) {
        CrashCapture.logger.error(
            "the event store \(path) could not be made: \(error); events wait in the session file for the next start")
        statements = [:]
        do {
            connection = try SQLiteConnection(path: ":memory:")
            try Self.createSchema(connection)
            try load()
            try connection.execute("PRAGMA query_only = ON")
        } catch {
            CrashCapture.logger.error("not even an empty store in memory: \(error)")
        }
    }

    /// Reads the whole file for damage; a damaged store is moved aside and a new one started.
    /// Returns whether that happened (`movedAside` then says where to, and why).
    @discardableResult
    package func checkIntegrity() throws -> Bool {
        lock.lock()
        defer { lock.unlock() }
        let result: String
        do {
            result = try connection.scalarText("PRAGMA quick_check(1)")
        } catch let error as SQLiteError where error.isCorruption {
            result = error.message
        }
        guard result != "ok" else { return false }
        try startOver(StoreProblem(reason: "damaged: \(result)"))
        return true
    }

    /// A one-line account of a store that was moved aside, for the operator.
    package var movedAsideNotice: String? {
        movedAside.map { "the event store \(path) was \($0.reason); it was moved to \($0.path)" }
    }

    private func startOver(_ problem: StoreProblem) throws {
        // Statements and the connection go first, so the file is closed before it is renamed.
        insertStatement = nil
        rememberStatement = nil
        seenStatement = nil
        statements = [:]
        connection = nil
        let aside = try Self.moveAside(path)
        movedAside = (aside, problem.reason)
        connection = try Self.openChecked(path, verify: false)
        try load()
    }

    deinit { checkpointer?.stop() }

    private func load() throws {
        try connection.execute("PRAGMA wal_autocheckpoint = \(checkpointPages)")
        // After a burst the WAL file shrinks back instead of keeping its largest size, but not
        // below what one round of checkpoints lets it reach: a WAL cut shorter at every restart
        // would be grown again, page by new page, every round.
        try connection.execute("PRAGMA journal_size_limit = \(max(16 << 20, checkpointPages * 4096 * 2))")
        if backgroundCheckpoints {
            checkpointer?.stop()
            let checkpointer = BackgroundCheckpointer(path: path, startPages: checkpointPages)
            checkpointer.attach(to: connection)
            self.checkpointer = checkpointer
        }
        contextIDs = [:]
        try prepareStatements()
        try readTotals()
        inFlight = [:]
        if acknowledgedThrough > 0 { try change { try purgeAcknowledged() } }
        // A store last written by a version that marked claimed rows in the table: they go
        // back in line (the collector de-duplicates). The partial index `events_in_flight`,
        // kept for this, makes it a lookup of nothing in any other store.
        try connection.execute("UPDATE events SET in_flight = 0 WHERE in_flight != 0")
    }

    /// The count and size of the stored events, kept in `meta` by every change (in the same
    /// transaction), so that opening a full store does not read every row to add them up.
    private func readTotals() throws {
        let totals = try connection.prepare(
            "SELECT key, value FROM meta WHERE key IN ('count', 'bytes', 'acknowledged')")
        var found: [String: Int] = [:]
        while try totals.step() { found[totals.text(0)] = Int(totals.int64(1)) }
        totals.reset()
        acknowledgedThrough = Int64(found["acknowledged"] ?? 0)
        if let count = found["count"], let bytes = found["bytes"] {
            eventCount = count
            eventBytes = bytes
            return
        }
        let scan = try connection.prepare("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM events")
        if try scan.step() {
            eventCount = Int(scan.int64(0))
            eventBytes = Int(scan.int64(1))
        }
        scan.reset()
        try saveTotals()
    }

    private func saveTotals() throws {
        let save = try statement(
            "INSERT OR REPLACE INTO meta(key, value) VALUES ('count', ?), ('bytes', ?), ('acknowledged', ?)")
        try save.bind(1, Int64(eventCount))
        try save.bind(2, Int64(eventBytes))
        try save.bind(3, acknowledgedThrough)
        _ = try save.step()
    }

    /// The statements an upload runs for every batch, prepared once; reset and ready to bind.
    private var statements: [String: SQLiteStatement] = [:]

    func statement(_ sql: String) throws -> SQLiteStatement {
        if let known = statements[sql] {
            known.reset()
            return known
        }
        let prepared = try connection.prepare(sql)
        statements[sql] = prepared
        return prepared
    }

    /// One transaction that changes the events: the totals are saved with it, and restored
    /// from the store if it is rolled back.
    func change<T>(_ body: () throws -> T) throws -> T {
        do {
            return try connection.transaction {
                let result = try body()
                try saveTotals()
                return result
            }
        } catch {
            try? readTotals()
            throw error
        }
    }

    private func prepareStatements() throws {
        insertStatement = try connection.prepare(
            "INSERT OR IGNORE INTO events(event_id, payload, bytes, context) VALUES (?, ?, ?, ?)")
        rememberStatement = try connection.prepare("INSERT OR IGNORE INTO imported_ids(event_id) VALUES (?)")
        seenStatement = try connection.prepare("SELECT 1 FROM imported_ids WHERE event_id = ?")
    }

    /// Appends events in the given order in one transaction. An event id already present (or,
    /// with `rememberIDs`, ever imported before) is skipped and counted as a duplicate.
    /// `context`: the text that `contextMarker` stands for in these payloads (stored once).
    /// `mark`: recorded in the same transaction, so a journal is imported exactly once.
    @discardableResult
    package func insert(
        _ events: [(id: String, payload: String)], rememberIDs: Bool = false, context: String? = nil,
        mark: JournalMark? = nil
    ) throws -> InsertResult {
        try insertRows(events.count, context: context, mark: mark, row: Self.rows(events, remember: rememberIDs))
    }

    /// Hands each event's id and payload bytes to the insert loop.
    private static func rows(_ events: [(id: String, payload: String)], remember: Bool) -> (
        Int, (UnsafeRawBufferPointer, UnsafeRawBufferPointer, Bool) throws -> Void
    ) throws -> Void {
        { index, insertRow in
            var id = events[index].id
            var payload = events[index].payload
            try id.withUTF8 { id in
                try payload.withUTF8 { payload in
                    try insertRow(UnsafeRawBufferPointer(id), UnsafeRawBufferPointer(payload), remember)
                }
            }
        }
    }

    /// A journal's rows, as the bytes the journal holds: bound to the insert where they are,
    /// with no string made of them. Otherwise like `insert`.
    package typealias RawRow = (id: UnsafeRawBufferPointer, payload: UnsafeRawBufferPointer)

    @discardableResult
    package func insert(raw rows: [RawRow], context: String, mark: JournalMark) throws -> InsertResult {
        try insertRows(rows.count, context: context, mark: mark) { index, insertRow in
            try insertRow(rows[index].id, rows[index].payload, false)
        }
    }

    /// The one insert loop: `row(index, insertRow)` hands each row's bytes to `insertRow`, whose
    /// last argument asks for the id to be remembered.
    private func insertRows(
        _ count: Int, context: String?, mark: JournalMark?,
        row: (Int, (UnsafeRawBufferPointer, UnsafeRawBufferPointer, Bool) throws -> Void) throws -> Void
    ) throws -> InsertResult {
        lock.lock()
        defer { lock.unlock() }
        return try change { try insertRowsInTransaction(count, context: context, mark: mark, row: row) }
    }

    /// `insertRows` for a caller that holds the lock and has begun the transaction.
    private func insertRowsInTransaction(
        _ count: Int, context: String?, mark: JournalMark?,
        row: (Int, (UnsafeRawBufferPointer, UnsafeRawBufferPointer, Bool) throws -> Void) throws -> Void
    ) throws -> InsertResult {
        var result = InsertResult()
        let contextRow = try context.map { try self.contextID(for: $0) } ?? 0
        if let mark { try self.save(mark) }
        for index in 0..<count {
            try row(index) { id, payload, remember in
                try self.insertRow(id: id, payload: payload, context: contextRow, remember: remember, into: &result)
            }
        }
        insertStatement.reset()
        rememberStatement.reset()
        result.dropped = try enforceLimits()
        return result
    }

    /// Several changes under one lock and committed together: a replay stores a few dozen crash
    /// files this way, with one commit rather than four for each (most of its store time).
    /// Nothing `body` did is kept if it throws.
    package func transaction<T>(_ body: (Transaction) throws -> T) throws -> T {
        lock.lock()
        defer { lock.unlock() }
        return try change { try body(Transaction(store: self)) }
    }

    /// The changes that can be made inside `transaction`.
    package struct Transaction {
        let store: EventStore

        @discardableResult
        package func insert(_ events: [(id: String, payload: String)], rememberIDs: Bool = false) throws
            -> InsertResult
        {
            try store.insertRowsInTransaction(
                events.count, context: nil, mark: nil, row: EventStore.rows(events, remember: rememberIDs))
        }

        /// Like `insert`, with each payload as its UTF-8 bytes: no String made of a large one.
        @discardableResult
        package func insert(bytes events: [(id: String, payload: [UInt8])], rememberIDs: Bool = false) throws
            -> InsertResult
        {
            try store.insertRowsInTransaction(events.count, context: nil, mark: nil) { index, insertRow in
                var id = events[index].id
                try id.withUTF8 { id in
                    try events[index].payload.withUnsafeBytes { payload in
                        try insertRow(UnsafeRawBufferPointer(id), payload, rememberIDs)
                    }
                }
            }
        }

        package func noteCrash(fingerprint: String, eventID: String, timeMilliseconds: Int64, window: Int64) throws
            -> (count: Int, firstMilliseconds: Int64)
        {
            try store.noteCrashLocked(
                fingerprint: fingerprint, eventID: eventID, timeMilliseconds: timeMilliseconds, window: window)
        }
    }

    private func insertRow(
        id: UnsafeRawBufferPointer, payload: UnsafeRawBufferPointer, context: Int64, remember: Bool,
        into result: inout InsertResult
    ) throws {
        if remember || Self.isLifecycleID(id) {
            seenStatement.reset()
            try seenStatement.bind(1, borrowing: id)
            let seen = try seenStatement.step()
            seenStatement.reset()
            if seen {
                result.duplicates += 1
                return
            }
            rememberStatement.reset()
            try rememberStatement.bind(1, borrowing: id)
            try rememberStatement.step()
        }
        insertStatement.reset()
        try insertStatement.bind(1, borrowing: id)
        try insertStatement.bind(2, borrowing: payload)
        try insertStatement.bind(3, Int64(payload.count))
        try insertStatement.bind(4, context)
        try insertStatement.step()
        if connection.changes == 1 {
            result.inserted += 1
            eventCount += 1
            eventBytes += payload.count
        } else {
            result.duplicates += 1
        }
    }

    /// A session's $AppStart and $AppEnd (ids ending in -start, -end) may reach the store by
    /// several roads (the journal, a crash file, the pairing of a killed session): their ids are
    /// always remembered, so each is stored once even after it was uploaded and deleted.
    static func isLifecycleID(_ id: UnsafeRawBufferPointer) -> Bool {
        func ends(_ suffix: StaticString) -> Bool {
            let count = suffix.utf8CodeUnitCount
            guard id.count >= count else { return false }
            return memcmp(id.baseAddress! + id.count - count, suffix.utf8Start, count) == 0
        }
        return ends("-start") || ends("-end")
    }

    /// Whether an event id was ever stored with its id remembered (a lifecycle event, an import).
    package func hasRemembered(_ id: String) throws -> Bool {
        lock.lock()
        defer { lock.unlock() }
        seenStatement.reset()
        try seenStatement.bind(1, id)
        defer { seenStatement.reset() }
        return try seenStatement.step()
    }

    private var contextIDs: [String: Int64] = [:]

    private func contextID(for text: String) throws -> Int64 {
        if let known = contextIDs[text] { return known }
        let insert = try connection.prepare("INSERT OR IGNORE INTO contexts(text) VALUES (?)")
        try insert.bind(1, text)
        try insert.step()
        let select = try connection.prepare("SELECT id FROM contexts WHERE text = ?")
        try select.bind(1, text)
        defer { select.reset() }
        guard try select.step() else {
            throw CrashCaptureError(.database, "cannot record the event context", path: path)
        }
        contextIDs[text] = select.int64(0)
        return select.int64(0)
    }

    /// Forgets shared texts that no stored event refers to any more (each session and each login
    /// leaves one behind). Reads every row, so the SDK calls it on its writer queue.
    package func pruneContexts() throws {
        lock.lock()
        defer { lock.unlock() }
        try connection.execute("DELETE FROM contexts WHERE id NOT IN (SELECT context FROM events)")
        contextIDs.removeAll()
    }

    /// Drops the oldest events (never ones in flight) until both limits hold again.
    private func enforceLimits() throws -> Int {
        guard eventCount > limits.maximumEvents || eventBytes > limits.maximumBytes else { return 0 }
        try purgeAcknowledged()
        let oldest = try connection.prepare("SELECT seq, bytes FROM events ORDER BY seq")
        var cutoff: Int64 = -1
        var dropped = 0
        var count = eventCount
        var bytes = eventBytes
        while count > limits.maximumEvents || bytes > limits.maximumBytes, try oldest.step() {
            let sequence = oldest.int64(0)
            if isInFlight(sequence) { continue }
            cutoff = sequence
            bytes -= Int(oldest.int64(1))
            count -= 1
            dropped += 1
        }
        oldest.reset()
        guard dropped > 0 else { return 0 }
        let spared = inFlight.values.map { " AND seq NOT BETWEEN \($0.lowerBound) AND \($0.upperBound)" }.joined()
        try connection.execute("DELETE FROM events WHERE seq <= \(cutoff)\(spared)")
        try connection.execute("UPDATE meta SET value = value + \(dropped) WHERE key = 'dropped'")
        eventCount = count
        eventBytes = bytes
        return dropped
    }

    /// Events in order, after a sequence number (for inspection and the collector's GET /events).
    package func events(after sequence: Int64 = 0, limit: Int = 1000) throws -> [Event] {
        lock.lock()
        defer { lock.unlock() }
        let select = try connection.prepare(
            "SELECT seq, event_id, \(Self.payloadColumn) FROM events WHERE seq > ? ORDER BY seq LIMIT ?")
        try select.bind(1, max(sequence, acknowledgedThrough))
        try select.bind(2, Int64(limit))
        var events: [Event] = []
        while try select.step() {
            events.append(Event(sequence: select.int64(0), eventID: select.text(1), payload: select.text(2)))
        }
        return events
    }

    package var count: Int {
        lock.lock()
        defer { lock.unlock() }
        return eventCount
    }

    package var byteCount: Int {
        lock.lock()
        defer { lock.unlock() }
        return eventBytes
    }

    /// Events dropped by the cap since the store was created.
    package var droppedCount: Int {
        lock.lock()
        defer { lock.unlock() }
        return Int((try? connection.scalarInt("SELECT value FROM meta WHERE key = 'dropped'")) ?? 0)
    }

    package var rejectedCount: Int {
        lock.lock()
        defer { lock.unlock() }
        return Int((try? connection.scalarInt("SELECT COUNT(*) FROM rejected_events")) ?? 0)
    }
}
