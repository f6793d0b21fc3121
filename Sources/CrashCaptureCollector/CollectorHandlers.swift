internal import Foundation
internal import NIOCore
internal import NIOHTTP1
internal import NIOPosix

/// Before the HTTP decoder: a request's head must arrive within a bound from its first byte,
/// so that a client sending one byte every few seconds cannot hold a connection for ever (the
/// idle timeout alone would never fire). The connection handler says when a head arrived and
/// when a request ended.
final class HeaderDeadline: ChannelInboundHandler, @unchecked Sendable {  // used on its event loop only
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundOut = ByteBuffer

    let collector: IngestCollector
    let timeout: TimeAmount
    let firstByteTimeout: TimeAmount
    private var waitingForHead = true
    private var timer: Scheduled<Void>?
    private var firstByteTimer: Scheduled<Void>?

    init(collector: IngestCollector, timeout: TimeAmount, firstByteTimeout: TimeAmount) {
        self.collector = collector
        self.timeout = timeout
        self.firstByteTimeout = firstByteTimeout
    }

    // A connection that never sends a byte is closed soon: it only holds a slot.
    func channelActive(context: ChannelHandlerContext) {
        let channel = context.channel
        firstByteTimer = context.eventLoop.scheduleTask(in: firstByteTimeout) { channel.close(promise: nil) }
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        firstByteTimer?.cancel()
        firstByteTimer = nil
        if waitingForHead && timer == nil {
            collector.requestBegan(on: context.channel)
            let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            timer = context.eventLoop.scheduleTask(in: timeout) {
                let (handler, context) = loopBound.value
                // Written from here, below the HTTP encoder: raw bytes straight to the socket.
                let body = "{\"error\":\"request head not received in time\"}"
                handler.answerAndClose(
                    context,
                    "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n"
                        + "Connection: close\r\n\r\n" + body)
            }
        }
        context.fireChannelRead(data)
    }

    func answerAndClose(_ context: ChannelHandlerContext, _ text: String) {
        var buffer = context.channel.allocator.buffer(capacity: text.utf8.count)
        buffer.writeString(text)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(buffer)).whenComplete { _ in channel.close(promise: nil) }
    }

    func headArrived() {
        waitingForHead = false
        timer?.cancel()
        timer = nil
    }

    func requestEnded() { waitingForHead = true }

    func handlerRemoved(context: ChannelHandlerContext) {
        timer?.cancel()
        firstByteTimer?.cancel()
    }
}

/// One connection's requests: gathered within the limits, answered in order (the pipeline's
/// pipelining assistance holds later requests back until each is answered).
final class ConnectionHandler: ChannelInboundHandler, @unchecked Sendable {  // used on its event loop only
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let collector: IngestCollector
    let headerDeadline: HeaderDeadline
    private var head: HTTPRequestHead?
    private var body: ByteBuffer?
    private var refused = false
    private var bodyTimer: Scheduled<Void>?
    private var busy = false

    init(collector: IngestCollector, headerDeadline: HeaderDeadline) {
        self.collector = collector
        self.headerDeadline = headerDeadline
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let requestHead):
            headerDeadline.headArrived()
            head = requestHead
            body = context.channel.allocator.buffer(capacity: 0)
            refused = false
            busy = true
            let lengths = requestHead.headers["content-length"]
            let chunked = requestHead.headers["transfer-encoding"].contains { $0.lowercased().contains("chunked") }
            if requestHead.method == .POST && lengths.isEmpty && !chunked {
                return refuse(context, 411, "send a Content-Length or a chunked body")
            }
            if let length = lengths.first.flatMap(Int.init), length > collector.limits.maximumBody {
                return refuse(context, 413, "body larger than \(collector.limits.maximumBody) bytes")
            }
            if requestHead.headers["expect"].contains(where: { $0.lowercased() == "100-continue" }) {
                context.writeAndFlush(
                    wrapOutboundOut(.head(HTTPResponseHead(version: requestHead.version, status: .continue))),
                    promise: nil)
            }
            let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            bodyTimer = context.eventLoop.scheduleTask(in: .milliseconds(Int64(collector.limits.bodyTimeout * 1000))) {
                let (handler, context) = loopBound.value
                handler.refuse(context, 408, "request body not received in time")
            }
        case .body(var part):
            guard !refused else { return }
            if (body?.readableBytes ?? 0) + part.readableBytes > collector.limits.maximumBody {
                return refuse(context, 413, "body larger than \(collector.limits.maximumBody) bytes")
            }
            body?.writeBuffer(&part)
        case .end:
            bodyTimer?.cancel()
            headerDeadline.requestEnded()
            guard !refused, let head, var body else { return }
            self.head = nil
            self.body = nil
            let request = IngestCollector.Request(
                method: head.method.rawValue, target: head.uri,
                headers: Dictionary(head.headers.map { ($0.name.lowercased(), $0.value) }) { $1 },
                body: Data(body.readBytes(length: body.readableBytes) ?? []),
                local: context.channel.localAddress?.ipAddress)
            let keepAlive = head.isKeepAlive
            let version = head.version
            let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            collector.respond(to: request, on: context.eventLoop).whenComplete { result in
                let (handler, context) = loopBound.value
                handler.busy = false
                switch result {
                case .success(let response?):
                    handler.write(context, response, version: version, keepAlive: keepAlive)
                case .success(nil):
                    context.close(promise: nil)  // a dropped request, injected
                case .failure(let error) where error is NIOThreadPoolError.ThreadPoolInactive:
                    // Stopping: the database thread takes no more; the client sends it again later.
                    var stopping = IngestCollector.Response(
                        status: 503, body: "{\"error\":\"the collector is stopping; retry\"}")
                    stopping.extraHeaders.append(("Retry-After", "1"))
                    handler.write(context, stopping, version: version, keepAlive: false)
                case .failure(let error):
                    handler.write(
                        context, IngestCollector.Response(status: 500, body: "{\"error\":\"\(error)\"}"),
                        version: version,
                        keepAlive: false)
                }
            }
        }
    }

    /// Answers now with `status` and closes: the rest of the request is not read.
    func refuse(_ context: ChannelHandlerContext, _ status: Int, _ reason: String) {
        guard !refused else { return }
        refused = true
        bodyTimer?.cancel()
        let version = head?.version ?? .http1_1
        write(
            context, IngestCollector.Response(status: status, body: "{\"error\":\"\(reason)\"}"), version: version,
            keepAlive: false)
    }

    func write(
        _ context: ChannelHandlerContext, _ response: IngestCollector.Response, version: HTTPVersion, keepAlive: Bool
    ) {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: response.contentType)
        headers.add(name: "Content-Length", value: String(response.data.count))
        headers.add(name: "Connection", value: keepAlive ? "keep-alive" : "close")
        for (name, value) in response.extraHeaders { headers.add(name: name, value: value) }
        let status = HTTPResponseStatus(statusCode: response.status)
        context.write(
            wrapOutboundOut(.head(HTTPResponseHead(version: version, status: status, headers: headers))), promise: nil)
        var buffer = context.channel.allocator.buffer(capacity: response.data.count)
        buffer.writeBytes(response.data)
        context.write(wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        let done = context.writeAndFlush(wrapOutboundOut(.end(nil)))
        let channel = context.channel
        if !keepAlive {
            done.whenComplete { _ in channel.close(promise: nil) }
        } else {
            collector.requestAnswered(on: channel)
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let idle = event as? IdleStateHandler.IdleStateEvent, idle == .read {
            // Idle between requests: just close. Inside one: the body timer answers.
            if !busy && head == nil { context.close(promise: nil) }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: Error) {
        // The decoder's verdicts: a header too large is 431, anything else malformed is 400.
        if let parse = error as? HTTPParserError {
            let status = parse == .headerOverflow ? 431 : 400
            let reason = parse == .headerOverflow ? "request header larger than 80 KiB" : "malformed request: \(parse)"
            refused = false
            refuse(context, status, reason)
        } else {
            context.close(promise: nil)
        }
    }
}

/// Over the connection cap: a plain 503 with Retry-After as soon as the connection is up,
/// then close.
final class RefuseConnection: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    func channelActive(context: ChannelHandlerContext) {
        let body = "{\"error\":\"too many connections; retry\"}"
        var buffer = context.channel.allocator.buffer(capacity: 200)
        buffer.writeString(
            "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
                + "Content-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n" + body)
        let channel = context.channel
        context.writeAndFlush(wrapOutboundOut(buffer)).whenComplete { _ in channel.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}
