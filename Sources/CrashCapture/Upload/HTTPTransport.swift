internal import Foundation

#if HTTPUpload
    import AsyncHTTPClient
    import NIOCore
    import NIOHTTP1
    import NIOPosix

    /// The uploader's requests, through async-http-client.
    enum HTTPTransport {
        static let available = true

        /// One client for every uploader in the process, on one event-loop thread of its own,
        /// never shut down (so no uploader has to outlive its requests). Each request carries its
        /// own deadline; a redirect is not followed (the events would go somewhere not configured).
        fileprivate static let client: HTTPClient = {
            var configuration = HTTPClient.Configuration(redirectConfiguration: .disallow)
            configuration.connectionPool = .init(
                idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 1)
            return HTTPClient(
                eventLoopGroupProvider: .shared(MultiThreadedEventLoopGroup(numberOfThreads: 1)),
                configuration: configuration)
        }()

        static func post(
            _ body: Data, to endpoint: URL, contentType: String, headers extra: [(String, String)], timeout: Double
        ) -> Uploader.InFlight {
            let done = DispatchSemaphore(value: 0)
            let result = Box<Uploader.Outcome>(.retry("no response"))
            let request: HTTPClient.Request
            do {
                var headers = HTTPHeaders([("Content-Type", contentType)])
                headers.add(contentsOf: extra)
                request = try HTTPClient.Request(url: endpoint, method: .POST, headers: headers, body: .data(body))
            } catch {
                let reason = "cannot make a request to \(Uploader.redacted(endpoint)): \(error)"
                return Uploader.InFlight { .retry(reason) }
            }
            let task = client.execute(
                request: request, delegate: StatusAndText(), deadline: .now() + .nanoseconds(Int64(timeout * 1e9)))
            task.futureResult.whenComplete { response in
                switch response {
                case .success(let (status, body, retryAfter)):
                    result.value = Uploader.classify(
                        status: status, body: body, retryAfter: retryAfter,
                        otlp: contentType == OTLPEncoding.contentType)
                case .failure(let error): result.value = .retry("network error: \(error)")
                }
                done.signal()
            }
            return Uploader.InFlight {
                // The request's own deadline ends it; this wait is only a backstop.
                if done.wait(timeout: .now() + timeout + 1) == .timedOut {
                    task.cancel()
                    return .retry("timed out after \(timeout) s")
                }
                return result.value
            }
        }
    }

    extension HTTPTransport {
        /// One POST whose answer (status, the start of its body, Retry-After) the caller reads
        /// itself: the minidump upload wants the body's event id.
        static func exchange(
            _ body: Data, to endpoint: URL, contentType: String, headers extra: [(String, String)], timeout: Double
        ) -> HTTPExchange {
            let done = DispatchSemaphore(value: 0)
            let result = Box<HTTPExchange>(.failed("no response"))
            let request: HTTPClient.Request
            do {
                var headers = HTTPHeaders([("Content-Type", contentType)])
                headers.add(contentsOf: extra)
                request = try HTTPClient.Request(url: endpoint, method: .POST, headers: headers, body: .data(body))
            } catch {
                return .failed("cannot make a request to \(Uploader.redacted(endpoint)): \(error)")
            }
            let task = client.execute(
                request: request, delegate: StatusAndText(), deadline: .now() + .nanoseconds(Int64(timeout * 1e9)))
            task.futureResult.whenComplete { response in
                switch response {
                case .success(let answer): result.value = .answer(answer.status, answer.body, answer.retryAfter)
                case .failure(let error): result.value = .failed("network error: \(error)")
                }
                done.signal()
            }
            if done.wait(timeout: .now() + timeout + 1) == .timedOut {
                task.cancel()
                return .failed("timed out after \(timeout) s")
            }
            return result.value
        }
    }

    /// Keeps a response's status and the start of its body (for the error message), and lets
    /// the rest go by: a server's answer never grows memory. `@unchecked`: async-http-client
    /// calls a delegate on one event loop, one callback at a time.
    private final class StatusAndText: HTTPClientResponseDelegate, @unchecked Sendable {
        typealias Response = (status: Int, body: [UInt8], retryAfter: String?)
        private static let keep = 4096
        private var status = 0
        private var retryAfter: String?
        private var start = ByteBuffer()

        func didReceiveHead(task: HTTPClient.Task<Response>, _ head: HTTPResponseHead) -> EventLoopFuture<Void> {
            status = Int(head.status.code)
            retryAfter = head.headers.first(name: "retry-after")
            return task.eventLoop.makeSucceededVoidFuture()
        }

        func didReceiveBodyPart(task: HTTPClient.Task<Response>, _ buffer: ByteBuffer) -> EventLoopFuture<Void> {
            var part = buffer
            if let slice = part.readSlice(length: min(part.readableBytes, Self.keep - start.readableBytes)) {
                start.writeImmutableBuffer(slice)
            }
            return task.eventLoop.makeSucceededVoidFuture()
        }

        func didFinishRequest(task: HTTPClient.Task<Response>) throws -> Response {
            (status, Array(start.readableBytesView), retryAfter)
        }
    }
#else
    /// A build without the package trait `HTTPUpload`: no HTTP client, events stay in the store.
    enum HTTPTransport {
        static let available = false

        static func post(
            _ body: Data, to endpoint: URL, contentType: String, headers: [(String, String)], timeout: Double
        ) -> Uploader.InFlight {
            Uploader.InFlight { .retry("this build has no HTTP client (the package trait HTTPUpload is off)") }
        }

        static func exchange(
            _ body: Data, to endpoint: URL, contentType: String, headers: [(String, String)], timeout: Double
        ) -> HTTPExchange {
            .failed("this build has no HTTP client (the package trait HTTPUpload is off)")
        }
    }
#endif
