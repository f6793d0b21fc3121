import CrashCapture
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix

/// The stored events of a track() run of `count` events, as they would be uploaded, and the
/// directory that holds their store.
func trackedPayloads(_ count: Int) throws -> (directory: String, payloads: [(String, String)]) {
    let directory = temporaryDirectory()
    let configuration = CrashCapture.Configuration(
        directory: directory, appName: "bench", appVersion: "1.0", staticProperties: ["tier": "bench"],
        trackLifecycle: false, journalBytes: 128 << 20)
    _ = try trackRun(events: count, configuration: configuration)
    let payloads = try EventStore(path: directory + "/events.sqlite").events(limit: count).map {
        ($0.eventID, $0.payload)
    }
    return (directory, payloads)
}

/// OTLP export: the events of a track() run, stored, then sent by the uploader as OTLP/HTTP
/// logs (protobuf, gzip, batches of 50 as the defaults say) to a receiver on loopback that
/// answers 200 to each request once its body has arrived, and nothing more; beside it, in the
/// same run, the same uploader sending the same events in the Sensors format to the same
/// receiver, and each format's encoding alone. Rounds alternate the two formats.
func otlpBenchmark(payloads: [(String, String)], directory: String, rounds: Int) throws {
    let receiver = try SinkReceiver()
    defer { receiver.stop() }
    var rates: [UploadFormat: [Double]] = [:]
    var bytes: [UploadFormat: Int] = [:]
    for round in 1...max(1, rounds) {
        for format in [UploadFormat.openTelemetryLogs, .sensorsAnalytics] {
            let store = try EventStore(path: directory + "/otlp-\(round)-\(format).sqlite")
            try store.insert(payloads)
            sync()
            let url = receiver.url + (format == .openTelemetryLogs ? "/v1/logs" : "/sa")
            let uploader = try Uploader(
                endpoint: URL(string: url)!, store: store, options: UploadOptions(), format: format)
            let before = receiver.received
            let start = monotonic()
            uploader.flushNow(deadline: Date().addingTimeInterval(600))
            let seconds = Double(monotonic() - start) / 1e9
            guard store.count == 0 else {
                throw CrashCaptureError.io("\(store.count) events left unsent: \(uploader.statistics.lastError ?? "")")
            }
            rates[format, default: []].append(Double(payloads.count) / seconds)
            bytes[format] = receiver.received.bytes - before.bytes
        }
    }
    // Encoding alone, one batch of 50 at a time, over every event.
    func encodeMicroseconds(_ encode: ([String]) throws -> Data) rethrows -> Double {
        let texts = payloads.map(\.1)
        let start = monotonic()
        for first in stride(from: 0, to: texts.count, by: 50) {
            _ = try encode(Array(texts[first..<min(first + 50, texts.count)]))
        }
        return Double(monotonic() - start) / 1e3 / Double(texts.count)
    }
    let otlpEncode = try encodeMicroseconds { try OTLPEncoding.body(events: $0, observedNanoseconds: 1) }
    let sensorsEncode = try encodeMicroseconds { try WireFormat.encode(events: $0) }
    print("## OTLP export: \(payloads.count) stored events to a loopback receiver, batches of 50\n")
    print(
        "| format | rate, median of \(rounds) rounds (each round) | bytes on the wire an event | encoding alone, µs an event |"
    )
    print("|---|---|---|---|")
    for (kind, name, encode) in [
        (UploadFormat.openTelemetryLogs, "OTLP/HTTP logs, protobuf + gzip", otlpEncode),
        (.sensorsAnalytics, "Sensors Analytics (the same uploader)", sensorsEncode),
    ] {
        let list = rates[kind] ?? []
        print(
            "| \(name) | \(format(Statistics(list).median, 0)) events/s (\(list.map { format($0, 0) }.joined(separator: ", "))) | \(format(Double(bytes[kind] ?? 0) / Double(payloads.count), 0)) | \(format(encode, 1)) |"
        )
    }
}

/// An HTTP server on SwiftNIO that reads each request whole and answers 200 with an empty
/// body: the cheapest receiver there is, so that the figure is the sender's.
final class SinkReceiver: @unchecked Sendable {  // `counts` is under `lock`
    private let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
    private var channel: Channel?
    private let lock = NSLock()
    private var counts = (requests: 0, bytes: 0)
    private(set) var url = ""

    var received: (requests: Int, bytes: Int) { lock.withLock { counts } }

    init() throws {
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(ChannelOptions.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(ChannelOptions.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { [self] channel in
                channel.pipeline.configureHTTPServerPipeline().flatMap {
                    channel.pipeline.addHandler(Answer(receiver: self))
                }
            }
        let bound = try bootstrap.bind(host: "127.0.0.1", port: 0).wait()
        channel = bound
        url = "http://127.0.0.1:\(bound.localAddress?.port ?? 0)"
    }

    func stop() {
        try? channel?.close().wait()
        try? group.syncShutdownGracefully()
    }

    func add(_ bytes: Int) { lock.withLock { counts = (counts.requests + 1, counts.bytes + bytes) } }

    final class Answer: ChannelInboundHandler, @unchecked Sendable {  // used on its event loop only
        typealias InboundIn = HTTPServerRequestPart
        typealias OutboundOut = HTTPServerResponsePart
        let receiver: SinkReceiver
        var bytes = 0
        init(receiver: SinkReceiver) { self.receiver = receiver }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            switch unwrapInboundIn(data) {
            case .head: bytes = 0
            case .body(let part): bytes += part.readableBytes
            case .end:
                receiver.add(bytes)
                let head = HTTPResponseHead(
                    version: .http1_1, status: .ok,
                    headers: ["Content-Length": "0", "Content-Type": "application/x-protobuf"])
                context.write(wrapOutboundOut(.head(head)), promise: nil)
                context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
            }
        }
    }
}
