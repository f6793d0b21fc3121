package import CrashCapture
internal import CrashFileFormat
internal import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// A small HTTP/1.1 server that accepts the Sensors Analytics wire format at `/sa`, verifies
/// crc and gzip, de-duplicates by event id, stores events in SQLite in arrival order and
/// serves them back as JSON lines at `/events`. For development and for our own tests.
/// `@unchecked`: the listening socket and settings are fixed after init; the fault counters
/// and the upload count are under `lock`, and the store has its own.
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
        package init() {}
    }

    package static let maximumBody = 32 << 20
    static let maximumHeader = 64 << 10

    package let store: EventStore
    package private(set) var port: UInt16 = 0
    let host: String
    let faults: Faults
    private var listener: Int32 = -1
    private let lock = NSLock()
    private var uploadCount = 0
    private var stopped = false
    private let connections = DispatchSemaphore(value: 64)

    package init(host: String = "127.0.0.1", port: UInt16, databasePath: String, faults: Faults = Faults()) throws {
        store = try EventStore(path: databasePath, limits: .init(maximumEvents: .max, maximumBytes: .max))
        self.host = host
        self.faults = faults
        try bind(port)
    }

    private func bind(_ requested: UInt16) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw CrashCaptureError.system("cannot create a socket") }
        var yes: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = requested.bigEndian
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else {
            close(fd)
            throw CrashCaptureError.invalidArgument("\(host) is not an IPv4 address")
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard bound == 0, listen(fd, 128) == 0 else {
            let failure = CrashCaptureError.system(
                "cannot listen on \(host):\(requested); pick a free port, or 0 for any")
            close(fd)
            throw failure
        }
        var actual = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        port = UInt16(bigEndian: actual.sin_port)
        listener = fd
    }

    package var url: String { "http://\(host):\(port)/sa" }

    /// Serves on a background thread until `stop()`.
    package func start() {
        let thread = Thread { [self] in serve() }
        thread.name = "collector-accept"
        thread.start()
    }

    /// Serves on the calling thread until `stop()`.
    package func serve() {
        while true {
            let client = accept(listener, nil, nil)
            if client < 0 {
                if errno == EINTR { continue }
                lock.lock()
                let done = stopped
                lock.unlock()
                if done { return }
                usleep(1000)
                continue
            }
            _ = fcntl(client, F_SETFD, FD_CLOEXEC)
            var timeout = timeval(tv_sec: 30, tv_usec: 0)
            setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
            var noDelay: Int32 = 1
            setsockopt(client, Int32(IPPROTO_TCP), TCP_NODELAY, &noDelay, socklen_t(MemoryLayout<Int32>.size))
            connections.wait()
            DispatchQueue.global().async {
                self.handle(connection: client)
                close(client)
                self.connections.signal()
            }
        }
    }

    package func stop() {
        lock.lock()
        stopped = true
        lock.unlock()
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }

    struct Request {
        var method: String
        var target: String
        var headers: [String: String]
        var body: Data
        /// The target without its query.
        var path: String { target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? target }
    }

    struct Response {
        var status: Int
        var data: Data
        var contentType: String

        init(status: Int, body: String, contentType: String = "application/json") {
            self.init(status: status, data: Data(body.utf8), contentType: contentType)
        }

        init(status: Int, data: Data, contentType: String) {
            self.status = status
            self.data = data
            self.contentType = contentType
        }
    }

    private func handle(connection fd: Int32) {
        var buffer = Data()
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let request: Request
            switch readRequest(fd, &buffer, &chunk) {
            case .closed: return
            case .failed(let response):
                write(fd, response, keepAlive: false)
                return
            case .request(let parsed): request = parsed
            }
            // Faults are for uploads: reading /events or /health neither triggers nor uses them up.
            var upload: Int?
            if request.method == "POST" && request.path == "/sa" {
                lock.lock()
                upload = uploadCount
                uploadCount += 1
                lock.unlock()
            }
            if let upload, upload < faults.dropFirst { return }
            if upload != nil, faults.delayMilliseconds > 0 { usleep(UInt32(faults.delayMilliseconds) * 1000) }
            let response: Response
            if let upload, upload < faults.dropFirst + faults.failFirst {
                response = Response(status: faults.failStatus, body: "{\"error\":\"fault injected\"}")
            } else {
                response = route(request)
            }
            let keepAlive = request.headers["connection"]?.lowercased() != "close"
            write(fd, response, keepAlive: keepAlive)
            if !keepAlive { return }
        }
    }

    enum ReadResult {
        case request(Request)
        case failed(Response)
        case closed
    }

    private func readRequest(_ fd: Int32, _ buffer: inout Data, _ chunk: inout [UInt8]) -> ReadResult {
        let separator = Data("\r\n\r\n".utf8)
        var headerEnd: Range<Data.Index>?
        while true {
            headerEnd = buffer.range(of: separator)
            if headerEnd != nil { break }
            if buffer.count > Self.maximumHeader {
                return .failed(Response(status: 431, body: "{\"error\":\"request header larger than 64 KiB\"}"))
            }
            guard receive(fd, into: &buffer, &chunk) else { return .closed }
        }
        let head = String(decoding: buffer[buffer.startIndex..<headerEnd!.lowerBound], as: UTF8.self)
        buffer.removeSubrange(buffer.startIndex..<headerEnd!.upperBound)
        var lines = head.components(separatedBy: "\r\n")
        let requestLine = lines.removeFirst().split(separator: " ")
        guard requestLine.count == 3, requestLine[2].hasPrefix("HTTP/1.") else {
            return .failed(Response(status: 400, body: "{\"error\":\"malformed request line\"}"))
        }
        var headers: [String: String] = [:]
        for line in lines {
            guard let colon = line.firstIndex(of: ":") else {
                return .failed(Response(status: 400, body: "{\"error\":\"malformed header line\"}"))
            }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(
                in: .whitespaces)
        }
        if headers["transfer-encoding"] != nil {
            return .failed(
                Response(status: 411, body: "{\"error\":\"send a Content-Length; chunked bodies are not taken\"}"))
        }
        let length = Int(headers["content-length"] ?? "0") ?? -1
        guard length >= 0 else { return .failed(Response(status: 400, body: "{\"error\":\"bad Content-Length\"}")) }
        guard length <= Self.maximumBody else {
            return .failed(Response(status: 413, body: "{\"error\":\"body larger than \(Self.maximumBody) bytes\"}"))
        }
        if headers["expect"]?.lowercased() == "100-continue" {
            let continueLine = "HTTP/1.1 100 Continue\r\n\r\n"
            _ = continueLine.withCString { Glibc.send(fd, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
        }
        while buffer.count < length {
            guard receive(fd, into: &buffer, &chunk) else { return .closed }
        }
        let body = buffer.prefix(length)
        buffer.removeFirst(length)
        return .request(
            Request(method: String(requestLine[0]), target: String(requestLine[1]), headers: headers, body: Data(body)))
    }

    /// Reads what has arrived into `buffer`, through the connection's one `chunk`.
    private func receive(_ fd: Int32, into buffer: inout Data, _ chunk: inout [UInt8]) -> Bool {
        while true {
            let count = recv(fd, &chunk, chunk.count, 0)
            if count > 0 {
                buffer.append(contentsOf: chunk[0..<count])
                return true
            }
            if count < 0 && errno == EINTR { continue }
            return false
        }
    }

    private func write(_ fd: Int32, _ response: Response, keepAlive: Bool) {
        let reason =
            [
                200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 411: "Length Required",
                413: "Payload Too Large", 431: "Request Header Fields Too Large",
            ][response.status] ?? "Status"
        let body = response.data
        var head = "HTTP/1.1 \(response.status) \(reason)\r\nContent-Type: \(response.contentType)\r\n"
        head += "Content-Length: \(body.count)\r\nConnection: \(keepAlive ? "keep-alive" : "close")\r\n\r\n"
        var bytes = Data(head.utf8)
        bytes.append(body)
        bytes.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let sent = Glibc.send(fd, raw.baseAddress! + offset, raw.count - offset, Int32(MSG_NOSIGNAL))
                if sent < 0 && errno == EINTR { continue }
                if sent <= 0 { return }
                offset += sent
            }
        }
    }

    func route(_ request: Request) -> Response {
        let path = request.path
        switch (request.method, path) {
        case ("POST", "/sa"): return ingest(request.body)
        // The web SDK's image beacon: the record in the query, a 1×1 GIF back.
        case ("GET", "/sa.gif"), ("GET", "/sa"):
            let query = request.target.split(separator: "?", maxSplits: 1).dropFirst().first.map(String.init) ?? ""
            let answer = ingest(Data(query.utf8))
            guard answer.status == 200, path == "/sa.gif" else { return answer }
            return Response(status: 200, data: Self.transparentGIF, contentType: "image/gif")
        case ("GET", "/events"): return listEvents(request.target)
        case ("GET", "/health"): return Response(status: 200, body: "{\"status\":\"ok\",\"events\":\(store.count)}")
        case (_, "/sa"), (_, "/events"), (_, "/health"):
            return Response(status: 405, body: "{\"error\":\"method \(request.method) not allowed on \(path)\"}")
        default: return Response(status: 404, body: "{\"error\":\"no route \(path); POST /sa, GET /events\"}")
        }
    }

    /// The smallest transparent GIF, as beacons expect (43 bytes).
    static let transparentGIF = Data(base64Encoded: "R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")!

    func ingest(_ body: Data) -> Response {
        let rows: [(id: String, text: String)]
        do {
            rows = try WireFormat.decodeEvents(body: body)
        } catch {
            return Response(status: 400, body: "{\"error\":\(JSONText.quoted("\(error)"))}")
        }
        do {
            // Stored exactly as each event arrived.
            let result = try store.insert(rows.map { (id: $0.id, payload: $0.text) })
            return Response(status: 200, body: "{\"inserted\":\(result.inserted),\"duplicates\":\(result.duplicates)}")
        } catch {
            return Response(status: 500, body: "{\"error\":\(JSONText.quoted("\(error)"))}")
        }
    }

    func listEvents(_ target: String) -> Response {
        let query = URLComponents(string: "http://x" + target)?.queryItems ?? []
        let after = Int64(query.first { $0.name == "after" }?.value ?? "0") ?? 0
        let limit = min(Int(query.first { $0.name == "limit" }?.value ?? "100000") ?? 100_000, 1_000_000)
        guard let events = try? store.events(after: after, limit: limit) else {
            return Response(status: 500, body: "{\"error\":\"cannot read the store\"}")
        }
        let lines = events.map(\.payload).joined(separator: "\n")
        return Response(status: 200, body: lines.isEmpty ? "" : lines + "\n", contentType: "application/x-ndjson")
    }
}
