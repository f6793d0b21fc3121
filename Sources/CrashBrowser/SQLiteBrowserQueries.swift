internal import CrashCapture
internal import Foundation

/// The browser's questions answered from an event store in SQLite: the collector's file, or an
/// app's own `events.sqlite` (`crashcap serve`). Crash and hang events are indexed into a table
/// of their own (`crash_index`: the columns the pages filter, group and count by, read from each
/// payload once with SQLite's JSON functions), caught up from the events table before each
/// answer. The collector's index lives in its file (`main`), so that a restart does not read a
/// million payloads again; an app's lives in the connection's `temp` schema, so that the app's
/// own store is never written by the browser.
/// `@unchecked`: the one connection is used under `lock`.
package final class SQLiteBrowserQueries: BrowserQueries, @unchecked Sendable {
    private let connection: SQLiteConnection
    private let schema: String
    private let lock = NSLock()
    /// The app's store keeps the last crash reports in `crash_history` after their events were
    /// uploaded and deleted: indexed too.
    private let withHistory: Bool

    /// `persistent`: the index in the store's own file (the collector's); else in `temp`.
    package init(path: String, persistent: Bool) throws {
        connection = try SQLiteConnection(path: path)
        schema = persistent ? "main" : "temp"
        withHistory = !persistent
        try connection.execute(
            """
            CREATE TABLE IF NOT EXISTS \(schema).crash_index(
                event_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, kind TEXT NOT NULL, fingerprint TEXT NOT NULL,
                title TEXT NOT NULL, app TEXT NOT NULL, version TEXT NOT NULL, time_ms INTEGER NOT NULL,
                user TEXT NOT NULL, install TEXT NOT NULL, signal TEXT NOT NULL, host TEXT NOT NULL,
                os TEXT NOT NULL, context TEXT NOT NULL);
            CREATE INDEX IF NOT EXISTS \(schema).crash_index_by_kind ON crash_index(kind, time_ms);
            -- Covering indexes: the list groups a kind's rows by fingerprint, and a group's numbers
            -- read its rows, from the index alone (1,000,000 events: the list took 960 ms with
            -- table lookups for every row, crashcap-bench browser).
            CREATE INDEX IF NOT EXISTS \(schema).crash_index_list
                ON crash_index(kind, fingerprint, time_ms, app, version, signal);
            CREATE INDEX IF NOT EXISTS \(schema).crash_index_group
                ON crash_index(fingerprint, time_ms, event_id, kind, app, version, signal, user, install, host, os);
            CREATE INDEX IF NOT EXISTS \(schema).crash_index_by_seq ON crash_index(seq);
            CREATE TABLE IF NOT EXISTS \(schema).crash_groups(
                fingerprint TEXT PRIMARY KEY, first_ms INTEGER NOT NULL, first_version TEXT NOT NULL) WITHOUT ROWID;
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

    /// Indexes what arrived since the last call.
    private func catchUp() throws {
        let last = try connection.scalarInt("SELECT coalesce(max(seq), 0) FROM \(schema).crash_index")
        let before = try connection.scalarInt("SELECT coalesce(max(rowid), 0) FROM \(schema).crash_index")
        // Most events are not crashes: a LIKE on the raw text passes over them before any JSON is parsed.
        try connection.execute(
            """
            INSERT OR IGNORE INTO \(schema).crash_index(event_id, seq, kind, fingerprint, title, app, version, time_ms,
                user, install, signal, host, os, context)
            SELECT \(Self.columns.replacingOccurrences(of: "json_extract(p, '$.event_id')", with: "json_extract(p, '$.event_id'), seq")) FROM (
                SELECT seq, \(EventStore.payloadColumn) AS p FROM main.events
                WHERE seq > \(last) AND (payload LIKE '%"$AppCrashed"%' OR payload LIKE '%"$AppHang"%'))
            WHERE json_valid(p) AND json_extract(p, '$.event') IN ('$AppCrashed', '$AppHang')
            """)
        if withHistory {
            try connection.execute(
                """
                INSERT OR IGNORE INTO \(schema).crash_index(event_id, seq, kind, fingerprint, title, app, version, time_ms,
                    user, install, signal, host, os, context)
                SELECT \(Self.columns.replacingOccurrences(of: "json_extract(p, '$.event_id')", with: "json_extract(p, '$.event_id'), 0")) FROM (
                    SELECT payload AS p FROM main.crash_history WHERE payload IS NOT NULL)
                WHERE json_valid(p) AND json_extract(p, '$.event') IN ('$AppCrashed', '$AppHang')
                """)
        }
        // The small tables the list reads instead of scanning the index: each group's first event
        // ever, each app's versions in the order they appeared, the signals there are.
        try connection.execute(
            """
            INSERT INTO \(schema).crash_groups(fingerprint, first_ms, first_version)
            SELECT fingerprint, time_ms, version FROM (SELECT fingerprint, time_ms, version,
                row_number() OVER (PARTITION BY fingerprint ORDER BY time_ms) AS n
                FROM \(schema).crash_index WHERE rowid > \(before)) WHERE n = 1
            ON CONFLICT(fingerprint) DO UPDATE SET first_ms = excluded.first_ms, first_version = excluded.first_version
            WHERE excluded.first_ms < first_ms;
            INSERT INTO \(schema).crash_versions(app, version, first_ms)
            SELECT app, version, min(time_ms) FROM \(schema).crash_index WHERE rowid > \(before) GROUP BY app, version
            ON CONFLICT(app, version) DO UPDATE SET first_ms = min(first_ms, excluded.first_ms);
            INSERT OR IGNORE INTO \(schema).crash_signals(kind, signal)
            SELECT DISTINCT kind, signal FROM \(schema).crash_index WHERE rowid > \(before);
            """)
        // After a large catch-up, the planner's statistics again (a page chose a scan without them).
        let after = try connection.scalarInt("SELECT coalesce(max(rowid), 0) FROM \(schema).crash_index")
        if after - before > 10_000 { try connection.execute("ANALYZE \(schema)") }
    }

    /// A filter as SQL conditions and the values they bind, in order.
    private static func conditions(_ filter: BrowserFilter, fingerprint: String? = nil) -> (String, [Value]) {
        // One group's rows are found by fingerprint: `+kind` keeps SQLite from walking the kind
        // index over every group's rows instead (it did, 50 times for a page of the list).
        var parts = [fingerprint == nil ? "kind = ?" : "+kind = ?"]
        var values: [Value] = [.text(filter.kind.rawValue)]
        if let fingerprint {
            parts.insert("fingerprint = ?", at: 0)
            values.insert(.text(fingerprint), at: 0)
        }
        for (column, value) in [("app", filter.app), ("version", filter.version), ("signal", filter.signal)]
        where !value.isEmpty {
            parts.append("\(column) = ?")
            values.append(.text(value))
        }
        if let since = filter.since {
            parts.append("time_ms >= ?")
            values.append(.integer(since))
        }
        if !filter.text.isEmpty {
            parts.append("instr(lower(title), lower(?)) > 0")
            values.append(.text(filter.text))
        }
        return (parts.joined(separator: " AND "), values)
    }

    enum Value {
        case text(String)
        case integer(Int64)
    }

    private func rows(_ sql: String, _ values: [Value], _ read: (SQLiteStatement) -> Void) throws {
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

    private func locked<T>(_ body: () throws -> T) throws -> T {
        try lock.withLock {
            try catchUp()
            return try body()
        }
    }

    package func groups(_ filter: BrowserFilter, limit: Int) throws -> GroupPage {
        try locked {
            let (conditions, values) = Self.conditions(filter)
            let sortColumn = ["events": "n", "last": "l", "first": "f"][filter.sort.rawValue]!
            var having = ""
            var havingValues: [Value] = []
            if let after = filter.after {
                having = "HAVING \(sortColumn) < ? OR (\(sortColumn) = ? AND fingerprint > ?)"
                havingValues = [.integer(after.value), .integer(after.value), .text(after.fingerprint)]
            }
            var found: [(String, Int, Int64, Int64)] = []
            try rows(
                """
                SELECT fingerprint, count(*) AS n, min(time_ms) AS f, max(time_ms) AS l FROM \(schema).crash_index
                WHERE \(conditions) GROUP BY fingerprint \(having)
                ORDER BY \(sortColumn) DESC, fingerprint LIMIT \(limit + 1)
                """, values + havingValues
            ) { found.append(($0.text(0), Int($0.int64(1)), $0.int64(2), $0.int64(3))) }
            var totals = (groups: 0, events: 0)
            try rows(
                "SELECT count(DISTINCT fingerprint), count(*) FROM \(schema).crash_index WHERE \(conditions)", values
            ) { totals = (Int($0.int64(0)), Int($0.int64(1))) }
            let newest = try newestVersions()
            let summaries = try found.prefix(limit).map { row in
                try summary(row.0, events: row.1, first: row.2, last: row.3, filter, newest: newest)
            }
            return GroupPage(
                rows: summaries, totalGroups: totals.groups, totalEvents: totals.events, more: found.count > limit)
        }
    }

    /// Each app's newest version: the one whose first event came last.
    private func newestVersions() throws -> [String: String] {
        var newest: [String: String] = [:]
        try rows("SELECT app, version FROM \(schema).crash_versions ORDER BY first_ms", []) {
            newest[$0.text(0)] = $0.text(1)
        }
        return newest
    }

    private static let day: Int64 = 86_400_000

    /// Events a day over `days` days up to `filter.now`, oldest first.
    private func daily(_ fingerprint: String, _ filter: BrowserFilter, days: Int) throws -> [Int] {
        let (conditions, values) = Self.conditions(filter, fingerprint: fingerprint)
        let start = filter.now - Int64(days) * Self.day
        var counts = Array(repeating: 0, count: days)
        try rows(
            """
            SELECT (time_ms - ?) / \(Self.day) AS d, count(*) FROM \(schema).crash_index
            WHERE \(conditions) AND time_ms >= ? AND time_ms < ? GROUP BY d
            """, [.integer(start)] + values + [.integer(start), .integer(filter.now)]
        ) { row in
            let index = Int(row.int64(0))
            if counts.indices.contains(index) { counts[index] = Int(row.int64(1)) }
        }
        return counts
    }

    private func summary(
        _ fingerprint: String, events: Int, first: Int64, last: Int64, _ filter: BrowserFilter,
        newest: [String: String]
    ) throws -> GroupSummary {
        let (conditions, values) = Self.conditions(filter, fingerprint: fingerprint)
        let values2 = values
        var users = 0
        var installs = 0
        try rows(
            "SELECT count(DISTINCT user), count(DISTINCT install) FROM \(schema).crash_index WHERE \(conditions)",
            values
        ) {
            users = Int($0.int64(0))
            installs = Int($0.int64(1))
        }
        var firstVersion = ""
        try rows(
            "SELECT version FROM \(schema).crash_index WHERE \(conditions) ORDER BY time_ms, event_id LIMIT 1", values2
        ) { firstVersion = $0.text(0) }
        var latest = (version: "", title: "", app: "")
        try rows(
            "SELECT version, title, app FROM \(schema).crash_index WHERE \(conditions) ORDER BY time_ms DESC, event_id DESC LIMIT 1",
            values2
        ) { latest = ($0.text(0), $0.text(1), $0.text(2)) }
        var everFirst = ""
        try rows("SELECT first_version FROM \(schema).crash_groups WHERE fingerprint = ?", [.text(fingerprint)]) {
            everFirst = $0.text(0)
        }
        let newVersion = filter.version.isEmpty ? newest[latest.app] ?? "" : filter.version
        return GroupSummary(
            fingerprint: fingerprint, title: latest.title, app: latest.app, events: events, users: users,
            installs: installs, firstSeen: first, firstVersion: firstVersion, lastSeen: last,
            lastVersion: latest.version, daily: try daily(fingerprint, filter, days: 14),
            isNew: !newVersion.isEmpty && everFirst == newVersion)
    }

    package func group(_ fingerprint: String, _ filter: BrowserFilter) throws -> GroupDetail? {
        try locked {
            let (conditions, values) = Self.conditions(filter, fingerprint: fingerprint)
            var aggregate: (Int, Int64, Int64) = (0, 0, 0)
            try rows(
                "SELECT count(*), coalesce(min(time_ms), 0), coalesce(max(time_ms), 0) FROM \(schema).crash_index WHERE \(conditions)",
                values
            ) { aggregate = (Int($0.int64(0)), $0.int64(1), $0.int64(2)) }
            guard aggregate.0 > 0 else { return nil }
            let summary = try summary(
                fingerprint, events: aggregate.0, first: aggregate.1, last: aggregate.2, filter,
                newest: try newestVersions())
            func count(since: Int64) throws -> Int {
                var count = 0
                try rows(
                    "SELECT count(*) FROM \(schema).crash_index WHERE \(conditions) AND time_ms >= ?",
                    values + [.integer(since)]
                ) { count = Int($0.int64(0)) }
                return count
            }
            var facets: [Facet] = []
            for (name, expression, from, only) in [
                ("version", "version", "", ""), ("host", "host", "", ""), ("OS", "os", "", ""),
                ("signal", "signal", "", ""),
                // The context's members with a string or a number as their value, as `key = value`.
                (
                    "context", "j.key || ' = ' || CAST(j.value AS TEXT)", ", json_each(crash_index.context) AS j",
                    "j.type IN ('text', 'integer', 'real') AND "
                ),
            ] {
                var counted: [(String, Int)] = []
                try rows(
                    """
                    SELECT \(expression) AS v, count(*) AS n FROM \(schema).crash_index\(from) WHERE \(only)\(conditions)
                    GROUP BY v ORDER BY n DESC, v LIMIT 10
                    """, values
                ) { counted.append(($0.text(0), Int($0.int64(1)))) }
                if !counted.isEmpty { facets.append(Facet(name: name, values: counted)) }
            }
            var events: [EventRow] = []
            try rows(
                """
                SELECT event_id, time_ms, version, host, user FROM \(schema).crash_index WHERE \(conditions)
                ORDER BY time_ms DESC, event_id DESC LIMIT \(GroupDetail.eventsShown)
                """, values
            ) {
                events.append(
                    EventRow(
                        eventID: $0.text(0), time: $0.int64(1), version: $0.text(2), host: $0.text(3), user: $0.text(4))
                )
            }
            return GroupDetail(
                summary: summary, last24Hours: try count(since: filter.now - Self.day),
                last30Days: try count(since: filter.now - 30 * Self.day),
                daily30: try daily(fingerprint, filter, days: 30),
                facets: facets, events: events)
        }
    }

    package func eventPayload(_ eventID: String) throws -> String? {
        try lock.withLock {
            var payload: String?
            try rows("SELECT \(EventStore.payloadColumn) FROM main.events WHERE event_id = ?", [.text(eventID)]) {
                payload = $0.text(0)
            }
            if payload == nil && withHistory {
                try rows(
                    "SELECT payload FROM main.crash_history WHERE event_id = ? AND payload IS NOT NULL",
                    [
                        .text(eventID)
                    ]
                ) { payload = $0.text(0) }
            }
            return payload
        }
    }

    package func choices(kind: BrowserFilter.Kind) throws -> FilterChoices {
        try locked {
            var versions: [String: [String]] = [:]
            try rows("SELECT app, version FROM \(schema).crash_versions ORDER BY first_ms, version", []) {
                versions[$0.text(0), default: []].append($0.text(1))
            }
            var signals: [String] = []
            try rows(
                "SELECT signal FROM \(schema).crash_signals WHERE kind = ? ORDER BY signal", [.text(kind.rawValue)]
            ) {
                signals.append($0.text(0))
            }
            return FilterChoices(
                apps: versions.keys.sorted(), versions: versions, signals: signals.filter { !$0.isEmpty })
        }
    }

    package func topCrashers(app: String, version: String, previous: String?, kind: BrowserFilter.Kind, limit: Int)
        throws -> [TopCrasher]
    {
        try locked {
            var top: [TopCrasher] = []
            try rows(
                """
                SELECT c.fingerprint, count(*) AS n, g.first_version,
                    (SELECT title FROM \(schema).crash_index t WHERE t.fingerprint = c.fingerprint ORDER BY time_ms DESC LIMIT 1)
                FROM \(schema).crash_index c JOIN \(schema).crash_groups g ON g.fingerprint = c.fingerprint
                WHERE c.kind = ? AND c.app = ? AND c.version = ? GROUP BY c.fingerprint ORDER BY n DESC, c.fingerprint
                LIMIT \(limit)
                """, [.text(kind.rawValue), .text(app), .text(version)]
            ) {
                top.append(
                    TopCrasher(
                        fingerprint: $0.text(0), title: $0.text(3), events: Int($0.int64(1)), previousEvents: 0,
                        isNew: $0.text(2) == version))
            }
            if let previous {
                for index in top.indices {
                    try rows(
                        "SELECT count(*) FROM \(schema).crash_index WHERE kind = ? AND app = ? AND version = ? AND fingerprint = ?",
                        [.text(kind.rawValue), .text(app), .text(previous), .text(top[index].fingerprint)]
                    ) { top[index].previousEvents = Int($0.int64(0)) }
                }
            }
            return top
        }
    }

    package func versionEvents(app: String, version: String, kind: BrowserFilter.Kind) throws -> Int {
        try locked {
            var count = 0
            try rows(
                "SELECT count(*) FROM \(schema).crash_index WHERE kind = ? AND app = ? AND version = ?",
                [.text(kind.rawValue), .text(app), .text(version)]
            ) { count = Int($0.int64(0)) }
            return count
        }
    }

    package func storedEventCount() throws -> Int {
        try lock.withLock { Int(try connection.scalarInt("SELECT count(*) FROM main.events")) }
    }
}
