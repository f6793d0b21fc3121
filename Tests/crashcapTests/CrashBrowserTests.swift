import Foundation
import ProcessSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The crash browser (`crashcap collect`'s pages, and `crashcap serve DIR`): real crash and hang
/// reports from the samples, replayed, given three versions of two apps over two weeks, uploaded
/// to real collectors; the pages' numbers read back against what was stored, hostile text looked
/// for unescaped, and the same flows run in Debian's chromium through Playwright against SQLite
/// and ClickHouse.
@Suite(.serialized) struct CrashBrowserTests {
    /// The events every test uploads, made once per test process.
    struct Fixture: @unchecked Sendable {  // built once, then only read
        var events: [[String: Any]]
        /// The group whose title, breadcrumbs, context, thread names and module paths are hostile.
        var hostile: String
        /// A crash group whose report has other threads.
        var threaded: String
        /// A directory replayed by `crashcap replay` whose store holds its crash: for `crashcap serve`.
        var appDirectory: String
    }

    static let hostileText = #"<script>alert(1)</script>"><img src=x onerror=alert(2)> javascript:alert(3)"#
    static let versions = ["1.0", "1.1", "2.0"]
    static let day: Int64 = 86_400_000

    static let fixture: Result<Fixture, any Error> = Result { try makeFixture() }

    /// Runs each sample under capture, replays it, and makes copies of its crash (or hang) in three
    /// versions over the last 14 days, each with its own id, time and user. The first crash of
    /// each app is only in 2.0 (new there); the others are in every version, more in the later.
    static func makeFixture() throws -> Fixture {
        let runs: [(String, [String], [String: String])] = [
            (Paths.cSample, ["abort"], [:]), (Paths.cSample, ["threads-parked"], [:]),
            (Paths.cSample, ["int-divide-by-zero"], [:]),
            (Paths.swiftSample, ["swift-force-unwrap"], [:]), (Paths.swiftSample, ["swift-async-deep"], [:]),
            (Paths.cSample, ["hang-sleep"], ["CRASH_SAMPLE_HANG_MS": "600"]),
        ]
        var bases: [[String: Any]] = []
        var appDirectory = ""
        for (sample, arguments, environment) in runs {
            let directory = makeTemporaryDirectory("browser-sample")
            _ = try run(sample, arguments, environment: environment.merging(["CRASHCAPTURE_DIR": directory]) { $1 })
            let replay = try run(Paths.crashcap, ["replay", directory], timeout: 60)
            guard replay.exitCode == 0 else { throw TestFailure("replay: \(replay.stderr)") }
            let found = try storedEvents(in: directory).filter {
                ["$AppCrashed", "$AppHang"].contains($0["event"] as? String ?? "")
            }
            guard let event = found.first else { throw TestFailure("no crash or hang from \(arguments)") }
            bases.append(event)
            if arguments == ["threads-parked"] { appDirectory = directory }
        }
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        var events: [[String: Any]] = []
        var firstOfApp: Set<String> = []
        for (index, base) in bases.enumerated() {
            let properties = base["properties"] as? [String: Any] ?? [:]
            let app = properties["$app_name"] as? String ?? ""
            let onlyNew = base["event"] as? String == "$AppCrashed" && firstOfApp.insert(app).inserted
            for (versionIndex, version) in versions.enumerated() where !onlyNew || version == "2.0" {
                // 1.0 from 13 to 10 days ago, 1.1 from 8 to 5, 2.0 the last 3 days (today too).
                let copies = onlyNew ? 3 : 1 + versionIndex + (index % 2)
                for copy in 0..<copies {
                    var event = base
                    var properties = properties
                    properties["$app_version"] = version
                    properties["$hostname"] = "host-\(copy % 2)"
                    event["properties"] = properties
                    event["event_id"] = "\(base["event_id"] as? String ?? "e")-\(version)-\(copy)"
                    event["distinct_id"] = "user-\((index + copy) % 4)"
                    let daysAgo = Int64([12, 6, 1][versionIndex] - copy % 2)
                    event["time"] = now - daysAgo * day - Int64(copy + 1) * 60_000
                    events.append(event)
                }
            }
        }
        // One crash of crash-sample-c 2.0 whose every text is hostile.
        var hostile = bases[1]
        var properties = hostile["properties"] as? [String: Any] ?? [:]
        properties["$app_version"] = "2.0"
        properties["crash_title"] = hostileText
        properties["crash_fingerprint"] = "hostile00000001"
        properties["crash_breadcrumbs"] = [hostileText, #"{"event":"javascript:alert(4)"}"#]
        properties["crash_context"] = ["<script>": "javascript:alert(5)", "url": #""><img src=x onerror=alert(6)>"#]
        properties["crash_message"] = hostileText
        hostile["properties"] = properties
        var crash = hostile["crash"] as? [String: Any] ?? [:]
        crash["threads"] = (crash["threads"] as? [[String: Any]] ?? []).map { thread in
            var thread = thread
            thread["name"] = hostileText
            return thread
        }
        crash["modules"] = (crash["modules"] as? [[String: Any]] ?? []).map { module in
            var module = module
            module["path"] = "/opt/javascript:alert(7)/" + hostileText + ".so"
            return module
        }
        crash["frames"] = (crash["frames"] as? [[String: Any]] ?? []).map { frame in
            var frame = frame
            frame["module_name"] = hostileText
            return frame
        }
        hostile["crash"] = crash
        hostile["event_id"] = "hostile-\"><script>alert(8)</script>"
        hostile["time"] = now - 3_600_000
        events.append(hostile)
        let threaded = (bases[1]["properties"] as? [String: Any])?["crash_fingerprint"] as? String ?? ""
        return Fixture(events: events, hostile: "hostile00000001", threaded: threaded, appDirectory: appDirectory)
    }

    /// Uploads the events as the SDKs do (a form with `data_list`), 20 a request.
    static func upload(_ events: [[String: Any]], to collector: CollectorProcess) throws {
        for start in stride(from: 0, to: events.count, by: 20) {
            let batch = Array(events[start..<min(start + 20, events.count)])
            let json = try JSONSerialization.data(withJSONObject: batch)
            var allowed = CharacterSet.alphanumerics
            allowed.remove(charactersIn: "+&=")
            let body =
                "data_list="
                + (String(decoding: json, as: UTF8.self).addingPercentEncoding(withAllowedCharacters: allowed) ?? "")
            let (status, answer) = try collector.request("POST", "/sa", body: Data(body.utf8))
            guard status == 200 else {
                throw TestFailure("upload: \(status) \(String(decoding: answer, as: UTF8.self))")
            }
        }
    }

    /// The groups expected on the list under a version filter: fingerprint → (events, users).
    static func expected(_ events: [[String: Any]], kind: String = "$AppCrashed", version: String? = nil) -> [String: (
        events: Int, users: Int
    )] {
        var groups: [String: (events: Int, users: Set<String>)] = [:]
        for event in events where event["event"] as? String == kind {
            let properties = event["properties"] as? [String: Any] ?? [:]
            if let version, properties["$app_version"] as? String != version { continue }
            let fingerprint = (properties["crash_fingerprint"] ?? properties["hang_fingerprint"]) as? String ?? ""
            groups[fingerprint, default: (0, [])].events += 1
            groups[fingerprint, default: (0, [])].users.insert(event["distinct_id"] as? String ?? "")
        }
        return groups.mapValues { ($0.events, $0.users.count) }
    }

    /// The list page's rows: fingerprint, events, users, installs.
    static func rows(_ html: String) -> [(fingerprint: String, events: Int, users: Int, installs: Int)] {
        let pattern =
            #"<tr class="group" data-fingerprint="([^"]*)">.*?<td class="n events">(\d+)</td><td class="n users">(\d+)</td><td class="n installs">(\d+)</td>"#
        let regex = try! NSRegularExpression(pattern: pattern, options: [.dotMatchesLineSeparators])
        let text = html as NSString
        return regex.matches(in: html, range: NSRange(location: 0, length: text.length)).map { match in
            (
                text.substring(with: match.range(at: 1)), Int(text.substring(with: match.range(at: 2)))!,
                Int(text.substring(with: match.range(at: 3)))!, Int(text.substring(with: match.range(at: 4)))!
            )
        }
    }

    static func page(_ collector: CollectorProcess, _ path: String) throws -> String {
        let (status, data) = try collector.get(path)
        guard status == 200 else {
            throw TestFailure("GET \(path): \(status) \(String(decoding: data, as: UTF8.self))")
        }
        return String(decoding: data, as: UTF8.self)
    }

    /// Every number the list shows, with and without a version filter, for crashes and hangs, is
    /// what was stored; a group's page counts its events under the same filter.
    static func checkNumbers(_ collector: CollectorProcess, _ fixture: Fixture) throws {
        for (kind, event) in [("", "$AppCrashed"), ("kind=hang&", "$AppHang")] {
            for version in [nil] + versions {
                let html = try page(collector, "/?" + kind + (version.map { "version=" + $0 } ?? ""))
                let shown = rows(html)
                let expected = expected(fixture.events, kind: event, version: version)
                #expect(shown.count == expected.count, "\(kind) \(version ?? "all"): \(shown.map(\.fingerprint))")
                for row in shown {
                    #expect(
                        row.events == expected[row.fingerprint]?.events, "\(row.fingerprint) in \(version ?? "all")")
                    #expect(row.users == expected[row.fingerprint]?.users, "\(row.fingerprint) in \(version ?? "all")")
                    #expect(row.installs == row.users, "an install is a distinct id here")
                }
                #expect(shown.map(\.events) == shown.map(\.events).sorted(by: >), "most events first")
                let total = expected.values.reduce(0) { $0 + $1.events }
                #expect(html.contains("<span id=\"total-events\">\(total)</span>"), "\(version ?? "all")")
            }
        }
        // The group's own page, under a version filter: its counts are of that version only.
        let expected20 = expected(fixture.events, version: "2.0")[fixture.threaded]?.events ?? -1
        let group = try page(collector, "/groups/\(fixture.threaded)?version=2.0")
        #expect(group.contains("<b id=\"count-events\">\(expected20)</b>"), "\(expected20)")
        #expect(group.contains("<details class=\"thread\">"), "other threads collapsed")
        // New in 2.0: the apps' first crashes; the others were seen in 1.0.
        let list = try page(collector, "/?version=2.0")
        let newMarks = list.components(separatedBy: "<span class=\"new\"").count - 1
        #expect(newMarks == 3, "two apps' new crashes and the hostile one")
        let top = try page(collector, "/top?app=crash-sample-c&version=2.0")
        #expect(top.contains("<span id=\"version-events\">"))
        #expect(top.contains("<span class=\"new\">new</span>"))
    }

    /// Hostile text shows as text: no tag, attribute or URL of it reaches a page as markup.
    static func checkEscaping(_ collector: CollectorProcess, _ fixture: Fixture) throws {
        let group = try page(collector, "/groups/\(fixture.hostile)")
        let reportID = "hostile-\"><script>alert(8)</script>"
        let report = try page(
            collector, "/reports/" + reportID.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!)
        for html in [try page(collector, "/?version=2.0"), group, report] {
            #expect(!html.contains("<script"), "no script element")
            #expect(!html.contains("<img"), "no img element")
            #expect(!html.contains("href=\"javascript"), "no javascript: link")
            #expect(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x onerror=alert(2)&gt;"))
        }
        #expect(report.contains("javascript:alert(7)"), "the module path, as text")
        #expect(group.contains("javascript:alert(5)"), "the context, as text")
        let (status, _) = try collector.get("/style.css")
        #expect(status == 200)
    }

    @Test func pagesShowTheStoredNumbersAndEscapeHostileText() throws {
        let fixture = try Self.fixture.get()
        let collector = try CollectorProcess()
        try Self.upload(fixture.events, to: collector)
        try Self.checkNumbers(collector, fixture)
        try Self.checkEscaping(collector, fixture)
        // Every page carries the policy; the uploads' routes are untouched.
        let headers = try run("/usr/bin/curl", ["-s", "-D", "-", "-o", "/dev/null", collector.base + "/?version=2.0"])
        #expect(
            headers.stdout.contains(
                "Content-Security-Policy: default-src 'none'; style-src 'self'; img-src 'self' data:"),
            "\(headers.stdout)")
        #expect(try collector.events().count == fixture.events.count)
    }

    /// With a token, the pages ask for it and every link carries it on.
    @Test func aTokenGuardsThePages() throws {
        let collector = try CollectorProcess(["--token", "s3cret"])
        let (refused, _) = try collector.get("/")
        #expect(refused == 401)
        let (allowed, data) = try collector.get("/?token=s3cret")
        #expect(allowed == 200)
        let html = String(decoding: data, as: UTF8.self)
        #expect(html.contains("href=\"/?kind=hang&amp;token=s3cret\""), "links carry the token")
        #expect(html.contains("<input type=\"hidden\" name=\"token\" value=\"s3cret\">"), "and the filter form")
    }

    /// Listening on every address (with a token, as it must), the collector answers pages only
    /// to connections that arrive at loopback, until `--ui-host` names the address they arrive at.
    @Test func pagesAnswerLoopbackUnlessUIHostSaysOtherwise() throws {
        let addresses = try run("/usr/bin/hostname", ["-I"]).stdout.split(separator: " ").map(String.init)
        let outside = try #require(
            addresses.first { $0.contains(".") && !$0.hasPrefix("127.") }, "no IPv4 address but loopback here")
        for (arguments, expected) in [
            ([String](), "404"), (["--ui-host", "0.0.0.0"], "200"), (["--ui-host", outside], "200"),
        ] {
            let collector = try CollectorProcess(["--host", "0.0.0.0", "--token", "t"] + arguments)
            let port = try #require(collector.base.split(separator: ":").last.map(String.init))
            let fromOutside = try run(
                "/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://\(outside):\(port)/?token=t"])
            #expect(fromOutside.stdout == expected, "\(arguments)")
            let fromLoopback = try run(
                "/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://127.0.0.1:\(port)/?token=t"])
            #expect(fromLoopback.stdout == "200", "\(arguments)")
            // Uploads and /health are not pages: they answer on every address, as before.
            let health = try run(
                "/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "http://\(outside):\(port)/health"])
            #expect(health.stdout == "200")
        }
    }

    /// `crashcap serve DIR`: the app's own store, read, never written; no upload route.
    @Test func serveShowsAnAppsOwnStore() throws {
        let fixture = try Self.fixture.get()
        let store = fixture.appDirectory + "/events.sqlite"
        let before = try Data(contentsOf: URL(fileURLWithPath: store))
        let child = try Child(Paths.crashcap, ["serve", fixture.appDirectory, "--port", "0"])
        guard child.waitForOutput("crash browser on"), let range = child.stdout.range(of: "http://") else {
            throw TestFailure("serve did not start: \(child.stdout) \(child.stderr)")
        }
        let base = String(child.stdout[range.lowerBound...]).trimmingCharacters(in: .whitespacesAndNewlines)
        let list = try run("/usr/bin/curl", ["-s", base])
        #expect(list.stdout.contains("data-fingerprint=\"\(fixture.threaded)\""), "\(list.stdout.prefix(2000))")
        let upload = try run(
            "/usr/bin/curl", ["-s", "-o", "/dev/null", "-w", "%{http_code}", "-d", "x=1", base + "sa"])
        #expect(upload.stdout == "404")
        #expect(try Data(contentsOf: URL(fileURLWithPath: store)) == before, "the app's store is only read")
    }

    /// Where the browser test writes its screenshots: the README's, when asked
    /// (CRASHCAPTURE_UPDATE_SCREENSHOTS=1), else a temporary directory.
    static var screenshots: String {
        ProcessInfo.processInfo.environment["CRASHCAPTURE_UPDATE_SCREENSHOTS"] == "1"
            ? Paths.packageRoot + "/Docs/images" : makeTemporaryDirectory("screenshots")
    }

    /// The same uploads into SQLite and into ClickHouse: the same numbers on every list, the
    /// same facets on a group's page, both checked as above; then a user's flows in chromium
    /// on both, in one Python process.
    @Test func sqliteAndClickHouseShowTheSamePagesInARealBrowser() throws {
        let fixture = try Self.fixture.get()
        let server = try ClickHouseServer()
        let clickHouse = try CollectorProcess(clickHouse: server.url + "?database=crashcap")
        let sqlite = try CollectorProcess()
        // ClickHouse gets every batch twice, as a client whose answer was lost sends it: the rows
        // are there twice until ClickHouse merges them, and every page counts each event once.
        for collector in [sqlite, clickHouse, clickHouse] { try Self.upload(fixture.events, to: collector) }
        let rows =
            Int(
                try server.query("SELECT count() FROM events", database: "crashcap").trimmingCharacters(
                    in: .whitespacesAndNewlines)) ?? 0
        #expect(rows == 2 * fixture.events.count, "both copies stored, not merged yet")
        try Self.checkNumbers(clickHouse, fixture)
        try Self.checkEscaping(clickHouse, fixture)
        for path in ["/", "/?version=1.1", "/?kind=hang", "/?signal=SIGSEGV&range=7d", "/?q=nil&sort=last"] {
            let (a, b) = (Self.rows(try Self.page(sqlite, path)), Self.rows(try Self.page(clickHouse, path)))
            #expect(a.map(\.fingerprint) == b.map(\.fingerprint), "\(path)")
            #expect(a.map(\.events) == b.map(\.events) && a.map(\.users) == b.map(\.users), "\(path)")
        }
        func facets(_ html: String) -> String {
            guard let start = html.range(of: "<h2>Facets</h2>"), let end = html.range(of: "<h2>Latest report") else {
                return ""
            }
            return String(html[start.lowerBound..<end.lowerBound])
        }
        for path in ["/groups/\(fixture.threaded)", "/groups/\(fixture.hostile)?version=2.0"] {
            let (a, b) = (facets(try Self.page(sqlite, path)), facets(try Self.page(clickHouse, path)))
            #expect(!a.isEmpty && a == b, "\(path):\n\(a)\n\(b)")
        }
        // The browser's flows: the list, a version filter, a group, a thread, a report, Back.
        let shots = Self.screenshots
        func counts(_ groups: [String: (events: Int, users: Int)]) -> [String: Int] { groups.mapValues(\.events) }
        let hostileID = "hostile-\"><script>alert(8)</script>"
        let config: [String: Any] = [
            "python_packages": Paths.packageRoot + "/.build/python-packages",
            "targets": [
                ["name": "sqlite", "base": sqlite.base, "screenshots": shots],
                ["name": "clickhouse", "base": clickHouse.base],
            ],
            "expected_all": counts(Self.expected(fixture.events)),
            "expected_2_0": counts(Self.expected(fixture.events, version: "2.0")),
            "expected_hangs": counts(Self.expected(fixture.events, kind: "$AppHang")),
            "threaded": fixture.threaded, "hostile": fixture.hostile, "hostile_text": Self.hostileText,
            "hostile_report": "/reports/" + hostileID.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!,
        ]
        let file = makeTemporaryDirectory("browser-flows") + "/config.json"
        try JSONSerialization.data(withJSONObject: config).write(to: URL(fileURLWithPath: file))
        let flows = try run(
            "/usr/bin/env", ["python3", Paths.packageRoot + "/Tests/crash_browser_flows.py", file], timeout: 180)
        #expect(flows.stdout.contains("{\"ok\": true"), "\(flows.stdout)\n\(flows.stderr.suffix(3000))")
        for name in ["list", "group", "report", "hangs", "top", "hostile"] {
            let size =
                (try? FileManager.default.attributesOfItem(atPath: shots + "/crash-browser-\(name).png")[.size]) as? Int
            #expect((size ?? 0) > 10_000, "screenshot \(name): \(size ?? 0) bytes")
        }
    }
}
