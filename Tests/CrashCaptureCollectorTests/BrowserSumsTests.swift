import CrashCapture
import Foundation
import TestSupport
import Testing

@testable import CrashBrowser
@testable import CrashCaptureCollector

/// The stores' sums (SQLite's, and ClickHouse's through a collector) against a count of the
/// events themselves, under every combination of filter: each list row's events, users, installs, first and last seen and versions, its
/// chart, the totals, and a group's 24 h and 30 d counts, chart, facets and latest events. The
/// events arrive in two batches with a page read between, as a collector's do, so that the sums
/// are added to, not only made.
@Suite struct BrowserSumsTests {
    static let day: Int64 = 86_400_000

    struct Event {
        var id: String
        var kind: BrowserFilter.Kind
        var fingerprint: String
        var title: String
        var app: String
        var version: String
        var signal: String
        var time: Int64
        var user: String
        var install: String
        var host: String
        var context: [String: String]

        var payload: String {
            let properties: [String: Any] = [
                "$app_name": app, "$app_version": version, "$hostname": host, "$os": "Linux",
                "$os_version": "6.1",
                kind == .crash ? "crash_fingerprint" : "hang_fingerprint": fingerprint,
                kind == .crash ? "crash_title" : "hang_title": title,
                "crash_context": context,
            ].merging(kind == .crash ? ["crash_signal_name": signal] : [:]) { a, _ in a }
            var object: [String: Any] = [
                "type": "track", "event": kind.event, "event_id": id, "time": time, "distinct_id": install,
                "properties": properties,
            ]
            if user != install { object["login_id"] = user }
            return String(decoding: try! JSONSerialization.data(withJSONObject: object), as: UTF8.self)
        }
    }

    static func events(now: Int64) -> [Event] {
        var generator = SeededGenerator(seed: 44)
        let signals = ["SIGSEGV", "SIGABRT", "SIGBUS"]
        return (0..<700).map { index in
            let group = Int.random(in: 0..<14, using: &generator) % (index % 5 == 0 ? 4 : 14)
            let kind: BrowserFilter.Kind = group >= 12 ? .hang : .crash
            let age = Int64.random(in: 0..<(40 * day), using: &generator)
            let app = "app-\(Int.random(in: 0..<2, using: &generator))"
            // Distinct times, so that the first and last event of anything are one event.
            let time = now - age - Int64(index)
            let daysAgo = age / day
            let install = "install-\(Int.random(in: 0..<25, using: &generator))"
            let user = Int.random(in: 0..<3, using: &generator) == 0 ? "user-\(index % 9)" : install
            return Event(
                id: "e-\(index)", kind: kind, fingerprint: "fp\(group)",
                title: kind == .crash ? "SIGSEGV in Module.fn\(group)(_:)" : "hang in wait\(group)",
                app: app, version: daysAgo >= 25 ? "1.0" : daysAgo >= 8 ? "1.1" : "2.0",
                signal: kind == .hang ? "hang" : signals[Int.random(in: 0..<3, using: &generator)],
                time: time, user: user, install: install, host: "host-\(Int.random(in: 0..<5, using: &generator))",
                context: ["region": "eu-\(index % 3)", "tier": "t\(group % 2)"])
        }
    }

    struct SeededGenerator: RandomNumberGenerator {
        var state: UInt64
        init(seed: UInt64) { state = seed }
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    /// The events a filter lets through, counted one by one.
    static func matching(_ events: [Event], _ filter: BrowserFilter, fingerprint: String? = nil) -> [Event] {
        // The text filter is on a group's latest title.
        var latestTitle: [String: (Int64, String)] = [:]
        for event in events where event.kind == filter.kind {
            if (latestTitle[event.fingerprint]?.0 ?? .min) < event.time {
                latestTitle[event.fingerprint] = (event.time, event.title)
            }
        }
        func passes(_ event: Event) -> Bool {
            guard event.kind == filter.kind else { return false }
            if let fingerprint, event.fingerprint != fingerprint { return false }
            if !filter.app.isEmpty && event.app != filter.app { return false }
            if !filter.version.isEmpty && event.version != filter.version { return false }
            if !filter.signal.isEmpty && event.signal != filter.signal { return false }
            if let since = filter.since, event.time < since { return false }
            if fingerprint != nil || filter.text.isEmpty { return true }
            let title = latestTitle[event.fingerprint]?.1 ?? ""
            return title.lowercased().contains(filter.text.lowercased())
        }
        return events.filter(passes)
    }

    static func chart(_ events: [Event], now: Int64, days: Int) -> [Int] {
        let first = now / day - Int64(days) + 1
        var counts = Array(repeating: 0, count: days)
        for event in events where event.time / day >= first && event.time / day <= now / day {
            counts[Int(event.time / day - first)] += 1
        }
        return counts
    }

    static func top(_ values: [String]) -> [String] {
        var counts: [String: Int] = [:]
        for value in values { counts[value, default: 0] += 1 }
        let ranked = counts.sorted { (a: (key: String, value: Int), b: (key: String, value: Int)) -> Bool in
            a.value != b.value ? a.value > b.value : a.key < b.key
        }
        return ranked.prefix(10).map { "\($0.key)=\($0.value)" }
    }

    @Test func everyNumberEqualsACountOfTheEventsUnderEveryFilter() throws {
        let directory = makeTemporaryDirectory("browser-sums")
        let path = directory + "/collected.sqlite"
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let all = Self.events(now: now)
        let store = try EventStore(path: path)
        try store.insert(all.prefix(400).map { ($0.id, $0.payload) })
        let queries = try SQLiteBrowserQueries(path: path, persistent: true)
        _ = try queries.groups(BrowserFilter(now: now), limit: 50)
        // The rest, an event sent again among them: stored once, summed once.
        try store.insert(all.suffix(300).map { ($0.id, $0.payload) } + [(all[3].id, all[3].payload)])
        #expect(try everyFilter(queries, all, now: now) == 128)
    }

    /// The same events through a collector into ClickHouse, the second batch sent twice (an
    /// answer lost on the way back): stored twice until merged, summed once.
    @Test func theClickHouseSumsEqualACountOfTheEventsUnderEveryFilter() throws {
        let server = try ClickHouseServer()
        let collector = try IngestCollector(
            port: 0, storage: .clickHouse(URL(string: server.url + "?database=sums")!))
        defer { collector.stop() }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let all = Self.events(now: now)
        func send(_ events: ArraySlice<Event>) throws {
            let file = makeTemporaryDirectory("sums-batch") + "/batch.json"
            let list = "[" + events.map(\.payload).joined(separator: ",") + "]"
            try Data(("data_list=" + list.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!).utf8).write(
                to: URL(fileURLWithPath: file))
            let sent = try run(
                "/usr/bin/curl", ["-s", "-f", "--data-binary", "@" + file, "http://127.0.0.1:\(collector.port)/sa"])
            #expect(sent.exitCode == 0, "\(sent.stdout) \(sent.stderr)")
        }
        try send(all.prefix(400))
        _ = try collector.browser.queries.groups(BrowserFilter(now: now), limit: 50)
        try send(all.suffix(300))
        try send(all.suffix(300))
        #expect(try everyFilter(collector.browser.queries, all, now: now) == 128)
    }

    func everyFilter(_ queries: any BrowserQueries, _ all: [Event], now: Int64) throws -> Int {
        var checked = 0
        for kind in BrowserFilter.Kind.allCases {
            for app in ["", "app-1"] {
                for version in ["", "1.1"] {
                    for signal in ["", kind == .crash ? "SIGSEGV" : "hang"] {
                        for range in ["all", "24h", "7d", "30d"] {
                            for text in ["", "FN3"] {
                                var filter = BrowserFilter(now: now)
                                (filter.kind, filter.app, filter.version, filter.signal) = (kind, app, version, signal)
                                (filter.range, filter.text) = (range, text)
                                try check(queries, all, filter)
                                checked += 1
                            }
                        }
                    }
                }
            }
        }
        return checked
    }

    func check(_ queries: any BrowserQueries, _ all: [Event], _ filter: BrowserFilter) throws {
        let name = filter.items().map { "\($0.0)=\($0.1)" }.joined(separator: "&")
        let matched = Self.matching(all, filter)
        let groups = Dictionary(grouping: matched, by: \.fingerprint)
        let page = try queries.groups(filter, limit: 100)
        #expect(page.totalGroups == groups.count, "\(name)")
        #expect(page.totalEvents == matched.count, "\(name)")
        #expect(page.rows.count == groups.count, "\(name)")
        for row in page.rows {
            let events = groups[row.fingerprint] ?? []
            let first = events.min { $0.time < $1.time }
            let last = events.max { $0.time < $1.time }
            #expect(row.events == events.count, "\(name) \(row.fingerprint)")
            #expect(row.users == Set(events.map(\.user)).count, "\(name) \(row.fingerprint) users")
            #expect(row.installs == Set(events.map(\.install)).count, "\(name) \(row.fingerprint) installs")
            #expect(row.firstSeen == first?.time && row.lastSeen == last?.time, "\(name) \(row.fingerprint)")
            #expect(
                row.firstVersion == first?.version && row.lastVersion == last?.version, "\(name) \(row.fingerprint)")
            #expect(row.daily == Self.chart(events, now: filter.now, days: 14), "\(name) \(row.fingerprint) chart")
        }
        #expect(page.rows.map(\.events) == page.rows.map(\.events).sorted(by: >), "\(name)")
        // A group's page: the largest under the filter.
        guard let largest = page.rows.first?.fingerprint else { return }
        let detail = try #require(try queries.group(largest, filter), "\(name)")
        let events = Self.matching(all, filter, fingerprint: largest)
        #expect(detail.summary.events == events.count, "\(name) group")
        #expect(detail.last24Hours == events.count { $0.time >= filter.now - Self.day }, "\(name) 24 h")
        #expect(detail.last30Days == events.count { $0.time >= filter.now - 30 * Self.day }, "\(name) 30 d")
        #expect(detail.daily30 == Self.chart(events, now: filter.now, days: 30), "\(name) 30-day chart")
        let facets = Dictionary(
            uniqueKeysWithValues: detail.facets.map { ($0.name, $0.values.map { "\($0.value)=\($0.count)" }) })
        #expect(facets["version"] ?? [] == Self.top(events.map(\.version)), "\(name) versions")
        #expect(facets["signal"] ?? [] == Self.top(events.map(\.signal)), "\(name) signals")
        #expect(facets["host"] ?? [] == Self.top(events.map(\.host)), "\(name) hosts")
        #expect(facets["OS"] ?? [] == Self.top(events.map { _ in "Linux 6.1" }), "\(name) OS")
        #expect(
            facets["context"] ?? [] == Self.top(events.flatMap { $0.context.map { "\($0.key) = \($0.value)" } }),
            "\(name) context")
        #expect(
            detail.events.map(\.eventID) == events.sorted { $0.time > $1.time }.prefix(100).map(\.id), "\(name) latest")
    }
}
