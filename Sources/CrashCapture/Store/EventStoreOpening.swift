internal import CSQLite
internal import Foundation

/// Opening the store: the file checked to be ours, the pragmas, the schema; and a damaged
/// store set aside.
extension EventStore {
    struct StoreProblem: Error {
        let reason: String
    }

    static func openChecked(_ path: String, verify: Bool) throws -> SQLiteConnection {
        let connection: SQLiteConnection
        // Links are never followed (SQLITE_OPEN_NOFOLLOW refuses them too, without saying why).
        // A link in place of the -wal or -shm holds nothing of ours: it goes. One in place of
        // the store is set aside like a damaged store, so capture goes on with a new one.
        for companion in [path + "-wal", path + "-shm"] where PrivateFiles.isLink(companion) { unlink(companion) }
        if PrivateFiles.isLink(path) {
            throw StoreProblem(reason: "a symbolic link, not followed")
        }
        PrivateFiles.prepareDatabase(path)
        do {
            connection = try SQLiteConnection(path: path)
            let application = try connection.scalarInt("PRAGMA application_id")
            let tables = try connection.scalarInt("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'")
            if application != applicationID && tables > 0 {
                throw StoreProblem(reason: "not a CrashCapture event store (application id \(application))")
            }
            if verify {
                let check = try connection.scalarText("PRAGMA quick_check(1)")
                if check != "ok" { throw StoreProblem(reason: "damaged: \(check)") }
            }
            // A new store holds nothing yet: making it (the switch to WAL, the schema) flushes
            // nothing, where each of its commits cost a flush of 0.3-0.5 ms on this disk and
            // install into a new directory 2.7 ms. Power lost meanwhile leaves a store that
            // the next start finds damaged and sets aside; the events are in the journal.
            if tables == 0 { try connection.execute("PRAGMA synchronous = OFF") }
            _ = try connection.scalarInt("PRAGMA journal_mode = WAL")
            // Debian's SQLite overwrites every deleted row with zeros (SECURE_DELETE), SQLite's
            // own default does not: FAST zeroes what lies in pages written anyway and writes no
            // page more for it. When uploaded events left the store a batch at a time, the pages
            // they freed were each written to the WAL again, zeroed (`crashcap-bench claim`).
            try connection.execute("PRAGMA secure_delete = FAST")
            // `seq` is a plain rowid (one past the largest), not AUTOINCREMENT: that keyword costs
            // a write to sqlite_sequence per row, a third of the writer's time (`crashcap-bench
            // writer`), and the order it guards holds without it (a new row is always last).
            // Stores made before keep their AUTOINCREMENT table and work unchanged.
            try createSchema(connection)
            try connection.execute("PRAGMA synchronous = NORMAL")
        } catch let error as SQLiteError where error.isCorruption {
            throw StoreProblem(reason: "not a SQLite database or damaged (\(error.message))")
        }
        return connection
    }

    /// The tables and indexes, made where missing.
    static func createSchema(_ connection: SQLiteConnection) throws {
        try connection.execute(
            """
            PRAGMA application_id = \(applicationID);
            CREATE TABLE IF NOT EXISTS events(
                seq INTEGER PRIMARY KEY,
                event_id TEXT NOT NULL UNIQUE,
                payload TEXT NOT NULL,
                bytes INTEGER NOT NULL,
                in_flight INTEGER NOT NULL DEFAULT 0,
                context INTEGER NOT NULL DEFAULT 0);
            CREATE INDEX IF NOT EXISTS events_in_flight ON events(seq) WHERE in_flight != 0;
            CREATE TABLE IF NOT EXISTS contexts(id INTEGER PRIMARY KEY, text TEXT NOT NULL UNIQUE);
            CREATE TABLE IF NOT EXISTS rejected_events(
                event_id TEXT PRIMARY KEY,
                payload TEXT NOT NULL,
                status INTEGER NOT NULL,
                reason TEXT NOT NULL,
                rejected_ms INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS imported_ids(event_id TEXT PRIMARY KEY) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
            CREATE TABLE IF NOT EXISTS journal_marks(
                session_id TEXT PRIMARY KEY,
                position INTEGER NOT NULL,
                distinct_id TEXT NOT NULL,
                login_id TEXT) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS crash_occurrences(
                fingerprint TEXT NOT NULL,
                event_id TEXT NOT NULL,
                time_ms INTEGER NOT NULL,
                PRIMARY KEY (fingerprint, event_id)) WITHOUT ROWID;
            CREATE INDEX IF NOT EXISTS crash_occurrences_by_time ON crash_occurrences(time_ms);
            CREATE TABLE IF NOT EXISTS crash_history(
                event_id TEXT PRIMARY KEY,
                time_ms INTEGER NOT NULL,
                signal TEXT NOT NULL,
                title TEXT NOT NULL,
                fingerprint TEXT NOT NULL,
                app_version TEXT NOT NULL,
                payload TEXT,
                payload_bytes INTEGER NOT NULL DEFAULT 0,
                stacks BLOB,
                minidump_sent INTEGER NOT NULL DEFAULT 0) WITHOUT ROWID;
            CREATE INDEX IF NOT EXISTS crash_history_by_time ON crash_history(time_ms);
            CREATE TABLE IF NOT EXISTS crash_runs(
                fingerprint TEXT PRIMARY KEY,
                first_ms INTEGER NOT NULL,
                count INTEGER NOT NULL) WITHOUT ROWID;
            INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', \(schemaVersion)), ('dropped', 0);
            """)
        // Stores made before the history kept whole reports get the columns; two processes that
        // open such a store at once both try, and one finds them made.
        for (column, definition) in [
            ("payload", "TEXT"), ("payload_bytes", "INTEGER NOT NULL DEFAULT 0"), ("stacks", "BLOB"),
            ("minidump_sent", "INTEGER NOT NULL DEFAULT 0"),
        ]
        where try connection.scalarInt(
            "SELECT COUNT(*) FROM pragma_table_info('crash_history') WHERE name = '\(column)'") == 0
        {
            do {
                try connection.execute("ALTER TABLE crash_history ADD COLUMN \(column) \(definition)")
            } catch let error as SQLiteError where error.message.contains("duplicate column") {}
        }
    }

    static func moveAside(_ path: String) throws -> String {
        let stamp = Int64(Date().timeIntervalSince1970 * 1000)
        let aside = "\(path).corrupt-\(stamp)"
        guard rename(path, aside) == 0 else {
            throw CrashCaptureError.system("cannot move the damaged event store aside; remove it by hand", path: path)
        }
        for suffix in ["-wal", "-shm"] { _ = rename(path + suffix, aside + suffix) }
        return aside
    }
}
