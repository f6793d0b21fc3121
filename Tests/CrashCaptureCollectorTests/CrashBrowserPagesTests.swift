import Foundation
import Testing

@testable import CrashBrowser

/// The pages' escaping in every context they write into (element text, attribute values, link
/// paths and queries, inline SVG), with every field a store can give back made hostile: a store
/// here that answers with nothing but attacker's text.
@Suite struct CrashBrowserPagesTests {
    static let hostile =
        #"</title><script>alert(1)</script>"' onmouseover=alert(2) x="<img src=x onerror=alert(3)>javascript:alert(4)"#
        + "\u{0}\u{1b}]8;;\u{7}"

    struct HostileStore: BrowserQueries {
        let text = CrashBrowserPagesTests.hostile
        func summary() -> GroupSummary {
            GroupSummary(
                fingerprint: text, title: text, app: text, events: 3, users: 2, installs: 1, firstSeen: 1,
                firstVersion: text, lastSeen: 2, lastVersion: text, daily: Array(repeating: 1, count: 14), isNew: true)
        }
        func groups(_ filter: BrowserFilter, limit: Int) throws -> GroupPage {
            GroupPage(rows: [summary()], totalGroups: 1, totalEvents: 3, more: true)
        }
        func group(_ fingerprint: String, _ filter: BrowserFilter) throws -> GroupDetail? {
            GroupDetail(
                summary: summary(), last24Hours: 1, last30Days: 3, daily30: Array(repeating: 2, count: 30),
                facets: [Facet(name: text, values: [(text, 3)])],
                events: [EventRow(eventID: text, time: 1, version: text, host: text, user: text)])
        }
        func eventPayload(_ eventID: String) throws -> String? {
            let event: [String: Any] = [
                "event": "$AppCrashed", "event_id": text, "time": 1,
                "properties": [
                    "crash_title": text, "crash_fingerprint": text, "crash_signal_name": text, "$app_name": text,
                    "crash_breadcrumbs": [text], "crash_context": [text: text], "crash_message": text,
                ],
                "crash": [
                    "frames": [["pc": text, "function": text, "module_name": text, "file": text, "line": 1]],
                    "threads": [["tid": 1, "name": text, "crashed": true], ["tid": 2, "name": text, "frames": []]],
                    "registers": [text: text],
                    "modules": [["path": text, "start": text, "end": text, "build_id": text]],
                    "memory": [["what": text, "address": text, "base64": "PHNjcmlwdD4="]],
                    "attachments": [["path": text, "text": text]],
                ],
            ]
            return String(decoding: try JSONSerialization.data(withJSONObject: event), as: UTF8.self)
        }
        func choices(kind: BrowserFilter.Kind) throws -> FilterChoices {
            FilterChoices(apps: [text], versions: [text: [text, text + "2"]], signals: [text])
        }
        func topCrashers(app: String, version: String, previous: String?, kind: BrowserFilter.Kind, limit: Int) throws
            -> [TopCrasher]
        {
            [TopCrasher(fingerprint: text, title: text, events: 2, previousEvents: 1, isNew: false)]
        }
        func versionEvents(app: String, version: String, kind: BrowserFilter.Kind) throws -> Int { 4 }
        func storedEventCount() throws -> Int { 3 }
    }

    /// Nothing of the text is markup on any page, and every link stays on our own paths.
    @Test func everyPageEscapesEveryField() throws {
        let browser = CrashBrowser(queries: HostileStore(), token: "to\"ken<")
        let encoded = HTML.component(Self.hostile)
        for target in [
            "/?token=to%22ken%3C&q=" + encoded + "&app=" + encoded + "&version=" + encoded,
            "/groups/" + encoded + "?token=to%22ken%3C", "/reports/" + encoded + "?token=to%22ken%3C",
            "/top?token=to%22ken%3C&app=" + encoded, "/?kind=hang&token=to%22ken%3C&after=3:" + encoded,
        ] {
            let response = browser.respond(method: "GET", target: target)
            #expect(response.status == 200, "\(target)")
            let html = String(decoding: response.body, as: UTF8.self)
            // The text's own quotes, raw, would end an attribute before its `onmouseover=`.
            for forbidden in ["<script", "<img", "\"' onmouseover=", "\u{0}", "\u{1b}", "\u{7}", "=\"javascript"] {
                #expect(!html.contains(forbidden), "\(target): \(forbidden)")
            }
            #expect(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39; onmouseover=alert(2)"), "\(target)")
            // Every href is one of our paths, and every attribute value closes where we close it.
            let hrefs = html.components(separatedBy: "href=\"").dropFirst().map { $0.prefix { $0 != "\"" } }
            #expect(!hrefs.isEmpty && hrefs.allSatisfy { $0.hasPrefix("/") || $0 == "data:," }, "\(hrefs)")
            #expect(hrefs.allSatisfy { !$0.contains("<") && !$0.contains("'") }, "\(hrefs)")
            #expect(response.headers.contains { $0 == ("Content-Security-Policy", CrashBrowser.contentSecurityPolicy) })
        }
    }

    @Test func theSVGTitleAndAnAttributeValueAreEscaped() {
        let svg = Chart.bars([0, 5, 1], width: 30, height: 10, label: Self.hostile)
        #expect(svg.hasPrefix("<svg") && svg.hasSuffix("</svg>"))
        #expect(!svg.contains("<script") && svg.contains("<title>&lt;/title&gt;&lt;script&gt;"))
        #expect(svg.components(separatedBy: "<rect").count - 1 == 3, "a baseline and the two days with events")
        #expect(HTML.escape("a\"b'c") == "a&quot;b&#39;c")
        #expect(
            HTML.href("/groups/" + HTML.component("x/../?y#z"), [("q", "a&b=c")])
                == "/groups/x%2F..%2F%3Fy%23z?q=a%26b%3Dc")
    }

    /// Without the token the pages say so; the stylesheet is served to anyone (it holds nothing).
    @Test func theTokenIsAskedForByEveryPage() {
        let browser = CrashBrowser(queries: HostileStore(), token: "t")
        for path in ["/", "/groups/x", "/reports/x", "/top", "/?token=u"] {
            #expect(browser.respond(method: "GET", target: path).status == 401, "\(path)")
        }
        #expect(browser.respond(method: "GET", target: "/style.css").status == 200)
        #expect(browser.respond(method: "POST", target: "/?token=t").status == 405)
    }
}
