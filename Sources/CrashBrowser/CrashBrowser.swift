package import Foundation

/// The crash browser's pages: read-only HTML over `BrowserQueries`, served by `crashcap collect`
/// and `crashcap serve`. The server hands over a request's method and target and sends back
/// what `respond` returns; nothing here knows how it arrived or where the events are.
///
/// No page runs script; the one stylesheet is ours (`/style.css`), and every answer carries a
/// Content-Security-Policy that allows nothing else. Every number on a page is computed under
/// the page's filter.
package final class CrashBrowser: Sendable {
    package struct Response: Sendable {
        package var status: Int
        package var contentType: String
        package var body: Data
        package var headers: [(String, String)]
    }

    package static let contentSecurityPolicy = "default-src 'none'; style-src 'self'; img-src 'self' data:"
    /// Groups on a page of the list.
    package static let pageSize = 50

    let queries: any BrowserQueries
    let token: String?
    let clock: @Sendable () -> Int64

    /// `token`: when set, every page asks for it (`?token=`) and every link carries it on.
    package init(
        queries: any BrowserQueries, token: String? = nil,
        clock: @escaping @Sendable () -> Int64 = { Int64(Date().timeIntervalSince1970 * 1000) }
    ) {
        self.queries = queries
        self.token = token.flatMap { $0.isEmpty ? nil : $0 }
        self.clock = clock
    }

    /// Whether a path is one of the browser's (the server routes the rest elsewhere).
    package static func serves(_ path: String) -> Bool {
        path == "/" || path == "/style.css" || path == "/top" || path.hasPrefix("/groups/")
            || path.hasPrefix("/reports/")
    }

    package func respond(method: String, target: String) -> Response {
        let parts = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
        let path = String(parts.first ?? "/")
        var query: [String: String] = [:]
        for item in URLComponents(string: "http://x/?" + (parts.count > 1 ? String(parts[1]) : ""))?.queryItems ?? []
        where query[item.name] == nil {
            query[item.name] = item.value ?? ""
        }
        guard method == "GET" || method == "HEAD" else { return plain(405, "the crash browser only reads: GET") }
        if path == "/style.css" {
            return Response(
                status: 200, contentType: "text/css; charset=utf-8", body: Data(Style.css.utf8),
                headers: Self.headers + [("Cache-Control", "max-age=3600")])
        }
        if let token, query["token"] != token { return plain(401, "this crash browser asks for its token: ?token=") }
        let page = Page(browser: self, query: query, now: clock())
        do {
            let html: String?
            switch path {
            case "/": html = try page.list()
            case "/top": html = try page.top()
            case _ where path.hasPrefix("/groups/"):
                html = try page.group(Self.segment(path.dropFirst("/groups/".count)))
            case _ where path.hasPrefix("/reports/"):
                html = try page.report(Self.segment(path.dropFirst("/reports/".count)))
            default: html = nil
            }
            guard let html else { return plain(404, "nothing at \(path)") }
            return Response(
                status: 200, contentType: "text/html; charset=utf-8", body: Data(html.utf8),
                headers: Self.headers + [("Cache-Control", "no-store")])
        } catch {
            return plain(500, "the store cannot be read: \(error)")
        }
    }

    static func segment(_ text: Substring) -> String {
        String(text).removingPercentEncoding ?? String(text)
    }

    /// On every answer: the policy, and no sniffing, framing or referrer (a token rides in URLs).
    static let headers: [(String, String)] = [
        ("Content-Security-Policy", contentSecurityPolicy), ("X-Content-Type-Options", "nosniff"),
        ("X-Frame-Options", "DENY"), ("Referrer-Policy", "no-referrer"),
    ]

    func plain(_ status: Int, _ text: String) -> Response {
        Response(
            status: status, contentType: "text/plain; charset=utf-8", body: Data((text + "\n").utf8),
            headers: Self.headers)
    }
}
