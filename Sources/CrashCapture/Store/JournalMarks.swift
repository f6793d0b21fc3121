internal import CSQLite
internal import Foundation

/// How far each session's journal is imported, recorded in the transaction that imports it, so
/// that a death at any moment neither loses nor repeats an event.
extension EventStore {
    /// How far a session's journal has been imported, and the ids its next entries carry.
    package struct JournalMark: Sendable, Equatable {
        package var sessionID: String
        package var position: UInt64
        package var distinctID: String
        package var loginID: String?

        package init(sessionID: String, position: UInt64, distinctID: String, loginID: String?) {
            self.sessionID = sessionID
            self.position = position
            self.distinctID = distinctID
            self.loginID = loginID
        }
    }

    func save(_ mark: JournalMark) throws {
        let save = try statement(
            "INSERT OR REPLACE INTO journal_marks(session_id, position, distinct_id, login_id) VALUES (?, ?, ?, ?)")
        try save.bind(1, mark.sessionID)
        try save.bind(2, Int64(bitPattern: mark.position))
        try save.bind(3, mark.distinctID)
        if let login = mark.loginID { try save.bind(4, login) } else { try save.bindNull(4) }
        _ = try save.step()
    }

    /// Where a session's journal import stands, if it was ever started.
    package func journalMark(session sessionID: String) throws -> JournalMark? {
        lock.lock()
        defer { lock.unlock() }
        let select = try statement("SELECT position, distinct_id, login_id FROM journal_marks WHERE session_id = ?")
        defer { select.reset() }
        try select.bind(1, sessionID)
        guard try select.step() else { return nil }
        return JournalMark(
            sessionID: sessionID, position: UInt64(bitPattern: select.int64(0)), distinctID: select.text(1),
            loginID: select.isNull(2) ? nil : select.text(2))
    }

    /// The session file is gone: its mark is no longer needed.
    package func forgetJournal(session sessionID: String) throws {
        lock.lock()
        defer { lock.unlock() }
        let delete = try statement("DELETE FROM journal_marks WHERE session_id = ?")
        try delete.bind(1, sessionID)
        _ = try delete.step()
    }
}
