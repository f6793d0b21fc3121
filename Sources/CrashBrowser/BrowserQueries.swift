internal import Foundation

/// What the crash browser's pages ask of a store. Two answer it: `SQLiteBrowserQueries` (the
/// collector's SQLite file, or an app's own `events.sqlite` for `crashcap serve`) and the
/// collector's ClickHouse adapter. Every answer is computed under the filter it is given.
package protocol BrowserQueries: Sendable {
    /// One page of crash groups, in `filter.sort` order, after `filter.after`.
    func groups(_ filter: BrowserFilter, limit: Int) throws -> GroupPage
    /// A group's counts, facets and events under `filter`; nil when it has no event under it.
    func group(_ fingerprint: String, _ filter: BrowserFilter) throws -> GroupDetail?
    /// One stored event's whole JSON text.
    func eventPayload(_ eventID: String) throws -> String?
    /// The apps, versions and signals there are events of: the choices the filter form offers.
    func choices(kind: BrowserFilter.Kind) throws -> FilterChoices
    /// Events a group has in `version` and in the version before it, the version's top groups first.
    func topCrashers(app: String, version: String, previous: String?, kind: BrowserFilter.Kind, limit: Int) throws
        -> [TopCrasher]
    /// Events of `kind` in one version of an app: what a top crasher's share is of.
    func versionEvents(app: String, version: String, kind: BrowserFilter.Kind) throws -> Int
    /// Every event of the store, of any kind: what a page's numbers are checked against.
    func storedEventCount() throws -> Int
}

/// A page's filter, read from its URL (`BrowserFilter(query:now:)`) and written back into its links.
package struct BrowserFilter: Sendable, Equatable {
    package enum Kind: String, Sendable, CaseIterable {
        case crash, hang
        /// The event that carries it.
        package var event: String { self == .crash ? "$AppCrashed" : "$AppHang" }
    }

    package enum Sort: String, Sendable, CaseIterable {
        case events, last, first
    }

    package static let ranges: [(name: String, milliseconds: Int64?)] = [
        ("24h", 86_400_000), ("7d", 7 * 86_400_000), ("14d", 14 * 86_400_000), ("30d", 30 * 86_400_000),
        ("90d", 90 * 86_400_000), ("all", nil),
    ]

    package var kind = Kind.crash
    package var app = ""
    package var version = ""
    package var signal = ""
    package var text = ""
    package var range = "all"
    package var sort = Sort.events
    /// Keyset paging: the sort value and fingerprint of the last row of the page before.
    package var after: (value: Int64, fingerprint: String)?
    /// Milliseconds since 1970 that the time range counts back from.
    package var now: Int64

    package init(now: Int64) { self.now = now }

    /// Milliseconds from which events count, or nil for all time.
    package var since: Int64? {
        Self.ranges.first { $0.name == range }?.milliseconds.map { now - $0 }
    }

    package static func == (a: BrowserFilter, b: BrowserFilter) -> Bool {
        a.kind == b.kind && a.app == b.app && a.version == b.version && a.signal == b.signal && a.text == b.text
            && a.range == b.range && a.sort == b.sort && a.after?.value == b.after?.value
            && a.after?.fingerprint == b.after?.fingerprint && a.now == b.now
    }

    /// Read from a query string's items; anything unknown falls back to the default.
    package init(query: [String: String], now: Int64) {
        self.now = now
        kind = Kind(rawValue: query["kind"] ?? "") ?? .crash
        app = query["app"] ?? ""
        version = query["version"] ?? ""
        signal = query["signal"] ?? ""
        text = query["q"] ?? ""
        if let asked = query["range"], Self.ranges.contains(where: { $0.name == asked }) { range = asked }
        sort = Sort(rawValue: query["sort"] ?? "") ?? .events
        if let cursor = query["after"], let colon = cursor.firstIndex(of: ":"),
            let value = Int64(cursor[..<colon])
        {
            after = (value, String(cursor[cursor.index(after: colon)...]))
        }
    }

    /// The query items that give this filter back (no paging unless asked), defaults left out.
    package func items(paging: Bool = false) -> [(String, String)] {
        var items: [(String, String)] = []
        if kind != .crash { items.append(("kind", kind.rawValue)) }
        if !app.isEmpty { items.append(("app", app)) }
        if !version.isEmpty { items.append(("version", version)) }
        if !signal.isEmpty { items.append(("signal", signal)) }
        if !text.isEmpty { items.append(("q", text)) }
        if range != "all" { items.append(("range", range)) }
        if sort != .events { items.append(("sort", sort.rawValue)) }
        if paging, let after { items.append(("after", "\(after.value):\(after.fingerprint)")) }
        return items
    }
}

/// A row of the group list.
package struct GroupSummary: Sendable, Equatable {
    package var fingerprint: String
    package var title: String
    package var app: String
    package var events: Int
    package var users: Int
    package var installs: Int
    package var firstSeen: Int64
    package var firstVersion: String
    package var lastSeen: Int64
    package var lastVersion: String
    /// Events on each of the 14 UTC days up to the one the filter's `now` is in, oldest first.
    package var daily: [Int]
    /// The group's first event ever (whatever the filter) is in the version filtered on, or,
    /// without a version filter, in its app's newest version.
    package var isNew: Bool
    package init(
        fingerprint: String, title: String, app: String, events: Int, users: Int, installs: Int, firstSeen: Int64,
        firstVersion: String, lastSeen: Int64, lastVersion: String, daily: [Int], isNew: Bool
    ) {
        self.fingerprint = fingerprint
        self.title = title
        self.app = app
        self.events = events
        self.users = users
        self.installs = installs
        self.firstSeen = firstSeen
        self.firstVersion = firstVersion
        self.lastSeen = lastSeen
        self.lastVersion = lastVersion
        self.daily = daily
        self.isNew = isNew
    }

    /// The value the list is sorted by.
    package func sortValue(_ sort: BrowserFilter.Sort) -> Int64 {
        switch sort {
        case .events: Int64(events)
        case .last: lastSeen
        case .first: firstSeen
        }
    }
}

package struct GroupPage: Sendable {
    package var rows: [GroupSummary]
    /// Groups and events under the filter, all pages together.
    package var totalGroups: Int
    package var totalEvents: Int
    /// There are rows after these.
    package var more: Bool
    package init(rows: [GroupSummary], totalGroups: Int, totalEvents: Int, more: Bool) {
        self.rows = rows
        self.totalGroups = totalGroups
        self.totalEvents = totalEvents
        self.more = more
    }
}

package struct Facet: Sendable, Equatable {
    package var name: String
    package var values: [(value: String, count: Int)]
    package init(name: String, values: [(value: String, count: Int)]) {
        self.name = name
        self.values = values
    }
    package static func == (a: Facet, b: Facet) -> Bool {
        a.name == b.name && a.values.map(\.value) == b.values.map(\.value)
            && a.values.map(\.count) == b.values.map(\.count)
    }
}

package struct EventRow: Sendable, Equatable {
    package var eventID: String
    package var time: Int64
    package var version: String
    package var host: String
    package var user: String
    package init(eventID: String, time: Int64, version: String, host: String, user: String) {
        self.eventID = eventID
        self.time = time
        self.version = version
        self.host = host
        self.user = user
    }
}

package struct GroupDetail: Sendable {
    package var summary: GroupSummary
    package var last24Hours: Int
    package var last30Days: Int
    /// Events on each of the 30 UTC days up to the one `now` is in, oldest first.
    package var daily30: [Int]
    package var facets: [Facet]
    /// Newest first, at most `eventsShown`.
    package var events: [EventRow]
    package init(
        summary: GroupSummary, last24Hours: Int, last30Days: Int, daily30: [Int], facets: [Facet], events: [EventRow]
    ) {
        self.summary = summary
        self.last24Hours = last24Hours
        self.last30Days = last30Days
        self.daily30 = daily30
        self.facets = facets
        self.events = events
    }
    package static let eventsShown = 100
}

package struct FilterChoices: Sendable, Equatable {
    package var apps: [String]
    /// Each app's versions, the oldest (by first event) first.
    package var versions: [String: [String]]
    package var signals: [String]
    package init(apps: [String], versions: [String: [String]], signals: [String]) {
        self.apps = apps
        self.versions = versions
        self.signals = signals
    }
}

package struct TopCrasher: Sendable, Equatable {
    package var fingerprint: String
    package var title: String
    package var events: Int
    package var previousEvents: Int
    /// Not one event of it in any earlier version.
    package var isNew: Bool
    package init(fingerprint: String, title: String, events: Int, previousEvents: Int, isNew: Bool) {
        self.fingerprint = fingerprint
        self.title = title
        self.events = events
        self.previousEvents = previousEvents
        self.isNew = isNew
    }
}
