import CrashCapture
import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Context, breadcrumbs and attached files: set while the app runs, kept in the session file
/// (or read at the crash, for a file's tail), and in the replayed $AppCrashed.
@Suite struct CrashNotesTests {
    func crashedEvent(_ directory: String) throws -> [String: Any] {
        let replay = try run(Paths.crashcap, ["replay", directory], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stdout)\(replay.stderr)")
        return try #require(try storedEvents(in: directory).first { $0["event"] as? String == "$AppCrashed" })
    }

    func writeLog(_ directory: String) throws -> (path: String, tail: String) {
        let path = makeTemporaryDirectory("notes-log") + "/app.log"
        let text = (0..<300).map { String(format: "line %04d\n", $0) }.joined()
        try text.write(toFile: path, atomically: true, encoding: .utf8)
        return (path, String(text.suffix(1000)))
    }

    func expectNotes(_ crashed: [String: Any], log tail: String, context expected: [String: AnyHashable]) throws {
        let properties = try #require(crashed["properties"] as? [String: Any])
        let context = try #require(properties["crash_context"] as? [String: Any], "\(properties.keys.sorted())")
        #expect(context.count == expected.count, "\(context)")
        for (key, value) in expected { #expect(context[key] as? AnyHashable == value, "\(key): \(context)") }
        let crumbs = try #require(properties["crash_breadcrumbs"] as? [String]).compactMap {
            try JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any]
        }
        let said = crumbs.compactMap { $0["breadcrumb"] as? String }
        #expect(said == ["opened cart", "paid"], "\(crumbs)")
        let crash = try #require(crashed["crash"] as? [String: Any])
        let attachment = try #require((crash["attachments"] as? [[String: Any]])?.first)
        #expect(attachment["text"] as? String == tail)
        #expect((attachment["bytes"] as? NSNumber)?.intValue == 1000)
        #expect((attachment["offset"] as? NSNumber)?.intValue == 2000)
        #expect(attachment["base64"] == nil, "the replay turned it into text")
    }

    /// `program kind`, given a log to attach, crashed and replayed: its $AppCrashed, and the
    /// log's last 1,000 bytes.
    func crashWithNotes(_ program: String, _ kind: String) throws -> (event: [String: Any], tail: String) {
        let directory = makeTemporaryDirectory(kind)
        let log = try writeLog(directory)
        let crashed = try run(
            program, [kind],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_LOG": log.path, "SWIFT_BACKTRACE": "enable=no"],
            timeout: 30)
        #expect(crashed.signal == SIGSEGV, "\(crashed.stderr)")
        return (try crashedEvent(directory), log.tail)
    }

    @Test func theSwiftSDKsNotesReachTheReplayedCrash() throws {
        let (event, tail) = try crashWithNotes(Paths.swiftSample, "pipeline-notes-crash")
        try expectNotes(event, log: tail, context: ["order_id": "A-17", "tier": 3])
        // Events and breadcrumbs in the order they happened.
        let crumbs = try #require((event["properties"] as? [String: Any])?["crash_breadcrumbs"] as? [String])
        let order = crumbs.compactMap { text -> String? in
            let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any]
            return object?["breadcrumb"] as? String ?? object?["event"] as? String
        }
        #expect(
            order.suffix(4) == ["before_cart", "opened cart", "after_cart", "paid"], "\(order)")
    }

    @Test func theCAPIsNotesReachTheReplayedCrash() throws {
        let (event, tail) = try crashWithNotes(Paths.cSample, "notes-then-segv")
        try expectNotes(event, log: tail, context: ["order_id": "A-17"])
    }

    @Test func badNotesAreClearErrors() {
        do {
            try CrashCapture.setContext("1st", "x")
            Issue.record("a bad key was accepted")
        } catch {
            #expect(error.kind == .invalidArgument)
        }
        do {
            try CrashCapture.setContext("fine", "x")
            Issue.record("set before install")
        } catch {
            #expect(error.kind == .notInstalled)
        }
        do {
            try CrashCapture.attachFile("/var/log/x.log", maxBytes: 1 << 20)
            Issue.record("an attachment of 1 MiB was accepted")
        } catch {
            #expect(error.kind == .invalidArgument && error.message.contains("max_bytes"))
        }
    }

    /// `CrashCapture.lastRun`, right after install: whether the previous run crashed, with what,
    /// and how many crashes in a row, over five starts in one directory.
    @Test func lastRunSaysHowThePreviousRunEnded() throws {
        let directory = makeTemporaryDirectory("last-run")
        func start(crashing: Bool) throws -> [String: Any] {
            var environment = [
                "CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no", "CRASH_SAMPLE_EVENTS": "0",
            ]
            if crashing { environment["CRASH_SAMPLE_CRASH_AFTER"] = "1" }
            let result = try run(Paths.swiftSample, ["pipeline-last-run"], environment: environment, timeout: 30)
            #expect(crashing ? result.signal == SIGSEGV : result.exitCode == 0, "\(result.stderr)")
            let line = try #require(result.stdout.split(separator: "\n").first.map(String.init), "\(result.stderr)")
            return try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        }
        let first = try start(crashing: false)
        #expect(first["crashed"] as? Bool == false && first["consecutive"] as? Int == 0)
        let second = try start(crashing: true)
        #expect(second["crashed"] as? Bool == false, "\(second)")
        let third = try start(crashing: true)
        #expect(third["crashed"] as? Bool == true && third["consecutive"] as? Int == 1, "\(third)")
        #expect(third["signal"] as? String == "SIGSEGV")
        #expect((third["title"] as? String)?.hasPrefix("SIGSEGV") == true, "\(third)")
        let fourth = try start(crashing: false)
        #expect(fourth["crashed"] as? Bool == true && fourth["consecutive"] as? Int == 2, "\(fourth)")
        let fifth = try start(crashing: false)
        #expect(fifth["crashed"] as? Bool == false && fifth["consecutive"] as? Int == 0, "\(fifth)")
    }
}
