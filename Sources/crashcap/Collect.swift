import ArgumentParser
import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

extension Crashcap {
    struct Collect: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Run an ingest server (SwiftNIO): POST /sa takes uploads into SQLite or ClickHouse, GET /events lists what arrived.",
            discussion: """
                Accepts the Sensors Analytics wire format (crc, gzip, data_list), rejects malformed \
                batches with a 4xx that says why, de-duplicates by event_id and stores events in SQLite \
                (--db) in arrival order, or in ClickHouse (--clickhouse), where several collectors may \
                share one table. GET /events?after=N&limit=N returns them as JSON lines. SIGTERM or \
                SIGINT stops it: uploads being stored are committed and answered first; exit status 0.
                """)

        @Option(help: "Port to listen on (0: any free port, printed at start).")
        var port: UInt16 = 8106

        @Option(help: "Address to listen on.")
        var host = "127.0.0.1"

        @Option(help: "SQLite file for the received events.")
        var db: String?

        @Option(
            help: ArgumentHelp(
                "ClickHouse's HTTP interface to store into instead of SQLite; the table events is made when missing.",
                valueName: "url"))
        var clickhouse: String?

        @Option(help: "Close the connection of the first N uploads without answering (fault injection).")
        var dropFirst = 0

        @Option(help: "Answer the next N uploads with --fail-status (fault injection).")
        var failFirst = 0

        @Option(help: "Status for --fail-first.")
        var failStatus = 500

        @Option(help: "Wait this many ms before answering each upload (fault injection).")
        var delayMs = 0

        @Option(help: "Send Retry-After with this many seconds on the --fail-first answers.")
        var retryAfter: Int?

        @Option(help: "Seconds a request's head may take from its first byte (then 408).")
        var headerTimeout = 10.0

        @Option(
            help:
                "Seconds a new connection may wait before its first byte (then it is closed). When every slot is taken, the connection idle the longest is closed for a new one."
        )
        var firstByteTimeout = 5.0

        @Option(help: "Seconds a request's body may take after its head (then 408).")
        var bodyTimeout = 60.0

        @Option(help: "Seconds an idle keep-alive connection stays open.")
        var idleTimeout = 30.0

        @Option(
            help:
                "Connections served at once. When all are taken, the one idle the longest is closed for a new one; only when every one is inside a request does a new one get 503 with Retry-After."
        )
        var maxConnections = 512

        @Option(help: "Connections one address may hold at once; past that its own oldest idle one is closed.")
        var maxConnectionsPerPeer = 128

        @Option(help: "Largest request body in bytes (then 413).")
        var maxBody = 32 << 20

        @Option(
            help:
                "Token uploads and GET /events must carry (?token= or Authorization: Bearer); required beyond loopback. Also CRASHCAPTURE_COLLECTOR_TOKEN."
        )
        var token: String?

        @Option(
            help: ArgumentHelp(
                "The crash browser's pages (/, /groups/..., /reports/..., /top) answer connections to loopback only; also to this address (0.0.0.0: any). With --token, the pages ask for ?token= too.",
                valueName: "address"))
        var uiHost: String?

        func validate() throws {
            if (db == nil) == (clickhouse == nil) {
                throw ValidationError(
                    "give one store: --db FILE (SQLite) or --clickhouse URL (e.g. http://127.0.0.1:8123/?database=crashcap)"
                )
            }
            if dropFirst < 0 || failFirst < 0 || delayMs < 0 {
                throw ValidationError("fault counts must not be negative")
            }
            if !(100...599).contains(failStatus) { throw ValidationError("--fail-status must be an HTTP status") }
            if headerTimeout <= 0 || firstByteTimeout <= 0 || bodyTimeout <= 0 || idleTimeout <= 0 || maxConnections < 1
                || maxConnectionsPerPeer < 1 || maxBody < 1
            {
                throw ValidationError("timeouts and limits must be positive")
            }
        }

        mutating func run() throws {
            var faults = IngestCollector.Faults()
            faults.dropFirst = dropFirst
            faults.failFirst = failFirst
            faults.failStatus = failStatus
            faults.delayMilliseconds = delayMs
            faults.retryAfterSeconds = retryAfter
            var limits = IngestCollector.Limits()
            limits.headerTimeout = headerTimeout
            limits.firstByteTimeout = firstByteTimeout
            limits.maximumConnectionsPerPeer = maxConnectionsPerPeer
            limits.bodyTimeout = bodyTimeout
            limits.idleTimeout = idleTimeout
            limits.maximumConnections = maxConnections
            limits.maximumBody = maxBody
            limits.token = token ?? ProcessInfo.processInfo.environment["CRASHCAPTURE_COLLECTOR_TOKEN"]
            limits.uiHost = uiHost
            let collector: IngestCollector
            do {
                let storage: IngestCollector.Storage
                if let clickhouse {
                    guard let url = URL(string: clickhouse) else {
                        throw CrashCaptureError.invalidArgument("--clickhouse \(clickhouse) is not a URL")
                    }
                    storage = .clickHouse(url)
                } else {
                    storage = .sqlite(path: db ?? "")
                }
                collector = try IngestCollector(
                    host: host, port: port, storage: storage, faults: faults, limits: limits)
            } catch {
                let usage = (error as? CrashCaptureError)?.kind == .invalidArgument
                throw Crashcap.fail("\(error)", code: usage ? 64 : 69)
            }
            if let notice = collector.store?.movedAsideNotice {
                FileHandle.standardError.write(Data("crashcap: \(notice)\n".utf8))
            }
            // Written straight to the descriptor: whoever started us waits for this line.
            if let clickHouse = collector.clickHouse {
                FileHandle.standardError.write(Data("crashcap: storing into ClickHouse at \(clickHouse.shown)\n".utf8))
            }
            FileHandle.standardOutput.write(Data("listening on \(collector.url)\n".utf8))
            signal(SIGPIPE, SIG_IGN)
            // SIGTERM or SIGINT: stop as `stop()` does (what is being stored is committed and
            // answered), then exit 0.
            let stopped = DispatchSemaphore(value: 0)
            // One queue for both signals, so that a second signal while stopping changes nothing.
            let signals = DispatchQueue(label: "crashcap.collect.signals")
            nonisolated(unsafe) var stopAsked = false
            let stopSignals = [SIGTERM, SIGINT].map { number in
                signal(number, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: number, queue: signals)
                source.setEventHandler {
                    guard !stopAsked else { return }
                    stopAsked = true
                    collector.stop()
                    stopped.signal()
                }
                source.resume()
                return source
            }
            collector.serve()
            // Closed by a signal's stop: wait for that to finish. Closed any other way: stop here.
            let byASignal = signals.sync {
                defer { stopAsked = true }
                return stopAsked
            }
            if byASignal { stopped.wait() } else { collector.stop() }
            for source in stopSignals { source.cancel() }
        }
    }
}
