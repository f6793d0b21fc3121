internal import CrashBrowser
package import CrashCapture
internal import CrashFileFormat
package import Foundation
internal import NIOCore
internal import NIOHTTP1
internal import NIOPosix

#if canImport(Glibc)
    import Glibc
#endif

/// An HTTP/1.1 server on SwiftNIO that takes what the Sensors Analytics SDKs send at `/sa`
/// (and `/sa.gif`), stores records in SQLite in arrival order and serves them back as JSON
/// lines at `/events`; or, for a fleet, stores them into ClickHouse (`ClickHouseStore`). Every limit answers with its own status: headers over 80 KiB (431),
/// a body over `maximumBody` or a batch that inflates past `maximumInflated` (413), a POST
/// without a length (411), a request whose head does not arrive within `headerTimeout` or
/// whose body does not within `bodyTimeout` (408), more than `maximumConnections` at once
/// (503 with Retry-After). An idle keep-alive connection is closed after `idleTimeout`.
/// SQLite runs on a thread pool of its own, never on the event loop, and a batch is
/// acknowledged only once it is committed.
/// `@unchecked`: settings are fixed after init; the fault counters and the connection count
/// are under `lock`, and the store has its own.
package final class IngestCollector: @unchecked Sendable {
    /// Failures on purpose, to prove the uploader survives them.
    package struct Faults: Sendable {
        /// The first N requests get their connection closed without a response.
        package var dropFirst = 0
        /// The next N requests get `failStatus`.
        package var failFirst = 0
        package var failStatus = 500
        /// Every response waits this long first.
        package var delayMilliseconds = 0
        /// A Retry-After header (seconds) on the injected failures.
        package var retryAfterSeconds: Int?
        package init() {}
    }

    package struct Limits: Sendable {
        package var maximumBody = 32 << 20
        package var maximumInflated = 64 << 20
        package var maximumConnections = 512
        /// Slots one address may hold at once (its oldest idle connection makes room past that).
        package var maximumConnectionsPerPeer = 128
        package var headerTimeout = 10.0
        /// A connection that sends nothing at all within this is closed.
        package var firstByteTimeout = 5.0
        package var bodyTimeout = 60.0
        package var idleTimeout = 30.0
        /// How long an INSERT into ClickHouse waits for more uploads to join it while many
        /// clients upload (`lingerForMore`); zero for the benchmark's reference.
        package var clickHouseLinger: Duration = .milliseconds(5)
        /// When set, uploads and `GET /events` must carry it (`?token=`, as the Sensors SDKs'
        /// server URL does, or `Authorization: Bearer`). Required to listen beyond loopback.
        package var token: String?
        /// The crash browser's pages answer connections that arrive at a loopback address, and
        /// at this one too when set (`0.0.0.0` or `::`: any); other connections get 404 for them.
        package var uiHost: String?
        package init() {}
    }

    package static var maximumBody: Int { Limits().maximumBody }

    /// Where the events go: one of the two.
    package enum Storage: Sendable {
        case sqlite(path: String)
        case clickHouse(URL)
        /// No uploads: the crash browser's pages over an app's own `events.sqlite`, which is only
        /// read (`crashcap serve`).
        case pagesOnly(path: String)
    }

    /// The SQLite store; nil when the events go to ClickHouse.
    package let store: EventStore?
    package let clickHouse: ClickHouseStore?
    /// The crash browser's pages, over the same store.
    let browser: CrashBrowser
    /// Serving pages only (`Storage.pagesOnly`): every other route is 404.
    let pagesOnly: Bool
    package private(set) var port: UInt16 = 0
    let host: String
    let faults: Faults
    let limits: Limits
    private let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    /// SQLite's thread: one, so that stores are in arrival order.
    private let database = NIOThreadPool(numberOfThreads: 1)
    /// Unpacking and checking uploads (base64, gzip, the JSON scan) takes most of a request's
    /// time and needs no store: it runs beside SQLite, on threads of its own.
    private let decoders = NIOThreadPool(numberOfThreads: 2)
    private var channel: Channel?
    private let lock = NSLock()
    private var uploadCount = 0
    /// Every open connection, and since when it has been idle (no request begun since its last
    /// answer, or none ever); nil while a request is in progress.
    private var connections: [ObjectIdentifier: (channel: Channel, peer: String, idleSince: UInt64?)] = [:]

    package convenience init(
        host: String = "127.0.0.1", port: UInt16, databasePath: String, faults: Faults = Faults(),
        limits: Limits = Limits()
    ) throws {
        try self.init(host: host, port: port, storage: .sqlite(path: databasePath), faults: faults, limits: limits)
    }

    package init(
        host: String = "127.0.0.1", port: UInt16, storage: Storage, faults: Faults = Faults(), limits: Limits = Limits()
    ) throws {
        self.host = host
        self.faults = faults
        self.limits = limits
        if !Self.isLoopback(host) && (limits.token ?? "").isEmpty {
            throw CrashCaptureError.invalidArgument(
                "listening on \(host) serves every stored event to whoever can reach it: give a token "
                    + "(--token or CRASHCAPTURE_COLLECTOR_TOKEN) that uploads and GET /events must carry, or listen on 127.0.0.1"
            )
        }
        var databasePath: String?
        var existed = false
        switch storage {
        case .sqlite(let path):
            databasePath = path
            existed = FileManager.default.fileExists(atPath: path)
            // A checkpoint every 32 MiB of WAL rather than SQLite's 4 MiB, and on a thread of its
            // own: run by the commit that crossed the threshold, the copy and its two fsyncs held
            // every client for about 50 ms, every 45,000 events (under wrk with 4 connections, p99
            // 52-58 ms against 6.6-7.7 ms on its own thread).
            let store = try EventStore(
                path: path, limits: .init(maximumEvents: .max, maximumBytes: .max), checkpointPages: 8192,
                backgroundCheckpoints: true)
            self.store = store
            clickHouse = nil
            browser = CrashBrowser(
                queries: try SQLiteBrowserQueries(path: path, persistent: true), token: limits.token)
        case .clickHouse(let url):
            store = nil
            let clickHouse = try ClickHouseStore(url: url)
            self.clickHouse = clickHouse
            browser = CrashBrowser(queries: try ClickHouseCrashIndex.browserQueries(clickHouse), token: limits.token)
        case .pagesOnly(let path):
            store = nil
            clickHouse = nil
            browser = CrashBrowser(
                queries: try SQLiteBrowserQueries(path: path, persistent: false), token: limits.token)
        }
        if case .pagesOnly = storage { pagesOnly = true } else { pagesOnly = false }
        database.start()
        decoders.start()
        do {
            try bind(port)
        } catch {
            // A collector that cannot listen leaves nothing behind.
            try? database.syncShutdownGracefully()
            try? decoders.syncShutdownGracefully()
            try? group.syncShutdownGracefully()
            clickHouse?.shutdown()
            if let databasePath, !existed {
                for suffix in ["", "-wal", "-shm"] { unlink(databasePath + suffix) }
            }
            throw error
        }
    }

    private func bind(_ requested: UInt16) throws {
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(ChannelOptions.backlog, value: 256)
            .serverChannelOption(ChannelOptions.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(ChannelOptions.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { [self] channel in
                guard admit(channel) else { return channel.pipeline.addHandler(RefuseConnection()) }
                channel.closeFuture.whenComplete { _ in self.release(channel) }
                let timer = HeaderDeadline(
                    collector: self, timeout: .milliseconds(Int64(self.limits.headerTimeout * 1000)),
                    firstByteTimeout: .milliseconds(Int64(self.limits.firstByteTimeout * 1000)))
                // The initializer runs on the channel's own event loop: the handlers go in there
                // and then, synchronously (IdleStateHandler is not Sendable, and need not be).
                do {
                    let pipeline = channel.pipeline.syncOperations
                    try pipeline.addHandler(timer)
                    try pipeline.configureHTTPServerPipeline(withPipeliningAssistance: true, withErrorHandling: false)
                    try pipeline.addHandlers([
                        IdleStateHandler(readTimeout: .milliseconds(Int64(self.limits.idleTimeout * 1000))),
                        ConnectionHandler(collector: self, headerDeadline: timer),
                    ])
                    return channel.eventLoop.makeSucceededVoidFuture()
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }
        do {
            let bound = try bootstrap.bind(host: host, port: Int(requested)).wait()
            channel = bound
            port = UInt16(bound.localAddress?.port ?? 0)
        } catch {
            throw CrashCaptureError.io(
                "cannot listen on \(host):\(requested) (\(error)); pick a free port, or 0 for any", path: nil)
        }
    }

    static func isLoopback(_ host: String) -> Bool {
        host == "localhost" || host == "::1" || host.hasPrefix("127.") || host.hasPrefix("::ffff:127.")
    }

    /// The pages are for loopback unless `uiHost` names the address a connection came in on.
    func pagesAllowed(on local: String?) -> Bool {
        guard let local else { return false }
        if Self.isLoopback(local) { return true }
        guard let uiHost = limits.uiHost else { return false }
        return uiHost == "0.0.0.0" || uiHost == "::" || uiHost == local
    }

    /// Whether a request carries the token, where one is set.
    func authorized(_ request: Request) -> Bool {
        guard let token = limits.token, !token.isEmpty else { return true }
        let query = URLComponents(string: "http://x" + request.target)?.queryItems ?? []
        if query.contains(where: { $0.name == "token" && $0.value == token }) { return true }
        return request.headers["authorization"] == "Bearer " + token
    }

    /// A new connection takes a free slot, or the slot of the connection idle the longest, which
    /// is closed: sockets that hold a slot and send nothing cannot keep real clients out. Only
    /// when every connection is inside a request is the new one refused (503).
    /// A peer (an address) may hold `maximumConnectionsPerPeer` slots: past that its own oldest
    /// idle connection makes room, so one client cannot take the slots of all the others.
    private func admit(_ channel: Channel) -> Bool {
        let peer = channel.remoteAddress?.ipAddress ?? "?"
        let evicted: Channel? = lock.withLock {
            func oldestIdle(_ among: [ObjectIdentifier: (channel: Channel, peer: String, idleSince: UInt64?)]) -> (
                key: ObjectIdentifier, channel: Channel
            )? {
                among.filter { $0.value.idleSince != nil }.min { $0.value.idleSince! < $1.value.idleSince! }
                    .map { ($0.key, $0.value.channel) }
            }
            let now = DispatchTime.now().uptimeNanoseconds
            let own = connections.filter { $0.value.peer == peer }
            var room: (key: ObjectIdentifier, channel: Channel)?
            if own.count >= limits.maximumConnectionsPerPeer {
                guard let oldest = oldestIdle(own) else { return nil }
                room = oldest
            } else if connections.count >= limits.maximumConnections {
                guard let oldest = oldestIdle(connections) else { return nil }
                room = oldest
            }
            if let room { connections[room.key] = nil }
            connections[ObjectIdentifier(channel)] = (channel, peer, now)
            return room?.channel ?? channel
        }
        guard let evicted else { return false }
        if evicted !== channel { evicted.close(promise: nil) }
        return true
    }

    private func release(_ channel: Channel) {
        lock.withLock {
            if connections[ObjectIdentifier(channel)]?.channel === channel {
                connections[ObjectIdentifier(channel)] = nil
            }
        }
    }

    /// A request has begun on `channel` (its first byte came): not to be evicted until answered.
    func requestBegan(on channel: Channel) {
        lock.withLock { connections[ObjectIdentifier(channel)]?.idleSince = nil }
    }

    /// Its answer is written and the connection kept: idle from now.
    func requestAnswered(on channel: Channel) {
        lock.withLock { connections[ObjectIdentifier(channel)]?.idleSince = DispatchTime.now().uptimeNanoseconds }
    }

    package var url: String {
        let shown = host.contains(":") ? "[\(host)]" : host
        return "http://\(shown):\(port)/sa"
    }

    /// Blocks the calling thread until `stop()`.
    package func serve() {
        try? channel?.closeFuture.wait()
    }

    /// Stops listening, lets the batches already with the database thread be committed and
    /// answered, then closes the connections. The event loops go last: a batch committed
    /// after them had nowhere to send its answer (SwiftNIO printed "Cannot schedule tasks on
    /// an EventLoop that has already shut down", which it means to make a crash).
    package func stop() {
        try? channel?.close().wait()
        try? database.syncShutdownGracefully()
        try? decoders.syncShutdownGracefully()
        try? group.syncShutdownGracefully()
        clickHouse?.shutdown()
    }

    /// Events stored: in SQLite, or rows in ClickHouse's table (a duplicate not merged yet too).
    package func storedCount() throws -> Int {
        if let clickHouse { return try clickHouse.count() }
        return store?.count ?? 0
    }

    struct Request {
        var method: String
        var target: String
        var headers: [String: String]
        var body: Data
        /// The address the connection arrived at.
        var local: String? = nil
        /// The target without its query.
        var path: String { target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? target }
    }

    struct Response: Sendable {
        var status: Int
        var data: Data
        var contentType: String
        var extraHeaders: [(String, String)] = []

        init(status: Int, body: String, contentType: String = "application/json") {
            self.init(status: status, data: Data(body.utf8), contentType: contentType)
        }

        init(status: Int, data: Data, contentType: String) {
            self.status = status
            self.data = data
            self.contentType = contentType
        }
    }

    /// What to do with a whole request: drop it (fault injection), or answer it, on the
    /// database's thread (every route touches the store), after the injected delay.
    func respond(to request: Request, on eventLoop: EventLoop) -> EventLoopFuture<Response?> {
        // Faults are for uploads: reading /events or /health neither triggers nor uses them up.
        var upload: Int?
        if request.method == "POST" && request.path == "/sa" {
            upload = lock.withLock {
                defer { uploadCount += 1 }
                return uploadCount
            }
        }
        if let upload, upload < faults.dropFirst { return eventLoop.makeSucceededFuture(nil) }
        let delay: TimeAmount = upload != nil ? .milliseconds(Int64(faults.delayMilliseconds)) : .zero
        if let upload, upload < faults.dropFirst + faults.failFirst {
            var failed = Response(status: faults.failStatus, body: "{\"error\":\"fault injected\"}")
            if let seconds = faults.retryAfterSeconds { failed.extraHeaders.append(("Retry-After", String(seconds))) }
            let answer = failed
            return eventLoop.scheduleTask(in: delay) { answer }.futureResult
        }
        let answer: EventLoopFuture<Response>
        if pagesOnly && !CrashBrowser.serves(request.path) {
            answer = eventLoop.makeSucceededFuture(
                Response(status: 404, body: "{\"error\":\"only the crash browser's pages here\"}"))
        } else if let upload = uploadBody(request) {
            let beacon = request.path == "/sa.gif"
            answer = decodeSoon(upload, on: eventLoop).flatMap { (decoded: Decoded) in
                switch decoded {
                case .refused(let response): eventLoop.makeSucceededFuture(response)
                case .rows(let batch): self.store(batch, on: eventLoop).map { Self.answer($0, beacon: beacon) }
                }
            }
        } else {
            answer = database.runIfActive(eventLoop: eventLoop) { [self] in route(request) }
        }
        guard delay > .zero else { return answer.map { $0 } }
        return answer.flatMap { response in eventLoop.scheduleTask(in: delay) { response }.futureResult }
    }

    func route(_ request: Request) -> Response {
        let path = request.path
        if CrashBrowser.serves(path) {
            guard pagesAllowed(on: request.local) else {
                return Response(status: 404, body: "{\"error\":\"no route \(path)\"}")
            }
            let page = browser.respond(method: request.method, target: request.target)
            var response = Response(status: page.status, data: page.body, contentType: page.contentType)
            response.extraHeaders = page.headers
            return response
        }
        if path != "/health" && !authorized(request) {
            return Response(status: 401, body: "{\"error\":\"a token is required: ?token= or Authorization: Bearer\"}")
        }
        switch (request.method, path) {
        case ("GET", "/events"): return listEvents(request.target)
        case ("GET", "/health"):
            guard let count = try? storedCount() else {
                return Response(status: 503, body: "{\"status\":\"the store cannot be read\"}")
            }
            return Response(status: 200, body: "{\"status\":\"ok\",\"events\":\(count)}")
        case (_, "/sa"), (_, "/events"), (_, "/health"):
            return Response(status: 405, body: "{\"error\":\"method \(request.method) not allowed on \(path)\"}")
        default: return Response(status: 404, body: "{\"error\":\"no route \(path); POST /sa, GET /events\"}")
        }
    }

    /// The smallest transparent GIF, as beacons expect (43 bytes).
    static let transparentGIF = Data(base64Encoded: "R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")!

    /// The form an upload carries: a POST's body, or the query of the web SDK's beacon
    /// (`GET /sa.gif`, `GET /sa`). Nil for every other request, and for one without the token.
    func uploadBody(_ request: Request) -> Data? {
        guard request.path == "/sa" || request.path == "/sa.gif", authorized(request) else { return nil }
        switch request.method {
        case "POST" where request.path == "/sa": return request.body
        case "GET":
            let query = request.target.split(separator: "?", maxSplits: 1).dropFirst().first.map(String.init) ?? ""
            return Data(query.utf8)
        default: return nil
        }
    }

    enum Decoded: Sendable {
        case rows(WireFormat.DecodedBatch)
        case refused(Response)
    }

    /// A body up to this size that inflates to no more than `decodedOnLoop` is decoded on the
    /// event loop, saving a hand-over to another thread and back; anything larger goes to the
    /// decoders' threads, so that no request holds the loop long (a gzip bomb included).
    package static let bodyDecodedOnLoop = 64 << 10
    package static let decodedOnLoop = 256 << 10

    /// The upload decoded: at once, or on the decoders' threads (see `bodyDecodedOnLoop`).
    func decodeSoon(_ body: Data, on eventLoop: EventLoop) -> EventLoopFuture<Decoded> {
        if body.count <= Self.bodyDecodedOnLoop {
            let decoded = decode(body, maximumInflated: min(Self.decodedOnLoop, limits.maximumInflated))
            if case .refused(let response) = decoded, response.status == 413,
                limits.maximumInflated > Self.decodedOnLoop
            {
                return decoders.runIfActive(eventLoop: eventLoop) { [self] in decode(body) }
            }
            return eventLoop.makeSucceededFuture(decoded)
        }
        return decoders.runIfActive(eventLoop: eventLoop) { [self] in decode(body) }
    }

    func decode(_ body: Data, maximumInflated: Int? = nil) -> Decoded {
        do {
            return .rows(
                try WireFormat.decodeBatch(
                    body: body, maximumInflated: maximumInflated ?? limits.maximumInflated,
                    clickHouseRows: clickHouse != nil,
                    receivedMilliseconds: Int64(Date().timeIntervalSince1970 * 1000)))
        } catch {
            // A batch that inflates past the limit is too large, not malformed.
            let tooLarge = "\(error)".contains("inflated data exceeds")
            return .refused(Response(status: tooLarge ? 413 : 400, body: "{\"error\":\(JSONText.quoted("\(error)"))}"))
        }
    }

    /// The beacon's answer to a stored upload is a GIF.
    static func answer(_ response: Response, beacon: Bool) -> Response {
        guard response.status == 200, beacon else { return response }
        return Response(status: 200, data: transparentGIF, contentType: "image/gif")
    }

    /// A decoded upload waiting for the database thread, and the answer its request is owed.
    private struct WaitingBatch {
        var rows: [(id: String, payload: String)]
        var clickHouseRows: [UInt8]?
        var crashKeys: [ClickHouseRows.CrashKey]
        var answer: EventLoopPromise<Response>
    }

    /// Batches decoded and not yet stored, in arrival order; `storing` is true while the
    /// database thread works through them. Both under `lock`.
    private var waiting: [WaitingBatch] = []
    private var storing = false

    /// At most this much goes into one transaction, so that no commit grows without bound.
    static let groupCommitBytes = 8 << 20

    /// Stores a batch, each event's text exactly as it arrived, in arrival order, and answers
    /// once it is committed. Batches that arrive while the database thread is busy are
    /// committed together in one transaction (a group commit): with several clients, each
    /// batch no longer pays for a commit of its own (the WAL frames of the pages every commit
    /// touches, and a hand-over to the thread and back).
    func store(_ decoded: WireFormat.DecodedBatch, on eventLoop: EventLoop) -> EventLoopFuture<Response> {
        let answer = eventLoop.makePromise(of: Response.self)
        let batch = WaitingBatch(
            rows: decoded.events.map { (id: $0.id, payload: $0.text) }, clickHouseRows: decoded.clickHouseRows,
            crashKeys: decoded.crashKeys, answer: answer)
        let start = lock.withLock {
            waiting.append(batch)
            defer { storing = true }
            return !storing
        }
        if start {
            database.runIfActive(eventLoop: eventLoop) { [self] in storeWaiting() }.whenFailure { [self] error in
                // The pool has stopped: nothing waiting will be stored.
                let abandoned = lock.withLock {
                    defer { waiting = []; storing = false }
                    return waiting
                }
                for batch in abandoned { batch.answer.fail(error) }
            }
        }
        return answer.futureResult
    }

    /// On the database thread: stores what is waiting, a group at a time, until nothing is.
    private func storeWaiting() {
        while true {
            if clickHouse != nil && lastGroupSize >= 8 && limits.clickHouseLinger > .zero { lingerForMore() }
            let group: [WaitingBatch] = lock.withLock {
                var bytes = 0
                var count = 0
                for batch in waiting {
                    bytes += batch.rows.reduce(0) { $0 + $1.payload.utf8.count }
                    if count > 0 && bytes > Self.groupCommitBytes { break }
                    count += 1
                }
                if count == 0 { storing = false }
                defer { waiting.removeFirst(count) }
                return Array(waiting.prefix(count))
            }
            if group.isEmpty { return }
            if let clickHouse {
                lastGroupSize = group.count
                lock.withLock { insertCounts = (insertCounts.inserts + 1, insertCounts.uploads + group.count) }
                insert(group, into: clickHouse)
                continue
            }
            guard let store else { return }
            let results: [EventStore.InsertResult]
            do {
                results = try store.transaction { transaction in
                    try group.map { try transaction.insert($0.rows) }
                }
            } catch {
                // One group failed whole: each batch then gets its own transaction and answer,
                // so that one batch's failure is not every batch's.
                for batch in group { batch.answer.succeed(insertAlone(batch.rows)) }
                continue
            }
            for (batch, result) in zip(group, results) { batch.answer.succeed(Self.stored(result)) }
        }
    }

    /// Uploads in the last INSERT: many clients are uploading at once. Only the database
    /// thread touches it.
    private var lastGroupSize = 0

    /// INSERTs sent to ClickHouse, and the uploads they carried, for the benchmark. Under `lock`.
    private var insertCounts = (inserts: 0, uploads: 0)
    package var clickHouseInserts: (inserts: Int, uploads: Int) { lock.withLock { insertCounts } }

    /// Before an INSERT into ClickHouse, while many clients upload (eight batches or more went
    /// into the last one), a few milliseconds for more uploads to join it, unless a part's
    /// worth already waits. A lone client's upload never waits. The clients answered by the
    /// last INSERT send their next batches over the following milliseconds: taken at once, the
    /// first of them went alone, and ClickHouse spent a part (its files, and merging them
    /// later) on every few batches. `crashcap-bench ingest-clickhouse` measures it against no
    /// wait, in the same run.
    private func lingerForMore() {
        let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(limits.clickHouseLinger.seconds * 1e9)
        while DispatchTime.now().uptimeNanoseconds < deadline {
            let waitingBytes = lock.withLock { waiting.reduce(0) { $0 + ($1.clickHouseRows?.count ?? 0) } }
            if waitingBytes >= Self.groupCommitBytes / 2 { return }
            usleep(250)
        }
    }

    /// One INSERT for the whole group. When ClickHouse does not take it, every batch of the
    /// group is answered 503 with a Retry-After, and its client sends it again: nothing is
    /// acknowledged that ClickHouse does not hold.
    /// One INSERT at a time, each as large as what waits: ClickHouse 18.16 spends 10 to 50 ms
    /// on any INSERT (a new part, some 35 files), and its CPU is what bounds the rate. Two or
    /// four in flight made smaller parts and more merging: 128 clients got 97,000 and 80,000
    /// events/s through, against 124,000 with one.
    private func insert(_ group: [WaitingBatch], into clickHouse: ClickHouseStore) {
        var rows: [UInt8] = []
        rows.reserveCapacity(group.reduce(0) { $0 + ($1.clickHouseRows?.count ?? 0) })
        for batch in group { rows += batch.clickHouseRows ?? [] }
        do {
            try clickHouse.insert(rows)
            // Then its crashes into the browser's sums: if that fails, the 503 brings the batch again.
            try ClickHouseCrashIndex.add(group.flatMap(\.crashKeys), to: clickHouse)
            for batch in group {
                batch.answer.succeed(Response(status: 200, body: "{\"inserted\":\(batch.rows.count)}"))
            }
        } catch {
            var failed = Response(status: 503, body: "{\"error\":\(JSONText.quoted("\(error)"))}")
            failed.extraHeaders.append(("Retry-After", "5"))
            for batch in group { batch.answer.succeed(failed) }
        }
    }

    private func insertAlone(_ rows: [(id: String, payload: String)]) -> Response {
        guard let store else { return Response(status: 500, body: "{\"error\":\"no store\"}") }
        do {
            return Self.stored(try store.insert(rows))
        } catch {
            return Response(status: 500, body: "{\"error\":\(JSONText.quoted("\(error)"))}")
        }
    }

    static func stored(_ result: EventStore.InsertResult) -> Response {
        Response(status: 200, body: "{\"inserted\":\(result.inserted),\"duplicates\":\(result.duplicates)}")
    }
}
