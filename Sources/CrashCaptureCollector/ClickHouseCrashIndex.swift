internal import CrashBrowser
internal import CrashFileFormat
internal import Foundation

/// The crash browser's tables in ClickHouse (Docs/Browser.md, "Where the numbers come from"):
/// `crash_index`, a row a crash or hang event with the columns the pages read (the properties'
/// values taken out once, when it arrives), and sums that materialized views keep as rows go into
/// it: a row a group (`crash_groups`), a group's events a UTC day, app, version and signal
/// (`crash_days`), its facet values (`crash_facets`), and the events by time
/// (`crash_by_time`, for the part of a time range's first day).
///
/// The collector inserts into `crash_index` itself, after the batch is in `events`, and only the
/// events it does not hold yet: a batch sent twice is stored twice in `events` until ClickHouse
/// merges it, but summed once. Sums cannot be undone, so views over `events` would have counted
/// the copy for good. Two collectors that take the same batch at the same moment may both add
/// it (Docs/Limits.md).
///
/// Only for the collector's own `events` table: a fleet whose collectors write into a
/// `Distributed` table (`table=`) keeps no sums, and its pages read the events as before.
enum ClickHouseCrashIndex {
    /// The kind, fingerprint, title, signal, user, install, host, OS and context of an `events` row.
    static let columns = """
        if(event = '$AppHang', 'hang', 'crash') AS kind,
        if(event = '$AppHang', visitParamExtractString(properties, 'hang_fingerprint'), crash_fingerprint) AS fingerprint,
        if(event = '$AppHang', visitParamExtractString(properties, 'hang_title'), crash_title) AS title,
        app_name AS app, app_version AS version,
        if(event = '$AppHang', 'hang', visitParamExtractString(properties, 'crash_signal_name')) AS signal,
        time, event_time, event_id,
        if(visitParamHas(payload, 'login_id'), visitParamExtractString(payload, 'login_id'), distinct_id) AS user,
        if(visitParamHas(payload, 'anonymous_id'), visitParamExtractString(payload, 'anonymous_id'), distinct_id)
            AS install,
        visitParamExtractString(properties, '$hostname') AS host,
        replaceRegexpAll(concat(visitParamExtractString(properties, '$os'), ' ',
            visitParamExtractString(properties, '$os_version')), '^ +| +$', '') AS os,
        visitParamExtractRaw(properties, 'crash_context') AS context,
        cityHash64(user) AS user_hash, cityHash64(install) AS install_hash
        """

    static let names =
        "kind, fingerprint, title, app, version, signal, time, event_time, event_id, user, install, host, os, context, "
        + "user_hash, install_hash"

    /// The tables, then the views, as ClickHouse 18.16 (Debian 12's) reads them. A view sees the
    /// rows inserted into `crash_index` (18.16 runs no view on the rows another view inserts).
    static let definitions = [
        """
        CREATE TABLE IF NOT EXISTS crash_groups (kind String, fingerprint String,
            n AggregateFunction(count), f AggregateFunction(min, Int64), l AggregateFunction(max, Int64),
            first_version AggregateFunction(argMin, String, Int64), last_version AggregateFunction(argMax, String, Int64),
            title AggregateFunction(argMax, String, Int64), app AggregateFunction(argMax, String, Int64))
        ENGINE = AggregatingMergeTree ORDER BY (kind, fingerprint) SETTINGS index_granularity = 128
        """,
        """
        CREATE TABLE IF NOT EXISTS crash_days (kind String, day UInt32, fingerprint String, app String, version String,
            signal String, n AggregateFunction(count), f AggregateFunction(min, Int64), l AggregateFunction(max, Int64))
        ENGINE = AggregatingMergeTree ORDER BY (kind, day, fingerprint, app, version, signal)
        """,
        """
        CREATE TABLE IF NOT EXISTS crash_by_time (kind String, time Int64, event_time DateTime, fingerprint String,
            app String, version String, signal String)
        ENGINE = MergeTree PARTITION BY toYYYYMM(event_time) ORDER BY (kind, time) SETTINGS index_granularity = 1024
        """,
        """
        CREATE TABLE IF NOT EXISTS crash_facets (kind String, fingerprint String, facet String, app String,
            version String, signal String, value String, n UInt64)
        ENGINE = SummingMergeTree(n) ORDER BY (kind, fingerprint, facet, app, version, signal, value)
        SETTINGS index_granularity = 1024
        """,
        // A group's rows together, so that its page reads them alone.
        """
        CREATE TABLE IF NOT EXISTS crash_index (kind String, fingerprint String, title String, app String,
            version String, signal String, time Int64, event_time DateTime, event_id String, user String,
            install String, host String, os String, context String,
            -- Distinct users and installs counted as 64-bit hashes: twice as fast as the strings.
            user_hash UInt64, install_hash UInt64)
        ENGINE = ReplacingMergeTree PARTITION BY toYYYYMM(event_time) ORDER BY (kind, fingerprint, time, event_id)
        SETTINGS index_granularity = 1024
        """,
        """
        CREATE MATERIALIZED VIEW IF NOT EXISTS crash_groups_view TO crash_groups AS
        SELECT kind, fingerprint, countState() AS n, minState(time) AS f, maxState(time) AS l,
            argMinState(version, time) AS first_version, argMaxState(version, time) AS last_version,
            argMaxState(title, time) AS title, argMaxState(app, time) AS app
        FROM crash_index GROUP BY kind, fingerprint
        """,
        """
        CREATE MATERIALIZED VIEW IF NOT EXISTS crash_days_view TO crash_days AS
        SELECT kind, toUInt32(intDiv(time, 86400000)) AS day, fingerprint, app, version, signal,
            countState() AS n, minState(time) AS f, maxState(time) AS l
        FROM crash_index GROUP BY kind, day, fingerprint, app, version, signal
        """,
        """
        CREATE MATERIALIZED VIEW IF NOT EXISTS crash_by_time_view TO crash_by_time AS
        SELECT kind, time, event_time, fingerprint, app, version, signal FROM crash_index
        """,
        """
        CREATE MATERIALIZED VIEW IF NOT EXISTS crash_facets_view TO crash_facets AS
        SELECT kind, fingerprint, pair.1 AS facet, app, version, signal, pair.2 AS value, count() AS n
        FROM crash_index ARRAY JOIN
            [('version', version), ('signal', signal), ('host', host), ('OS', os), ('context', context)] AS pair
        GROUP BY kind, fingerprint, facet, app, version, signal, value
        """,
    ]

    /// What the collector's pages read: the sums, made ready, where the collector keeps them;
    /// else the events as they are.
    static func browserQueries(_ store: ClickHouseStore) throws -> any BrowserQueries {
        guard store.keepsCrashSums else { return try ClickHouseBrowserQueries(store) }
        try prepare(store)
        return try ClickHouseSummedBrowserQueries(store)
    }

    /// Makes the tables and views where they are missing. A `crash_index` made now is filled
    /// from the events already stored (a collector of an earlier release, or a first start on
    /// a table someone else filled), each event once.
    static func prepare(_ store: ClickHouseStore) throws {
        let existed =
            try store.run("EXISTS TABLE crash_index").trimmingCharacters(in: .whitespacesAndNewlines) == "1"
        for definition in definitions { try store.run(definition) }
        if !existed {
            try store.run(
                """
                INSERT INTO crash_index (\(names)) SELECT \(columns) FROM \(store.table)
                WHERE event IN ('$AppCrashed', '$AppHang') LIMIT 1 BY event_id
                """)
        }
    }

    /// Adds to `crash_index` (and so to the sums) the crash and hang events of `keys`
    /// (`ClickHouseRows.crashKeys`), stored in `events` already and not in it yet; nothing where
    /// the collector keeps no sums.
    static func add(_ keys: [ClickHouseRows.CrashKey], to store: ClickHouseStore) throws {
        guard store.keepsCrashSums, !keys.isEmpty else { return }
        let ids = keys.map { ClickHouseBrowserQueries.literal($0.id) }.joined(separator: ", ")
        let times = Set(keys.map(\.eventTime)).map { "toDateTime(\($0))" }.joined(separator: ", ")
        try store.run(
            """
            INSERT INTO crash_index (\(names)) SELECT \(columns) FROM \(store.table)
            WHERE event_time IN (\(times)) AND event_id IN (\(ids)) AND event IN ('$AppCrashed', '$AppHang')
                AND event_id NOT IN (SELECT event_id FROM crash_index WHERE event_id IN (\(ids)))
            LIMIT 1 BY event_id
            """)
    }
}
