import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A receiver of minidumps that parses each request as Sentry's endpoint does
/// (Tests/minidump_receiver.py, Python's own multipart parser).
final class MinidumpReceiver {
    let child: Child
    let output: String
    let url: String

    init(_ arguments: [String] = []) throws {
        output = makeTemporaryDirectory("minidump-receiver") + "/requests.jsonl"
        child = try Child(
            "/usr/bin/env", ["python3", Paths.packageRoot + "/Tests/minidump_receiver.py", output] + arguments)
        guard child.waitForOutput("listening on"),
            let port = child.stdout.split(separator: " ").last?.trimmingCharacters(in: .whitespacesAndNewlines)
        else { throw TestFailure("the minidump receiver did not start: \(child.stderr)") }
        url = "http://127.0.0.1:\(port)"
    }

    /// Every request the receiver accepted: its id, its form fields, the dump's name, size and magic.
    var accepted: [[String: Any]] {
        ((try? String(contentsOfFile: output, encoding: .utf8)) ?? "").split(separator: "\n").compactMap {
            try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
    }
}

@Suite(.serialized) struct MinidumpUploadTests {
    func crash(into directory: String) throws {
        let crashed = try run(
            Paths.swiftSample, ["swift-null-read"],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(crashed.signal == SIGSEGV)
    }

    /// Two crashes, one replay: one dump each, in `upload_file_minidump`, the first attempt
    /// answered 503 with Retry-After and retried once; the receiver's ids are printed; a second
    /// run sends nothing again.
    @Test func eachCrashIsSentOnceAfterA503() throws {
        let receiver = try MinidumpReceiver(["--fail-first", "1", "--status", "503", "--retry-after", "1"])
        let directory = makeTemporaryDirectory("minidump-upload")
        try crash(into: directory)
        try crash(into: directory)
        let endpoint = receiver.url + "/api/42/minidump/?sentry_key=0123abcd"
        let replay = try run(Paths.crashcap, ["replay", directory, "--minidump-url", endpoint], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stdout)\(replay.stderr)")
        #expect(
            replay.stderr.contains("minidump upload attempt 1 failed (HTTP 503, retry after 1 s"), "\(replay.stderr)")
        #expect(!replay.stderr.contains("attempt 2"), "one retry: \(replay.stderr)")
        let accepted = receiver.accepted
        #expect(accepted.count == 2, "\(accepted)")
        var crashIDs: [String] = []
        for request in accepted {
            let dump = request["dump"] as? [String: Any] ?? [:]
            #expect(dump["magic"] as? String == "MDMP")
            #expect((dump["size"] as? Int ?? 0) > 10_000)
            let fields = request["fields"] as? [String: String] ?? [:]
            #expect(fields["sentry[tags][signal]"] == "SIGSEGV", "\(fields)")
            #expect(fields["sentry[tags][app]"]?.isEmpty == false, "\(fields)")
            #expect(fields["sentry[tags][fingerprint]"]?.isEmpty == false, "\(fields)")
            #expect(fields["sentry[release]"]?.isEmpty == false, "\(fields)")
            let crashID = try #require(fields["sentry[tags][crash_id]"])
            #expect(dump["filename"] as? String == crashID + ".dmp")
            crashIDs.append(crashID)
            // The receiver's answer is logged with the crash it was for.
            #expect(replay.stdout.contains("minidump of \(crashID) sent"), "\(replay.stdout)")
            #expect(replay.stdout.contains("event id \(request["id"] as? String ?? "?")"), "\(replay.stdout)")
        }
        #expect(Set(crashIDs).count == 2)
        #expect(request(in: accepted, "key") == ["0123abcd", "0123abcd"])

        // Exactly once: the same store, asked again, has nothing left to send.
        let again = try run(Paths.crashcap, ["upload", directory, "--minidump-url", endpoint], timeout: 60)
        #expect(again.exitCode == 0, "\(again.stderr)")
        #expect(!again.stdout.contains("minidump of"), "\(again.stdout)")
        #expect(receiver.accepted.count == 2)
    }

    /// The key in a header instead of the URL (`--header`), as Sentry's X-Sentry-Auth carries it.
    @Test func authHeaderReachesTheReceiver() throws {
        let receiver = try MinidumpReceiver()
        let directory = makeTemporaryDirectory("minidump-header")
        try crash(into: directory)
        let replay = try run(
            Paths.crashcap,
            [
                "replay", directory, "--minidump-url", receiver.url + "/api/7/minidump/", "--header",
                "X-Sentry-Auth: Sentry sentry_version=7, sentry_key=feedbeef",
            ], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stderr)")
        #expect(request(in: receiver.accepted, "auth") == ["Sentry sentry_version=7, sentry_key=feedbeef"])
    }

    /// The SDK (`Configuration.minidumpURL`, here through CRASHCAPTURE_MINIDUMP_URL): the next
    /// start imports the crash and sends its minidump from a thread of its own, once.
    @Test func theNextStartSendsTheCrash() throws {
        let receiver = try MinidumpReceiver()
        let directory = makeTemporaryDirectory("minidump-sdk")
        try crash(into: directory)
        let environment = [
            "CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no",
            "CRASHCAPTURE_MINIDUMP_URL": receiver.url + "/api/3/minidump/?sentry_key=5ca1ab1e",
        ]
        for _ in 0..<2 {
            let next = try Child(Paths.swiftSample, ["pipeline-wait"], environment: environment)
            #expect(next.waitForOutput("ready"), "\(next.stderr)")
            let deadline = Date().addingTimeInterval(20)
            while receiver.accepted.isEmpty && Date() < deadline { usleep(20_000) }
            usleep(300_000)  // time for a second sending, were there one
            #expect(next.waitOrKill(timeout: 0))
        }
        let accepted = receiver.accepted
        #expect(accepted.count == 1, "\(accepted)")
        #expect((accepted.first?["dump"] as? [String: Any])?["magic"] as? String == "MDMP")
    }

    /// `crashcap watch` as a sidecar: a C crash under the watch reaches the receiver as a
    /// minidump without the app starting again, once, even after the watch has looked again.
    @Test func theWatchSendsEachCrashOnce() throws {
        let receiver = try MinidumpReceiver()
        let directory = makeTemporaryDirectory("minidump-watch")
        let watch = try Child(
            Paths.crashcap, ["watch", directory, "--minidump-url", receiver.url + "/api/9/minidump/?sentry_key=ab12"])
        #expect(watch.waitForOutput("watching"), "\(watch.stderr)")
        let crashed = try run(
            Paths.cSample, ["null-read"], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(crashed.signal == SIGSEGV)
        let deadline = Date().addingTimeInterval(20)
        while receiver.accepted.isEmpty && Date() < deadline { usleep(20_000) }
        // A second crash: the first is not sent again with it.
        let again = try run(
            Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(again.signal == SIGABRT)
        let later = Date().addingTimeInterval(20)
        while receiver.accepted.count < 2 && Date() < later { usleep(20_000) }
        kill(watch.pid, SIGTERM)
        #expect(watch.wait(timeout: 10))
        let accepted = receiver.accepted
        #expect(accepted.count == 2, "\(accepted) \(watch.stdout) \(watch.stderr)")
        #expect(accepted.allSatisfy { ($0["dump"] as? [String: Any])?["magic"] as? String == "MDMP" })
        let names = accepted.compactMap { ($0["dump"] as? [String: Any])?["filename"] as? String }
        #expect(Set(names).count == 2, "two crashes, two dumps: \(names)")
    }

    func request(in accepted: [[String: Any]], _ key: String) -> [String] {
        accepted.compactMap { $0[key] as? String }
    }
}
