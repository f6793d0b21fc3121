internal import CSQLite
internal import Foundation

/// A thin, strict wrapper over one SQLite connection: every failure is an error with
/// SQLite's own message, and statements are finalized when dropped.
package final class SQLiteConnection {
    let handle: OpaquePointer
    let path: String

    package init(path: String) throws {
        var db: OpaquePointer?
        // A link under the store's name (or its -wal, -shm) is refused, never read or written through.
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_NOFOLLOW
        let status = sqlite3_open_v2(path, &db, flags, nil)
        guard status == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            if let db { sqlite3_close_v2(db) }
            throw SQLiteError(code: status, message: "cannot open \(path): \(message)")
        }
        handle = db
        self.path = path
        sqlite3_busy_timeout(db, 5000)
    }

    deinit { sqlite3_close_v2(handle) }

    package func execute(_ sql: String) throws {
        var error: UnsafeMutablePointer<CChar>?
        let status = sqlite3_exec(handle, sql, nil, nil, &error)
        if status != SQLITE_OK {
            let message = error.map { String(cString: $0) } ?? String(cString: sqlite3_errmsg(handle))
            sqlite3_free(error)
            throw SQLiteError(code: status, message: message)
        }
    }

    package func prepare(_ sql: String) throws -> SQLiteStatement {
        var statement: OpaquePointer?
        let status = sqlite3_prepare_v2(handle, sql, -1, &statement, nil)
        guard status == SQLITE_OK, let statement else { throw error(status) }
        return SQLiteStatement(connection: self, handle: statement)
    }

    func error(_ status: Int32) -> SQLiteError {
        SQLiteError(code: status, message: String(cString: sqlite3_errmsg(handle)))
    }

    /// Runs `body` in one IMMEDIATE transaction: all of it lands, or none.
    func transaction<T>(_ body: () throws -> T) throws -> T {
        try execute("BEGIN IMMEDIATE")
        do {
            let result = try body()
            try execute("COMMIT")
            return result
        } catch {
            try? execute("ROLLBACK")
            throw error
        }
    }

    package func scalarInt(_ sql: String) throws -> Int64 {
        let statement = try prepare(sql)
        // An unfinished statement holds a read transaction open; end it before returning.
        defer { statement.reset() }
        guard try statement.step() else { return 0 }
        return statement.int64(0)
    }

    func scalarText(_ sql: String) throws -> String {
        let statement = try prepare(sql)
        defer { statement.reset() }
        guard try statement.step() else { return "" }
        return statement.text(0)
    }

    var changes: Int { Int(sqlite3_changes(handle)) }
}

package final class SQLiteStatement {
    let connection: SQLiteConnection
    let handle: OpaquePointer

    init(connection: SQLiteConnection, handle: OpaquePointer) {
        self.connection = connection
        self.handle = handle
    }

    deinit { sqlite3_finalize(handle) }

    package func reset() {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
    }

    package func bind(_ index: Int32, _ value: Int64) throws {
        let status = sqlite3_bind_int64(handle, index, value)
        if status != SQLITE_OK { throw connection.error(status) }
    }

    package func bind(_ index: Int32, _ value: String) throws {
        // From the string's own bytes: passing the String as a C string made a copy of it first
        // (tens of MB for a large crash report's payload), which SQLite then copies again.
        var value = value
        let status = value.withUTF8 { bytes in
            guard bytes.count <= Int32.max else { return SQLITE_TOOBIG }
            return sqlite3_bind_text(
                handle, index,
                UnsafeRawPointer(bytes.baseAddress ?? UnsafePointer(bitPattern: 1)!)
                    .assumingMemoryBound(to: CChar.self),
                Int32(bytes.count), csqlite_transient())
        }
        if status != SQLITE_OK { throw connection.error(status) }
    }

    /// Binds text that stays where it is until the statement is reset: no copy.
    func bind(_ index: Int32, borrowing text: UnsafeRawBufferPointer) throws {
        guard text.count <= Int32.max else { throw connection.error(SQLITE_TOOBIG) }
        let status = sqlite3_bind_text(
            handle, index, text.baseAddress?.assumingMemoryBound(to: CChar.self), Int32(text.count), nil)
        if status != SQLITE_OK { throw connection.error(status) }
    }

    func bind(_ index: Int32, blob: [UInt8]) throws {
        let status = blob.withUnsafeBytes {
            sqlite3_bind_blob(handle, index, $0.baseAddress, Int32($0.count), csqlite_transient())
        }
        if status != SQLITE_OK { throw connection.error(status) }
    }

    package func bindNull(_ index: Int32) throws {
        let status = sqlite3_bind_null(handle, index)
        if status != SQLITE_OK { throw connection.error(status) }
    }

    package func isNull(_ column: Int32) -> Bool { sqlite3_column_type(handle, column) == SQLITE_NULL }

    /// True while a row is available; false when done.
    @discardableResult
    package func step() throws -> Bool {
        let status = sqlite3_step(handle)
        if status == SQLITE_ROW { return true }
        if status == SQLITE_DONE { return false }
        throw connection.error(status)
    }

    package func int64(_ column: Int32) -> Int64 { sqlite3_column_int64(handle, column) }

    func blob(_ column: Int32) -> [UInt8] {
        let count = Int(sqlite3_column_bytes(handle, column))
        guard count > 0, let pointer = sqlite3_column_blob(handle, column) else { return [] }
        return Array(UnsafeRawBufferPointer(start: pointer, count: count))
    }

    package func text(_ column: Int32) -> String {
        guard let pointer = sqlite3_column_text(handle, column) else { return "" }
        return String(cString: pointer)
    }
}

package struct SQLiteError: Error, CustomStringConvertible {
    package let code: Int32
    package let message: String
    package var description: String { "SQLite error \(code): \(message)" }
    /// The file is not a database, or is damaged.
    var isCorruption: Bool {
        let primary = code & 0xff
        return primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT
    }
}
