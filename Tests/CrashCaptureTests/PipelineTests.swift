import CrashFileFormat
import Foundation
import TestSupport
import Testing

@testable import CrashCapture

#if canImport(Glibc)
    import Glibc
#endif

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

@Suite(.serialized) struct PipelineTests {
    func sample(
        _ kind: String, directory: String, collector: CollectorProcess?, events: Int, extra: [String: String] = [:],
        timeout: Double = 60
    ) throws -> RunResult {
        var env = [
            "CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "\(events)", "CRASH_SAMPLE_RETRY_BASE": "0.05",
        ]
        if let collector { env["CRASHCAPTURE_SERVER_URL"] = collector.url }
        for (key, value) in extra { env[key] = value }
        return try run(Paths.swiftSample, [kind], environment: env, timeout: timeout)
    }

    func names(_ events: [[String: Any]]) -> [String] { events.compactMap { $0["event"] as? String } }
    func indexes(_ events: [[String: Any]]) -> [Int] {
        events.compactMap { ($0["properties"] as? [String: Any])?["index"] as? Int }
    }

    @Test func theExitFlushKeepsItsBoundWhileABackgroundUploadHangs() throws {
        // The collector holds every request for 10 s: the upload started at 100 events is still
        // on the wire when the app exits, and the exit flush (2 s) must not wait for it.
        let collector = try CollectorProcess(["--delay-ms", "10000"])
        let directory = makeTemporaryDirectory("exit-bound")
        let result = try sample("pipeline-track", directory: directory, collector: collector, events: 150)
        #expect(result.exitCode == 0)
        #expect(result.seconds < 5, "exit took \(result.seconds) s with a 2 s exit flush")
        // Nothing is lost: what was not acknowledged is still in the store for the next start.
        #expect(try EventStore(path: directory + "/events.sqlite").count > 0)
    }

    @Test func normalExitDeliversEverythingOnceInOrder() throws {
        let collector = try CollectorProcess()
        let directory = makeTemporaryDirectory("pipeline")
        let result = try sample("pipeline-track", directory: directory, collector: collector, events: 250)
        #expect(result.exitCode == 0, "\(result.stderr)")
        let events = try collector.events()
        #expect(names(events).first == "$AppStart")
        #expect(names(events).last == "$AppEnd")
        #expect(names(events).filter { $0 == "$AppEnd" }.count == 1)
        #expect(indexes(events) == Array(0..<250))
        #expect(Set(events.compactMap { $0["event_id"] as? String }).count == events.count)
        #expect(events.allSatisfy { ($0["_flush_time"] as? Int ?? 0) >= ($0["time"] as? Int ?? .max) })
        let end = try #require(events.last?["properties"] as? [String: Any])
        #expect(end["$app_end_reason"] as? String == "exit")
        #expect((end["$event_duration"] as? Double ?? -1) >= 0)
        #expect(try EventStore(path: directory + "/events.sqlite").count == 0, "uploaded events leave the store")
    }

    @Test func serverErrorsAndDroppedConnectionsAreRetried() throws {
        let collector = try CollectorProcess(["--drop-first", "2", "--fail-first", "3"])
        let directory = makeTemporaryDirectory("faults")
        let result = try sample(
            "pipeline-track", directory: directory, collector: collector, events: 180,
            extra: ["CRASH_SAMPLE_EXIT_FLUSH": "10"])
        #expect(result.exitCode == 0, "\(result.stderr)")
        let events = try collector.events()
        #expect(indexes(events) == Array(0..<180))
        #expect(names(events).filter { $0 == "$AppStart" }.count == 1)
        #expect(names(events).filter { $0 == "$AppEnd" }.count == 1)
    }

    @Test func slowServerPastTheTimeoutLosesNothingAndDuplicatesNothing() throws {
        // Every response comes after the client gave up: the server stores each batch, the
        // client keeps it and sends it again; the collector must hold each event once.
        let collector = try CollectorProcess(["--delay-ms", "700"])
        let directory = makeTemporaryDirectory("slow")
        _ = try sample(
            "pipeline-track", directory: directory, collector: collector, events: 60,
            extra: ["CRASH_SAMPLE_REQUEST_TIMEOUT": "0.3", "CRASH_SAMPLE_EXIT_FLUSH": "3"])
        Thread.sleep(forTimeInterval: 1)
        let events = try collector.events()
        let ids = events.compactMap { $0["event_id"] as? String }
        #expect(Set(ids).count == ids.count, "no duplicates at the collector")
        let leftover = try EventStore(path: directory + "/events.sqlite").events()
        let all = Set(ids).union(leftover.map(\.eventID))
        #expect(all.count == 62, "every event is either delivered or still queued")
    }

    @Test func uploaderKilledMidBatchLosesAndDuplicatesNothing() throws {
        let collector = try CollectorProcess(["--delay-ms", "15"])
        let directory = makeTemporaryDirectory("sigkill")
        let streaming = try Child(
            Paths.swiftSample, ["pipeline-stream"],
            environment: [
                "CRASHCAPTURE_DIR": directory, "CRASHCAPTURE_SERVER_URL": collector.url, "CRASH_SAMPLE_EVENTS": "4000",
                "CRASH_SAMPLE_RETRY_BASE": "0.05",
            ])
        Thread.sleep(forTimeInterval: 0.4)
        kill(streaming.pid, SIGKILL)
        #expect(streaming.wait(timeout: 10))
        #expect(streaming.signal == SIGKILL)
        let delivered = try collector.events().count
        // The next start recovers the rows that were in flight and sends everything left: up to
        // 80 batches at 15 ms each, so its exit flush gets more than the default 2 s when the
        // machine is busy with the other suites.
        let second = try sample(
            "pipeline-track", directory: directory, collector: collector, events: 0,
            extra: ["CRASH_SAMPLE_EXIT_FLUSH": "20"])
        #expect(second.exitCode == 0)
        let events = try collector.events()
        let ids = events.compactMap { $0["event_id"] as? String }
        #expect(Set(ids).count == ids.count, "no duplicates")
        let first = events.filter {
            ($0["properties"] as? [String: Any])?["sample_kind"] as? String == "pipeline-stream"
        }
        let seen = indexes(first)
        #expect(seen == Array(0..<seen.count), "the killed session's stored events arrive in order, without gaps")
        #expect(seen.count > 0 && delivered < events.count)
        #expect(try EventStore(path: directory + "/events.sqlite").count == 0)
    }

    @Test func sigtermEndsTheSessionAndStillDiesOfSigterm() throws {
        let directory = makeTemporaryDirectory("sigterm")
        let waiting = try Child(
            Paths.swiftSample, ["pipeline-wait"],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "5"])
        #expect(waiting.waitForOutput("ready"))
        kill(waiting.pid, SIGTERM)
        #expect(waiting.wait(timeout: 20))
        #expect(waiting.signal == SIGTERM)
        let stored = try EventStore(path: directory + "/events.sqlite").events()
        #expect(stored.first?.eventID.hasSuffix("-start") == true)
        let end = try #require(stored.last)
        #expect(end.payload.contains("\"event\":\"$AppEnd\""))
        #expect(end.payload.contains("\"$app_end_reason\":\"SIGTERM\""))
        #expect(stored.count == 7)
    }

    @Test func crashGetsItsAppEndFromTheCrashFileOnly() throws {
        let directory = makeTemporaryDirectory("crashend")
        let result = try sample("pipeline-crash", directory: directory, collector: nil, events: 4)
        #expect(result.signal == SIGSEGV)
        let stored = try EventStore(path: directory + "/events.sqlite").events()
        #expect(stored.count == 5, "$AppStart and 4 events")
        #expect(!stored.contains { $0.payload.contains("$AppEnd") })
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.endEvents.count == 1)
        #expect(report.crashed?["session_id"] as? String == stored.first.map { String($0.eventID.dropLast(6)) })
    }

    @Test func loginChangesTheDistinctIDEverywhere() throws {
        let directory = makeTemporaryDirectory("login")
        _ = try sample("pipeline-login", directory: directory, collector: nil, events: 2)
        let stored = try EventStore(path: directory + "/events.sqlite").events()
        let objects = stored.compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any]
        }
        let signUp = try #require(objects.first { $0["event"] as? String == "$SignUp" })
        let anonymous = try String(contentsOfFile: directory + "/distinct_id", encoding: .utf8)
        // A track_signup record with the anonymous id as its own original_id, as the official SDKs send.
        #expect(signUp["type"] as? String == "track_signup")
        #expect(signUp["original_id"] as? String == anonymous)
        let tracked = objects.filter { $0["event"] as? String == "sample_event" }
        #expect(tracked.count == 2 && tracked.allSatisfy { $0["distinct_id"] as? String == "user-42" })
        // The next session starts logged in, and its crash reports carry the login id.
        let crash = try sample("pipeline-crash", directory: directory, collector: nil, events: 0)
        #expect(crash.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.crashed?["distinct_id"] as? String == "user-42")
        #expect(report.crashed?["login_id"] as? String == "user-42")
    }

    @Test func clientErrorsMoveTheBatchAsideAndTheQueueGoesOn() throws {
        let collector = try CollectorProcess(["--fail-first", "1", "--fail-status", "400"])
        let directory = makeTemporaryDirectory("reject")
        _ = try sample("pipeline-track", directory: directory, collector: collector, events: 120)
        let store = try EventStore(path: directory + "/events.sqlite")
        // The first batch (whatever was cached when the first upload ran) is refused and kept
        // aside; everything after it is delivered; nothing is left and nothing is lost.
        #expect(store.rejectedCount >= 1, "the refused batch is kept aside, not lost")
        #expect(store.count == 0)
        #expect(try collector.events().count + store.rejectedCount == 122)
    }
}

@Suite struct UploaderPolicyTests {
    @Test func httpsUnlessLoopback() throws {
        try Uploader.validate(URL(string: "https://ingest.example.com/sa")!, allowInsecureHTTP: false)
        try Uploader.validate(URL(string: "http://127.0.0.1:8106/sa")!, allowInsecureHTTP: false)
        try Uploader.validate(URL(string: "http://localhost/sa")!, allowInsecureHTTP: false)
        #expect(throws: CrashCaptureError.self) {
            try Uploader.validate(URL(string: "http://ingest.example.com/sa")!, allowInsecureHTTP: false)
        }
        try Uploader.validate(URL(string: "http://ingest.example.com/sa")!, allowInsecureHTTP: true)
        #expect(throws: CrashCaptureError.self) {
            try Uploader.validate(URL(string: "ftp://ingest.example.com/sa")!, allowInsecureHTTP: true)
        }
    }

    @Test func trackValidatesLikeTheSensorsSDKs() throws {
        #expect(throws: CrashCaptureError.self) { try PropertyRules.validateName("$Custom", kind: "event name") }
        #expect(throws: CrashCaptureError.self) { try PropertyRules.validateName("1st", kind: "event name") }
        #expect(throws: CrashCaptureError.self) { try PropertyRules.validateName("event", kind: "event name") }
        #expect(throws: CrashCaptureError.self) { try PropertyRules.validateName("Distinct_ID", kind: "property key") }
        #expect(throws: CrashCaptureError.self) { try PropertyRules.validateName("DateTime", kind: "property key") }
        try PropertyRules.validateName("distinct_ids", kind: "property key")
        #expect(throws: CrashCaptureError.self) {
            try PropertyRules.validateName(String(repeating: "a", count: 101), kind: "event name")
        }
        try PropertyRules.validateName("order_paid", kind: "event name")
        #expect(throws: CrashCaptureError.self) {
            try PropertyRules.validate(["tags": .strings(Array(repeating: "x", count: 501))])
        }
    }
}

/// A Python server started from `script` (with `arguments`), which prints "port N" once it
/// listens; stopped when the test's `defer` calls `stop()`.
struct PythonServer {
    let child: Child
    let port: String

    init(_ script: String, _ arguments: [String] = []) throws {
        child = try Child("/usr/bin/env", ["python3", "-c", script] + arguments)
        guard child.waitForOutput("port "), let port = child.stdout.split(separator: " ").last else {
            _ = child.waitOrKill(timeout: 0)
            throw TestFailure("server did not start: \(child.stderr)")
        }
        self.port = port.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func stop() { _ = child.waitOrKill(timeout: 0) }
}

/// A store holding one small event, and that event claimed as a batch.
func storeWithOneEvent(_ name: String) throws -> (EventStore, EventStore.Batch) {
    let store = try EventStore(path: makeTemporaryDirectory(name) + "/events.sqlite")
    try store.insert([(id: "a", payload: "{\"event_id\":\"a\",\"event\":\"e\",\"properties\":{}}")])
    return (store, try #require(try store.claimBatch(limit: 50)))
}

/// The uploader against a server that misbehaves in ways the collector does not.
@Suite struct UploaderResponseTests {
    /// A plain HTTP server: /redirect answers 302 to /elsewhere (which counts its visits),
    /// /huge answers 400 with a 4 MiB body.
    static let server = """
        import http.server, sys
        visits = []
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def log_message(self, *args): pass
            def answer(self, status, body, extra=()):
                self.send_response(status)
                for key, value in extra: self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/redirect": self.answer(302, b"", [("Location", "/elsewhere")])
                elif self.path == "/huge": self.answer(400, b"x" * (4 << 20))
                else:
                    visits.append(self.path)
                    self.answer(200, b"{}")
            def do_GET(self): self.answer(200, str(len(visits)).encode())
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        print("port", httpd.server_address[1], flush=True)
        httpd.serve_forever()
        """

    @Test func redirectsAreNotFollowedAndLongAnswersAreCut() throws {
        let server = try PythonServer(Self.server)
        defer { server.stop() }
        let base = "http://127.0.0.1:\(server.port)"
        let (store, batch) = try storeWithOneEvent("responses")

        let redirected = try Uploader(
            endpoint: URL(string: base + "/redirect")!, store: store, options: UploadOptions())
        // Retried (the batch stays), and the events did not go where the redirect pointed.
        #expect(redirected.send(batch, timeout: 5) == .retry("unexpected HTTP 302"))
        let visits = try String(contentsOf: URL(string: base + "/count")!, encoding: .utf8)
        #expect(visits == "0")

        let huge = try Uploader(endpoint: URL(string: base + "/huge")!, store: store, options: UploadOptions())
        guard case .rejected(let status, let text) = huge.send(batch, timeout: 10) else {
            Issue.record("a 400 was not a rejection")
            return
        }
        #expect(status == 400)
        #expect(text == String(repeating: "x", count: 300), "only the start of an answer is kept")
    }
}

/// `http://` endpoints are spoken to over a plain socket on the uploader's own thread
/// (`PlainHTTPConnection`): every way a server may frame, delay, garble or cut its answer.
@Suite struct PlainHTTPTests {
    /// A raw HTTP/1.1 server: reads each request whole, then answers as its path says.
    /// `GET /count` answers how many POSTs arrived.
    static let server = #"""
        import socket, socketserver, struct, sys, threading, time
        posts = []
        lock = threading.Lock()
        ANSWERS = {
            "/ok": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            "/close-after": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            "/reset-after": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            "/chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\nT: v\r\n\r\n",
            "/until-close": b"HTTP/1.0 200 OK\r\n\r\n{\"ok\":true}",
            "/interim": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
            "/garbage": b"hello there\r\n\r\n",
            "/cut": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\":",
            "/two-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
            "/no-content": b"HTTP/1.1 204 No Content\r\n\r\n",
            "/busy": b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nbusy",
        }
        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                data = b""
                while True:
                    while b"\r\n\r\n" not in data:
                        more = self.request.recv(65536)
                        if not more: return
                        data += more
                    head, data = data.split(b"\r\n\r\n", 1)
                    lines = head.decode().split("\r\n")
                    method, path = lines[0].split(" ")[:2]
                    length = 0
                    for line in lines[1:]:
                        name, value = line.split(":", 1)
                        if name.lower() == "content-length": length = int(value)
                    if path == "/early-413":
                        # Refused from its head alone, the body unread, as a server with a
                        # size limit does.
                        with lock: posts.append(path)
                        self.request.sendall(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 9\r\nConnection: close\r\n\r\ntoo large")
                        time.sleep(0.5)
                        return
                    while len(data) < length:
                        data += self.request.recv(65536)
                    data = data[length:]
                    if method == "GET":
                        with lock: count = str(len(posts)).encode()
                        self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(count), count))
                        continue
                    with lock: posts.append(path)
                    if path == "/silent":
                        time.sleep(30)
                        return
                    self.request.sendall(ANSWERS[path])
                    if path == "/reset-after":
                        # Closed with a reset: the client's next send on it fails at once.
                        time.sleep(0.05)
                        self.request.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        return
                    if path in ("/close-after", "/until-close", "/garbage", "/cut"): return
        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True
        server = Server(("127.0.0.1", 0), Handler)
        print("port", server.server_address[1], flush=True)
        server.serve_forever()
        """#

    @Test func everyFramingAndFailureOfAnAnswer() throws {
        let server = try PythonServer(Self.server)
        defer { server.stop() }
        let base = "http://127.0.0.1:\(server.port)"
        let (store, batch) = try storeWithOneEvent("plain-http")
        func uploader(_ path: String) throws -> Uploader {
            try Uploader(endpoint: URL(string: base + path)!, store: store, options: UploadOptions())
        }
        func posts() throws -> Int { Int(try String(contentsOf: URL(string: base + "/count")!, encoding: .utf8))! }

        // Kept alive: three requests, one connection, each answered.
        let kept = try uploader("/ok")
        for _ in 0..<3 { #expect(kept.send(batch, timeout: 5) == .accepted) }
        // The server closes after each answer without saying so: the next request finds the
        // connection closed and is sent again on a new one, once.
        let closing = try uploader("/close-after")
        let before = try posts()
        for _ in 0..<3 { #expect(closing.send(batch, timeout: 5) == .accepted) }
        #expect(try posts() == before + 3, "each batch arrived once")
        // The same, the closing seen when sending: a reset that arrived while it was idle.
        let resetting = try uploader("/reset-after")
        for _ in 0..<3 {
            #expect(resetting.send(batch, timeout: 5) == .accepted)
            usleep(200_000)
        }
        #expect(try uploader("/chunked").send(batch, timeout: 5) == .accepted)
        #expect(try uploader("/until-close").send(batch, timeout: 5) == .accepted)
        #expect(try uploader("/interim").send(batch, timeout: 5) == .accepted)
        // No body, and none awaited: twice on the same connection, each well within its deadline.
        let noContent = try uploader("/no-content")
        let started = Date()
        for _ in 0..<2 { #expect(noContent.send(batch, timeout: 3) == .accepted) }
        #expect(Date().timeIntervalSince(started) < 2)
        #expect(try uploader("/busy").send(batch, timeout: 5) == .retryAfter("HTTP 503, retry after 7 s: busy", 7))
        for (path, reason) in [
            ("/garbage", "not an HTTP response"), ("/cut", "connection closed before the response ended"),
            ("/two-lengths", "malformed Content-Length"),
        ] {
            guard case .retry(let text) = try uploader(path).send(batch, timeout: 5) else {
                Issue.record("\(path) was not retried")
                continue
            }
            #expect(text.contains(reason), "\(path): \(text)")
        }
        // Refused before the body was read: the answer is read though the body never went out.
        let large = try EventStore(path: makeTemporaryDirectory("plain-http-large") + "/events.sqlite")
        let noise = (0..<(12 << 20) / 8).map { _ in String(UInt64.random(in: 0...UInt64.max), radix: 36) }.joined()
        try large.insert([
            (id: "big", payload: "{\"event_id\":\"big\",\"event\":\"e\",\"properties\":{\"n\":\"\(noise)\"}}")
        ])
        let bigBatch = try #require(try large.claimBatch(limit: 1))
        let refusedEarly = try Uploader(
            endpoint: URL(string: base + "/early-413")!, store: large, options: UploadOptions())
        #expect(refusedEarly.send(bigBatch, timeout: 10) == .rejected(413, "too large"))
        // A server that never answers: the request's own deadline ends it.
        let start = Date()
        guard case .retry(let text) = try uploader("/silent").send(batch, timeout: 1) else {
            Issue.record("a silent server was not retried")
            return
        }
        #expect(text.contains("timed out"), "\(text)")
        #expect(Date().timeIntervalSince(start) < 3)
        // Nobody listening.
        let nobody = try Uploader(
            endpoint: URL(string: "http://127.0.0.1:9/sa")!, store: store, options: UploadOptions())
        guard case .retry(let refused) = nobody.send(batch, timeout: 5) else {
            Issue.record("a refused connection was not retried")
            return
        }
        #expect(refused.contains("cannot connect"), "\(refused)")
    }

    /// https still goes through the TLS client, which checks the server's certificate: a
    /// self-signed one is refused, and the batch kept for a retry.
    @Test func httpsGoesThroughTheTLSClientThatChecksCertificates() throws {
        let directory = makeTemporaryDirectory("https")
        let made = try run(
            "/usr/bin/openssl",
            [
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", directory + "/key.pem", "-out",
                directory + "/cert.pem", "-days", "1", "-subj", "/CN=localhost",
            ])
        try #require(made.exitCode == 0, "\(made.stderr)")
        let server = """
            import http.server, ssl, sys
            class Handler(http.server.BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.1"
                def log_message(self, *args): pass
                def do_POST(self):
                    self.rfile.read(int(self.headers.get("Content-Length", 0)))
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
            httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(sys.argv[1] + "/cert.pem", sys.argv[1] + "/key.pem")
            httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
            print("port", httpd.server_address[1], flush=True)
            httpd.serve_forever()
            """
        let tls = try PythonServer(server, [directory])
        defer { tls.stop() }
        let (store, batch) = try storeWithOneEvent("https-store")
        let url = URL(string: "https://localhost:\(tls.port)/sa")!
        let uploader = try Uploader(endpoint: url, store: store, options: UploadOptions())
        guard case .retry(let reason) = uploader.send(batch, timeout: 5) else {
            Issue.record("a self-signed certificate was accepted")
            return
        }
        #expect(reason.contains("network error"), "\(reason)")
    }
}

@Suite struct BuildWithoutHTTPTests {
    /// The README's test command builds the release samples without the package trait
    /// HTTPUpload: such a build must still capture and store, and say why it does not upload.
    @Test func withoutTheHTTPClientEventsStayInTheStore() throws {
        let sample = Paths.packageRoot + "/.build/release/crash-sample-swift"
        try #require(
            FileManager.default.fileExists(atPath: sample), "no release samples: run the README's test command")
        let canUpload = try run(sample, ["--can-upload"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        try #require(
            canUpload == "false", "the release samples were built with HTTPUpload; Scripts/test.sh builds them without")
        let directory = makeTemporaryDirectory("no-http")
        let result = try run(
            sample, ["pipeline-track"],
            environment: [
                "CRASHCAPTURE_DIR": directory, "CRASHCAPTURE_SERVER_URL": "http://127.0.0.1:9/sa",
                "CRASH_SAMPLE_EVENTS": "5",
            ])
        #expect(result.exitCode == 0, "\(result.stderr)")
        #expect(result.stderr.contains("built without HTTP upload"))
        let stored = try EventStore(path: directory + "/events.sqlite").events().map(\.payload)
        #expect(stored.filter { $0.contains("\"event\":\"sample_event\"") }.count == 5)
    }
}
