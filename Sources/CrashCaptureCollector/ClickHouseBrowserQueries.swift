internal import CrashBrowser
internal import CrashFileFormat
internal import Foundation

/// The crash browser's questions answered by ClickHouse, from the collector's `events` table:
/// the same pages and numbers as `SQLiteBrowserQueries`. Fingerprint, title, app, version and time
/// are columns of the table; the signal, host and OS are read from the properties' JSON text with
/// `visitParamExtractString`, which ClickHouse 18.16 (Debian 12's) has. Events are counted as
/// distinct ids (`uniqExact(event_id)`), so that a batch stored twice and not yet merged counts
/// once: reading the table `FINAL` instead merged it on every read, and a page of the list over a
/// million events took 2.3 s (`crashcap-bench browser`).
/// `@unchecked`: the store is thread-safe and nothing else is kept.
final class ClickHouseBrowserQueries: BrowserQueries, @unchecked Sendable {
    let store: ClickHouseStore

    /// The expression each derived value is read with, computed at every read. MATERIALIZED
    /// columns added to the table were faster to read, but a `Distributed` table made `AS` the
    /// table (as Fleet.md shows) then refused every insert ("Cannot insert column
    /// browser_fingerprint, because it is MATERIALIZED column"): the collector leaves the table as it is.
    let columns: [String: String]

    init(_ store: ClickHouseStore) throws {
        self.store = store
        columns = [
            "fingerprint": Self.fingerprint, "title": Self.title, "signal": Self.signal, "user": Self.user,
            "install": Self.install, "host": Self.host, "os": Self.os,
        ]
    }

    /// The columns the pages use, as expressions over the table's own (`c`: the events of one kind).
    static let fingerprint =
        "if(event = '$AppHang', visitParamExtractString(properties, 'hang_fingerprint'), crash_fingerprint)"
    static let title = "if(event = '$AppHang', visitParamExtractString(properties, 'hang_title'), crash_title)"
    static let signal = "if(event = '$AppHang', 'hang', visitParamExtractString(properties, 'crash_signal_name'))"
    static let user =
        "if(visitParamHas(payload, 'login_id'), visitParamExtractString(payload, 'login_id'), distinct_id)"
    static let install =
        "if(visitParamHas(payload, 'anonymous_id'), visitParamExtractString(payload, 'anonymous_id'), distinct_id)"
    static let host = "visitParamExtractString(properties, '$hostname')"
    static let os =
        "replaceRegexpAll(concat(visitParamExtractString(properties, '$os'), ' ', visitParamExtractString(properties, '$os_version')), '^ +| +$', '')"

    /// The events of the filter's kind with the columns named, as a subquery.
    var indexed: String {
        """
        (SELECT event_id, event, \(columns["fingerprint"]!) AS fingerprint, \(columns["title"]!) AS title,
            app_name AS app, app_version AS version, time AS time_ms, \(columns["user"]!) AS user,
            \(columns["install"]!) AS install, \(columns["signal"]!) AS signal, \(columns["host"]!) AS host,
            \(columns["os"]!) AS os, properties
         FROM \(store.table) WHERE event IN ('$AppCrashed', '$AppHang'))
        """
    }

    static func literal(_ text: String) -> String {
        "'" + text.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "'", with: "\\'") + "'"
    }

    static func conditions(_ filter: BrowserFilter, fingerprint: String? = nil) -> String {
        var parts = ["event = \(literal(filter.kind.event))"]
        if let fingerprint { parts.append("fingerprint = \(literal(fingerprint))") }
        for (column, value) in [("app", filter.app), ("version", filter.version), ("signal", filter.signal)]
        where !value.isEmpty {
            parts.append("\(column) = \(literal(value))")
        }
        if let since = filter.since { parts.append("time_ms >= \(since)") }
        if !filter.text.isEmpty { parts.append("positionCaseInsensitiveUTF8(title, \(literal(filter.text))) > 0") }
        return parts.joined(separator: " AND ")
    }

    func rows(_ sql: String) throws -> [[String: Any]] {
        try store.run(sql + " FORMAT JSONEachRow").split(separator: "\n").map {
            try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] ?? [:]
        }
    }

    /// A query's rows and its `WITH TOTALS` row, in ClickHouse's JSON format.
    func json(_ sql: String) throws -> (data: [[String: Any]], totals: [String: Any]) {
        let text = try store.run(sql + " FORMAT JSON")
        guard let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
            throw CrashCaptureError.corrupt("ClickHouse answered a query with \"\(text.prefix(80))\"")
        }
        return (object["data"] as? [[String: Any]] ?? [], object["totals"] as? [String: Any] ?? [:])
    }

    static func int(_ value: Any?) -> Int64 {
        if let number = value as? NSNumber { return number.int64Value }
        return Int64(value as? String ?? "") ?? 0
    }

    static func text(_ value: Any?) -> String { value as? String ?? "" }

    func groups(_ filter: BrowserFilter, limit: Int) throws -> GroupPage {
        let conditions = Self.conditions(filter)
        let sortColumn = ["events": "n", "last": "l", "first": "f"][filter.sort.rawValue]!
        var having = ""
        if let after = filter.after {
            having =
                "HAVING \(sortColumn) < \(after.value) OR (\(sortColumn) = \(after.value) AND fingerprint > \(Self.literal(after.fingerprint)))"
        }
        // One pass for the page's groups with every column of their rows.
        let found = try rows(
            """
            SELECT fingerprint, toInt64(uniqExact(event_id)) AS n, min(time_ms) AS f, max(time_ms) AS l,
                uniqExact(user) AS users, uniqExact(install) AS installs,
                argMin(version, (time_ms, event_id)) AS first_version, argMax(version, (time_ms, event_id)) AS last_version,
                argMax(title, (time_ms, event_id)) AS last_title, argMax(app, (time_ms, event_id)) AS last_app
            FROM \(indexed) WHERE \(conditions) GROUP BY fingerprint \(having)
            ORDER BY \(sortColumn) DESC, fingerprint LIMIT \(limit + 1)
            """)
        let totals =
            try rows("SELECT uniqExact(fingerprint) AS g, uniqExact(event_id) AS e FROM \(indexed) WHERE \(conditions)")
            .first ?? [:]
        let shown = Array(found.prefix(limit))
        let fingerprints = shown.map { Self.literal(Self.text($0["fingerprint"])) }
        let daily = try dailyCounts(fingerprints, filter, days: 14)
        let firsts = try firstVersions(fingerprints)
        let newest = try newestVersions()
        let summaries = shown.map { row -> GroupSummary in
            let fingerprint = Self.text(row["fingerprint"])
            let app = Self.text(row["last_app"])
            let newVersion = filter.version.isEmpty ? newest[app] ?? "" : filter.version
            return GroupSummary(
                fingerprint: fingerprint, title: Self.text(row["last_title"]), app: app,
                events: Int(Self.int(row["n"])),
                users: Int(Self.int(row["users"])), installs: Int(Self.int(row["installs"])),
                firstSeen: Self.int(row["f"]), firstVersion: Self.text(row["first_version"]),
                lastSeen: Self.int(row["l"]), lastVersion: Self.text(row["last_version"]),
                daily: daily[fingerprint] ?? Array(repeating: 0, count: 14),
                isNew: !newVersion.isEmpty && firsts[fingerprint] == newVersion)
        }
        return GroupPage(
            rows: summaries, totalGroups: Int(Self.int(totals["g"])), totalEvents: Int(Self.int(totals["e"])),
            more: found.count > limit)
    }

    private static let day: Int64 = 86_400_000

    /// Events on each of the `days` UTC days up to the one `filter.now` is in, oldest first.
    private func dailyCounts(_ fingerprints: [String], _ filter: BrowserFilter, days: Int) throws -> [String: [Int]] {
        guard !fingerprints.isEmpty else { return [:] }
        let firstDay = filter.now / Self.day - Int64(days) + 1
        var counts: [String: [Int]] = [:]
        for row in try rows(
            """
            SELECT fingerprint, intDiv(time_ms, \(Self.day)) - \(firstDay) AS d, uniqExact(event_id) AS n FROM \(indexed)
            WHERE \(Self.conditions(filter)) AND fingerprint IN (\(fingerprints.joined(separator: ", ")))
                AND time_ms >= \(firstDay * Self.day) AND time_ms < \((filter.now / Self.day + 1) * Self.day)
            GROUP BY fingerprint, d
            """)
        {
            let fingerprint = Self.text(row["fingerprint"])
            let index = Int(Self.int(row["d"]))
            var days = counts[fingerprint] ?? Array(repeating: 0, count: days)
            if days.indices.contains(index) { days[index] = Int(Self.int(row["n"])) }
            counts[fingerprint] = days
        }
        return counts
    }

    /// Each group's first version ever, whatever the filter.
    private func firstVersions(_ fingerprints: [String]) throws -> [String: String] {
        guard !fingerprints.isEmpty else { return [:] }
        var versions: [String: String] = [:]
        for row in try rows(
            """
            SELECT fingerprint, argMin(version, (time_ms, event_id)) AS v FROM \(indexed)
            WHERE fingerprint IN (\(fingerprints.joined(separator: ", "))) GROUP BY fingerprint
            """)
        {
            versions[Self.text(row["fingerprint"])] = Self.text(row["v"])
        }
        return versions
    }

    private func versionOrder() throws -> [(app: String, version: String)] {
        try rows(
            "SELECT app, version, min(time_ms) AS f FROM \(indexed) GROUP BY app, version ORDER BY f, version"
        ).map { (Self.text($0["app"]), Self.text($0["version"])) }
    }

    private func newestVersions() throws -> [String: String] {
        var newest: [String: String] = [:]
        for (app, version) in try versionOrder() { newest[app] = version }
        return newest
    }

    func group(_ fingerprint: String, _ filter: BrowserFilter) throws -> GroupDetail? {
        let conditions = Self.conditions(filter, fingerprint: fingerprint)
        guard
            let row = try rows(
                """
                SELECT fingerprint, toInt64(uniqExact(event_id)) AS n, min(time_ms) AS f, max(time_ms) AS l,
                    uniqExact(user) AS users, uniqExact(install) AS installs,
                    argMin(version, (time_ms, event_id)) AS first_version, argMax(version, (time_ms, event_id)) AS last_version,
                    argMax(title, (time_ms, event_id)) AS last_title, argMax(app, (time_ms, event_id)) AS last_app,
                    uniqExactIf(event_id, time_ms >= \(filter.now - Self.day)) AS day,
                    uniqExactIf(event_id, time_ms >= \(filter.now - 30 * Self.day)) AS month
                FROM \(indexed) WHERE \(conditions) GROUP BY fingerprint
                """
            ).first
        else { return nil }
        let literal = [Self.literal(fingerprint)]
        let app = Self.text(row["last_app"])
        let newVersion = filter.version.isEmpty ? try newestVersions()[app] ?? "" : filter.version
        let everFirst = try firstVersions(literal)[fingerprint]
        let summary = GroupSummary(
            fingerprint: fingerprint, title: Self.text(row["last_title"]), app: app, events: Int(Self.int(row["n"])),
            users: Int(Self.int(row["users"])), installs: Int(Self.int(row["installs"])),
            firstSeen: Self.int(row["f"]), firstVersion: Self.text(row["first_version"]),
            lastSeen: Self.int(row["l"]), lastVersion: Self.text(row["last_version"]),
            daily: try dailyCounts(literal, filter, days: 14)[fingerprint] ?? Array(repeating: 0, count: 14),
            isNew: !newVersion.isEmpty && everFirst == newVersion)
        var facets: [Facet] = []
        for name in ["version", "host", "OS", "signal"] {
            let counted = try rows(
                """
                SELECT \(name == "OS" ? "os" : name) AS value, uniqExact(event_id) AS n FROM \(indexed) WHERE \(conditions)
                GROUP BY value ORDER BY n DESC, value LIMIT 10
                """
            ).map { (value: Self.text($0["value"]), count: Int(Self.int($0["n"]))) }
            if !counted.isEmpty { facets.append(Facet(name: name, values: counted)) }
        }
        // ClickHouse 18.16 has no function that lists a JSON object's members: the distinct
        // context objects are counted there (a fleet's contexts repeat), and their members here.
        // Each event once, first: the copies of one event may spell its context in another order.
        var members: [String: Int] = [:]
        for row in try rows(
            """
            SELECT context, count() AS n FROM (
                SELECT event_id, any(visitParamExtractRaw(properties, 'crash_context')) AS context FROM \(indexed)
                WHERE \(conditions) GROUP BY event_id)
            GROUP BY context
            """)
        {
            guard
                let context = try? JSONSerialization.jsonObject(with: Data(Self.text(row["context"]).utf8))
                    as? [String: Any]
            else { continue }
            for (key, value) in context {
                let shown: String
                switch value {
                case let text as String: shown = text
                case let number as NSNumber: shown = number.stringValue
                default: continue
                }
                members[key + " = " + shown, default: 0] += Int(Self.int(row["n"]))
            }
        }
        let context = members.sorted { $0.value != $1.value ? $0.value > $1.value : $0.key < $1.key }.prefix(10)
        if !context.isEmpty { facets.append(Facet(name: "context", values: context.map { ($0.key, $0.value) })) }
        let events = try rows(
            """
            SELECT DISTINCT event_id, time_ms, version, host, user FROM \(indexed) WHERE \(conditions)
            ORDER BY time_ms DESC, event_id DESC LIMIT \(GroupDetail.eventsShown)
            """
        ).map {
            EventRow(
                eventID: Self.text($0["event_id"]), time: Self.int($0["time_ms"]), version: Self.text($0["version"]),
                host: Self.text($0["host"]), user: Self.text($0["user"]))
        }
        var daily30 = Array(repeating: 0, count: 30)
        if let counts = try dailyCounts(literal, filter, days: 30)[fingerprint] { daily30 = counts }
        return GroupDetail(
            summary: summary, last24Hours: Int(Self.int(row["day"])), last30Days: Int(Self.int(row["month"])),
            daily30: daily30, facets: facets, events: events)
    }

    func eventPayload(_ eventID: String) throws -> String? {
        try rows(
            "SELECT payload, properties FROM \(store.table) WHERE event_id = \(Self.literal(eventID)) LIMIT 1"
        ).first.map {
            ClickHouseRows.record(payload: Self.text($0["payload"]), properties: Self.text($0["properties"]))
        }
    }

    func choices(kind: BrowserFilter.Kind) throws -> FilterChoices {
        var versions: [String: [String]] = [:]
        for (app, version) in try versionOrder() { versions[app, default: []].append(version) }
        let signals = try rows(
            "SELECT DISTINCT signal FROM \(indexed) WHERE event = \(Self.literal(kind.event)) ORDER BY signal"
        ).map { Self.text($0["signal"]) }.filter { !$0.isEmpty }
        return FilterChoices(apps: versions.keys.sorted(), versions: versions, signals: signals)
    }

    func topCrashers(app: String, version: String, previous: String?, kind: BrowserFilter.Kind, limit: Int) throws
        -> [TopCrasher]
    {
        let base = "event = \(Self.literal(kind.event)) AND app = \(Self.literal(app))"
        let top = try rows(
            """
            SELECT fingerprint, toInt64(uniqExact(event_id)) AS n, argMax(title, (time_ms, event_id)) AS last_title FROM \(indexed)
            WHERE \(base) AND version = \(Self.literal(version)) GROUP BY fingerprint ORDER BY n DESC, fingerprint
            LIMIT \(limit)
            """)
        let fingerprints = top.map { Self.literal(Self.text($0["fingerprint"])) }
        let firsts = try firstVersions(fingerprints)
        var before: [String: Int] = [:]
        if let previous, !fingerprints.isEmpty {
            for row in try rows(
                """
                SELECT fingerprint, uniqExact(event_id) AS n FROM \(indexed) WHERE \(base) AND version = \(Self.literal(previous))
                    AND fingerprint IN (\(fingerprints.joined(separator: ", "))) GROUP BY fingerprint
                """)
            {
                before[Self.text(row["fingerprint"])] = Int(Self.int(row["n"]))
            }
        }
        return top.map {
            let fingerprint = Self.text($0["fingerprint"])
            return TopCrasher(
                fingerprint: fingerprint, title: Self.text($0["last_title"]), events: Int(Self.int($0["n"])),
                previousEvents: before[fingerprint] ?? 0, isNew: firsts[fingerprint] == version)
        }
    }

    func versionEvents(app: String, version: String, kind: BrowserFilter.Kind) throws -> Int {
        Int(
            Self.int(
                try rows(
                    """
                    SELECT uniqExact(event_id) AS n FROM \(indexed) WHERE event = \(Self.literal(kind.event))
                        AND app = \(Self.literal(app)) AND version = \(Self.literal(version))
                    """
                ).first?["n"]))
    }

    func storedEventCount() throws -> Int { try store.count() }
}
