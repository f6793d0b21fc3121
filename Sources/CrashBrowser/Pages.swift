internal import Foundation

/// One request's page: its filter read from the URL, the links it writes keeping that filter
/// (and the token) so that a URL can be shared and Back works.
struct Page {
    let browser: CrashBrowser
    let query: [String: String]
    var filter: BrowserFilter
    let now: Int64

    init(browser: CrashBrowser, query: [String: String], now: Int64) {
        self.browser = browser
        self.query = query
        self.now = now
        filter = BrowserFilter(query: query, now: now)
    }

    var queries: any BrowserQueries { browser.queries }

    /// A link to our own `path` with `items`, and the token when there is one.
    func link(_ path: String, _ items: [(String, String)]) -> String {
        HTML.href(path, items + (browser.token.map { [("token", $0)] } ?? []))
    }

    func nav(_ on: String) -> String {
        let entries = [
            ("crash", "Crashes", link("/", [])), ("hang", "Hangs", link("/", [("kind", "hang")])),
            ("top", "Top crashers", link("/top", [])),
        ]
        return entries.map { "<a href=\"\($0.2)\"\($0.0 == on ? " class=\"on\"" : "")>\($0.1)</a>" }.joined()
    }

    func option(_ value: String, _ label: String, selected: String) -> String {
        "<option value=\"\(HTML.escape(value))\"\(value == selected ? " selected" : "")>\(HTML.escape(label))</option>"
    }

    /// The filter form: GET, so that its answer is a URL like any other.
    func filterForm(_ choices: FilterChoices, action: String = "/") -> String {
        let versions =
            filter.app.isEmpty
            ? Array(Set(choices.versions.values.joined())).sorted() : choices.versions[filter.app] ?? []
        var html = "<form class=\"filters\" method=\"get\" action=\"\(action)\">"
        if filter.kind != .crash { html += "<input type=\"hidden\" name=\"kind\" value=\"\(filter.kind.rawValue)\">" }
        if filter.sort != .events { html += "<input type=\"hidden\" name=\"sort\" value=\"\(filter.sort.rawValue)\">" }
        if let token = browser.token {
            html += "<input type=\"hidden\" name=\"token\" value=\"\(HTML.escape(token))\">"
        }
        html +=
            "<label>app<select name=\"app\">" + option("", "all apps", selected: filter.app)
            + choices.apps.map { option($0, $0, selected: filter.app) }.joined() + "</select></label>"
        html +=
            "<label>version<select name=\"version\">" + option("", "all versions", selected: filter.version)
            + versions.map { option($0, $0, selected: filter.version) }.joined() + "</select></label>"
        html +=
            "<label>signal<select name=\"signal\">" + option("", "any", selected: filter.signal)
            + choices.signals.map { option($0, $0, selected: filter.signal) }.joined() + "</select></label>"
        html +=
            "<label>time<select name=\"range\">"
            + BrowserFilter.ranges.map {
                option($0.name, $0.name == "all" ? "all time" : "last " + $0.name, selected: filter.range)
            }
            .joined() + "</select></label>"
        html += "<label>title contains<input type=\"search\" name=\"q\" value=\"\(HTML.escape(filter.text))\"></label>"
        return html + "<button type=\"submit\">Filter</button></form>"
    }

    func dailyChart(_ counts: [Int], width: Int = 112, height: Int = 24) -> String {
        Chart.bars(
            counts, width: width, height: height,
            label: "events a UTC day, oldest first (the last is today so far): "
                + counts.map(String.init).joined(separator: " "))
    }

    // MARK: the list of groups

    func list() throws -> String {
        let choices = try queries.choices(kind: filter.kind)
        let page = try queries.groups(filter, limit: CrashBrowser.pageSize)
        let noun = filter.kind == .crash ? "crash" : "hang"
        var body = "<h1>\(filter.kind == .crash ? "Crash" : "Hang") groups</h1>" + filterForm(choices)
        body +=
            "<p class=\"summary\"><span id=\"total-groups\">\(page.totalGroups)</span> groups, "
            + "<span id=\"total-events\">\(page.totalEvents)</span> \(noun) events under this filter</p>"
        let sortLink = { (sort: BrowserFilter.Sort, label: String) -> String in
            var sorted = filter
            sorted.sort = sort
            sorted.after = nil
            let here = filter.sort == sort
            return
                "<a href=\"\(link("/", sorted.items()))\"\(here ? " class=\"on\"" : "")>\(label)\(here ? " ▾" : "")</a>"
        }
        body +=
            "<table class=\"groups\"><thead><tr><th>\(noun)</th><th>app</th><th class=\"n\">\(sortLink(.events, "events"))</th>"
            + "<th class=\"n\">users</th><th class=\"n\">installs</th><th>14 days</th>"
            + "<th>\(sortLink(.first, "first seen"))</th><th>\(sortLink(.last, "last seen"))</th></tr></thead><tbody>"
        for row in page.rows {
            body +=
                "<tr class=\"group\" data-fingerprint=\"\(HTML.escape(row.fingerprint))\">"
                + "<td class=\"title\"><a href=\"\(link("/groups/" + HTML.component(row.fingerprint), filter.items()))\">"
                + HTML.escape(row.title.isEmpty ? row.fingerprint : row.title) + "</a>"
                + (row.isNew ? "<span class=\"new\" title=\"first seen in this version\">new</span>" : "")
                + "<div class=\"dim small\">\(HTML.escape(row.fingerprint))</div></td>"
                + "<td>\(HTML.escape(row.app))</td><td class=\"n events\">\(row.events)</td>"
                + "<td class=\"n users\">\(row.users)</td><td class=\"n installs\">\(row.installs)</td>"
                + "<td>\(dailyChart(row.daily))</td>"
                + "<td title=\"\(HTML.time(row.firstSeen))\">\(HTML.ago(row.firstSeen, now: now))<div class=\"dim small\">\(HTML.escape(row.firstVersion))</div></td>"
                + "<td title=\"\(HTML.time(row.lastSeen))\">\(HTML.ago(row.lastSeen, now: now))<div class=\"dim small\">\(HTML.escape(row.lastVersion))</div></td></tr>"
        }
        body += "</tbody></table>"
        if page.rows.isEmpty { body += "<p class=\"dim\">No \(noun) under this filter.</p>" }
        body += "<div class=\"pager\">"
        if filter.after != nil {
            var first = filter
            first.after = nil
            body += "<a href=\"\(link("/", first.items()))\">first page</a>"
        }
        if page.more, let last = page.rows.last {
            var next = filter
            next.after = (last.sortValue(filter.sort), last.fingerprint)
            body += "<a rel=\"next\" href=\"\(link("/", next.items(paging: true)))\">next page</a>"
        }
        body += "</div>"
        return HTML.page(title: "\(noun) groups", nav: nav(filter.kind.rawValue), body: body)
    }

    // MARK: one group

    func group(_ fingerprint: String) throws -> String? {
        guard let detail = try queries.group(fingerprint, filter) else { return nil }
        let summary = detail.summary
        var body = "<p class=\"dim small\"><a href=\"\(link("/", filter.items()))\">← all groups</a></p>"
        body +=
            "<h1>" + HTML.escape(summary.title.isEmpty ? fingerprint : summary.title)
            + (summary.isNew ? "<span class=\"new\">new</span>" : "") + "</h1>"
        body +=
            "<p class=\"dim\">" + HTML.escape(summary.app) + " · fingerprint <code>" + HTML.escape(fingerprint)
            + "</code> · first seen \(HTML.time(summary.firstSeen)) in " + HTML.escape(summary.firstVersion)
            + " · last seen \(HTML.time(summary.lastSeen)) in " + HTML.escape(summary.lastVersion) + "</p>"
        body +=
            "<div class=\"counts\"><div><b id=\"count-24h\">\(detail.last24Hours)</b>last 24 h</div>"
            + "<div><b id=\"count-30d\">\(detail.last30Days)</b>last 30 days</div>"
            + "<div><b id=\"count-events\">\(summary.events)</b>events under this filter</div>"
            + "<div><b>\(summary.users)</b>users</div><div><b>\(summary.installs)</b>installs</div></div>"
        body += "<h2>Events a day, last 30 days</h2>" + dailyChart(detail.daily30, width: 600, height: 80)
        body += "<h2>Facets</h2><div class=\"facets\">"
        for facet in detail.facets {
            body +=
                "<table class=\"facet\" data-facet=\"\(HTML.escape(facet.name))\"><tr><th>\(HTML.escape(facet.name))</th><th class=\"n\">events</th><th class=\"n\">%</th></tr>"
                + facet.values.map {
                    "<tr><td>\(HTML.escape($0.value))</td><td class=\"n\">\($0.count)</td><td class=\"n\">\(HTML.percent($0.count, of: summary.events))</td></tr>"
                }.joined() + "</table>"
        }
        body += "</div>"
        if let latest = detail.events.first,
            let payload = try queries.eventPayload(latest.eventID),
            let event = try? JSONSerialization.jsonObject(with: Data(payload.utf8)) as? [String: Any]
        {
            body +=
                "<h2>Latest report <a class=\"small\" id=\"latest-report\" href=\"\(link("/reports/" + HTML.component(latest.eventID), filter.items()))\">the whole report</a></h2>"
                + ReportHTML.report(event, all: false)
        }
        body +=
            "<h2>Events (newest first\(detail.events.count == GroupDetail.eventsShown ? ", the last \(GroupDetail.eventsShown)" : ""))</h2>"
            + "<table class=\"events\"><tr><th>time</th><th>version</th><th>host</th><th>user</th></tr>"
            + detail.events.map {
                "<tr><td><a href=\"\(link("/reports/" + HTML.component($0.eventID), filter.items()))\">\(HTML.time($0.time))</a></td><td>\(HTML.escape($0.version))</td><td>\(HTML.escape($0.host))</td><td>\(HTML.escape($0.user))</td></tr>"
            }.joined() + "</table>"
        return HTML.page(title: summary.title, nav: nav(filter.kind.rawValue), body: body)
    }

    // MARK: one report

    func report(_ eventID: String) throws -> String? {
        guard let payload = try queries.eventPayload(eventID) else { return nil }
        let event = (try? JSONSerialization.jsonObject(with: Data(payload.utf8)) as? [String: Any]) ?? [:]
        let (_, properties) = ReportHTML.parts(event)
        let title = ReportHTML.string(properties["crash_title"] ?? properties["hang_title"])
        let fingerprint = ReportHTML.string(properties["crash_fingerprint"] ?? properties["hang_fingerprint"])
        var body =
            "<p class=\"dim small\"><a href=\"\(link("/groups/" + HTML.component(fingerprint), filter.items()))\">← its group</a></p>"
        body +=
            "<h1>" + HTML.escape(title) + "</h1><p class=\"dim\">event <code>" + HTML.escape(eventID) + "</code> · "
            + HTML.time((event["time"] as? NSNumber)?.int64Value ?? 0) + "</p>"
        body += ReportHTML.report(event, all: true) + ReportHTML.everythingElse(event)
        body += "<h2>Raw JSON</h2><pre id=\"raw\">" + HTML.escape(ReportHTML.pretty(event)) + "</pre>"
        return HTML.page(title: title, nav: nav(filter.kind.rawValue), body: body)
    }

    // MARK: top crashers of a version

    func top() throws -> String {
        let choices = try queries.choices(kind: filter.kind)
        let app = filter.app.isEmpty ? choices.apps.first ?? "" : filter.app
        let versions = choices.versions[app] ?? []
        let version =
            filter.version.isEmpty || !versions.contains(filter.version) ? versions.last ?? "" : filter.version
        let previous = versions.firstIndex(of: version).flatMap { $0 > 0 ? versions[$0 - 1] : nil }
        var body =
            "<h1>Top \(filter.kind == .crash ? "crashers" : "hangs") of " + HTML.escape(app) + " "
            + HTML.escape(version) + "</h1>"
        var form = filter
        form.app = app
        form.version = version
        body += with(form).filterForm(choices, action: "/top")
        let top = try queries.topCrashers(app: app, version: version, previous: previous, kind: filter.kind, limit: 50)
        let total = try queries.versionEvents(app: app, version: version, kind: filter.kind)
        let previousTotal =
            try previous.map { try queries.versionEvents(app: app, version: $0, kind: filter.kind) } ?? 0
        body +=
            "<p class=\"summary\"><span id=\"version-events\">\(total)</span> events in " + HTML.escape(version)
            + (previous.map { ", \(previousTotal) in the version before it, " + HTML.escape($0) }
                ?? ", the app's first version")
            + "</p>"
        body +=
            "<table class=\"top\"><tr><th class=\"n\">rank</th><th>\(filter.kind == .crash ? "crash" : "hang")</th><th class=\"n\">events</th><th class=\"n\">% of \(HTML.escape(version))</th><th class=\"n\">% of \(HTML.escape(previous ?? "–"))</th><th>change</th></tr>"
        for (rank, row) in top.enumerated() {
            let share = total > 0 ? Double(row.events) * 100 / Double(total) : 0
            let before = previousTotal > 0 ? Double(row.previousEvents) * 100 / Double(previousTotal) : 0
            let change: String
            if row.isNew {
                change = "<span class=\"new\">new</span>"
            } else if previous == nil || row.previousEvents == 0 {
                change = "<span class=\"dim\">–</span>"
            } else {
                let delta = share - before
                change =
                    "<span class=\"\(delta > 0 ? "up" : "down")\">" + String(format: "%+.1f points", delta) + "</span>"
            }
            var groupFilter = BrowserFilter(now: now)
            groupFilter.kind = filter.kind
            groupFilter.app = app
            groupFilter.version = version
            body +=
                "<tr><td class=\"n\">\(rank + 1)</td><td class=\"title\"><a href=\"\(link("/groups/" + HTML.component(row.fingerprint), groupFilter.items()))\">"
                + HTML.escape(row.title.isEmpty ? row.fingerprint : row.title)
                + "</a></td><td class=\"n\">\(row.events)</td>"
                + "<td class=\"n\">" + String(format: "%.1f %%", share) + "</td><td class=\"n\">"
                + (previous == nil ? "–" : String(format: "%.1f %%", before)) + "</td><td>\(change)</td></tr>"
        }
        body += "</table>"
        return HTML.page(title: "top crashers", nav: nav("top"), body: body)
    }

    func with(_ other: BrowserFilter) -> Page {
        var copy = self
        copy.filter = other
        return copy
    }
}
