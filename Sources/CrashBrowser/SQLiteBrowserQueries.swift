internal import CrashCapture
internal import Foundation

/// The browser's questions answered from an event store in SQLite: the collector's file, or an
/// app's own `events.sqlite` (`crashcap serve`). Crash and hang events are indexed into a table
/// of their own (`crash_index`: the columns the pages filter, group and count by, read from each
/// payload once with SQLite's JSON functions), caught up from the events table before each
/// answer, and summed as they arrive into small tables that the pages read instead of a million
/// rows (Docs/Browser.md, "Where the numbers come from"): a row a group (`crash_groups`), a row a
/// group, app, version and signal (`crash_combos`), the same a UTC day (`crash_days`), facet values
/// (`crash_facets`), and each group's distinct users and installs with their last event's time.
/// Every number stays exact under the page's filter: a time range counts its whole days from
/// `crash_days` and the part of its first day from the index.
/// The collector's tables live in its file (`main`), so that a restart does not read a million
/// payloads again; an app's live in the connection's `temp` schema, so that the app's own store
/// is never written by the browser.
/// `@unchecked`: the one connection is used under `lock`.
package final class SQLiteBrowserQueries: BrowserQueries, @unchecked Sendable {
    let connection: SQLiteConnection
    let schema: String
    let lock = NSLock()
    /// The app's store keeps the last crash reports in `crash_history` after their events were
    /// uploaded and deleted: indexed too.
    let withHistory: Bool

    /// The layout of the browser's tables; another in the file (an older collector's) is dropped
    /// and indexed again from the events.
    private static let layout = 2
    private static let tables = [
        "crash_index", "crash_groups", "crash_combos", "crash_days", "crash_facets", "crash_group_users",
        "crash_group_installs", "crash_combo_users", "crash_combo_installs", "crash_versions", "crash_signals",
    ]

    /// `persistent`: the tables in the store's own file (the collector's); else in `temp`.
    package init(path: String, persistent: Bool) throws {
        connection = try SQLiteConnection(path: path)
        schema = persistent ? "main" : "temp"
        withHistory = !persistent
        try connection.execute("CREATE TABLE IF NOT EXISTS \(schema).crash_browser_layout(version INTEGER NOT NULL)")
        let found = try connection.scalarInt("SELECT coalesce(max(version), 0) FROM \(schema).crash_browser_layout")
        if found != Self.layout {
            try connection.execute(
                Self.tables.map { "DROP TABLE IF EXISTS \(schema).\($0);" }.joined()
                    + "DELETE FROM \(schema).crash_browser_layout; INSERT INTO \(schema).crash_browser_layout VALUES (\(Self.layout));"
            )
        }
        try connection.execute(
            """
            CREATE TABLE IF NOT EXISTS \(schema).crash_index(
                event_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, kind TEXT NOT NULL, fingerprint TEXT NOT NULL,
                title TEXT NOT NULL, app TEXT NOT NULL, version TEXT NOT NULL, time_ms INTEGER NOT NULL,
                user TEXT NOT NULL, install TEXT NOT NULL, signal TEXT NOT NULL, host TEXT NOT NULL,
                os TEXT NOT NULL, context TEXT NOT NULL);
            -- The part of a time range's first day, over every group.
            CREATE INDEX IF NOT EXISTS \(schema).crash_index_by_time
                ON crash_index(kind, time_ms, fingerprint, app, version, signal);
            -- One group's events: its latest, its charts' partial day, its facets under a range.
            CREATE INDEX IF NOT EXISTS \(schema).crash_index_group
                ON crash_index(fingerprint, kind, time_ms, event_id, app, version, signal, host, os, user, install);
            CREATE INDEX IF NOT EXISTS \(schema).crash_index_by_seq ON crash_index(seq);
            -- A group over all time, whatever the filter: what the unfiltered list reads alone.
            CREATE TABLE IF NOT EXISTS \(schema).crash_groups(
                kind TEXT NOT NULL, fingerprint TEXT NOT NULL, title TEXT NOT NULL, app TEXT NOT NULL,
                n INTEGER NOT NULL, users INTEGER NOT NULL, installs INTEGER NOT NULL,
                first_ms INTEGER NOT NULL, first_version TEXT NOT NULL, last_ms INTEGER NOT NULL,
                last_version TEXT NOT NULL, PRIMARY KEY (kind, fingerprint)) WITHOUT ROWID;
            CREATE INDEX IF NOT EXISTS \(schema).crash_groups_by_events ON crash_groups(kind, n DESC, fingerprint);
            CREATE INDEX IF NOT EXISTS \(schema).crash_groups_by_last ON crash_groups(kind, last_ms DESC, fingerprint);
            CREATE INDEX IF NOT EXISTS \(schema).crash_groups_by_first ON crash_groups(kind, first_ms DESC, fingerprint);
            CREATE TABLE IF NOT EXISTS \(schema).crash_combos(
                kind TEXT NOT NULL, fingerprint TEXT NOT NULL, app TEXT NOT NULL, version TEXT NOT NULL,
                signal TEXT NOT NULL, n INTEGER NOT NULL, users INTEGER NOT NULL, installs INTEGER NOT NULL,
                first_ms INTEGER NOT NULL, last_ms INTEGER NOT NULL,
                PRIMARY KEY (kind, fingerprint, app, version, signal)) WITHOUT ROWID;
            CREATE INDEX IF NOT EXISTS \(schema).crash_combos_by_version ON crash_combos(kind, app, version, n);
            CREATE TABLE IF NOT EXISTS \(schema).crash_days(
                kind TEXT NOT NULL, fingerprint TEXT NOT NULL, day INTEGER NOT NULL, app TEXT NOT NULL,
                version TEXT NOT NULL, signal TEXT NOT NULL, n INTEGER NOT NULL, first_ms INTEGER NOT NULL,
                last_ms INTEGER NOT NULL, PRIMARY KEY (kind, fingerprint, day, app, version, signal)) WITHOUT ROWID;
            CREATE INDEX IF NOT EXISTS \(schema).crash_days_by_day ON crash_days(kind, day, n, first_ms, last_ms);
            CREATE TABLE IF NOT EXISTS \(schema).crash_facets(
                kind TEXT NOT NULL, fingerprint TEXT NOT NULL, facet TEXT NOT NULL, app TEXT NOT NULL,
                version TEXT NOT NULL, signal TEXT NOT NULL, value TEXT NOT NULL, n INTEGER NOT NULL,
                PRIMARY KEY (kind, fingerprint, facet, app, version, signal, value)) WITHOUT ROWID;
            -- Each distinct user and install with the time of its last event, so that "users with
            -- an event since T" is a count over an index range.
            CREATE TABLE IF NOT EXISTS \(schema).crash_group_users(kind TEXT NOT NULL, fingerprint TEXT NOT NULL,
                user TEXT NOT NULL, last_ms INTEGER NOT NULL, PRIMARY KEY (kind, fingerprint, user)) WITHOUT ROWID;
            CREATE INDEX IF NOT EXISTS \(schema).crash_group_users_by_last ON crash_group_users(kind, fingerprint, last_ms);
            CREATE TABLE IF NOT EXISTS \(schema).crash_group_installs(kind TEXT NOT NULL, fingerprint TEXT NOT NULL,
                install TEXT NOT NULL, last_ms INTEGER NOT NULL, PRIMARY KEY (kind, fingerprint, install)) WITHOUT ROWID;
            CREATE INDEX IF NOT EXISTS \(schema).crash_group_installs_by_last
                ON crash_group_installs(kind, fingerprint, last_ms);
            CREATE TABLE IF NOT EXISTS \(schema).crash_combo_users(kind TEXT NOT NULL, fingerprint TEXT NOT NULL,
                app TEXT NOT NULL, version TEXT NOT NULL, signal TEXT NOT NULL, user TEXT NOT NULL,
                last_ms INTEGER NOT NULL, PRIMARY KEY (kind, fingerprint, app, version, signal, user)) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS \(schema).crash_combo_installs(kind TEXT NOT NULL, fingerprint TEXT NOT NULL,
                app TEXT NOT NULL, version TEXT NOT NULL, signal TEXT NOT NULL, install TEXT NOT NULL,
                last_ms INTEGER NOT NULL, PRIMARY KEY (kind, fingerprint, app, version, signal, install)) WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS \(schema).crash_versions(
                app TEXT NOT NULL, version TEXT NOT NULL, first_ms INTEGER NOT NULL, PRIMARY KEY (app, version))
                WITHOUT ROWID;
            CREATE TABLE IF NOT EXISTS \(schema).crash_signals(kind TEXT NOT NULL, signal TEXT NOT NULL,
                PRIMARY KEY (kind, signal)) WITHOUT ROWID;
            """)
    }

    /// The columns of one payload `p`, as SQL over SQLite's JSON functions.
    private static let columns = """
        json_extract(p, '$.event_id'),
        CASE json_extract(p, '$.event') WHEN '$AppHang' THEN 'hang' ELSE 'crash' END,
        coalesce(json_extract(p, '$.properties.crash_fingerprint'), json_extract(p, '$.properties.hang_fingerprint'), ''),
        coalesce(json_extract(p, '$.properties.crash_title'), json_extract(p, '$.properties.hang_title'), ''),
        coalesce(json_extract(p, '$.properties."$app_name"'), ''),
        coalesce(json_extract(p, '$.properties."$app_version"'), ''),
        coalesce(json_extract(p, '$.time'), 0),
        coalesce(json_extract(p, '$.login_id'), json_extract(p, '$.distinct_id'), ''),
        coalesce(json_extract(p, '$.anonymous_id'), json_extract(p, '$.distinct_id'), ''),
        coalesce(json_extract(p, '$.properties.crash_signal_name'), CASE WHEN json_extract(p, '$.event') = '$AppHang'
            THEN 'hang' ELSE '' END),
        coalesce(json_extract(p, '$.properties."$hostname"'), ''),
        trim(coalesce(json_extract(p, '$.properties."$os"'), '') || ' ' || coalesce(json_extract(p, '$.properties."$os_version"'), '')),
        CASE json_type(p, '$.properties.crash_context') WHEN 'object' THEN json_extract(p, '$.properties.crash_context') ELSE '{}' END
        """

    /// Indexes what arrived since the last call, and adds it to the sums, in one transaction.
    private func catchUp() throws {
        let last = try connection.scalarInt("SELECT coalesce(max(seq), 0) FROM \(schema).crash_index")
        let before = try connection.scalarInt("SELECT coalesce(max(rowid), 0) FROM \(schema).crash_index")
        try connection.execute("BEGIN IMMEDIATE")
        do {
            try indexAndSum(last: last, before: before)
            try connection.execute("COMMIT")
        } catch {
            try? connection.execute("ROLLBACK")
            throw error
        }
        // After a large catch-up, the planner's statistics again (a page chose a scan without them).
        let after = try connection.scalarInt("SELECT coalesce(max(rowid), 0) FROM \(schema).crash_index")
        if after - before > 10_000 { try connection.execute("ANALYZE \(schema)") }
    }

    private func indexAndSum(last: Int64, before: Int64) throws {
        let s = schema
        // Most events are not crashes: a LIKE on the raw text passes over them before any JSON is parsed.
        try connection.execute(
            """
            INSERT OR IGNORE INTO \(s).crash_index(event_id, seq, kind, fingerprint, title, app, version, time_ms,
                user, install, signal, host, os, context)
            SELECT \(Self.columns.replacingOccurrences(of: "json_extract(p, '$.event_id')", with: "json_extract(p, '$.event_id'), seq")) FROM (
                SELECT seq, \(EventStore.payloadColumn) AS p FROM main.events
                WHERE seq > \(last) AND (payload LIKE '%"$AppCrashed"%' OR payload LIKE '%"$AppHang"%'))
            WHERE json_valid(p) AND json_extract(p, '$.event') IN ('$AppCrashed', '$AppHang')
            """)
        if withHistory {
            try connection.execute(
                """
                INSERT OR IGNORE INTO \(s).crash_index(event_id, seq, kind, fingerprint, title, app, version, time_ms,
                    user, install, signal, host, os, context)
                SELECT \(Self.columns.replacingOccurrences(of: "json_extract(p, '$.event_id')", with: "json_extract(p, '$.event_id'), 0")) FROM (
                    SELECT payload AS p FROM main.crash_history WHERE payload IS NOT NULL)
                WHERE json_valid(p) AND json_extract(p, '$.event') IN ('$AppCrashed', '$AppHang')
                """)
        }
        // The rows just indexed (an event stored twice was ignored above, so it is never summed twice).
        try connection.execute(
            """
            DROP TABLE IF EXISTS temp.crash_fresh;
            CREATE TEMP TABLE crash_fresh AS SELECT * FROM \(s).crash_index WHERE rowid > \(before);
            INSERT INTO \(s).crash_groups(kind, fingerprint, title, app, n, users, installs, first_ms, first_version,
                last_ms, last_version)
            SELECT a.kind, a.fingerprint, l.title, l.app, a.n, 0, 0, f.t, f.version, l.t, l.version
            FROM (SELECT kind, fingerprint, count(*) AS n FROM crash_fresh GROUP BY kind, fingerprint) a
            -- SQLite's bare columns: the row of the min, or of the max.
            JOIN (SELECT kind, fingerprint, min(time_ms) AS t, version FROM crash_fresh GROUP BY kind, fingerprint) f
                USING (kind, fingerprint)
            JOIN (SELECT kind, fingerprint, max(time_ms) AS t, version, title, app FROM crash_fresh
                GROUP BY kind, fingerprint) l USING (kind, fingerprint)
            WHERE true
            ON CONFLICT (kind, fingerprint) DO UPDATE SET n = n + excluded.n,
                first_version = CASE WHEN excluded.first_ms < first_ms THEN excluded.first_version ELSE first_version END,
                first_ms = min(first_ms, excluded.first_ms),
                title = CASE WHEN excluded.last_ms >= last_ms THEN excluded.title ELSE title END,
                app = CASE WHEN excluded.last_ms >= last_ms THEN excluded.app ELSE app END,
                last_version = CASE WHEN excluded.last_ms >= last_ms THEN excluded.last_version ELSE last_version END,
                last_ms = max(last_ms, excluded.last_ms);
            INSERT INTO \(s).crash_combos(kind, fingerprint, app, version, signal, n, users, installs, first_ms, last_ms)
            SELECT kind, fingerprint, app, version, signal, count(*), 0, 0, min(time_ms), max(time_ms) FROM crash_fresh
            GROUP BY kind, fingerprint, app, version, signal
            ON CONFLICT (kind, fingerprint, app, version, signal) DO UPDATE SET n = n + excluded.n,
                first_ms = min(first_ms, excluded.first_ms), last_ms = max(last_ms, excluded.last_ms);
            INSERT INTO \(s).crash_days(kind, fingerprint, day, app, version, signal, n, first_ms, last_ms)
            SELECT kind, fingerprint, time_ms / \(Self.day), app, version, signal, count(*), min(time_ms), max(time_ms)
            FROM crash_fresh GROUP BY kind, fingerprint, time_ms / \(Self.day), app, version, signal
            ON CONFLICT (kind, fingerprint, day, app, version, signal) DO UPDATE SET n = n + excluded.n,
                first_ms = min(first_ms, excluded.first_ms), last_ms = max(last_ms, excluded.last_ms);
            INSERT INTO \(s).crash_facets(kind, fingerprint, facet, app, version, signal, value, n)
            SELECT kind, fingerprint, facet, app, version, signal, value, count(*) FROM (
                SELECT kind, fingerprint, 'host' AS facet, app, version, signal, host AS value FROM crash_fresh
                UNION ALL SELECT kind, fingerprint, 'OS', app, version, signal, os FROM crash_fresh
                UNION ALL SELECT kind, fingerprint, 'context', app, version, signal, \(Self.contextMember)
                    FROM crash_fresh, json_each(crash_fresh.context) AS j WHERE \(Self.contextMemberKept))
            GROUP BY kind, fingerprint, facet, app, version, signal, value
            ON CONFLICT (kind, fingerprint, facet, app, version, signal, value) DO UPDATE SET n = n + excluded.n;
            -- Distinct users and installs: the pairs not seen before are counted, then kept.
            DROP TABLE IF EXISTS temp.crash_fresh_people;
            CREATE TEMP TABLE crash_fresh_people AS SELECT kind, fingerprint, app, version, signal, user, install,
                max(time_ms) AS l FROM crash_fresh GROUP BY kind, fingerprint, app, version, signal, user, install;
            """)
        for (column, table) in [("user", "users"), ("install", "installs")] {
            try connection.execute(
                """
                UPDATE \(s).crash_groups SET \(table) = \(table) + x.c FROM (
                    SELECT kind, fingerprint, count(*) AS c FROM (SELECT DISTINCT kind, fingerprint, \(column)
                        FROM crash_fresh_people) p
                    WHERE NOT EXISTS (SELECT 1 FROM \(s).crash_group_\(table) g WHERE g.kind = p.kind
                        AND g.fingerprint = p.fingerprint AND g.\(column) = p.\(column))
                    GROUP BY kind, fingerprint) x
                WHERE crash_groups.kind = x.kind AND crash_groups.fingerprint = x.fingerprint;
                UPDATE \(s).crash_combos SET \(table) = \(table) + x.c FROM (
                    SELECT kind, fingerprint, app, version, signal, count(*) AS c FROM (SELECT DISTINCT kind, fingerprint,
                        app, version, signal, \(column) FROM crash_fresh_people) p
                    WHERE NOT EXISTS (SELECT 1 FROM \(s).crash_combo_\(table) g WHERE g.kind = p.kind
                        AND g.fingerprint = p.fingerprint AND g.app = p.app AND g.version = p.version
                        AND g.signal = p.signal AND g.\(column) = p.\(column))
                    GROUP BY kind, fingerprint, app, version, signal) x
                WHERE crash_combos.kind = x.kind AND crash_combos.fingerprint = x.fingerprint AND crash_combos.app = x.app
                    AND crash_combos.version = x.version AND crash_combos.signal = x.signal;
                INSERT INTO \(s).crash_group_\(table)(kind, fingerprint, \(column), last_ms)
                SELECT kind, fingerprint, \(column), max(l) FROM crash_fresh_people GROUP BY kind, fingerprint, \(column)
                ON CONFLICT (kind, fingerprint, \(column)) DO UPDATE SET last_ms = max(last_ms, excluded.last_ms);
                INSERT INTO \(s).crash_combo_\(table)(kind, fingerprint, app, version, signal, \(column), last_ms)
                SELECT kind, fingerprint, app, version, signal, \(column), max(l) FROM crash_fresh_people
                GROUP BY kind, fingerprint, app, version, signal, \(column)
                ON CONFLICT (kind, fingerprint, app, version, signal, \(column))
                DO UPDATE SET last_ms = max(last_ms, excluded.last_ms);
                """)
        }
        try connection.execute(
            """
            INSERT INTO \(s).crash_versions(app, version, first_ms)
            SELECT app, version, min(time_ms) FROM crash_fresh WHERE true GROUP BY app, version
            ON CONFLICT (app, version) DO UPDATE SET first_ms = min(first_ms, excluded.first_ms);
            INSERT OR IGNORE INTO \(s).crash_signals(kind, signal) SELECT DISTINCT kind, signal FROM crash_fresh;
            DROP TABLE temp.crash_fresh;
            DROP TABLE temp.crash_fresh_people;
            """)
    }

    /// A context member with a string or a number as its value, as `key = value` (of `json_each` j).
    static let contextMember = "j.key || ' = ' || CAST(j.value AS TEXT)"
    static let contextMemberKept = "j.type IN ('text', 'integer', 'real')"
    static let day: Int64 = 86_400_000

    enum Value {
        case text(String)
        case integer(Int64)
    }

    func rows(_ sql: String, _ values: [Value], _ read: (SQLiteStatement) -> Void) throws {
        let statement = try connection.prepare(sql)
        defer { statement.reset() }
        for (index, value) in values.enumerated() {
            switch value {
            case .text(let text): try statement.bind(Int32(index + 1), text)
            case .integer(let number): try statement.bind(Int32(index + 1), number)
            }
        }
        while try statement.step() { read(statement) }
    }

    func locked<T>(_ body: () throws -> T) throws -> T {
        try lock.withLock {
            try catchUp()
            return try body()
        }
    }
}
