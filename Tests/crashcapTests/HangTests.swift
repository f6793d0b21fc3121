import CrashCapture
import CrashFileFormat
import Foundation
import ProcessSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Hangs caught by a watch: real processes whose other threads wait as a server's do
/// (epoll_wait, nanosleep, poll, sigtimedwait), each counting any EINTR it sees. The report is
/// read back as an analyst gets it: replayed by `crashcap replay` into the store, frames named.
@Suite struct HangTests {
    func replay(_ directory: String) throws -> [[String: Any]] {
        let replay = try run(Paths.crashcap, ["replay", directory], timeout: 120)
        #expect(replay.exitCode == 0, "\(replay.stdout)\(replay.stderr)")
        return try storedEvents(in: directory)
    }

    func hangFiles(_ directory: String) -> [String] {
        crashFiles(in: directory).filter { ($0 as NSString).lastPathComponent.contains("-hang-") }
    }

    /// The functions on a stored thread's stack, in order.
    func functions(_ thread: [String: Any]) -> [String] {
        (thread["frames"] as? [[String: Any]] ?? []).map { $0["function"] as? String ?? "?" }
    }

    func properties(_ event: [String: Any]) -> [String: Any] { event["properties"] as? [String: Any] ?? [:] }

    /// The main thread blocks in a handler's sleep for a second past its watch's 200 ms; four
    /// other threads wait. The report shows the main thread in the handler, every waiting thread
    /// captured, and no thread of the process saw EINTR; the hang's end follows with its length.
    @Test func aBlockedLoopIsReportedWithEveryThreadAndNoEINTR() throws {
        let directory = makeTemporaryDirectory("hang-sleep")
        let result = try run(
            Paths.cSample, ["hang-sleep"], environment: ["CRASHCAPTURE_DIR": directory], timeout: 60)
        #expect(result.exitCode == 0, "\(result.stderr)")
        #expect(result.stdout.contains("eintr=0"), "the freeze ended a wait: \(result.stdout)")
        #expect(hangFiles(directory).count == 2, "\(crashFiles(in: directory))")
        let events = try replay(directory)
        let hang = try #require(events.first { $0["event"] as? String == "$AppHang" })
        let end = try #require(events.first { $0["event"] as? String == "$AppHangEnd" })
        let facts = properties(hang)
        #expect(facts["hang_watch"] as? String == "main-loop")
        #expect(facts["hang_threshold_ms"] as? Int == 200)
        #expect((facts["hang_stalled_ms"] as? Int ?? 0) >= 200)
        #expect(facts["hang_main_thread"] as? Bool == true)
        #expect(facts["hang_deadlock"] as? Bool == false)
        #expect((facts["hang_threads_held_ms"] as? Double ?? 99) < 50)
        #expect((facts["hang_title"] as? String ?? "").contains("sample_handler_blocked_in_sleep"), "\(facts)")
        #expect((facts["app_hang_reason"] as? String ?? "").contains("sample_handler_blocked_in_sleep"))
        let details = try #require(hang["hang"] as? [String: Any])
        #expect(details["threads_frozen_by"] as? String == "ptrace")
        let threads = try #require(details["threads"] as? [[String: Any]])
        let hung = try #require(threads.first { $0["hung"] as? Bool == true })
        #expect(hung["tid"] as? Int == facts["hang_tid"] as? Int)
        #expect(functions(hung).contains("sample_handler_blocked_in_sleep"), "\(functions(hung))")
        #expect(functions(hung).contains("hang"))
        for name in ["epoll-waiter", "sleeper", "poller", "sigwaiter"] {
            let thread = try #require(threads.first { $0["name"] as? String == name }, "\(name) not listed")
            #expect(thread["captured"] as? Bool == true, "\(name): \(thread)")
            #expect(thread["state"] as? String == "S", "\(name) was waiting")
            #expect(functions(thread).count >= 3, "\(name): \(functions(thread))")
        }
        let ended = properties(end)
        #expect(ended["hang_id"] as? String == facts["hang_id"] as? String)
        #expect((ended["hang_duration_ms"] as? Int ?? 0) >= 900, "\(ended)")
        #expect(hangFiles(directory).isEmpty, "replay removes what it imported")
    }

    /// Two threads take two locks in opposite orders; the process never recovers, and the
    /// orchestrator kills it. The report was on disk before the kill: at the next replay the
    /// `$AppHang` names the deadlock, both threads and the locks.
    @Test func aDeadlockIsNamedAndOutlivesSIGKILL() throws {
        let directory = makeTemporaryDirectory("hang-deadlock")
        let child = try Child(Paths.cSample, ["hang-deadlock"], environment: ["CRASHCAPTURE_DIR": directory])
        defer { _ = child.waitOrKill(timeout: 0) }
        let deadline = Date().addingTimeInterval(20)
        while hangFiles(directory).isEmpty && Date() < deadline { usleep(20_000) }
        #expect(!hangFiles(directory).isEmpty, "no hang report: \(child.stderr)")
        kill(child.pid, SIGKILL)
        _ = child.wait(timeout: 10)
        #expect(child.signal == SIGKILL)
        // Read before the replay, as a person at the machine reads it.
        let shown = try run(Paths.crashcap, ["show", directory, "--no-color"])
        #expect(shown.stdout.contains("title:    Deadlock in sample_deadlock_take_a_then_b"), "\(shown.stdout)")
        #expect(shown.stdout.contains("\"locker-b\" waits for lock"), "\(shown.stdout)")
        #expect(shown.stdout.contains("frozen by ptrace"))
        let events = try replay(directory)
        let hang = try #require(events.first { $0["event"] as? String == "$AppHang" })
        let facts = properties(hang)
        #expect(facts["hang_deadlock"] as? Bool == true, "\(facts)")
        #expect(
            (facts["hang_title"] as? String ?? "").hasPrefix("Deadlock in sample_deadlock_take_a_then_b"), "\(facts)")
        let reason = facts["app_hang_reason"] as? String ?? ""
        #expect(reason.contains("deadlock: thread \(child.pid)"), "\(reason)")
        #expect(reason.contains("\"locker-b\""), "\(reason)")
        let details = try #require(hang["hang"] as? [String: Any])
        let cycle = try #require(details["deadlock"] as? [[String: Any]])
        #expect(cycle.count == 2)
        let threads = try #require(details["threads"] as? [[String: Any]])
        let locker = try #require(threads.first { $0["name"] as? String == "locker-b" })
        #expect(locker["waits_for"] as? Int == Int(child.pid))
        #expect(functions(locker).contains("sample_deadlock_take_b_then_a"), "\(functions(locker))")
        #expect(!events.contains { $0["event"] as? String == "$AppHangEnd" }, "the hang never ended")
        // The killed session is closed as such, beside its hang.
        let ends = events.filter { $0["event"] as? String == "$AppEnd" }
        #expect(ends.count == 1 && properties(ends[0])["$app_end_reason"] as? String == "killed", "\(ends)")
    }
}

/// The Swift SDK: a SwiftNIO event loop watched through CrashCaptureNIO, blocked by a handler
/// that sleeps; the live process imports its own report, names every frame, and ends the hang.
@Suite struct SwiftHangTests {
    /// The Swift sample's `kind` run to its end under capture (its hang `hangMilliseconds` long
    /// where it has one), with its directory, the events then in its store among them.
    func runSample(_ kind: String, hangMilliseconds: Int? = nil, threshold: Int) throws -> (
        result: RunResult, directory: String
    ) {
        let directory = makeTemporaryDirectory(kind)
        var environment = ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_HANG_THRESHOLD_MS": "\(threshold)"]
        if let hangMilliseconds { environment["CRASH_SAMPLE_HANG_MS"] = "\(hangMilliseconds)" }
        return (try run(Paths.swiftSample, [kind], environment: environment, timeout: 60), directory)
    }

    @Test func aBlockedEventLoopIsImportedByTheLiveProcess() throws {
        guard try run(Paths.swiftSample, ["--has-nio"]).stdout.contains("yes") else { return }
        let (result, directory) = try runSample("hang-nio", hangMilliseconds: 1500, threshold: 300)
        #expect(result.exitCode == 0, "\(result.stderr)")
        #expect(result.stdout.contains("loop unblocked"))
        #expect(result.stderr.contains("hang: a watch missed its threshold"), "\(result.stderr)")
        // Imported before the process ended: no hang file is left for a replay.
        #expect(HangTests().hangFiles(directory).isEmpty, "\(crashFiles(in: directory))")
        let events = try storedEvents(in: directory)
        let hang = try #require(events.first { $0["event"] as? String == "$AppHang" })
        let facts = HangTests().properties(hang)
        #expect(facts["hang_watch"] as? String == "nio-loop-0")
        #expect((facts["hang_title"] as? String ?? "").contains("handleRequestBlockingInSleep"), "\(facts)")
        let details = try #require(hang["hang"] as? [String: Any])
        let threads = try #require(details["threads"] as? [[String: Any]])
        let hung = try #require(threads.first { $0["hung"] as? Bool == true })
        let functions = HangTests().functions(hung)
        #expect(functions.contains { $0.contains("handleRequestBlockingInSleep") }, "\(functions)")
        #expect(functions.contains { $0.contains("SelectableEventLoop") }, "\(functions)")
        // The other loop sits in epoll_wait, captured, and was not woken with EINTR (SwiftNIO
        // would retry; the rewind makes it never see one).
        #expect(
            threads.filter { $0["captured"] as? Bool == true }.count == threads.count,
            "\(threads.map { $0["name"] ?? "" })")
        let end = try #require(events.first { $0["event"] as? String == "$AppHangEnd" })
        #expect((HangTests().properties(end)["hang_duration_ms"] as? Int ?? 0) >= 1200)
    }

    /// The main queue watched (`watchMainQueue`) in an app that runs it: a block on it sleeps
    /// past the threshold, and the main thread is the hung one.
    @Test func aBlockedMainQueueIsReported() throws {
        let (result, directory) = try runSample("hang-main-queue", hangMilliseconds: 1000, threshold: 300)
        #expect(result.exitCode == 0, "\(result.stderr)")
        let events = try storedEvents(in: directory)
        let hang = try #require(events.first { $0["event"] as? String == "$AppHang" }, "\(result.stderr)")
        let facts = HangTests().properties(hang)
        #expect(facts["hang_watch"] as? String == "main-queue")
        #expect(facts["hang_main_thread"] as? Bool == true)
        #expect((facts["hang_title"] as? String ?? "").contains("blockTheMainQueue"), "\(facts)")
        #expect(events.contains { $0["event"] as? String == "$AppHangEnd" })
    }

    /// A hang inside a named Swift task, two async calls deep: the hung thread carries the task's
    /// name and its [async] callers, named.
    @Test func aHangInsideANamedTaskShowsTheTaskAndItsAsyncCallers() throws {
        let (result, directory) = try runSample("hang-in-task", hangMilliseconds: 800, threshold: 200)
        #expect(result.exitCode == 0, "\(result.stderr)")
        let hang = try #require(
            try storedEvents(in: directory).first { $0["event"] as? String == "$AppHang" }, "\(result.stderr)")
        let threads = try #require((hang["hang"] as? [String: Any])?["threads"] as? [[String: Any]])
        let hung = try #require(threads.first { $0["hung"] as? Bool == true })
        #expect(hung["task_name"] as? String == "ingest-loop", "\(hung)")
        let callers = (hung["async_frames"] as? [[String: Any]] ?? []).compactMap { $0["function"] as? String }
        #expect(callers.contains { $0.contains("ingestLevel1") }, "\(callers)")
        #expect(HangTests().functions(hung).contains { $0.contains("ingestLevel2") }, "\(HangTests().functions(hung))")
    }

    /// A watch beaten only from a thread that has ended (without stop()) reported a hang of
    /// thread 0: now nothing is reported, and that the watch is no longer checked is logged once.
    @Test func aWatchWhoseBeaterEndedIsNoLongerChecked() throws {
        let (result, directory) = try runSample("hang-watch-thread-ended", threshold: 200)
        #expect(result.exitCode == 0, "\(result.stderr)")
        let hangs = try storedEvents(in: directory).filter { $0["event"] as? String == "$AppHang" }
        #expect(hangs.isEmpty, "\(hangs)")
        #expect(HangTests().hangFiles(directory).isEmpty)
        #expect(result.stderr.components(separatedBy: "watch no longer checked").count == 2, "\(result.stderr)")
    }

    /// A watch stopped and then released after a new watch took its slot: the new one is still
    /// checked (the release does not stop it a second time), and its hang is reported.
    @Test func aWatchStoppedTwiceLeavesItsSuccessorWatched() throws {
        let (result, directory) = try runSample("hang-watch-reuse", threshold: 200)
        #expect(result.exitCode == 0, "\(result.stderr)")
        let hangs = try storedEvents(in: directory).filter { $0["event"] as? String == "$AppHang" }
        #expect(hangs.map { HangTests().properties($0)["hang_watch"] as? String } == ["second"], "\(result.stderr)")
    }

    /// Sync-over-async: the main thread waits for a task that awaits a continuation nobody
    /// resumes. The report, imported by the live process before the kill, shows the main thread
    /// in the app's function that waits.
    @Test func aThreadWaitingForAStuckTaskIsReported() throws {
        let directory = makeTemporaryDirectory("hang-task")
        let child = try Child(
            Paths.swiftSample, ["hang-continuation"],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_HANG_THRESHOLD_MS": "300"])
        defer { _ = child.waitOrKill(timeout: 0) }
        let deadline = Date().addingTimeInterval(30)
        var hang: [String: Any]?
        while hang == nil && Date() < deadline {
            usleep(50_000)
            hang = (try? storedEvents(in: directory))?.first { $0["event"] as? String == "$AppHang" }
        }
        kill(child.pid, SIGKILL)
        _ = child.wait(timeout: 10)
        let event = try #require(hang, "no $AppHang stored: \(child.stderr)")
        let facts = HangTests().properties(event)
        #expect(facts["hang_main_thread"] as? Bool == true)
        #expect((facts["app_hang_reason"] as? String ?? "").contains("waitForTaskAnswer"), "\(facts)")
        #expect((facts["hang_title"] as? String ?? "").contains("waitForTaskAnswer"), "\(facts)")
    }
}
