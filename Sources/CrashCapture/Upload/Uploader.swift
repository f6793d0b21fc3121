package import Foundation

/// When and how stored events are sent.
public struct UploadOptions: Sendable {
    /// Flush once this many events are cached.
    public var flushBulkSize = 100
    /// And at least this often.
    public var flushInterval: Duration = .seconds(15)
    /// Events per request.
    public var batchSize = 50
    /// How long one request may take before it counts as failed and is retried.
    public var requestTimeout: Duration = .seconds(10)
    /// Retries wait base × 2^(failures-1), with jitter, up to the maximum.
    public var retryBaseDelay: Duration = .seconds(1)
    /// The longest wait between retries.
    public var retryMaximumDelay: Duration = .seconds(300)
    /// How long exit may spend on a last upload.
    public var exitFlushTimeout: Duration = .seconds(2)
    /// Plain http to a host that is not this machine is refused unless this is set.
    public var allowInsecureHTTP = false
    /// Headers every upload request carries besides its own: a hosted OTLP backend's API key,
    /// say (`["x-api-key": "…"]`). With `otlpURL` set and none given here, the SDK reads them
    /// from `OTEL_EXPORTER_OTLP_LOGS_HEADERS` or `OTEL_EXPORTER_OTLP_HEADERS` (`k=v,k2=v2`).
    public var headers: [String: String] = [:]

    /// The defaults of the Sensors Analytics SDKs: flush at 100 events or every 15 s, 50 a request.
    public init() {}

    func validate() throws {
        guard flushBulkSize > 0, batchSize > 0 else {
            throw CrashCaptureError.invalidArgument("flushBulkSize and batchSize must be positive")
        }
        guard flushInterval > .zero, requestTimeout > .zero, retryBaseDelay > .zero,
            retryMaximumDelay >= retryBaseDelay, exitFlushTimeout >= .zero
        else { throw CrashCaptureError.invalidArgument("upload intervals and timeouts must be positive") }
        let reserved: Set<String> = ["host", "content-type", "content-length", "content-encoding", "transfer-encoding"]
        for (name, value) in headers {
            // Written as they are into the request: a name must be a token, and no value may
            // carry a line break into the request's head.
            let token =
                !name.isEmpty
                && name.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7f && !"()<>@,;:\\\"/[]?={}".utf8.contains($0) }
            guard token, !reserved.contains(name.lowercased()) else {
                throw CrashCaptureError.invalidArgument("\"\(name)\" cannot be an upload header")
            }
            guard !value.utf8.contains(where: { $0 == 0x0d || $0 == 0x0a || $0 == 0 }) else {
                throw CrashCaptureError.invalidArgument("the value of upload header \"\(name)\" holds a line break")
            }
        }
    }
}

/// The protocol an uploader speaks.
package enum UploadFormat: Sendable, Equatable {
    /// The Sensors Analytics wire format (`WireFormat`), to a Sensors server or `crashcap collect`.
    case sensorsAnalytics
    /// OTLP/HTTP logs, protobuf and gzip (`OTLPEncoding`), to an OpenTelemetry Collector or any
    /// OTLP receiver.
    case openTelemetryLogs

    var contentType: String {
        switch self {
        case .sensorsAnalytics: WireFormat.contentType
        case .openTelemetryLogs: OTLPEncoding.contentType
        }
    }

    /// Headers beyond the content type: OTLP's body is gzip'd as a whole request.
    var headers: [(String, String)] {
        switch self {
        case .sensorsAnalytics: []
        case .openTelemetryLogs: [("Content-Encoding", "gzip")]
        }
    }
}

/// Sends stored events in order, one batch at a time, in the Sensors Analytics wire format
/// or as OTLP logs.
/// 2xx deletes the batch; 5xx, 403, 404, 408, 429 and network errors keep it and retry with
/// exponential backoff and jitter; any other 4xx means the server will never take this batch:
/// its events move to the store's `rejected_events` table instead of blocking the queue.
/// `@unchecked`: the schedule, counters and timer are behind `lock`; sending runs on `queue`.
package final class Uploader: @unchecked Sendable {
    package enum Outcome: Equatable, Sendable {
        case accepted
        /// Accepted, but the receiver refused this many records, saying why (OTLP's partial
        /// success); they are not sent again.
        case acceptedWithRefusals(Int, String)
        case retry(String)
        /// A 429 or 503 whose Retry-After asks for this many seconds at least.
        case retryAfter(String, Double)
        case rejected(Int, String)
    }

    package struct Statistics: Sendable {
        package var acceptedBatches = 0
        package var acceptedEvents = 0
        /// Records a receiver refused inside a batch it accepted (OTLP's partial success).
        package var refusedByReceiver = 0
        package var failedAttempts = 0
        package var rejectedBatches = 0
        /// Events the server refused for good (kept in `rejected_events`), one 413 at a time
        /// included.
        package var rejectedEvents = 0
        /// Batches answered 413 and sent again as two halves.
        package var splitBatches = 0
        package var lastError: String?
    }

    package let endpoint: URL
    package let options: UploadOptions
    package let format: UploadFormat
    let store: EventStore
    private let queue = DispatchQueue(label: "CrashCapture.uploader", qos: .utility)
    private let lock = NSLock()
    private var flushScheduled = false
    private var failures = 0
    private var retryAt = Date.distantPast
    /// After a 413: the size the batch that was too large is sent in, halved again on each 413.
    private var claimLimit: Int?
    private var timer: DispatchSourceTimer?
    private var stats = Statistics()
    /// For `http://` endpoints: requests go out on the uploader's own thread (see
    /// `PlainHTTPConnection`); https goes through async-http-client.
    private let plainConnection: PlainHTTPConnection?

    /// False in a build without the package trait `HTTPUpload` (no HTTP client linked in).
    package static var canUpload: Bool { HTTPTransport.available }

    /// With `.openTelemetryLogs`, an `endpoint` without a path gets OTLP's `/v1/logs`.
    package init(
        endpoint given: URL, store: EventStore, options: UploadOptions, format: UploadFormat = .sensorsAnalytics
    )
        throws
    {
        guard Self.canUpload else {
            throw CrashCaptureError.invalidArgument(
                "this build of CrashCapture has no HTTP client (the package trait HTTPUpload is off)")
        }
        let endpoint = format == .openTelemetryLogs ? OTLPEncoding.logsEndpoint(given) : given
        try Self.validate(endpoint, allowInsecureHTTP: options.allowInsecureHTTP)
        try options.validate()
        self.format = format
        self.endpoint = endpoint
        self.store = store
        self.options = options
        plainConnection = endpoint.scheme?.lowercased() == "http" ? PlainHTTPConnection(endpoint: endpoint) : nil
    }

    deinit { timer?.cancel() }

    /// https, or http only to this machine (or when explicitly allowed).
    /// The endpoint as it may appear in output and logs: no user info, no `token` value.
    package static func redacted(_ url: URL) -> String {
        guard var components = URLComponents(url: url, resolvingAgainstBaseURL: false) else { return "(a URL)" }
        if components.user != nil || components.password != nil {
            components.user = nil
            components.password = nil
        }
        components.queryItems = components.queryItems?.map { item in
            item.name.lowercased() == "token" ? URLQueryItem(name: item.name, value: "redacted") : item
        }
        return components.string ?? "(a URL)"
    }

    package static func validate(_ url: URL, allowInsecureHTTP: Bool) throws {
        guard let scheme = url.scheme?.lowercased(), let host = url.host, !host.isEmpty else {
            throw CrashCaptureError.invalidArgument("server URL \(redacted(url)) needs a scheme and a host")
        }
        switch scheme {
        case "https": return
        case "http":
            let loopback = host == "localhost" || host.hasPrefix("127.") || host == "::1" || host == "[::1]"
            if loopback || allowInsecureHTTP { return }
            throw CrashCaptureError.invalidArgument(
                "server URL \(redacted(url)) uses plain http to another machine; use https, or allow plain http "
                    + "explicitly (crashcap: --allow-insecure-http; the SDK: UploadOptions.allowInsecureHTTP)")
        default:
            throw CrashCaptureError.invalidArgument("server URL \(redacted(url)) must be http or https")
        }
    }

    package var statistics: Statistics {
        lock.lock()
        defer { lock.unlock() }
        return stats
    }

    /// Starts the periodic flush.
    package func start() {
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(deadline: .now() + options.flushInterval.seconds, repeating: options.flushInterval.seconds)
        timer.setEventHandler { [weak self] in self?.flush(deadline: nil) }
        timer.resume()
        self.timer = timer
    }

    func noteInserted() {
        if store.count >= options.flushBulkSize { requestFlush() }
    }

    /// Schedules one flush on the upload queue; requests while one is pending coalesce.
    package func requestFlush() {
        lock.lock()
        let schedule = !flushScheduled
        flushScheduled = true
        lock.unlock()
        guard schedule else { return }
        queue.async {
            self.lock.lock()
            self.flushScheduled = false
            self.lock.unlock()
            self.flush(deadline: nil)
        }
    }

    /// Told of each failed attempt before the wait that follows it: the failures in a row,
    /// why, and the seconds until the next try. For a tool that shows its progress.
    package var onRetry: (@Sendable (_ failures: Int, _ reason: String, _ delaySeconds: Double) -> Void)?

    /// Sends everything now, on the calling thread's behalf, until done, a failure, or the deadline.
    /// Returns by `deadline` even when a background upload is still waiting on a server that
    /// does not answer: the exit flush's bound holds whatever is on the wire.
    package func flushNow(deadline: Date) {
        let done = DispatchSemaphore(value: 0)
        queue.async {
            self.flush(deadline: deadline)
            done.signal()
        }
        _ = done.wait(timeout: .now() + max(0, deadline.timeIntervalSinceNow))
    }

    private func flush(deadline: Date?) {
        lock.lock()
        let waiting = retryAt
        lock.unlock()
        // During backoff only the exit flush tries again; the scheduled retry comes later.
        if deadline == nil && Date() < waiting { return }
        var current = prepareNext(completing: nil)
        // The last accepted batch, whose events leave the store in the same transaction that
        // claims the batch after next (or at the end).
        var accepted: EventStore.Batch?
        defer {
            if let accepted { try? store.complete(accepted) }
        }
        while let (batch, body) = current {
            var timeout = options.requestTimeout.seconds
            if let deadline {
                timeout = min(timeout, deadline.timeIntervalSinceNow)
                if timeout <= 0.05 {
                    try? store.release(batch)
                    return
                }
            }
            // Only one request is on the wire at a time, so batches arrive in order; the local
            // bookkeeping (finishing the last batch, claiming and encoding the next) is done
            // while it is out.
            let request = post(body, timeout: timeout)
            let next = prepareNext(completing: accepted)
            accepted = nil
            let outcome = request.outcome()
            lock.lock()
            switch outcome {
            case .accepted, .acceptedWithRefusals:
                if case .acceptedWithRefusals(let refused, let message) = outcome {
                    stats.refusedByReceiver += refused
                    stats.lastError = "the receiver refused \(refused) records: \(message)"
                    CrashCapture.logger.warning(
                        "the receiver took the batch but refused some of its records",
                        metadata: ["refused": "\(refused)", "message": "\(message)"])
                }
                failures = 0
                retryAt = .distantPast
                claimLimit = nil
                stats.acceptedBatches += 1
                stats.acceptedEvents += batch.events.count
                lock.unlock()
                accepted = batch
            case .rejected(413, _) where batch.events.count > 1:
                // Too large for the server: the same events again, in halves, until each half
                // passes or a single event is left to be set aside.
                stats.splitBatches += 1
                claimLimit = max(1, batch.events.count / 2)
                lock.unlock()
                if let (claimed, _) = next { try? store.release(claimed) }
                try? store.release(batch)
                current = prepareNext(completing: nil)
                continue
            case .rejected(let status, let reason):
                stats.rejectedBatches += 1
                stats.rejectedEvents += batch.events.count
                stats.lastError = "HTTP \(status): \(reason)"
                lock.unlock()
                try? store.reject(batch, status: status, reason: reason)
            case .retry, .retryAfter:
                let (reason, asked): (String, Double) =
                    switch outcome {
                    case .retryAfter(let text, let seconds): (text, seconds)
                    case .retry(let text): (text, 0)
                    default: ("", 0)
                    }
                failures += 1
                stats.failedAttempts += 1
                stats.lastError = reason
                // The server's Retry-After wins over our backoff, within our longest delay.
                let delay = max(
                    Self.backoff(failures: failures, options: options), min(asked, options.retryMaximumDelay.seconds))
                retryAt = Date().addingTimeInterval(delay)
                let attempt = failures
                lock.unlock()
                onRetry?(attempt, reason, delay)
                // The next batch goes back too: nothing may overtake the one that failed.
                if let (claimed, _) = next { try? store.release(claimed) }
                try? store.release(batch)
                guard let deadline else {
                    queue.asyncAfter(deadline: .now() + delay) { self.flush(deadline: nil) }
                    return
                }
                // A flush with a deadline (at exit) keeps trying, with the same backoff, while time remains.
                guard deadline.timeIntervalSinceNow > delay + 0.05 else { return }
                Thread.sleep(forTimeInterval: delay)
                current = prepareNext(completing: nil)
                continue
            }
            current = next
        }
    }

    /// Finishes an accepted batch and claims the oldest events not yet in flight, with their
    /// request body.
    private func prepareNext(completing finished: EventStore.Batch?) -> (EventStore.Batch, Data)? {
        let claimed: EventStore.Batch?
        do {
            claimed = try store.completeAndClaim(finished, limit: lock.withLock { claimLimit ?? options.batchSize })
        } catch {
            if let finished { try? store.complete(finished) }
            return nil
        }
        guard let batch = claimed else { return nil }
        guard let body = try? encode(batch) else {
            try? store.release(batch)
            return nil
        }
        return (batch, body)
    }

    /// The request body; `_flush_time` is added to each event as it leaves.
    func encode(_ batch: EventStore.Batch) throws -> Data {
        if format == .openTelemetryLogs {
            return try OTLPEncoding.body(
                events: batch.events.map(\.payload),
                observedNanoseconds: UInt64(Date().timeIntervalSince1970 * 1e9))
        }
        return try WireFormat.encode(
            events: batch.events.map(\.payload),
            addingToEach: "\"_flush_time\":\(Int64(Date().timeIntervalSince1970 * 1000))")
    }

    /// Retry-After as seconds or as an HTTP date; nil when it is neither.
    static func retryAfterSeconds(_ value: String) -> Double? {
        let text = value.trimmingCharacters(in: .whitespaces)
        if let seconds = Double(text), seconds >= 0 { return seconds }
        let format = DateFormatter()
        format.locale = Locale(identifier: "en_US_POSIX")
        format.timeZone = TimeZone(identifier: "GMT")
        format.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = format.date(from: text) else { return nil }
        return max(0, date.timeIntervalSinceNow)
    }

    static func backoff(failures: Int, options: UploadOptions) -> Double {
        let exponential = options.retryBaseDelay.seconds * pow(2, Double(min(failures, 30) - 1))
        return min(exponential, options.retryMaximumDelay.seconds) * Double.random(in: 0.5...1.0)
    }

    /// One request for one batch, on the upload queue like every other (the plain http
    /// connection is one socket, used by one request at a time).
    package func send(_ batch: EventStore.Batch, timeout: Double) -> Outcome {
        queue.sync {
            do {
                return post(try encode(batch), timeout: timeout).outcome()
            } catch {
                return .retry("cannot encode the batch: \(error)")
            }
        }
    }

    /// The format's own headers, then the configured ones, in a stable order.
    var requestHeaders: [(String, String)] {
        format.headers + options.headers.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
    }

    /// OpenTelemetry's headers variables (`k=v,k2=v2`, values percent-encoded): the logs one,
    /// else the general one; empty when neither is set.
    package static func otlpHeadersFromEnvironment(
        _ environment: [String: String] = ProcessInfo.processInfo.environment
    ) -> [String: String] {
        guard
            let text = environment["OTEL_EXPORTER_OTLP_LOGS_HEADERS"] ?? environment["OTEL_EXPORTER_OTLP_HEADERS"],
            !text.isEmpty
        else { return [:] }
        var headers: [String: String] = [:]
        for pair in text.split(separator: ",") {
            let parts = pair.split(separator: "=", maxSplits: 1)
            guard parts.count == 2 else { continue }
            let name = parts[0].trimmingCharacters(in: .whitespaces)
            let value = parts[1].trimmingCharacters(in: .whitespaces)
            headers[name] = value.removingPercentEncoding ?? value
        }
        return headers
    }

    /// A request on its way; `outcome()` waits for its answer.
    struct InFlight {
        let outcome: () -> Outcome
    }

    func post(_ body: Data, timeout: Double) -> InFlight {
        guard let plainConnection else {
            return HTTPTransport.post(
                body, to: endpoint, contentType: format.contentType, headers: requestHeaders, timeout: timeout)
        }
        let answer = plainConnection.post(
            body, contentType: format.contentType, headers: requestHeaders, timeout: timeout)
        let otlp = format == .openTelemetryLogs
        return InFlight {
            switch answer() {
            case .success(let response):
                Self.classify(
                    status: response.status, body: response.body, retryAfter: response.retryAfter,
                    otlp: otlp)
            case .failure(let failure): .retry("network error: \(failure)")
            }
        }
    }

    /// `body`: the start of the answer. An OTLP receiver's 200 may say that it refused some
    /// records (a partial success), which is not to be sent again.
    static func classify(status: Int, body: [UInt8], retryAfter: String? = nil, otlp: Bool = false) -> Outcome {
        if otlp, (200..<300).contains(status), let (refused, message) = OTLPEncoding.refusals(in: body) {
            return .acceptedWithRefusals(refused, message)
        }
        // A message's worth of the answer: an error page is cut where a person stops reading.
        return classify(status: status, text: String(decoding: body.prefix(300), as: UTF8.self), retryAfter: retryAfter)
    }

    static func classify(status: Int, text: String, retryAfter: String? = nil) -> Outcome {
        switch status {
        case 200..<300: return .accepted
        case 429, 503:
            guard let seconds = retryAfter.flatMap(Self.retryAfterSeconds) else {
                return .retry("HTTP \(status): \(text)")
            }
            return .retryAfter("HTTP \(status), retry after \(Int(seconds)) s: \(text)", seconds)
        case 403, 404, 408, 500..<600: return .retry("HTTP \(status): \(text)")
        case 400..<500: return .rejected(status, text)
        default: return .retry("unexpected HTTP \(status)")
        }
    }
}

/// A mutable box for a value handed across a completion handler. `@unchecked`: the writer and
/// the reader are ordered by the semaphore or queue that hands the value over.
final class Box<T>: @unchecked Sendable {
    var value: T
    init(_ value: T) { self.value = value }
}

extension Duration {
    /// The duration in seconds, for the clocks and timers that count in them.
    package var seconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
