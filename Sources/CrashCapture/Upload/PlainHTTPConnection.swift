internal import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// One keep-alive HTTP/1.1 connection over a plain socket, for `http://` endpoints (a collector
/// or sidecar on this machine, or where `allowInsecureHTTP` allows). The request is written
/// on the uploader's own thread and its answer read there, with no event loop between: the
/// uploader keeps one request on the wire, so every hand-over between threads is on the path
/// of every batch. Through async-http-client a loopback request took 0.2-0.3 ms longer than
/// from a plain client (`crashcap-bench upload`); https still goes through it.
/// `@unchecked`: used by one uploader's queue at a time; `close()` may come from a timeout's
/// cancel, under `lock`.
final class PlainHTTPConnection: @unchecked Sendable {
    let host: String
    let port: String
    /// The request target: the path and the query.
    let target: String
    let hostHeader: String
    private let lock = NSLock()
    private var socket: Int32 = -1
    /// Whether the socket carried a request before the one now on it: a server may have closed
    /// it since.
    private var reused = false

    /// Longest response head taken; a response's body is kept to its first `keptBody` bytes
    /// (enough for an OTLP receiver's partial success and its message).
    static let maximumHead = 64 << 10
    static let keptBody = 4096

    init(endpoint: URL) {
        let name = endpoint.host ?? "localhost"
        host = name.hasPrefix("[") ? String(name.dropFirst().dropLast()) : name
        port = String(endpoint.port ?? 80)
        let path = endpoint.path.isEmpty ? "/" : endpoint.path
        target = path + (endpoint.query.map { "?" + $0 } ?? "")
        let shown = host.contains(":") ? "[\(host)]" : host
        hostHeader = endpoint.port.map { "\(shown):\($0)" } ?? shown
    }

    deinit { close() }

    struct Failure: Error, CustomStringConvertible {
        var description: String
        /// Nothing of a response arrived on a connection that had carried one before: the
        /// server most likely closed it while idle, and the request may be sent again at once.
        var staleConnection = false
        /// The server answered, or stopped reading, before the whole request was sent (a
        /// server refusing a body too large answers 413 at once): its answer is read, then the
        /// connection closed.
        var answeredEarly = false
    }

    /// The answer: status, the start of the body (as bytes, and as text), and Retry-After.
    struct Response {
        var status: Int
        var body: [UInt8]
        var retryAfter: String?
        var text: String { String(decoding: body, as: UTF8.self) }
    }

    /// Sends one POST and returns its answer, reading it only when the returned function is
    /// called, so that the caller can work while the request is out. A kept connection found
    /// closed by the server is replaced and the request sent once more.
    func post(_ body: Data, contentType: String, headers: [(String, String)] = [], timeout: Double) -> () -> Result<
        Response, Failure
    > {
        let deadline = Self.now() + timeout
        let request = requestBytes(body, contentType: contentType, headers: headers)
        var failure = send(request, deadline: deadline)
        if let stale = failure, stale.staleConnection { failure = send(request, deadline: deadline) }
        if let failure {
            guard failure.answeredEarly else { return { .failure(failure) } }
            return { [self] in
                defer { close() }
                guard case .success(let response) = readResponse(deadline: deadline) else { return .failure(failure) }
                return .success(response)
            }
        }
        return { [self] in
            switch readResponse(deadline: deadline) {
            case .failure(let failure) where failure.staleConnection:
                if let again = send(request, deadline: deadline) { return .failure(again) }
                return readResponse(deadline: deadline)
            case let other: return other
            }
        }
    }

    func close() {
        lock.withLock {
            if socket >= 0 { Glibc.close(socket) }
            socket = -1
            reused = false
        }
    }

    private func requestBytes(_ body: Data, contentType: String, headers: [(String, String)]) -> [UInt8] {
        let extra = headers.map { "\($0.0): \($0.1)\r\n" }.joined()
        var bytes = Array(
            "POST \(target) HTTP/1.1\r\nHost: \(hostHeader)\r\nContent-Type: \(contentType)\r\n\(extra)Content-Length: \(body.count)\r\n\r\n"
                .utf8)
        bytes.append(contentsOf: body)
        return bytes
    }

    private func send(_ request: [UInt8], deadline: Double) -> Failure? {
        let (descriptor, wasReused): (Int32, Bool)
        do {
            (descriptor, wasReused) = try connection(deadline: deadline)
        } catch let failure as Failure {
            return failure
        } catch {
            return Failure(description: "\(error)")
        }
        var sent = 0
        while sent < request.count {
            let written = request.withUnsafeBytes { bytes in
                Glibc.send(descriptor, bytes.baseAddress! + sent, bytes.count - sent, Int32(MSG_NOSIGNAL))
            }
            if written > 0 {
                sent += written
            } else if written < 0 && (errno == EAGAIN || errno == EINTR) {
                // Writable again, or an answer before the whole request went out.
                if let failure = wait(descriptor, for: Int16(POLLOUT) | Int16(POLLIN), until: deadline) {
                    close()
                    return failure
                }
                var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
                if poll(&entry, 1, 0) > 0 && entry.revents & Int16(POLLIN) != 0 {
                    return Failure(description: "the server answered before the request was sent", answeredEarly: true)
                }
            } else {
                let reason = String(cString: strerror(errno))
                if sent > 0 { return Failure(description: "sending: \(reason)", answeredEarly: true) }
                close()
                return Failure(description: "sending: \(reason)", staleConnection: wasReused)
            }
        }
        return nil
    }

    /// The open connection, or a new one.
    private func connection(deadline: Double) throws -> (Int32, Bool) {
        // An open socket has carried a request before this one (each is used at once).
        if let open = lock.withLock({ socket >= 0 ? socket : nil }) {
            lock.withLock { reused = true }
            return (open, true)
        }
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_family = AF_UNSPEC
        var found: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, port, &hints, &found)
        guard status == 0, let first = found else {
            throw Failure(description: "cannot resolve \(host): \(String(cString: gai_strerror(status)))")
        }
        defer { freeaddrinfo(first) }
        var reason = "no address"
        var address: UnsafeMutablePointer<addrinfo>? = first
        while let candidate = address {
            address = candidate.pointee.ai_next
            let descriptor = Glibc.socket(
                candidate.pointee.ai_family,
                Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue)
                    | Int32(SOCK_NONBLOCK.rawValue), 0)
            guard descriptor >= 0 else {
                reason = String(cString: strerror(errno))
                continue
            }
            if Glibc.connect(descriptor, candidate.pointee.ai_addr, candidate.pointee.ai_addrlen) != 0
                && errno != EINPROGRESS
            {
                reason = String(cString: strerror(errno))
                Glibc.close(descriptor)
                continue
            }
            if let failure = wait(descriptor, for: Int16(POLLOUT), until: deadline) {
                reason = failure.description
                Glibc.close(descriptor)
                continue
            }
            var error: Int32 = 0
            var length = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(descriptor, SOL_SOCKET, SO_ERROR, &error, &length)
            if error != 0 {
                reason = String(cString: strerror(error))
                Glibc.close(descriptor)
                continue
            }
            var on: Int32 = 1
            setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
            lock.withLock {
                socket = descriptor
                reused = false
            }
            return (descriptor, false)
        }
        throw Failure(description: "cannot connect to \(hostHeader): \(reason)")
    }

    private func wait(_ descriptor: Int32, for events: Int16, until deadline: Double) -> Failure? {
        while true {
            let left = deadline - Self.now()
            if left <= 0 { return Failure(description: "timed out") }
            var entry = pollfd(fd: descriptor, events: events, revents: 0)
            let ready = poll(&entry, 1, Int32(min(left * 1000 + 1, Double(Int32.max))))
            if ready > 0 { return nil }
            if ready < 0 && errno != EINTR { return Failure(description: "poll: \(String(cString: strerror(errno)))") }
        }
    }

    /// Reads one response: its head, then its body by Content-Length, by chunks, or to the end
    /// of the connection. Anything malformed closes the connection.
    private func readResponse(deadline: Double) -> Result<Response, Failure> {
        guard let descriptor = lock.withLock({ socket >= 0 ? socket : nil }) else {
            return .failure(Failure(description: "connection closed"))
        }
        let wasReused = lock.withLock { reused }
        var reader = Reader(descriptor: descriptor, deadline: deadline, connection: self)
        do {
            var head: Head
            repeat {
                head = try reader.head()
            } while (100..<200).contains(head.status)  // an interim answer: the real one follows
            var text: [UInt8] = []
            func keep(_ bytes: ArraySlice<UInt8>) {
                text += bytes.prefix(max(0, Self.keptBody - text.count))
            }
            if head.status == 204 || head.status == 304 {
                // No body, whatever the headers say.
            } else if head.chunked {
                while true {
                    let line = try reader.line()
                    let size = line.split(separator: UInt8(ascii: ";")).first.flatMap {
                        Int(String(decoding: $0, as: UTF8.self).trimmingCharacters(in: .whitespaces), radix: 16)
                    }
                    guard let size, size >= 0 else { throw Failure(description: "malformed chunk size") }
                    if size == 0 {
                        while try !reader.line().isEmpty {}  // trailers
                        break
                    }
                    try reader.bytes(size, into: keep)
                    guard try reader.line().isEmpty else { throw Failure(description: "malformed chunk") }
                }
            } else if let length = head.contentLength {
                try reader.bytes(length, into: keep)
            } else {
                try reader.toEnd(into: keep)
                head.keepAlive = false
            }
            if !head.keepAlive { close() }
            return .success(
                Response(status: head.status, body: text, retryAfter: head.retryAfter))
        } catch var failure as Failure {
            failure.staleConnection = wasReused && reader.received == 0
            close()
            return .failure(failure)
        } catch {
            close()
            return .failure(Failure(description: "\(error)"))
        }
    }

    struct Head {
        var status: Int
        var contentLength: Int?
        var chunked = false
        var keepAlive: Bool
        var retryAfter: String?
    }

    /// Buffered reads from the socket, bounded by the deadline.
    private struct Reader {
        let descriptor: Int32
        let deadline: Double
        let connection: PlainHTTPConnection
        var buffer: [UInt8] = []
        var position = 0
        var received = 0

        /// More bytes into the buffer; false at the end of the connection.
        mutating func fill() throws -> Bool {
            if position > 0 && position == buffer.count {
                buffer.removeAll(keepingCapacity: true)
                position = 0
            }
            var chunk = [UInt8](repeating: 0, count: 16384)
            while true {
                let count = chunk.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
                if count > 0 {
                    buffer += chunk[0..<count]
                    received += count
                    return true
                }
                if count == 0 { return false }
                guard errno == EAGAIN || errno == EINTR else {
                    throw Failure(description: "receiving: \(String(cString: strerror(errno)))")
                }
                if let failure = connection.wait(descriptor, for: Int16(POLLIN), until: deadline) { throw failure }
            }
        }

        /// One line, without its CRLF.
        mutating func line() throws -> [UInt8] {
            while true {
                if let end = buffer[position...].firstIndex(of: UInt8(ascii: "\n")) {
                    var line = Array(buffer[position..<end])
                    if line.last == UInt8(ascii: "\r") { line.removeLast() }
                    position = end + 1
                    return line
                }
                guard buffer.count - position < PlainHTTPConnection.maximumHead else {
                    throw Failure(description: "response line too long")
                }
                guard try fill() else { throw Failure(description: "connection closed before the response ended") }
            }
        }

        mutating func head() throws -> Head {
            let status = try line()
            let parts = status.split(separator: UInt8(ascii: " "), maxSplits: 2)
            guard parts.count >= 2, parts[0].starts(with: Array("HTTP/1.".utf8)),
                let code = Int(String(decoding: parts[1], as: UTF8.self)), (100...999).contains(code)
            else {
                throw Failure(
                    description: "not an HTTP response: \(String(decoding: status.prefix(60), as: UTF8.self))")
            }
            var head = Head(status: code, keepAlive: parts[0].last != UInt8(ascii: "0"))
            var size = status.count
            while true {
                let field = try line()
                if field.isEmpty { return head }
                size += field.count
                guard size <= PlainHTTPConnection.maximumHead else {
                    throw Failure(description: "response head too large")
                }
                guard let colon = field.firstIndex(of: UInt8(ascii: ":")) else {
                    throw Failure(description: "malformed response header")
                }
                let name = String(decoding: field[..<colon], as: UTF8.self).lowercased()
                let value = String(decoding: field[(colon + 1)...], as: UTF8.self).trimmingCharacters(in: .whitespaces)
                switch name {
                case "content-length":
                    guard let length = Int(value), length >= 0, head.contentLength ?? length == length else {
                        throw Failure(description: "malformed Content-Length")
                    }
                    head.contentLength = length
                case "transfer-encoding": head.chunked = value.lowercased().contains("chunked")
                case "connection":
                    let tokens = value.lowercased()
                    if tokens.contains("close") { head.keepAlive = false }
                    if tokens.contains("keep-alive") { head.keepAlive = true }
                case "retry-after": head.retryAfter = value
                default: break
                }
            }
        }

        mutating func bytes(_ count: Int, into keep: (ArraySlice<UInt8>) -> Void) throws {
            var left = count
            while left > 0 {
                if position == buffer.count {
                    guard try fill() else { throw Failure(description: "connection closed before the response ended") }
                }
                let take = min(left, buffer.count - position)
                keep(buffer[position..<(position + take)])
                position += take
                left -= take
            }
        }

        mutating func toEnd(into keep: (ArraySlice<UInt8>) -> Void) throws {
            while true {
                keep(buffer[position...])
                position = buffer.count
                guard try fill() else { return }
            }
        }
    }

    static func now() -> Double {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
    }
}
