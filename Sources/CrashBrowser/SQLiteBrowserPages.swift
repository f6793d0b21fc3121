internal import CrashCapture
internal import Foundation

/// The pages' questions over the tables `SQLiteBrowserQueries` keeps (Docs/Browser.md, "Where the
/// numbers come from"): every number exact under the page's filter, each read from the sums where
/// the filter allows, and from the index for what they cannot answer (a time range's first day).
extension SQLiteBrowserQueries {
    /// `AND app = ? ...` for the filter's app, version and signal, and their values.
    private static func combo(_ filter: BrowserFilter) -> (String, [Value]) {
        var sql = ""
        var values: [Value] = []
        for (column, value) in [("app", filter.app), ("version", filter.version), ("signal", filter.signal)]
        where !value.isEmpty {
            sql += " AND \(column) = ?"
            values.append(.text(value))
        }
        return (sql, values)
    }

    /// Neither an app, a version, a signal nor a time range: what the groups' own rows answer.
    private static func allOf(_ filter: BrowserFilter) -> Bool {
        filter.app.isEmpty && filter.version.isEmpty && filter.signal.isEmpty && filter.since == nil
    }

    /// Each group's events under the filter, as rows (fingerprint, n, f, l): over all time from
    /// `crash_combos`; with a time range, its whole days from `crash_days` and the rest of its
    /// first day from the index. The text filter is on the group's title.
    private func matched(_ filter: BrowserFilter, fingerprint: String? = nil) -> (String, [Value]) {
        let kind = Value.text(filter.kind.rawValue)
        let (combo, comboValues) = Self.combo(filter)
        var only = ""
        var onlyValues: [Value] = []
        if let fingerprint {
            only = " AND fingerprint = ?"
            onlyValues = [.text(fingerprint)]
        } else if !filter.text.isEmpty {
            only =
                " AND fingerprint IN (SELECT fingerprint FROM \(schema).crash_groups WHERE kind = ? AND instr(lower(title), lower(?)) > 0)"
            onlyValues = [kind, .text(filter.text)]
        }
        guard let since = filter.since else {
            return (
                "SELECT fingerprint, sum(n) AS n, min(first_ms) AS f, max(last_ms) AS l FROM \(schema).crash_combos "
                    + "WHERE kind = ?\(only)\(combo) GROUP BY fingerprint", [kind] + onlyValues + comboValues
            )
        }
        let firstWholeDay = (since + Self.day - 1) / Self.day
        // Every group's events of one day: the index by time, or the planner scans a group index.
        let byTime = only.isEmpty ? " INDEXED BY crash_index_by_time" : ""
        return (
            """
            SELECT fingerprint, sum(n) AS n, min(f) AS f, max(l) AS l FROM (
                SELECT fingerprint, n, first_ms AS f, last_ms AS l FROM \(schema).crash_days
                WHERE kind = ?\(only) AND day >= ?\(combo)
                UNION ALL
                SELECT fingerprint, count(*), min(time_ms), max(time_ms) FROM \(schema).crash_index\(byTime)
                WHERE kind = ?\(only) AND time_ms >= ? AND time_ms < ?\(combo) GROUP BY fingerprint)
            GROUP BY fingerprint
            """,
            [kind] + onlyValues + [.integer(firstWholeDay)] + comboValues + [kind] + onlyValues
                + [.integer(since), .integer(firstWholeDay * Self.day)] + comboValues
        )
    }

    /// A group's distinct users and installs under the filter. A range has only a lower bound, so
    /// "a user with an event since T" is one whose last event is.
    private func people(_ fingerprint: String, _ filter: BrowserFilter) throws -> (users: Int, installs: Int) {
        let key: [Value] = [.text(filter.kind.rawValue), .text(fingerprint)]
        let pinned = !(filter.app.isEmpty && filter.version.isEmpty && filter.signal.isEmpty)
        var found = (users: 0, installs: 0)
        if !pinned, filter.since == nil {
            try rows("SELECT users, installs FROM \(schema).crash_groups WHERE kind = ? AND fingerprint = ?", key) {
                found = (Int($0.int64(0)), Int($0.int64(1)))
            }
            return found
        }
        let (combo, comboValues) = Self.combo(filter)
        if pinned, filter.since == nil {
            var combos: [(Int, Int)] = []
            try rows(
                "SELECT users, installs FROM \(schema).crash_combos WHERE kind = ? AND fingerprint = ?\(combo)",
                key + comboValues
            ) { combos.append((Int($0.int64(0)), Int($0.int64(1)))) }
            // One (app, version, signal) matched: its own counts. Several: a user may be in more than one.
            if combos.count <= 1 { return combos.first.map { (users: $0.0, installs: $0.1) } ?? found }
        }
        let since = filter.since.map { (" AND last_ms >= ?", [Value.integer($0)]) } ?? ("", [])
        for (column, table) in [("user", "users"), ("install", "installs")] {
            let sql =
                pinned
                ? "SELECT count(DISTINCT \(column)) FROM \(schema).crash_combo_\(table) WHERE kind = ? AND fingerprint = ?\(combo)\(since.0)"
                : "SELECT count(*) FROM \(schema).crash_group_\(table) WHERE kind = ? AND fingerprint = ?\(since.0)"
            try rows(sql, key + (pinned ? comboValues : []) + since.1) {
                if column == "user" { found.users = Int($0.int64(0)) } else { found.installs = Int($0.int64(0)) }
            }
        }
        return found
    }

    /// The versions of a group's first and last event under the filter.
    private func firstAndLastVersion(_ fingerprint: String, _ filter: BrowserFilter) throws -> (String, String) {
        let key: [Value] = [.text(filter.kind.rawValue), .text(fingerprint)]
        var versions = ("", "")
        if Self.allOf(filter) {
            try rows(
                "SELECT first_version, last_version FROM \(schema).crash_groups WHERE kind = ? AND fingerprint = ?", key
            ) { versions = ($0.text(0), $0.text(1)) }
            return versions
        }
        let (combo, comboValues) = Self.combo(filter)
        try rows(
            "SELECT version, max(last_ms) FROM \(schema).crash_combos WHERE kind = ? AND fingerprint = ?\(combo)",
            key + comboValues
        ) { versions.1 = $0.text(0) }
        if let since = filter.since {
            try rows(
                """
                SELECT version FROM \(schema).crash_index WHERE fingerprint = ? AND kind = ? AND time_ms >= ?\(combo)
                ORDER BY time_ms, event_id LIMIT 1
                """, [key[1], key[0], .integer(since)] + comboValues
            ) { versions.0 = $0.text(0) }
        } else {
            try rows(
                "SELECT version, min(first_ms) FROM \(schema).crash_combos WHERE kind = ? AND fingerprint = ?\(combo)",
                key + comboValues
            ) { versions.0 = $0.text(0) }
        }
        return versions
    }

    /// Events on each of the `days` UTC days up to the one `filter.now` is in, oldest first, for
    /// each group: whole days from `crash_days`, and a time range's first day, which it takes only
    /// part of, from the index.
    private func daily(_ fingerprints: [String], _ filter: BrowserFilter, days: Int) throws -> [String: [Int]] {
        var counts = Dictionary(uniqueKeysWithValues: fingerprints.map { ($0, Array(repeating: 0, count: days)) })
        guard !fingerprints.isEmpty else { return counts }
        let today = filter.now / Self.day
        let firstDay = today - Int64(days) + 1
        let kind = Value.text(filter.kind.rawValue)
        let (combo, comboValues) = Self.combo(filter)
        let marks = Array(repeating: "?", count: fingerprints.count).joined(separator: ", ")
        let listed = fingerprints.map { Value.text($0) }
        var wholeFrom = firstDay
        if let since = filter.since, since > firstDay * Self.day {
            wholeFrom = (since + Self.day - 1) / Self.day
            if since % Self.day != 0 {
                let partDay = since / Self.day
                try rows(
                    """
                    SELECT fingerprint, count(*) FROM \(schema).crash_index WHERE fingerprint IN (\(marks)) AND kind = ?
                        AND time_ms >= ? AND time_ms < ?\(combo) GROUP BY fingerprint
                    """, listed + [kind, .integer(since), .integer((partDay + 1) * Self.day)] + comboValues
                ) { counts[$0.text(0)]?[Int(partDay - firstDay)] += Int($0.int64(1)) }
            }
        }
        try rows(
            """
            SELECT fingerprint, day, sum(n) FROM \(schema).crash_days WHERE kind = ? AND fingerprint IN (\(marks))
                AND day >= ? AND day <= ?\(combo) GROUP BY fingerprint, day
            """, [kind] + listed + [.integer(wholeFrom), .integer(today)] + comboValues
        ) { counts[$0.text(0)]?[Int($0.int64(1) - firstDay)] += Int($0.int64(2)) }
        return counts
    }

    /// Each app's newest version: the one whose first event came last.
    private func newestVersions() throws -> [String: String] {
        var newest: [String: String] = [:]
        try rows("SELECT app, version FROM \(schema).crash_versions ORDER BY first_ms", []) {
            newest[$0.text(0)] = $0.text(1)
        }
        return newest
    }

    /// What every row shows of a group and its numbers under the filter, from what is known already.
    private struct Found {
        var fingerprint: String
        var events: Int
        var first: Int64
        var last: Int64
        var title: String
        var app: String
        var people: (users: Int, installs: Int)?
        var versions: (String, String)?
    }

    /// `charts`: the rows' 14-day charts, when the caller has them already.
    private func summaries(_ found: [Found], _ filter: BrowserFilter, charts: [String: [Int]]? = nil) throws
        -> [GroupSummary]
    {
        let charts = try charts ?? daily(found.map(\.fingerprint), filter, days: 14)
        let newest = try newestVersions()
        return try found.map { row in
            let people = try row.people ?? self.people(row.fingerprint, filter)
            let versions = try row.versions ?? firstAndLastVersion(row.fingerprint, filter)
            var everFirst = ""
            try rows(
                "SELECT first_version FROM \(schema).crash_groups WHERE kind = ? AND fingerprint = ?",
                [.text(filter.kind.rawValue), .text(row.fingerprint)]
            ) { everFirst = $0.text(0) }
            let newVersion = filter.version.isEmpty ? newest[row.app] ?? "" : filter.version
            return GroupSummary(
                fingerprint: row.fingerprint, title: row.title, app: row.app, events: row.events, users: people.users,
                installs: people.installs, firstSeen: row.first, firstVersion: versions.0, lastSeen: row.last,
                lastVersion: versions.1, daily: charts[row.fingerprint] ?? Array(repeating: 0, count: 14),
                isNew: !newVersion.isEmpty && everFirst == newVersion)
        }
    }

    package func groups(_ filter: BrowserFilter, limit: Int) throws -> GroupPage {
        try locked {
            let kind = Value.text(filter.kind.rawValue)
            var found: [Found] = []
            var totals = (groups: 0, events: 0)
            if Self.allOf(filter) {
                let column = ["events": "n", "last": "last_ms", "first": "first_ms"][filter.sort.rawValue]!
                let (text, textValues) =
                    filter.text.isEmpty
                    ? ("", []) : (" AND instr(lower(title), lower(?)) > 0", [Value.text(filter.text)])
                var keyset = ""
                var keysetValues: [Value] = []
                if let after = filter.after {
                    keyset = " AND (\(column) < ? OR (\(column) = ? AND fingerprint > ?))"
                    keysetValues = [.integer(after.value), .integer(after.value), .text(after.fingerprint)]
                }
                try rows(
                    """
                    SELECT fingerprint, n, first_ms, last_ms, title, app, users, installs, first_version, last_version
                    FROM \(schema).crash_groups WHERE kind = ?\(text)\(keyset) ORDER BY \(column) DESC, fingerprint
                    LIMIT \(limit + 1)
                    """, [kind] + textValues + keysetValues
                ) {
                    found.append(
                        Found(
                            fingerprint: $0.text(0), events: Int($0.int64(1)), first: $0.int64(2), last: $0.int64(3),
                            title: $0.text(4), app: $0.text(5), people: (Int($0.int64(6)), Int($0.int64(7))),
                            versions: ($0.text(8), $0.text(9))))
                }
                try rows(
                    "SELECT count(*), coalesce(sum(n), 0) FROM \(schema).crash_groups WHERE kind = ?\(text)",
                    [kind] + textValues
                ) { totals = (Int($0.int64(0)), Int($0.int64(1))) }
            } else {
                let sortColumn = ["events": "n", "last": "l", "first": "f"][filter.sort.rawValue]!
                let (sql, values) = matched(filter)
                var keyset = ""
                var keysetValues: [Value] = []
                if let after = filter.after {
                    keyset = " WHERE \(sortColumn) < ? OR (\(sortColumn) = ? AND fingerprint > ?)"
                    keysetValues = [.integer(after.value), .integer(after.value), .text(after.fingerprint)]
                }
                // The page and, in the same pass, the totals of every group under the filter.
                try rows(
                    """
                    WITH m AS (\(sql)), t AS (
                        SELECT m.fingerprint, m.n, m.f, m.l, g.title, g.app, count(*) OVER () AS groups,
                            sum(m.n) OVER () AS events
                        FROM m JOIN \(schema).crash_groups g ON g.kind = ? AND g.fingerprint = m.fingerprint)
                    SELECT * FROM t\(keyset) ORDER BY \(sortColumn) DESC, fingerprint LIMIT \(limit + 1)
                    """, values + [kind] + keysetValues
                ) {
                    found.append(
                        Found(
                            fingerprint: $0.text(0), events: Int($0.int64(1)), first: $0.int64(2), last: $0.int64(3),
                            title: $0.text(4), app: $0.text(5)))
                    totals = (Int($0.int64(6)), Int($0.int64(7)))
                }
                if found.isEmpty {
                    try rows("WITH m AS (\(sql)) SELECT count(*), coalesce(sum(n), 0) FROM m", values) {
                        totals = (Int($0.int64(0)), Int($0.int64(1)))
                    }
                }
            }
            return GroupPage(
                rows: try summaries(Array(found.prefix(limit)), filter), totalGroups: totals.groups,
                totalEvents: totals.events, more: found.count > limit)
        }
    }

    package func group(_ fingerprint: String, _ filter: BrowserFilter) throws -> GroupDetail? {
        try locked {
            var byFilter = filter
            byFilter.text = ""
            let (sql, values) = matched(byFilter, fingerprint: fingerprint)
            var aggregate: Found?
            let key: [Value] = [.text(filter.kind.rawValue), .text(fingerprint)]
            try rows(sql, values) {
                aggregate = Found(
                    fingerprint: fingerprint, events: Int($0.int64(1)), first: $0.int64(2), last: $0.int64(3),
                    title: "", app: "")
            }
            guard var found = aggregate, found.events > 0 else { return nil }
            try rows("SELECT title, app FROM \(schema).crash_groups WHERE kind = ? AND fingerprint = ?", key) {
                found.title = $0.text(0)
                found.app = $0.text(1)
            }
            // The 30-day chart, whose last 14 days are the summary's.
            let chart = try daily([fingerprint], byFilter, days: 30)[fingerprint] ?? Array(repeating: 0, count: 30)
            let summary = try summaries([found], byFilter, charts: [fingerprint: Array(chart.suffix(14))])[0]
            // The last 24 hours and 30 days under the filter: from the later of its start and theirs.
            func count(within: Int64) throws -> Int {
                var narrowed = byFilter
                if (filter.since ?? .min) <= filter.now - within { narrowed.range = within == Self.day ? "24h" : "30d" }
                let (sql, values) = matched(narrowed, fingerprint: fingerprint)
                var events = 0
                try rows(sql, values) { events = Int($0.int64(1)) }
                return events
            }
            return GroupDetail(
                summary: summary, last24Hours: try count(within: Self.day),
                last30Days: try count(within: 30 * Self.day), daily30: chart,
                facets: try facets(fingerprint, byFilter, events: found.events),
                events: try latestEvents(fingerprint, byFilter))
        }
    }

    /// The ten most common values of each facet of a group's events under the filter. Over all
    /// time from the sums; with a time range, from whichever side of its start has fewer events:
    /// the sums less the events before it, or the events since it counted.
    private func facets(_ fingerprint: String, _ filter: BrowserFilter, events: Int) throws -> [Facet] {
        let key: [Value] = [.text(filter.kind.rawValue), .text(fingerprint)]
        let (combo, comboValues) = Self.combo(filter)
        func summed(_ name: String) -> String {
            ["version", "signal"].contains(name)
                ? "SELECT \(name) AS v, sum(n) AS c FROM \(schema).crash_combos WHERE kind = ? AND fingerprint = ?\(combo) GROUP BY v"
                : "SELECT value AS v, sum(n) AS c FROM \(schema).crash_facets WHERE kind = ? AND fingerprint = ? AND facet = '\(name)'\(combo) GROUP BY v"
        }
        var allTime = 0
        if filter.since != nil {
            try rows(
                "SELECT coalesce(sum(n), 0) FROM \(schema).crash_combos WHERE kind = ? AND fingerprint = ?\(combo)",
                key + comboValues
            ) { allTime = Int($0.int64(0)) }
        }
        var facets: [Facet] = []
        for (name, expression, from, only) in [
            ("version", "version", "", ""), ("host", "host", "", ""), ("OS", "os", "", ""),
            ("signal", "signal", "", ""),
            ("context", Self.contextMember, ", json_each(crash_index.context) AS j", " AND \(Self.contextMemberKept)"),
        ] {
            var counted: [(String, Int)] = []
            let read: (SQLiteStatement) -> Void = { counted.append(($0.text(0), Int($0.int64(1)))) }
            if let since = filter.since {
                if allTime - events < events {
                    try rows(
                        """
                        SELECT v, sum(c) AS c FROM (\(summed(name)) UNION ALL
                            SELECT \(expression) AS v, -count(*) AS c FROM \(schema).crash_index\(from)
                            WHERE fingerprint = ? AND kind = ? AND time_ms < ?\(combo)\(only) GROUP BY v)
                        GROUP BY v HAVING sum(c) > 0 ORDER BY c DESC, v LIMIT 10
                        """, key + comboValues + [key[1], key[0], .integer(since)] + comboValues, read)
                } else {
                    try rows(
                        """
                        SELECT \(expression) AS v, count(*) AS c FROM \(schema).crash_index\(from)
                        WHERE fingerprint = ? AND kind = ? AND time_ms >= ?\(combo)\(only)
                        GROUP BY v ORDER BY c DESC, v LIMIT 10
                        """, [key[1], key[0], .integer(since)] + comboValues, read)
                }
            } else {
                try rows(
                    "SELECT v, c FROM (\(summed(name))) ORDER BY c DESC, v LIMIT 10",
                    key + comboValues, read)
            }
            if !counted.isEmpty { facets.append(Facet(name: name, values: counted)) }
        }
        return facets
    }

    private func latestEvents(_ fingerprint: String, _ filter: BrowserFilter) throws -> [EventRow] {
        let (combo, comboValues) = Self.combo(filter)
        let since = filter.since.map { (" AND time_ms >= ?", [Value.integer($0)]) } ?? ("", [])
        var events: [EventRow] = []
        try rows(
            """
            SELECT event_id, time_ms, version, host, user FROM \(schema).crash_index
            WHERE fingerprint = ? AND kind = ?\(since.0)\(combo)
            ORDER BY time_ms DESC, event_id DESC LIMIT \(GroupDetail.eventsShown)
            """, [.text(fingerprint), .text(filter.kind.rawValue)] + since.1 + comboValues
        ) {
            events.append(
                EventRow(
                    eventID: $0.text(0), time: $0.int64(1), version: $0.text(2), host: $0.text(3), user: $0.text(4)))
        }
        return events
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
                SELECT c.fingerprint, sum(c.n) AS n, g.title, g.first_version FROM \(schema).crash_combos c
                JOIN \(schema).crash_groups g ON g.kind = c.kind AND g.fingerprint = c.fingerprint
                WHERE c.kind = ? AND c.app = ? AND c.version = ? GROUP BY c.fingerprint ORDER BY n DESC, c.fingerprint
                LIMIT \(limit)
                """, [.text(kind.rawValue), .text(app), .text(version)]
            ) {
                top.append(
                    TopCrasher(
                        fingerprint: $0.text(0), title: $0.text(2), events: Int($0.int64(1)), previousEvents: 0,
                        isNew: $0.text(3) == version))
            }
            if let previous, !top.isEmpty {
                var before: [String: Int] = [:]
                try rows(
                    """
                    SELECT fingerprint, sum(n) FROM \(schema).crash_combos WHERE kind = ? AND app = ? AND version = ?
                        AND fingerprint IN (\(Array(repeating: "?", count: top.count).joined(separator: ", ")))
                    GROUP BY fingerprint
                    """, [.text(kind.rawValue), .text(app), .text(previous)] + top.map { .text($0.fingerprint) }
                ) { before[$0.text(0)] = Int($0.int64(1)) }
                for index in top.indices { top[index].previousEvents = before[top[index].fingerprint] ?? 0 }
            }
            return top
        }
    }

    package func versionEvents(app: String, version: String, kind: BrowserFilter.Kind) throws -> Int {
        try locked {
            var count = 0
            try rows(
                "SELECT coalesce(sum(n), 0) FROM \(schema).crash_combos WHERE kind = ? AND app = ? AND version = ?",
                [.text(kind.rawValue), .text(app), .text(version)]
            ) { count = Int($0.int64(0)) }
            return count
        }
    }

    package func storedEventCount() throws -> Int {
        try lock.withLock { Int(try connection.scalarInt("SELECT count(*) FROM main.events")) }
    }
}
