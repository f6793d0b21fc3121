import CrashCapture
import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// crashcapture_track: a C program's events wait in its session file (it has no store), survive
/// a normal exit as well as a crash, and a replay imports them with the session's lifecycle.
@Suite struct CTrackTests {
    func sessionFiles(_ directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter(SessionFile.isSessionFileName)
    }

    @Test(arguments: ["track-then-exit", "track-then-segv"])
    func eventsOfACProgramReachTheStoreThroughReplay(kind: String) throws {
        let directory = makeTemporaryDirectory("c-track")
        let result = try run(
            Paths.cSample, [kind], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"],
            timeout: 30)
        let crashes = kind.hasSuffix("segv")
        #expect(crashes ? result.signal == SIGSEGV : result.exitCode == 0, "\(result.stderr)")
        #expect(result.stdout.contains("bad name: event name must match"), "\(result.stdout)")
        #expect(sessionFiles(directory).count == 1, "the session file keeps the events")
        let replay = try run(Paths.crashcap, ["replay", directory], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stdout)\(replay.stderr)")
        let events = try storedEvents(in: directory)
        let tracked = events.filter { $0["event"] as? String == "c_event" }
        #expect(tracked.count == 3)
        #expect(
            tracked.compactMap { ($0["properties"] as? [String: Any])?["index"] as? String } == ["0", "1", "2"])
        let first = try #require(tracked.first)
        #expect((first["properties"] as? [String: Any])?["screen"] as? String == "checkout")
        #expect((first["lib"] as? [String: Any])?["$lib_method"] as? String == "code")
        #expect(first["distinct_id"] as? String != nil && first["session_id"] as? String != nil)
        #expect(events.filter { $0["event"] as? String == "$AppStart" }.count == 1)
        let ends = events.filter { $0["event"] as? String == "$AppEnd" }
        #expect(ends.count == 1)
        let reason = (ends.first?["properties"] as? [String: Any])?["$app_end_reason"] as? String
        #expect(reason == (crashes ? "crash" : "exit"), "\(reason ?? "none")")
        #expect(events.contains { $0["event"] as? String == "$AppCrashed" } == crashes)
        #expect(sessionFiles(directory).isEmpty, "replay closed the session")
    }

    /// What the collector would refuse (a key twice in one object, text that is not strict UTF-8)
    /// is refused by track() and install, where it is made: the collector refuses a whole batch
    /// for one such event, and static properties that are not JSON spoil every report.
    @Test func badInputIsRefusedWhereItIsMade() throws {
        let directory = makeTemporaryDirectory("c-refusals")
        let result = try run(
            Paths.cSample, ["refusals"], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"],
            timeout: 30)
        #expect(result.exitCode == 0, "\(result.stdout)\(result.stderr)")
        let lines = result.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 19, "\(result.stdout)")
        #expect(lines.allSatisfy { $0.hasPrefix("ok ") }, "\(result.stdout)")
        #expect(
            lines.contains { $0.hasPrefix("ok track with a key twice: ") && $0.contains("\"screen\" is given twice") })
        #expect(result.stdout.contains("ok track with good properties"))
        #expect(result.stdout.contains("ok install with a trailing comma: prevalidated_properties_json"))
    }
}
