internal import CrashBrowser
internal import Foundation

/// The crash browser's questions answered by ClickHouse from the sums `ClickHouseCrashIndex`
/// keeps: the same pages and numbers as `SQLiteBrowserQueries`, each exact under the page's
/// filter. A time range counts its whole UTC days from `crash_days` and the rest of its first day
/// from `crash_by_time`; what no sum holds (distinct users under a filter, a group's facets under a
/// time range) is read from the group's own rows in `crash_index`, which its key keeps together.
/// `@unchecked`: the store is thread-safe and nothing else is kept.
final class ClickHouseSummedBrowserQueries: BrowserQueries, @unchecked Sendable {
    let store: ClickHouseStore
    private let events: ClickHouseBrowserQueries

    init(_ store: ClickHouseStore) throws {
        self.store = store
        events = try ClickHouseBrowserQueries(store)
    }

    private static let day: Int64 = 86_400_000

    private static func literal(_ text: String) -> String { ClickHouseBrowserQueries.literal(text) }
    private static func int(_ value: Any?) -> Int64 { ClickHouseBrowserQueries.int(value) }
    private static func text(_ value: Any?) -> String { ClickHouseBrowserQueries.text(value) }
    private func rows(_ sql: String) throws -> [[String: Any]] { try events.rows(sql) }

    /// `AND app = '...'` and so on for the filter's app, version and signal.
    private static func combo(_ filter: BrowserFilter) -> String {
        [("app", filter.app), ("version", filter.version), ("signal", filter.signal)].filter { !$0.1.isEmpty }
            .map { " AND \($0.0) = \(literal($0.1))" }.joined()
    }

    private static func allOf(_ filter: BrowserFilter) -> Bool {
        filter.app.isEmpty && filter.version.isEmpty && filter.signal.isEmpty && filter.since == nil
    }

    private static func kind(_ filter: BrowserFilter) -> String { literal(filter.kind.rawValue) }

    /// The fingerprints whose group's latest title holds the filter's text, as `AND fingerprint
    /// IN (...)`; nil when no group's does.
    private func titled(_ filter: BrowserFilter) throws -> String? {
        guard !filter.text.isEmpty else { return "" }
        let found = try rows(
            """
            SELECT fingerprint FROM crash_groups WHERE kind = \(Self.kind(filter)) GROUP BY fingerprint
            HAVING positionCaseInsensitiveUTF8(argMaxMerge(title), \(Self.literal(filter.text))) > 0
            """
        ).map { Self.literal(Self.text($0["fingerprint"])) }
        return found.isEmpty ? nil : " AND fingerprint IN (\(found.joined(separator: ", ")))"
    }

    /// Rows (fingerprint, n, f, l) a group under the filter, `only` narrowing the groups.
    private static func matched(_ filter: BrowserFilter, only: String) -> String {
        let conditions = "kind = \(kind(filter))\(combo(filter))\(only)"
        guard let since = filter.since else {
            if allOf(filter) {
                return
                    "SELECT fingerprint, countMerge(n) AS n, minMerge(f) AS f, maxMerge(l) AS l FROM crash_groups WHERE kind = \(kind(filter))\(only) GROUP BY fingerprint"
            }
            return
                "SELECT fingerprint, countMerge(n) AS n, minMerge(f) AS f, maxMerge(l) AS l FROM crash_days WHERE \(conditions) GROUP BY fingerprint"
        }
        let wholeDay = (since + day - 1) / day
        return """
            SELECT fingerprint, countMerge(n) AS n, minMerge(f) AS f, maxMerge(l) AS l FROM crash_days
            WHERE \(conditions) AND day >= \(wholeDay) GROUP BY fingerprint
            UNION ALL
            SELECT fingerprint, count() AS n, min(time) AS f, max(time) AS l FROM crash_by_time
            WHERE \(conditions) AND time >= \(since) AND time < \(wholeDay * day) GROUP BY fingerprint
            """
    }

    func groups(_ filter: BrowserFilter, limit: Int) throws -> GroupPage {
        guard let only = try titled(filter) else {
            return GroupPage(rows: [], totalGroups: 0, totalEvents: 0, more: false)
        }
        let sortColumn = ["events": "n", "last": "l", "first": "f"][filter.sort.rawValue]!
        var having = ""
        if let after = filter.after {
            having =
                " HAVING \(sortColumn) < \(after.value) OR (\(sortColumn) = \(after.value) AND fingerprint > \(Self.literal(after.fingerprint)))"
        }
        // The page and the totals in one pass; the keyset (HAVING) is left out of the totals.
        let answer = try events.json(
            """
            SELECT fingerprint, sum(n) AS n, min(f) AS f, max(l) AS l, uniqExact(fingerprint) AS groups
            FROM (\(Self.matched(filter, only: only))) GROUP BY fingerprint WITH TOTALS\(having)
            ORDER BY \(sortColumn) DESC, fingerprint LIMIT \(limit + 1) SETTINGS totals_mode = 'before_having'
            """)
        let shown = Array(answer.data.prefix(limit))
        let fingerprints = shown.map { Self.text($0["fingerprint"]) }
        let details = try self.details(fingerprints, filter)
        let charts = try daily(fingerprints, filter, days: 14)
        let newest = try newestVersions()
        let summaries = shown.map { row -> GroupSummary in
            let fingerprint = Self.text(row["fingerprint"])
            let detail = details[fingerprint] ?? [:]
            let app = Self.text(detail["app"])
            let newVersion = filter.version.isEmpty ? newest[app] ?? "" : filter.version
            return GroupSummary(
                fingerprint: fingerprint, title: Self.text(detail["title"]), app: app, events: Int(Self.int(row["n"])),
                users: Int(Self.int(detail["users"])), installs: Int(Self.int(detail["installs"])),
                firstSeen: Self.int(row["f"]), firstVersion: Self.text(detail["first_version"]),
                lastSeen: Self.int(row["l"]), lastVersion: Self.text(detail["last_version"]),
                daily: charts[fingerprint] ?? Array(repeating: 0, count: 14),
                isNew: !newVersion.isEmpty && Self.text(detail["ever_first"]) == newVersion)
        }
        return GroupPage(
            rows: summaries, totalGroups: Int(Self.int(answer.totals["groups"])),
            totalEvents: Int(Self.int(answer.totals["n"])), more: answer.data.count > limit)
    }

    /// For the groups shown: distinct users and installs, the first and last version under the
    /// filter, and the group's latest title, app and first version ever.
    private func details(_ fingerprints: [String], _ filter: BrowserFilter) throws -> [String: [String: Any]] {
        guard !fingerprints.isEmpty else { return [:] }
        let listed = fingerprints.map(Self.literal).joined(separator: ", ")
        let key = "kind = \(Self.kind(filter)) AND fingerprint IN (\(listed))"
        var found = try facts(fingerprints, kind: filter.kind)
        func add(_ rows: [[String: Any]]) {
            for row in rows { found[Self.text(row["fingerprint"]), default: [:]].merge(row) { _, new in new } }
        }
        if let since = filter.since {
            add(
                try rows(
                    """
                    SELECT fingerprint, uniqExact(user_hash) AS users, uniqExact(install_hash) AS installs,
                        argMin(version, (time, event_id)) AS first_version, argMax(version, (time, event_id)) AS last_version
                    FROM crash_index PREWHERE \(key) AND time >= \(since) WHERE 1\(Self.combo(filter)) GROUP BY fingerprint
                    """))
        } else {
            add(
                try rows(
                    """
                    SELECT fingerprint, uniqExact(user_hash) AS users, uniqExact(install_hash) AS installs
                    FROM crash_index PREWHERE \(key) WHERE 1\(Self.combo(filter)) GROUP BY fingerprint
                    """))
            if !Self.allOf(filter) {
                add(
                    try rows(
                        """
                        SELECT fingerprint, argMin(version, f) AS first_version, argMax(version, l) AS last_version FROM (
                            SELECT fingerprint, version, minMerge(f) AS f, maxMerge(l) AS l FROM crash_days
                            PREWHERE \(key) WHERE 1\(Self.combo(filter)) GROUP BY fingerprint, version)
                        GROUP BY fingerprint
                        """))
            }
        }
        return found
    }

    /// Each group's latest title and app, and its first and last version, over all time.
    private func facts(_ fingerprints: [String], kind: BrowserFilter.Kind) throws -> [String: [String: Any]] {
        guard !fingerprints.isEmpty else { return [:] }
        var found: [String: [String: Any]] = [:]
        for row in try rows(
            """
            SELECT fingerprint, argMaxMerge(title) AS latest_title, argMaxMerge(app) AS latest_app,
                argMinMerge(first_version) AS ever_first, argMaxMerge(last_version) AS ever_last
            FROM crash_groups PREWHERE kind = \(Self.literal(kind.rawValue))
                AND fingerprint IN (\(fingerprints.map(Self.literal).joined(separator: ", "))) GROUP BY fingerprint
            """)
        {
            // Under no filter, the first and last version are these too.
            found[Self.text(row["fingerprint"])] = [
                "title": row["latest_title"] ?? "", "app": row["latest_app"] ?? "",
                "ever_first": row["ever_first"] ?? "",
                "first_version": row["ever_first"] ?? "", "last_version": row["ever_last"] ?? "",
            ]
        }
        return found
    }

    /// Events on each of the `days` UTC days up to the one `filter.now` is in, oldest first.
    private func daily(_ fingerprints: [String], _ filter: BrowserFilter, days: Int) throws -> [String: [Int]] {
        var counts = Dictionary(uniqueKeysWithValues: fingerprints.map { ($0, Array(repeating: 0, count: days)) })
        guard !fingerprints.isEmpty else { return counts }
        let today = filter.now / Self.day
        let firstDay = today - Int64(days) + 1
        let listed = fingerprints.map(Self.literal).joined(separator: ", ")
        let conditions = "kind = \(Self.kind(filter)) AND fingerprint IN (\(listed))\(Self.combo(filter))"
        var wholeFrom = firstDay
        if let since = filter.since, since > firstDay * Self.day {
            wholeFrom = (since + Self.day - 1) / Self.day
            if since % Self.day != 0 {
                let partDay = since / Self.day
                for row in try rows(
                    """
                    SELECT fingerprint, count() AS n FROM crash_by_time
                    WHERE \(conditions) AND time >= \(since) AND time < \((partDay + 1) * Self.day) GROUP BY fingerprint
                    """)
                {
                    counts[Self.text(row["fingerprint"])]?[Int(partDay - firstDay)] += Int(Self.int(row["n"]))
                }
            }
        }
        for row in try rows(
            """
            SELECT fingerprint, day, countMerge(n) AS n FROM crash_days
            WHERE \(conditions) AND day >= \(wholeFrom) AND day <= \(today) GROUP BY fingerprint, day
            """)
        {
            counts[Self.text(row["fingerprint"])]?[Int(Self.int(row["day"]) - firstDay)] += Int(Self.int(row["n"]))
        }
        return counts
    }

    private func versionOrder() throws -> [(app: String, version: String)] {
        try rows(
            "SELECT app, version, minMerge(f) AS first FROM crash_days GROUP BY app, version ORDER BY first, version"
        )
        .map { (Self.text($0["app"]), Self.text($0["version"])) }
    }

    private func newestVersions() throws -> [String: String] {
        var newest: [String: String] = [:]
        for (app, version) in try versionOrder() { newest[app] = version }
        return newest
    }

    func group(_ fingerprint: String, _ filter: BrowserFilter) throws -> GroupDetail? {
        let since = filter.since.map { " AND time >= \($0)" } ?? ""
        let own =
            "PREWHERE kind = \(Self.kind(filter)) AND fingerprint = \(Self.literal(fingerprint)) WHERE 1\(since)\(Self.combo(filter))"
        guard
            let row = try rows(
                """
                SELECT count() AS n, min(time) AS f, max(time) AS l, uniqExact(user_hash) AS users,
                    uniqExact(install_hash) AS installs, argMin(version, (time, event_id)) AS first_version,
                    argMax(version, (time, event_id)) AS last_version,
                    countIf(time >= \(filter.now - Self.day)) AS day, countIf(time >= \(filter.now - 30 * Self.day)) AS month
                FROM crash_index \(own)
                """
            ).first, Self.int(row["n"]) > 0
        else { return nil }
        let group = try facts([fingerprint], kind: filter.kind)[fingerprint] ?? [:]
        let app = Self.text(group["app"])
        let newVersion = filter.version.isEmpty ? try newestVersions()[app] ?? "" : filter.version
        // The 30-day chart, whose last 14 days are the summary's.
        let chart = try daily([fingerprint], filter, days: 30)[fingerprint] ?? Array(repeating: 0, count: 30)
        let summary = GroupSummary(
            fingerprint: fingerprint, title: Self.text(group["title"]), app: app, events: Int(Self.int(row["n"])),
            users: Int(Self.int(row["users"])), installs: Int(Self.int(row["installs"])),
            firstSeen: Self.int(row["f"]), firstVersion: Self.text(row["first_version"]),
            lastSeen: Self.int(row["l"]), lastVersion: Self.text(row["last_version"]),
            daily: Array(chart.suffix(14)), isNew: !newVersion.isEmpty && Self.text(group["ever_first"]) == newVersion)
        // The latest 100: within the last day when it holds that many, else from all of them.
        let recent =
            Self.int(row["day"]) >= Int64(GroupDetail.eventsShown) && (filter.since ?? .min) <= filter.now - Self.day
            ? " AND time >= \(filter.now - Self.day)" : ""
        let latest = try rows(
            """
            SELECT event_id, time, version, host, user FROM crash_index \(own)\(recent)
            ORDER BY time DESC, event_id DESC LIMIT \(GroupDetail.eventsShown)
            """
        ).map {
            EventRow(
                eventID: Self.text($0["event_id"]), time: Self.int($0["time"]), version: Self.text($0["version"]),
                host: Self.text($0["host"]), user: Self.text($0["user"]))
        }
        return GroupDetail(
            summary: summary, last24Hours: Int(Self.int(row["day"])), last30Days: Int(Self.int(row["month"])),
            daily30: chart,
            facets: try facets(fingerprint, filter, own: own), events: latest)
    }

    /// Each facet's ten most common values: over all time from `crash_facets`; under a time range
    /// from the group's rows since its start.
    private func facets(_ fingerprint: String, _ filter: BrowserFilter, own: String) throws -> [Facet] {
        var counted: [String: [String: Int]] = [:]
        if filter.since == nil {
            for row in try rows(
                """
                SELECT facet, value, sum(n) AS c FROM crash_facets
                PREWHERE kind = \(Self.kind(filter)) AND fingerprint = \(Self.literal(fingerprint))
                WHERE 1\(Self.combo(filter)) GROUP BY facet, value
                """)
            {
                counted[Self.text(row["facet"]), default: [:]][Self.text(row["value"])] = Int(Self.int(row["c"]))
            }
        } else {
            for (name, column) in [("version", "version"), ("signal", "signal"), ("host", "host"), ("OS", "os")] {
                for row in try rows("SELECT \(column) AS value, count() AS c FROM crash_index \(own) GROUP BY value") {
                    counted[name, default: [:]][Self.text(row["value"])] = Int(Self.int(row["c"]))
                }
            }
            for row in try rows("SELECT context AS value, count() AS c FROM crash_index \(own) GROUP BY value") {
                counted["context", default: [:]][Self.text(row["value"])] = Int(Self.int(row["c"]))
            }
        }
        // ClickHouse 18.16 lists no JSON object's members: the distinct contexts are counted there,
        // their members added up here.
        var members: [String: Int] = [:]
        for (text, count) in counted["context"] ?? [:] {
            guard let context = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
                continue
            }
            for (key, value) in context {
                switch value {
                case let text as String: members[key + " = " + text, default: 0] += count
                case let number as NSNumber: members[key + " = " + number.stringValue, default: 0] += count
                default: continue
                }
            }
        }
        counted["context"] = members
        return ["version", "host", "OS", "signal", "context"].compactMap { name in
            let top = (counted[name] ?? [:]).filter { $0.value > 0 }
                .sorted { $0.value != $1.value ? $0.value > $1.value : $0.key < $1.key }.prefix(10)
            return top.isEmpty ? nil : Facet(name: name, values: top.map { ($0.key, $0.value) })
        }
    }

    func eventPayload(_ eventID: String) throws -> String? { try events.eventPayload(eventID) }

    func choices(kind: BrowserFilter.Kind) throws -> FilterChoices {
        var versions: [String: [String]] = [:]
        for (app, version) in try versionOrder() { versions[app, default: []].append(version) }
        let signals = try rows(
            "SELECT DISTINCT signal FROM crash_days WHERE kind = \(Self.literal(kind.rawValue)) ORDER BY signal"
        ).map { Self.text($0["signal"]) }.filter { !$0.isEmpty }
        return FilterChoices(apps: versions.keys.sorted(), versions: versions, signals: signals)
    }

    func topCrashers(app: String, version: String, previous: String?, kind: BrowserFilter.Kind, limit: Int) throws
        -> [TopCrasher]
    {
        let base = "kind = \(Self.literal(kind.rawValue)) AND app = \(Self.literal(app))"
        let top = try rows(
            """
            SELECT fingerprint, countMerge(n) AS n FROM crash_days WHERE \(base) AND version = \(Self.literal(version))
            GROUP BY fingerprint ORDER BY n DESC, fingerprint LIMIT \(limit)
            """)
        let fingerprints = top.map { Self.text($0["fingerprint"]) }
        let details = try facts(fingerprints, kind: kind)
        var before: [String: Int] = [:]
        if let previous, !fingerprints.isEmpty {
            for row in try rows(
                """
                SELECT fingerprint, countMerge(n) AS n FROM crash_days WHERE \(base) AND version = \(Self.literal(previous))
                    AND fingerprint IN (\(fingerprints.map(Self.literal).joined(separator: ", "))) GROUP BY fingerprint
                """)
            {
                before[Self.text(row["fingerprint"])] = Int(Self.int(row["n"]))
            }
        }
        return top.map {
            let fingerprint = Self.text($0["fingerprint"])
            return TopCrasher(
                fingerprint: fingerprint, title: Self.text(details[fingerprint]?["title"]),
                events: Int(Self.int($0["n"])), previousEvents: before[fingerprint] ?? 0,
                isNew: Self.text(details[fingerprint]?["ever_first"]) == version)
        }
    }

    func versionEvents(app: String, version: String, kind: BrowserFilter.Kind) throws -> Int {
        Int(
            Self.int(
                try rows(
                    """
                    SELECT countMerge(n) AS n FROM crash_days WHERE kind = \(Self.literal(kind.rawValue))
                        AND app = \(Self.literal(app)) AND version = \(Self.literal(version))
                    """
                ).first?["n"]))
    }

    func storedEventCount() throws -> Int { try store.count() }
}
