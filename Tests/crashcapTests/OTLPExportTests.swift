import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A receiver of OTLP/HTTP logs that decodes each request with the official opentelemetry-proto
/// Python package (Tests/otlp_receiver.py), never with our code.
final class OTLPReceiver {
    let child: Child
    let output: String
    let url: String

    init(_ arguments: [String] = []) throws {
        output = makeTemporaryDirectory("otlp") + "/requests.jsonl"
        child = try Child(
            "/usr/bin/env",
            [
                "python3", Paths.packageRoot + "/Tests/otlp_receiver.py", output,
                Paths.packageRoot + "/.build/python-packages",
            ]
                + arguments)
        guard child.waitForOutput("listening on"),
            let port = child.stdout.split(separator: " ").last?.trimmingCharacters(in: .whitespacesAndNewlines)
        else { throw TestFailure("the OTLP receiver did not start: \(child.stderr)") }
        url = "http://127.0.0.1:\(port)"
    }

    /// Every request as the official decoder read it (protobuf's JSON mapping).
    var requests: [[String: Any]] {
        ((try? String(contentsOfFile: output, encoding: .utf8)) ?? "").split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }

    /// Every record, with the attributes of its resource.
    var records: [(resource: [String: Any], record: [String: Any])] {
        requests.flatMap { request in
            (request["resourceLogs"] as? [[String: Any]] ?? []).flatMap { logs in
                let resource = Self.attributes((logs["resource"] as? [String: Any])?["attributes"])
                return (logs["scopeLogs"] as? [[String: Any]] ?? []).flatMap { scope in
                    (scope["logRecords"] as? [[String: Any]] ?? []).map { (resource, $0) }
                }
            }
        }
    }

    /// `[{key, value: {stringValue|intValue|...}}]` as a dictionary of plain values.
    static func attributes(_ list: Any?) -> [String: Any] {
        var result: [String: Any] = [:]
        for pair in list as? [[String: Any]] ?? [] {
            guard let key = pair["key"] as? String, let value = pair["value"] as? [String: Any] else { continue }
            result[key] = value["stringValue"] ?? value["intValue"] ?? value["boolValue"] ?? value["doubleValue"]
        }
        return result
    }
}

@Suite struct OTLPExportTests {
    /// A Swift crash replayed with `--otlp`: the crash is an `app.crash` record, FATAL, with the
    /// exception attributes, the thread, and the app's own frame; the session's other events are
    /// INFO records; the resource says which process wrote them.
    @Test func replayedSwiftCrashIsAnAppCrashLogRecord() throws {
        let receiver = try OTLPReceiver()
        let directory = makeTemporaryDirectory("otlp-crash")
        let crashed = try run(
            Paths.swiftSample, ["swift-null-read", "--context", "dispatch"],
            environment: [
                "CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no", "CRASH_SAMPLE_DISPATCH_WORKERS": "2",
            ])
        #expect(crashed.signal == SIGSEGV)
        let replay = try run(Paths.crashcap, ["replay", directory, "--otlp", receiver.url], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stderr)")
        #expect(replay.stdout.contains("uploaded 3 of 3 events to \(receiver.url)/v1/logs"), "\(replay.stdout)")
        let records = receiver.records
        #expect(
            records.compactMap { $0.record["eventName"] as? String }.sorted() == ["$AppEnd", "$AppStart", "app.crash"])
        let (resource, crash) = try #require(records.first { $0.record["eventName"] as? String == "app.crash" })
        #expect(
            receiver.requests.flatMap { $0["resourceLogs"] as? [Any] ?? [] }.count == 1, "one process, one resource")
        #expect(resource["service.name"] as? String == "crash-sample-swift")
        #expect(resource["service.version"] as? String == "1.0.0")
        #expect(resource["process.executable.name"] as? String == "crash-sample-swift")
        #expect(Int(resource["process.pid"] as? String ?? "") ?? 0 > 0, "\(resource)")
        #expect(resource["host.name"] as? String == ProcessInfo.processInfo.hostName)
        #expect(resource["os.type"] as? String == "linux")
        #expect(crash["severityNumber"] as? String == "SEVERITY_NUMBER_FATAL")
        #expect(crash["severityText"] as? String == "FATAL")
        let time = UInt64(crash["timeUnixNano"] as? String ?? "") ?? 0
        #expect(time > 1_700_000_000 * 1_000_000_000 && time % 1_000_000 == 0, "the event's milliseconds")
        let attributes = OTLPReceiver.attributes(crash["attributes"])
        #expect(attributes["exception.type"] as? String == "SIGSEGV (SEGV_MAPERR)", "\(attributes)")
        #expect((attributes["exception.message"] as? String ?? "").hasPrefix("SIGSEGV (SEGV_MAPERR) at 0x"))
        let stack = attributes["exception.stacktrace"] as? String ?? ""
        #expect(stack.contains("crashSwiftNullRead"), "\(stack.prefix(600))")
        #expect(stack.components(separatedBy: "\nthread ").count >= 3, "every thread: \(stack.prefix(2000))")
        #expect((attributes["code.function"] as? String ?? "").contains("crashSwiftNullRead"), "\(attributes)")
        #expect((attributes["code.filepath"] as? String ?? "").hasSuffix("CrashSamples/Swift/main.swift"))
        #expect(Int(attributes["code.lineno"] as? String ?? "") ?? 0 > 0)
        #expect(Int(attributes["thread.id"] as? String ?? "") ?? 0 > 0)
        #expect(attributes["thread.name"] is String)
        #expect((attributes["log.record.uid"] as? String ?? "").count > 10)
        #expect(attributes["crash_fingerprint"] is String, "the properties as attributes too")
        let start = try #require(records.first { $0.record["eventName"] as? String == "$AppStart" }).record
        #expect(start["severityNumber"] as? String == "SEVERITY_NUMBER_INFO")
        #expect(OTLPReceiver.attributes(start["attributes"])["session.id"] as? String != nil)
    }

    /// The Swift SDK's `Configuration.otlpURL`: the next start sends the crash and the session's
    /// tracked events as OTLP logs, with no crashcap in between.
    /// Its API key comes from OpenTelemetry's own variable, as the receiver demands one.
    @Test func swiftSDKSendsToOTLPFromItsConfiguration() throws {
        let receiver = try OTLPReceiver(["--require-header", "x-api-key", "s3cret key"])
        let directory = makeTemporaryDirectory("otlp-sdk")
        let environment = [
            "CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_OTLP_URL": receiver.url, "SWIFT_BACKTRACE": "enable=no",
            "CRASH_SAMPLE_EVENTS": "3", "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=s3cret%20key,other=1",
        ]
        let crashed = try run(Paths.swiftSample, ["pipeline-crash"], environment: environment)
        #expect(crashed.signal == SIGSEGV)
        let restarted = try run(Paths.swiftSample, ["pipeline-track"], environment: environment)
        #expect(restarted.exitCode == 0, "\(restarted.stderr)")
        let names = receiver.records.compactMap { $0.record["eventName"] as? String }
        #expect(names.contains("app.crash"), "\(names)")
        #expect(names.filter { $0 == "$AppStart" }.count == 2, "\(names)")
        let uids = receiver.records.compactMap {
            OTLPReceiver.attributes($0.record["attributes"])["log.record.uid"] as? String
        }
        #expect(Set(uids).count == uids.count, "every record once")
    }

    /// 503 with Retry-After is waited out and sent again; a 400 sets the batch aside (exit 65).
    @Test func failuresAreRetriedOrSetAside() throws {
        let directory = makeTemporaryDirectory("otlp-retry")
        let crashed = try run(Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": directory])
        #expect(crashed.signal == SIGABRT)
        let busy = try OTLPReceiver(["--fail-first", "1", "--status", "503", "--retry-after", "1"])
        let start = Date()
        let replay = try run(Paths.crashcap, ["replay", directory, "--otlp", busy.url], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stderr)")
        #expect(Date().timeIntervalSince(start) >= 1, "Retry-After: 1 was honoured")
        #expect(replay.stderr.contains("retry after 1 s"), "\(replay.stderr)")
        #expect(busy.records.count == 3)
        #expect(busy.records.contains { ($0.record["attributes"] as? [[String: Any]])?.isEmpty == false })

        let second = makeTemporaryDirectory("otlp-refused")
        #expect(try run(Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": second]).signal == SIGABRT)
        let refusing = try OTLPReceiver(["--fail-first", "1", "--status", "400"])
        let refused = try run(Paths.crashcap, ["replay", second, "--otlp", refusing.url], timeout: 60)
        #expect(refused.exitCode == 65, "\(refused.stderr)")
        #expect(refused.stderr.contains("refused by the server"), "\(refused.stderr)")
    }

    /// The sidecar with `--otlp`: a crash reaches the OTLP receiver without the app starting again.
    @Test func watchSendsACrashAsItHappens() throws {
        let receiver = try OTLPReceiver()
        let directory = makeTemporaryDirectory("otlp-watch")
        let watch = try Child(Paths.crashcap, ["watch", directory, "--otlp", receiver.url])
        #expect(watch.waitForOutput("watching"))
        let crashed = try run(Paths.cSample, ["null-read"], environment: ["CRASHCAPTURE_DIR": directory])
        #expect(crashed.signal == SIGSEGV)
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline, !receiver.records.contains(where: { $0.record["eventName"] as? String == "app.crash" })
        {
            usleep(50_000)
        }
        let crash = try #require(
            receiver.records.first { $0.record["eventName"] as? String == "app.crash" },
            "watch: \(watch.stdout) \(watch.stderr); receiver: \(receiver.child.stderr); records: \(receiver.records.count)"
        )
        #expect(
            OTLPReceiver.attributes(crash.record["attributes"])["exception.type"] as? String == "SIGSEGV (SEGV_MAPERR)")
        kill(watch.pid, SIGTERM)
        #expect(watch.wait(timeout: 10))
    }

    /// A receiver that takes the batch but refuses two of its records (a partial success): the
    /// batch is not sent again, and the tool says what the receiver said.
    @Test func aPartialSuccessIsReportedNotRetried() throws {
        let directory = makeTemporaryDirectory("otlp-partial")
        #expect(try run(Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": directory]).signal == SIGABRT)
        let receiver = try OTLPReceiver(["--partial", "2", "attribute too long"])
        let replay = try run(Paths.crashcap, ["replay", directory, "--otlp", receiver.url], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stderr)")
        #expect(replay.stdout.contains("uploaded 3 of 3 events"), "\(replay.stdout)")
        #expect(
            replay.stderr.contains(
                "the receiver refused 2 records of the batches it took (not sent again): the receiver refused 2 records: attribute too long"
            ),
            "\(replay.stderr)")
        #expect(receiver.requests.count == 1, "sent once")
    }

    /// `--header` gives a receiver its API key; without it the batch is refused (401) and set
    /// aside; a header that would smuggle a line into the request is refused before any is sent.
    @Test func headersReachTheReceiver() throws {
        let receiver = try OTLPReceiver(["--require-header", "x-api-key", "s3cret"])
        let refusedDirectory = makeTemporaryDirectory("otlp-no-key")
        #expect(
            try run(Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": refusedDirectory]).signal == SIGABRT)
        let refused = try run(Paths.crashcap, ["replay", refusedDirectory, "--otlp", receiver.url], timeout: 60)
        #expect(refused.exitCode == 65, "\(refused.stderr)")
        #expect(refused.stderr.contains("HTTP 401"), "\(refused.stderr)")
        let directory = makeTemporaryDirectory("otlp-key")
        #expect(try run(Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": directory]).signal == SIGABRT)
        let sent = try run(
            Paths.crashcap, ["replay", directory, "--otlp", receiver.url, "--header", "x-api-key: s3cret"], timeout: 60)
        #expect(sent.exitCode == 0, "\(sent.stderr)")
        #expect(receiver.records.count == 3)
        let smuggled = try run(
            Paths.crashcap, ["upload", directory, "--otlp", receiver.url, "--header", "x-api-key: a\r\nx-admin: 1"])
        #expect(smuggled.exitCode == 64, "\(smuggled.stderr)")
        #expect(smuggled.stderr.contains("line break"), "\(smuggled.stderr)")
    }

    @Test func otlpAndUploadTogetherIsAUsageError() throws {
        let both = try run(
            Paths.crashcap,
            [
                "upload", makeTemporaryDirectory("otlp-usage"), "--upload", "http://127.0.0.1:1/sa", "--otlp",
                "http://127.0.0.1:1",
            ])
        #expect(both.exitCode == 64)
        #expect(both.stderr.contains("give one"), "\(both.stderr)")
    }
}
