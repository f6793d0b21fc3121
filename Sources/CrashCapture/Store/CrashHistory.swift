internal import CSQLite
internal import Foundation

/// Every crash imported into the store, kept after its event is uploaded and deleted: what
/// `crashcap list` shows, as `coredumpctl list` does for core dumps. The newest
/// `CrashHistory.kept` are kept.
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
}
