internal import CSQLite
internal import Foundation

/// One crash of the store's history: every crash imported, kept after its event is uploaded
/// and deleted, for `crashcap list` (as `coredumpctl list` lists core dumps) and `crashcap show`.
/// The newest `EventStore.crashHistoryKept` are kept, the newest of them with their whole report
/// (`EventStore.crashReportsKept`).
package struct CrashHistoryEntry: Sendable, Equatable {
    package var eventID: String
    package var timeMilliseconds: Int64
    package var signal: String
    package var title: String
    package var fingerprint: String
    package var appVersion: String

    package init(
        eventID: String, timeMilliseconds: Int64, signal: String, title: String, fingerprint: String,
        appVersion: String
    ) {
        self.eventID = eventID
        self.timeMilliseconds = timeMilliseconds
        self.signal = signal
        self.title = title
        self.fingerprint = fingerprint
        self.appVersion = appVersion
    }
}

extension EventStore {
    /// Notes one crash of `fingerprint` (idempotent per event id) and returns how many crashes of
    /// it fall in the `window` ms before and including `timeMilliseconds`, this one included,
    /// with the first of them. Occurrences older than a day are forgotten as new ones come.
    package func noteCrash(fingerprint: String, eventID: String, timeMilliseconds: Int64, window: Int64) throws -> (
        count: Int, firstMilliseconds: Int64
    ) {
        lock.lock()
        defer { lock.unlock() }
        return try noteCrashLocked(
            fingerprint: fingerprint, eventID: eventID, timeMilliseconds: timeMilliseconds, window: window)
    }

    func noteCrashLocked(fingerprint: String, eventID: String, timeMilliseconds: Int64, window: Int64) throws
        -> (count: Int, firstMilliseconds: Int64)
    {
        let note = try statement(
            "INSERT OR IGNORE INTO crash_occurrences(fingerprint, event_id, time_ms) VALUES (?, ?, ?)")
        try note.bind(1, fingerprint)
        try note.bind(2, eventID)
        try note.bind(3, timeMilliseconds)
        _ = try note.step()
        let isNew = connection.changes > 0
        let forget = try statement("DELETE FROM crash_occurrences WHERE time_ms < ?")
        try forget.bind(1, timeMilliseconds - max(window, 86_400_000))
        _ = try forget.step()
        // One row per fingerprint counts the run of crashes that started within the window:
        // counting the occurrences themselves cost a scan per crash, quadratic in a crash loop.
        let run = try statement("SELECT first_ms, count FROM crash_runs WHERE fingerprint = ?")
        try run.bind(1, fingerprint)
        var first = timeMilliseconds
        var count = 1
        if try run.step() {
            let runFirst = run.int64(0)
            let runCount = Int(run.int64(1))
            if timeMilliseconds - runFirst <= window && timeMilliseconds >= runFirst - window {
                first = min(runFirst, timeMilliseconds)
                count = isNew ? runCount + 1 : runCount
            } else if !isNew {
                return (runCount, runFirst)
            }
        }
        let save = try statement(
            "INSERT INTO crash_runs(fingerprint, first_ms, count) VALUES (?, ?, ?) "
                + "ON CONFLICT(fingerprint) DO UPDATE SET first_ms = excluded.first_ms, count = excluded.count")
        try save.bind(1, fingerprint)
        try save.bind(2, first)
        try save.bind(3, Int64(count))
        _ = try save.step()
        return (count, first)
    }

    /// Crashes kept in the history at most; the oldest go first.
    package static let crashHistoryKept = 1000

    /// The crash history, newest first.
    package func crashHistory(limit: Int = EventStore.crashHistoryKept) throws -> [CrashHistoryEntry] {
        lock.lock()
        defer { lock.unlock() }
        let select = try connection.prepare(
            "SELECT event_id, time_ms, signal, title, fingerprint, app_version FROM crash_history "
                + "ORDER BY time_ms DESC, event_id DESC LIMIT ?")
        try select.bind(1, Int64(limit))
        var entries: [CrashHistoryEntry] = []
        while try select.step() {
            entries.append(
                CrashHistoryEntry(
                    eventID: select.text(0), timeMilliseconds: select.int64(1), signal: select.text(2),
                    title: select.text(3), fingerprint: select.text(4), appVersion: select.text(5)))
        }
        return entries
    }

    /// Whole reports (the `$AppCrashed` event as imported) kept in the history at most, the
    /// newest, and their bytes at most: a server's crash with every thread named is megabytes.
    /// Older crashes keep their line in the history without the report.
    package static let crashReportsKept = 100
    package static let crashReportBytesKept = 32 << 20

    /// The report of one crash of the history, the `$AppCrashed` event as it was imported: from
    /// the history, or from the events still waiting to be uploaded (a crash imported before the
    /// history kept reports). Nil when neither has it any more.
    package func crashReport(eventID: String) throws -> String? {
        lock.lock()
        defer { lock.unlock() }
        let kept = try connection.prepare(
            "SELECT payload FROM crash_history WHERE event_id = ? AND payload IS NOT NULL")
        try kept.bind(1, eventID)
        if try kept.step() { return kept.text(0) }
        let waiting = try connection.prepare("SELECT \(Self.payloadColumn) FROM events WHERE event_id = ?")
        try waiting.bind(1, eventID)
        return try waiting.step() ? waiting.text(0) : nil
    }

    /// The stacks record kept with a crash's report (every thread's registers and stack, what a
    /// minidump is made of); nil when the crash had none, or its report is no longer kept.
    package func crashStacks(eventID: String) throws -> [UInt8]? {
        lock.lock()
        defer { lock.unlock() }
        let kept = try connection.prepare("SELECT stacks FROM crash_history WHERE event_id = ? AND stacks IS NOT NULL")
        try kept.bind(1, eventID)
        return try kept.step() ? kept.blob(0) : nil
    }

    /// The crashes whose minidump is still to be sent (a report and its stacks kept, not sent
    /// nor refused yet), oldest first.
    package func pendingMinidumps() throws -> [String] {
        lock.lock()
        defer { lock.unlock() }
        let pending = try connection.prepare(
            "SELECT event_id FROM crash_history WHERE minidump_sent = 0 AND stacks IS NOT NULL "
                + "AND payload IS NOT NULL ORDER BY time_ms, event_id")
        var ids: [String] = []
        while try pending.step() { ids.append(pending.text(0)) }
        return ids
    }

    /// Notes a crash's minidump as sent (1) or refused for good by the receiver (2): it is
    /// never sent again.
    package func markMinidump(eventID: String, refused: Bool = false) throws {
        lock.lock()
        defer { lock.unlock() }
        let mark = try connection.prepare("UPDATE crash_history SET minidump_sent = ? WHERE event_id = ?")
        try mark.bind(1, Int64(refused ? 2 : 1))
        try mark.bind(2, eventID)
        _ = try mark.step()
    }

    /// Keeps a crash's whole report with its line of the history; inside the transaction that
    /// imports it. The oldest reports beyond the count or the bytes kept are let go.
    func keepCrashReportLocked(eventID: String, payload: String, stacks: [UInt8]? = nil) throws {
        var payload = payload
        try payload.withUTF8 {
            try keepCrashReportLocked(eventID: eventID, text: UnsafeRawBufferPointer($0), stacks: stacks)
        }
    }

    func keepCrashReportLocked(eventID: String, text: UnsafeRawBufferPointer, stacks: [UInt8]? = nil) throws {
        let keep = try statement(
            "UPDATE crash_history SET payload = ?, payload_bytes = ?, stacks = ? WHERE event_id = ?")
        // The report's text bound where it is, not copied: it can be tens of MB.
        do {
            defer { keep.reset() }
            try keep.bind(1, borrowing: text)
            try keep.bind(2, Int64(text.count + (stacks?.count ?? 0)))
            if let stacks { try keep.bind(3, blob: stacks) } else { try keep.bindNull(3) }
            try keep.bind(4, eventID)
            _ = try keep.step()
        }
        // The sizes are summed from their own column: reading the reports' text to measure it
        // would read up to crashReportBytesKept at every import.
        let trim = try statement(
            """
            UPDATE crash_history SET payload = NULL, payload_bytes = 0, stacks = NULL WHERE event_id IN (
                SELECT event_id FROM (
                    SELECT event_id, ROW_NUMBER() OVER newest AS n, SUM(payload_bytes) OVER newest AS bytes
                    FROM crash_history WHERE payload IS NOT NULL
                    WINDOW newest AS (ORDER BY time_ms DESC, event_id DESC))
                WHERE n > ? OR bytes > ?)
            """)
        try trim.bind(1, Int64(Self.crashReportsKept))
        try trim.bind(2, Int64(Self.crashReportBytesKept))
        _ = try trim.step()
    }

    /// Notes one imported crash; inside the transaction that imports it, so the two agree.
    func noteCrashInHistoryLocked(_ entry: CrashHistoryEntry) throws {
        let note = try statement(
            "INSERT OR IGNORE INTO crash_history(event_id, time_ms, signal, title, fingerprint, app_version) "
                + "VALUES (?, ?, ?, ?, ?, ?)")
        try note.bind(1, entry.eventID)
        try note.bind(2, entry.timeMilliseconds)
        try note.bind(3, entry.signal)
        try note.bind(4, entry.title)
        try note.bind(5, entry.fingerprint)
        try note.bind(6, entry.appVersion)
        _ = try note.step()
        let trim = try statement(
            "DELETE FROM crash_history WHERE event_id NOT IN "
                + "(SELECT event_id FROM crash_history ORDER BY time_ms DESC, event_id DESC LIMIT ?)")
        try trim.bind(1, Int64(Self.crashHistoryKept))
        _ = try trim.step()
    }
}

extension EventStore.Transaction {
    package func noteCrashInHistory(_ entry: CrashHistoryEntry) throws {
        try store.noteCrashInHistoryLocked(entry)
    }

    package func keepCrashReport(eventID: String, payload: String, stacks: [UInt8]? = nil) throws {
        try store.keepCrashReportLocked(eventID: eventID, payload: payload, stacks: stacks)
    }

    package func keepCrashReport(eventID: String, bytes: [UInt8], stacks: [UInt8]? = nil) throws {
        try bytes.withUnsafeBytes { try store.keepCrashReportLocked(eventID: eventID, text: $0, stacks: stacks) }
    }
}
