internal import AsyncHTTPClient
internal import CrashFileFormat
package import Foundation
internal import NIOCore
internal import NIOHTTP1
internal import NIOPosix

/// The collector's store when it runs for a fleet: a ClickHouse server, through its HTTP
/// interface. Rows go in with `INSERT INTO events FORMAT JSONEachRow`, one request for every
/// group of uploads that arrived together; ClickHouse answers 200 only once the rows are
/// written, and only then does the collector answer its clients.
///
/// Several collectors may write into one table and a client may send a batch twice (an answer
/// lost on the way back): the table is a `ReplacingMergeTree` whose sorting key ends in
/// `event_id`, so rows with one key are one row after ClickHouse merges its parts, and
/// `SELECT ... FINAL` reads them as one before that. ClickHouse's own insert de-duplication
/// serves replicated tables only, and only for a block sent twice byte for byte: a batch that
/// reaches another collector, or joins another group, would not be caught.
/// `@unchecked`: the settings are fixed at init; the client is thread-safe.
package final class ClickHouseStore: @unchecked Sendable {
    /// The server's address with its query (`database`, `user`, any setting), and no `query`.
    let endpoint: URLComponents
    package let database: String
    /// `events`, or the URL's `table=`: a `Distributed` table over the shards' `events`, made
    /// beforehand, into which the collector writes and which it then never creates.
    package let table: String
    /// The collector made the table and is its only writer's kind: it keeps the crash browser's
    /// sums beside it (`ClickHouseCrashIndex`). Not for a `Distributed` table named by `table=`.
    package let keepsCrashSums: Bool
    private let client: HTTPClient
    private let timeout: TimeAmount

    /// The table, as both ClickHouse 18.16 (Debian 12's) and today's releases read it: no
    /// `DateTime64` or `LowCardinality`, which the old one lacks. The months of the event's own
    /// time partition it; a row sent twice falls in the same month, where the merge finds it.
    package static func tableDefinition(_ table: String) -> String {
        """
        CREATE TABLE IF NOT EXISTS \(table) (
            event_id String,
            type String,
            event String,
            distinct_id String,
            time Int64,
            event_time DateTime,
            session_id String,
            app_name String,
            app_version String,
            received_at DateTime,
            crash_fingerprint String,
            crash_title String,
            properties String,
            payload String
        ) ENGINE = ReplacingMergeTree
        PARTITION BY toYYYYMM(event_time)
        ORDER BY (event_time, event_id)
        """
    }

    /// Connects, makes the database and the table where they are missing, and reads the table
    /// back: a server that cannot be reached, or refuses, is an error at once, not at the first upload.
    package init(url: URL, timeout: Duration = .seconds(30)) throws {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false),
            let scheme = components.scheme?.lowercased(), scheme == "http" || scheme == "https",
            components.host?.isEmpty == false
        else {
            throw CrashCaptureError.invalidArgument(
                "--clickhouse needs an http:// or https:// URL of ClickHouse's HTTP interface, such as http://127.0.0.1:8123/?database=crashcap"
            )
        }
        var items = components.queryItems ?? []
        if items.contains(where: { $0.name == "query" }) {
            throw CrashCaptureError.invalidArgument("the --clickhouse URL must not carry a query= of its own")
        }
        database = items.first { $0.name == "database" }?.value ?? "default"
        table = items.first { $0.name == "table" }?.value ?? "events"
        keepsCrashSums = !items.contains { $0.name == "table" }
        for (what, name) in [("database", database), ("table", table)]
        where name.range(of: "^[A-Za-z_][A-Za-z0-9_]*$", options: .regularExpression) == nil {
            throw CrashCaptureError.invalidArgument(
                "\(what) name \"\(name)\" in the --clickhouse URL: letters, digits and _ only")
        }
        items.removeAll { $0.name == "database" || $0.name == "table" }
        if components.path.isEmpty { components.path = "/" }
        components.queryItems = items.isEmpty ? nil : items
        endpoint = components
        self.timeout = .nanoseconds(Int64(timeout.seconds * 1e9))
        // A server that is down is found in 2 s, not the client's 10: until it is back, every
        // upload waits that long for its 503.
        var configuration = HTTPClient.Configuration(
            redirectConfiguration: .disallow, timeout: .init(connect: .seconds(2), read: .seconds(120)))
        configuration.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 4)
        client = HTTPClient(
            eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup(numberOfThreads: 1)),
            configuration: configuration)
        do {
            if database != "default" {
                _ = try run("CREATE DATABASE IF NOT EXISTS \(database)", inDatabase: false)
            }
            _ = try run(Self.tableDefinition(table))
            let columns = try run(
                "SELECT name FROM system.columns WHERE database = '\(database)' AND table = '\(table)'"
            )
            .split(separator: "\n").map(String.init)
            let missing = ClickHouseRows.columns.filter { !columns.contains($0) }
            if !missing.isEmpty {
                throw CrashCaptureError.invalidArgument(
                    "table \(database).\(table) exists without the columns \(missing.joined(separator: ", ")): give another database, or drop the table"
                )
            }
        } catch {
            try? client.syncShutdown()
            throw error
        }
    }

    /// The server's address as it may appear in output: no password.
    package var shown: String {
        var copy = endpoint
        copy.password = nil
        copy.queryItems = copy.queryItems?.map {
            $0.name == "password" ? URLQueryItem(name: $0.name, value: "redacted") : $0
        }
        return (copy.string ?? "ClickHouse") + " (database \(database))"
    }

    package func shutdown() { try? client.syncShutdown() }

    /// Stores rows made by `ClickHouseRows`; returns when ClickHouse has them.
    func insert(_ rows: [UInt8]) throws {
        guard !rows.isEmpty else { return }
        let columns = ClickHouseRows.columns.joined(separator: ", ")
        _ = try run(
            "INSERT INTO \(table) (\(columns)) FORMAT JSONEachRow", body: ByteBuffer(bytes: rows))
    }

    /// Rows in the table, a duplicate not yet merged away counted too (as `/health` says).
    func count() throws -> Int {
        let text = try run("SELECT count() FROM \(table)")
        guard let count = Int(text.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            throw CrashCaptureError.corrupt("ClickHouse answered count() with \"\(text.prefix(80))\"")
        }
        return count
    }

    /// The records, their properties first, de-duplicated, in the order they were received (by the
    /// second, then by key), from the `after`th on.
    func events(after: Int, limit: Int) throws -> [String] {
        let text = try run(
            "SELECT payload, properties FROM \(table) FINAL ORDER BY received_at, event_id LIMIT \(after), \(limit) FORMAT JSONEachRow"
        )
        return try text.split(separator: "\n").map { line in
            guard let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                let payload = object["payload"] as? String, let properties = object["properties"] as? String
            else { throw CrashCaptureError.corrupt("ClickHouse answered a row without payload and properties") }
            return ClickHouseRows.record(payload: payload, properties: properties)
        }
    }

    /// One statement: in the URL's `query` when a body carries the data, else as the body.
    /// A status other than 200 is an error with ClickHouse's own words.
    @discardableResult
    func run(_ statement: String, body: ByteBuffer? = nil, inDatabase: Bool = true) throws -> String {
        var components = endpoint
        var items = components.queryItems ?? []
        if inDatabase { items.append(URLQueryItem(name: "database", value: database)) }
        // Into a Distributed table, an insert is answered only once every shard has its rows,
        // not once they are queued on the node that took them (ClickHouse's default).
        if body != nil { items.append(URLQueryItem(name: "insert_distributed_sync", value: "1")) }
        if body != nil { items.append(URLQueryItem(name: "query", value: statement)) }
        components.queryItems = items.isEmpty ? nil : items
        guard let url = components.url else { throw CrashCaptureError.invalidArgument("cannot form a ClickHouse URL") }
        var headers = HTTPHeaders()
        if let user = components.user {
            let pair = "\(user.removingPercentEncoding ?? user):\(components.password?.removingPercentEncoding ?? "")"
            headers.add(name: "Authorization", value: "Basic " + Data(pair.utf8).base64EncodedString())
        }
        let response: HTTPClient.Response
        do {
            let request = try HTTPClient.Request(
                url: url, method: .POST, headers: headers, body: .byteBuffer(body ?? ByteBuffer(string: statement)))
            response = try client.execute(request: request, deadline: .now() + timeout).wait()
        } catch {
            throw CrashCaptureError.io("ClickHouse at \(shown) cannot be reached: \(error)", path: nil)
        }
        let text = response.body.map { String(buffer: $0) } ?? ""
        guard response.status == .ok else {
            throw CrashCaptureError.io(
                "ClickHouse at \(shown) answered HTTP \(response.status.code): \(text.prefix(500))", path: nil)
        }
        return text
    }
}
