import CrashFileFormat
import Foundation
import TestSupport
import Testing

@testable import CrashCapture

#if canImport(Glibc)
    import Glibc
#endif

/// Nothing tracked is lost, whatever ends the process, and every session is paired: real
/// processes killed by SIGKILL, crashes and the OOM killer, then the next start or
/// `crashcap replay`.
@Suite struct SessionJournalTests {
    func sessionFiles(_ directory: String) -> [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter {
            SessionFile.isSessionFileName($0)
        }
    }

    func events(_ events: [[String: Any]], named name: String, session: String? = nil) -> [[String: Any]] {
        events.filter { $0["event"] as? String == name && (session == nil || $0["session_id"] as? String == session) }
    }

    func property(_ event: [String: Any], _ key: String) -> Any? { (event["properties"] as? [String: Any])?[key] }

    /// Four threads tracking, SIGKILL at a random moment; returns the acknowledged counts per
    /// thread, the drops the child saw, and the killed session's id.
    func killStorm(_ directory: String, afterMilliseconds delay: Int) throws -> (
        acked: [Int], dropped: Int, session: String
    ) {
        let ackFile = directory + ".ack"
        defer { unlink(ackFile) }
        let storm = try Child(
            Paths.swiftSample, ["pipeline-storm"],
            environment: [
                "CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_ACK_FILE": ackFile,
                "CRASH_SAMPLE_JOURNAL_BYTES": "\(64 << 20)",
            ])
        guard storm.waitForOutput("ready") else { throw TestFailure("storm never started: \(storm.stderr)") }
        usleep(useconds_t(delay * 1000))
        kill(storm.pid, SIGKILL)
        guard storm.wait(timeout: 20), storm.signal == SIGKILL else {
            throw TestFailure("storm did not die of SIGKILL")
        }
        let counts = try Data(contentsOf: URL(fileURLWithPath: ackFile)).withUnsafeBytes { raw in
            (0..<5).map { index in Int(raw.loadUnaligned(fromByteOffset: index * 8, as: Int64.self)) }
        }
        guard let name = sessionFiles(directory).first, let session = SessionFile.sessionID(fromFileName: name) else {
            throw TestFailure("the killed session left no session file")
        }
        return (Array(counts[0..<4]), counts[4], session)
    }

    /// The killed session's storm events are there, each once, in each thread's order, and
    /// every one that was acknowledged; the session has one $AppStart and one $AppEnd.
    func checkStorm(_ stored: [[String: Any]], acked: [Int], session: String) throws {
        var seen = [[Int]](repeating: [], count: 4)
        for event in events(stored, named: "storm_event", session: session) {
            let thread = try #require(property(event, "thread") as? Int)
            seen[thread].append(try #require(property(event, "index") as? Int))
        }
        for thread in 0..<4 {
            // Each thread's events in the order tracked, none twice; the last one may have been
            // accepted without its acknowledgement being written before the kill.
            #expect(seen[thread] == Array(0..<seen[thread].count), "thread \(thread) lost or repeated events")
            #expect(
                seen[thread].count == acked[thread] || seen[thread].count == acked[thread] + 1,
                "thread \(thread): \(seen[thread].count) stored, \(acked[thread]) acknowledged")
        }
        #expect(events(stored, named: "$AppStart", session: session).count == 1)
        let ends = events(stored, named: "$AppEnd", session: session)
        #expect(ends.count == 1)
        #expect(ends.first.map { property($0, "$app_end_reason") as? String } == "killed")
    }

    @Test func sigkillDuringATrackStormLosesNothing() throws {
        for round in 0..<50 {
            let directory = makeTemporaryDirectory("storm")
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let (acked, dropped, session) = try killStorm(directory, afterMilliseconds: Int.random(in: 0...60))
            #expect(dropped == 0, "the 64 MiB journal filled")
            // The next start: the app itself half the time, crashcap replay the other half.
            if round % 2 == 0 {
                let next = try run(
                    Paths.swiftSample, ["pipeline-track"],
                    environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "0"])
                #expect(next.exitCode == 0)
            } else {
                let replay = try run(Paths.crashcap, ["replay", directory])
                #expect(replay.exitCode == 0, "\(replay.stdout)\(replay.stderr)")
            }
            try checkStorm(try storedEvents(in: directory), acked: acked, session: session)
            #expect(sessionFiles(directory).isEmpty, "round \(round): a session file was left behind")
        }
    }

    /// The store's default cap of events, from four threads as fast as they can, with every
    /// default: none dropped, all in SQLite, while the live process holds at most 2 MiB of disk.
    /// The journal is far smaller than the burst, so the writer has to make track() wait.
    @Test func aBurstOfTheStoresCapFromFourThreadsLosesNothingWithTheDefaultJournal() throws {
        let directory = makeTemporaryDirectory("burst")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let result = try run(
            Paths.swiftSample, ["pipeline-burst"],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "100000"], timeout: 240)
        #expect(result.exitCode == 0, "\(result.stderr)")
        let line = try #require(result.stdout.split(separator: "\n").last.map(String.init))
        let figures = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Int])
        #expect(figures["dropped"] == 0)
        #expect(try #require(figures["disk"]) <= 2 << 20, "the live process held \(figures["disk"] ?? 0) bytes")
        let store = try EventStore(path: directory + "/events.sqlite")
        let stored = try store.events(limit: 200_000).filter { $0.payload.contains("\"event\":\"burst_event\"") }
        // With the session's $AppStart and $AppEnd the store holds two events past its cap: it
        // let the two oldest go, counted, and nothing else is missing.
        #expect(store.count == 100_000)
        #expect(store.droppedCount == 2)
        #expect(stored.count == 99_999)
    }

    /// One field of a killed session's header corrupted in turn: the magic, the version, the
    /// header's size, the ring's size, the context's size, the reserved end, the consumed
    /// position. The file goes to damaged/ with a note, the replay
    /// says so (65), and every acknowledged event is imported all the same, found by its own
    /// checksum.
    @Test(arguments: [
        ("magic", 0, 4, UInt64(0x5858_5858)), ("version", 4, 4, UInt64(77)), ("header size", 8, 4, UInt64(8192)),
        ("header size", 8, 4, UInt64(12345)), ("ring size", 16, 8, UInt64(1) << 20), ("ring size", 16, 8, UInt64(7)),
        ("context size", 104, 4, UInt64(9)), ("reserved end", 80, 8, UInt64(0)),
        ("reserved end", 80, 8, UInt64(1) << 40), ("consumed position", 88, 8, UInt64(1) << 40),
    ])
    func aDamagedJournalHeaderLosesNoEvent(_ field: String, _ offset: Int, _ width: Int, _ value: UInt64) throws {
        let directory = makeTemporaryDirectory("damaged-header")
        let (acked, _, session) = try killStorm(directory, afterMilliseconds: 40)
        let path = directory + "/" + SessionFile.fileName(sessionID: session)
        let file = try FileHandle(forUpdating: URL(fileURLWithPath: path))
        try file.seek(toOffset: UInt64(offset))
        var bytes = withUnsafeBytes(of: value.littleEndian) { Array($0) }
        bytes = Array(bytes.prefix(width))
        try file.write(contentsOf: Data(bytes))
        try file.close()
        let replay = try run(Paths.crashcap, ["replay", directory], timeout: 60)
        #expect(replay.exitCode == 65, "\(field): \(replay.stdout) \(replay.stderr)")
        #expect(replay.stdout.contains("damaged"), "\(field): \(replay.stdout)")
        let aside = (try? FileManager.default.contentsOfDirectory(atPath: directory + "/damaged")) ?? []
        #expect(aside.contains(SessionFile.fileName(sessionID: session)), "\(field): set aside, not deleted: \(aside)")
        #expect(aside.contains { $0.hasSuffix(".txt") }, "\(field): with a note")
        var seen = [Int](repeating: 0, count: 4)
        for event in events(try storedEvents(in: directory), named: "storm_event", session: session) {
            if let thread = property(event, "thread") as? Int { seen[thread] += 1 }
        }
        for thread in 0..<4 {
            #expect(
                seen[thread] >= acked[thread],
                "\(field): thread \(thread): \(seen[thread]) of \(acked[thread]) acknowledged")
        }
    }

    /// A crash whose report could not be written (the file-size limit lowered to 1 KiB after
    /// install) is imported as a crash without a report, with its signal, not as a kill.
    @Test func aCrashWhoseReportCouldNotBeWrittenIsACrashWithoutAReport() throws {
        let directory = makeTemporaryDirectory("unwritable")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let crashed = try run(
            Paths.swiftSample, ["pipeline-crash-unwritable"],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "3", "SWIFT_BACKTRACE": "enable=no"],
            timeout: 60)
        #expect(crashed.signal == SIGSEGV, "died of \(crashed.signal ?? 0): \(crashed.stderr)")
        #expect(crashFiles(in: directory).isEmpty, "no report was written")
        let replay = try run(Paths.crashcap, ["replay", directory], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stdout) \(replay.stderr)")
        let stored = try storedEvents(in: directory)
        let crashes = events(stored, named: "$AppCrashed")
        #expect(crashes.count == 1, "\(stored.map { $0["event"] ?? "" })")
        if let crash = crashes.first {
            #expect(property(crash, "crash_not_kept") as? Bool == true)
            #expect(property(crash, "crash_signal") as? Int == Int(SIGSEGV))
        }
        let ends = events(stored, named: "$AppEnd")
        #expect(ends.count == 1)
        #expect(ends.first.map { property($0, "$app_end_reason") as? String } == "crash")
        #expect(events(stored, named: "sample_event").count == 3)
    }

    @Test func aCrashRightAfterTrackingKeepsEveryEventAndTheLast50AsBreadcrumbs() throws {
        let directory = makeTemporaryDirectory("crash-now")
        let crashed = try run(
            Paths.swiftSample, ["pipeline-crash-now"],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "200", "SWIFT_BACKTRACE": "enable=no"])
        #expect(crashed.signal == SIGSEGV)
        let replay = try run(Paths.crashcap, ["replay", directory])
        #expect(replay.exitCode == 0, "\(replay.stdout)\(replay.stderr)")
        let stored = try storedEvents(in: directory)
        let tracked = events(stored, named: "sample_event").compactMap { property($0, "index") as? Int }
        #expect(tracked == Array(0..<200))
        #expect(events(stored, named: "$AppStart").count == 1)
        #expect(events(stored, named: "$AppEnd").count == 1, "the crash file's, and no compensating one")
        let crash = try #require(events(stored, named: "$AppCrashed").first)
        let breadcrumbs = try #require(property(crash, "crash_breadcrumbs") as? [String])
        let indexes = try breadcrumbs.map { text -> Int in
            let crumb = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
            #expect(crumb["event"] as? String == "sample_event")
            #expect(crumb["time"] is Int)
            #expect(text.utf8.count <= SessionRecovery.breadcrumbBytes)
            return try #require((crumb["properties"] as? [String: Any])?["index"] as? Int)
        }
        #expect(indexes == Array(150..<200))
        // The crash came after the events it carries as breadcrumbs.
        let order = stored.map { $0["event"] as? String }
        #expect(order.lastIndex(of: "sample_event")! < order.firstIndex(of: "$AppCrashed")!)
    }

    @Test func aSessionWhoseProcessStillRunsIsLeftAlone() throws {
        let directory = makeTemporaryDirectory("alive")
        let waiting = try Child(
            Paths.swiftSample, ["pipeline-wait"],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "3"])
        #expect(waiting.waitForOutput("ready"))
        let first = try run(Paths.crashcap, ["replay", directory, "--json"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(first.stdout.utf8)) as? [String: Any])
        let sessions = try #require(object["sessions"] as? [[String: Any]])
        #expect(sessions.count == 1)
        #expect(sessions.first?["outcome"] as? String == "busy (another process holds it)")
        #expect(events(try storedEvents(in: directory), named: "$AppEnd").isEmpty)
        #expect(sessionFiles(directory).count == 1)
        kill(waiting.pid, SIGKILL)
        #expect(waiting.wait(timeout: 20))
        #expect(try run(Paths.crashcap, ["replay", directory]).exitCode == 0)
        let stored = try storedEvents(in: directory)
        #expect(events(stored, named: "sample_event").count == 3)
        let end = try #require(events(stored, named: "$AppEnd").first)
        #expect(property(end, "$app_end_reason") as? String == "killed")
        let duration = try #require(property(end, "$event_duration") as? Double)
        #expect(duration >= 0 && duration < 60)
    }

    /// An install killed between making its session file and naming it leaves the file under
    /// its temporary name, its journal's space reserved. A replay removes it once it is older
    /// than any install takes, and never while a process holds its lock.
    @Test func aSessionFileLeftUnnamedByAKilledInstallIsRemovedByReplay() throws {
        let directory = makeTemporaryDirectory("abandoned-temporary")
        func temporary(_ id: Character) -> String { ".session-" + String(repeating: id, count: 32) + ".ccs.tmp" }
        let abandoned = temporary("a"), locked = temporary("b"), recent = temporary("c")
        for name in [abandoned, locked, recent] {
            #expect(FileManager.default.createFile(atPath: directory + "/" + name, contents: Data(count: 1 << 20)))
        }
        let longAgo = Date().addingTimeInterval(-(SessionRecovery.abandonedTemporaryAge + 60))
        for name in [abandoned, locked] {
            try FileManager.default.setAttributes([.modificationDate: longAgo], ofItemAtPath: directory + "/" + name)
        }
        let holder = open(directory + "/" + locked, O_RDONLY | O_CLOEXEC)
        #expect(holder >= 0 && flock(holder, LOCK_SH | LOCK_NB) == 0)
        defer { close(holder) }
        let replay = try run(Paths.crashcap, ["replay", directory])
        #expect(replay.exitCode == 0, "\(replay.stdout)\(replay.stderr)")
        let left = Set(try FileManager.default.contentsOfDirectory(atPath: directory))
        #expect(!left.contains(abandoned))
        #expect(left.contains(locked))
        #expect(left.contains(recent))
    }

    /// Install names the crash file before it makes the session file, so a recovery can list
    /// the session files before that one exists and the crash files after the process has
    /// crashed (a watch woken by the crash file's name, on a busy machine). The crash file must
    /// then wait for its session, not be replayed alone while its session is closed without it.
    @Test func aCrashFileWhoseSessionFileAppearsDuringARecoveryWaitsForIt() throws {
        let directory = makeTemporaryDirectory("session-appears")
        let crashed = try run(
            Paths.cSample, ["null-read"], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(crashed.signal == SIGSEGV)
        let session = try #require(sessionFiles(directory).first)
        let held = directory + ".held-session"
        #expect(rename(directory + "/" + session, held) == 0)
        var recovery = SessionRecovery(
            replayer: CrashReplayer(directory: directory, store: try EventStore(path: directory + "/events.sqlite")))
        let path = directory + "/" + session
        recovery.afterListingSessions = { _ = rename(held, path) }
        let first = recovery.recoverAll()
        #expect(first.crashFiles.files.isEmpty, "replayed without its session: \(first.crashFiles.files)")
        #expect(first.sessions.isEmpty)
        recovery.afterListingSessions = nil
        let second = recovery.recoverAll()
        #expect(second.sessions.count == 1)
        #expect(second.sessions.first?.outcome == .closed)
        #expect(second.sessions.first?.crashFile?.outcome == .imported)
        #expect(second.crashFiles.files.isEmpty)
        #expect(events(try storedEvents(in: directory), named: "$AppCrashed").count == 1)
    }

    @Test func aReplayKilledMidwayAndRunAgainNeitherLosesNorRepeats() throws {
        let directory = makeTemporaryDirectory("replay-killed")
        let (acked, _, session) = try killStorm(directory, afterMilliseconds: 400)
        for delay in [5, 15, 30, 60, 120] {
            let replay = try Child(Paths.crashcap, ["replay", directory], environment: [:])
            usleep(useconds_t(delay * 1000))
            kill(replay.pid, SIGKILL)
            _ = replay.wait(timeout: 30)
        }
        let last = try run(Paths.crashcap, ["replay", directory])
        #expect(last.exitCode == 0, "\(last.stdout)\(last.stderr)")
        // Once, a storm of 102,000 events passed the store's cap and its oldest were dropped, as
        // the cap says; the storm now stops at 96,000. Should events be missing again, what the
        // directory holds says where they went.
        let stored = try storedEvents(in: directory)
        if events(stored, named: "$AppStart", session: session).isEmpty {
            Issue.record(
                "no $AppStart; the directory holds \((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []); the last replay said \(last.stdout) \(last.stderr)"
            )
        }
        try checkStorm(stored, acked: acked, session: session)
        #expect(sessionFiles(directory).isEmpty)
    }

    @Test func twoReplaysAtOnceImportEachEventOnce() throws {
        let directory = makeTemporaryDirectory("replay-twice")
        let (acked, _, session) = try killStorm(directory, afterMilliseconds: 200)
        let replays = try (0..<2).map { _ in try Child(Paths.crashcap, ["replay", directory], environment: [:]) }
        for replay in replays {
            #expect(replay.wait(timeout: 60))
            #expect(replay.exitCode == 0, "\(replay.stdout)\(replay.stderr)")
        }
        try checkStorm(try storedEvents(in: directory), acked: acked, session: session)
    }

    /// A journal whose last entry was cut at every byte: the entries before it are imported
    /// whole, the cut one never, not even in part.
    @Test func aJournalCutAtEveryByteOfItsLastEntry() throws {
        let source = makeTemporaryDirectory("cut-source")
        let waiting = try Child(
            Paths.swiftSample, ["pipeline-wait"], environment: ["CRASHCAPTURE_DIR": source, "CRASH_SAMPLE_EVENTS": "5"])
        #expect(waiting.waitForOutput("ready"))
        kill(waiting.pid, SIGKILL)
        #expect(waiting.wait(timeout: 20))
        let name = try #require(sessionFiles(source).first)
        var original = try Data(contentsOf: URL(fileURLWithPath: source + "/" + name))
        // Everything was stored before the kill; pretend none was, so the whole journal is read.
        original.replaceSubrange(88..<96, with: [UInt8](repeating: 0, count: 8))
        let fd = open(source + "/" + name, O_RDONLY)
        defer { close(fd) }
        let session = try SessionFile.read(fd: fd, path: name)
        let last = try #require(try session.entries().entries.last)
        let headerSize = original.withUnsafeBytes { Int($0.loadUnaligned(fromByteOffset: 8, as: UInt32.self)) }
        let entryStart = headerSize + Int(last.position % session.ringSize)
        let wholeSize = 24 + last.payload.count
        let paddedSize = Int(SessionFile.entrySize(last.payload.count))
        for cut in 0...paddedSize {
            for truncate in [false, true] {
                let directory = makeTemporaryDirectory("cut")
                defer { try? FileManager.default.removeItem(atPath: directory) }
                var damaged = original
                if truncate {
                    damaged = damaged.prefix(entryStart + cut)
                } else {
                    damaged.replaceSubrange(
                        (entryStart + cut)..<(entryStart + paddedSize),
                        with: [UInt8](repeating: 0, count: paddedSize - cut))
                }
                try damaged.write(to: URL(fileURLWithPath: directory + "/" + name))
                let store = try EventStore(path: directory + "/events.sqlite")
                let recovery = SessionRecovery(replayer: CrashReplayer(directory: directory, store: store))
                let result = recovery.recover(directory + "/" + name)
                // A file shorter than its header and ring is damaged, and so is an entry whose
                // commit word (stored last) stands over bytes that fail its checksum; an entry
                // cut before its commit word was never committed.
                let whole = cut >= wholeSize
                let setAside = truncate || (cut >= 8 && !whole)
                #expect(result.outcome == (setAside ? .damaged : .closed), "cut at \(cut), truncated: \(truncate)")
                let indexes = try storedEvents(in: directory).filter { $0["event"] as? String == "sample_event" }.map {
                    try #require(property($0, "index") as? Int)
                }
                #expect(indexes == Array(0..<(whole ? 5 : 4)), "cut at \(cut) of \(paddedSize), truncated: \(truncate)")
            }
        }
    }

    @Test func aForkedChildNeverWritesIntoItsParentsJournal() throws {
        let directory = makeTemporaryDirectory("fork")
        let result = try run(
            Paths.swiftSample, ["pipeline-fork"],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "4"])
        #expect(result.exitCode == 0)
        #expect(
            result.stdout.contains("child wait status 0\n"),
            "the child did not exit 0 after its track() calls were all dropped")
        let stored = try storedEvents(in: directory)
        // The parent's 4 before the fork and 4 after; none of the child's.
        let indexes = events(stored, named: "sample_event").compactMap { property($0, "index") as? Int }
        #expect(indexes == [0, 1, 2, 3, 0, 1, 2, 3])
        #expect(events(stored, named: "$AppStart").count == 1)
        #expect(events(stored, named: "$AppEnd").count == 1)
        #expect(sessionFiles(directory).isEmpty, "the parent's clean end removed its session file")
        #expect(try run(Paths.crashcap, ["replay", directory]).exitCode == 0)
        #expect(try storedEvents(in: directory).count == stored.count, "nothing was left for a replay")
    }

    @Test func aSessionFromAnEarlierBootEndsWithReboot() throws {
        let directory = makeTemporaryDirectory("reboot")
        let waiting = try Child(
            Paths.swiftSample, ["pipeline-wait"],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "2"])
        #expect(waiting.waitForOutput("ready"))
        kill(waiting.pid, SIGKILL)
        #expect(waiting.wait(timeout: 20))
        // The machine restarted since, as far as the file can tell: another boot id.
        let path = directory + "/" + (try #require(sessionFiles(directory).first))
        let fd = open(path, O_WRONLY)
        let otherBoot = Array("00000000-0000-4000-8000-000000000000".utf8)
        #expect(pwrite(fd, otherBoot, otherBoot.count, 152) == otherBoot.count)
        close(fd)
        #expect(try run(Paths.crashcap, ["replay", directory]).exitCode == 0)
        let stored = try storedEvents(in: directory)
        #expect(events(stored, named: "sample_event").count == 2)
        let ends = events(stored, named: "$AppEnd")
        #expect(ends.count == 1)
        #expect(ends.first.map { property($0, "$app_end_reason") as? String } == "reboot")
    }

    @Test func anExecEndsTheSessionOfTheImageBeforeIt() throws {
        let directory = makeTemporaryDirectory("exec")
        let preload = ["CRASHCAPTURE_DIR": directory, "LD_PRELOAD": Paths.preloadLibrary]
        // The shell's session ends when it execs; true's ends at its exit: nothing is left.
        #expect(try run("/bin/sh", ["-c", "exec /bin/true"], environment: preload).exitCode == 0)
        #expect(sessionFiles(directory).isEmpty, "\(sessionFiles(directory))")
        // Exec, then SIGKILL: one session to close (sleep's), not the shell's too.
        let chain = try Child("/bin/sh", ["-c", "exec /bin/sleep 30"], environment: preload)
        for _ in 0..<200 {
            let files = sessionFiles(directory)
            if files.count == 1, let ticks = try? sessionPid(directory + "/" + files[0]), ticks == chain.pid,
                (try? String(contentsOfFile: "/proc/\(chain.pid)/comm", encoding: .utf8))?.hasPrefix("sleep") == true
            {
                break
            }
            usleep(10_000)
        }
        kill(chain.pid, SIGKILL)
        #expect(chain.wait(timeout: 20))
        #expect(try run(Paths.crashcap, ["replay", directory]).exitCode == 0)
        let stored = try storedEvents(in: directory)
        #expect(stored.map { $0["event"] as? String } == ["$AppStart", "$AppEnd"])
    }

    /// A shell that runs a while before it execs (a wrapper script) has made its files by then:
    /// the image it becomes ends that session, however short its own life or however it ends:
    /// exiting before its own files, crashing, or crashing where its install's rest cannot help
    /// (the loader's lock held, so the crash path does without the rest).
    @Test(arguments: ["null-read", "loader-lock"])
    func anExecAfterTheFilesWereMadeStillEndsTheSessionBeforeIt(crash kind: String) throws {
        let directory = makeTemporaryDirectory("exec-late")
        let preload = ["CRASHCAPTURE_DIR": directory, "LD_PRELOAD": Paths.preloadLibrary]
        let quick = try run("/bin/sh", ["-c", "sleep 0.1; exec /bin/true"], environment: preload)
        #expect(quick.exitCode == 0)
        #expect(sessionFiles(directory).isEmpty, "\(sessionFiles(directory))")
        #expect(crashFiles(in: directory).isEmpty, "\(crashFiles(in: directory))")

        let crashed = makeTemporaryDirectory("exec-late-crash")
        let crashing = try run(
            "/bin/sh", ["-c", "sleep 0.1; exec '\(Paths.cSample)' \(kind)"],
            environment: [
                "CRASHCAPTURE_DIR": crashed, "LD_PRELOAD": Paths.preloadLibrary, "CRASH_SAMPLE_NO_INSTALL": "1",
            ])
        #expect(crashing.signal == SIGSEGV, "\(crashing.stderr)")
        #expect(crashFiles(in: crashed).count == 1, "\(crashFiles(in: crashed))")
        #expect(try run(Paths.crashcap, ["replay", crashed]).exitCode == 0)
        let stored = try storedEvents(in: crashed)
        #expect(stored.map { $0["event"] as? String } == ["$AppStart", "$AppCrashed", "$AppEnd"])
        #expect(events(stored, named: "$AppEnd").map { property($0, "$app_end_reason") as? String } == ["crash"])
    }

    func sessionPid(_ path: String) throws -> Int32 {
        let fd = open(path, O_RDONLY)
        defer { close(fd) }
        return try SessionFile.read(fd: fd, path: path).pid
    }

    @Test func aCProgramUnderThePreloadLibraryKilledIsPairedAndOneThatExitsLeavesNothing() throws {
        let directory = makeTemporaryDirectory("preload-killed")
        let preload = ["CRASHCAPTURE_DIR": directory, "LD_PRELOAD": Paths.preloadLibrary]
        let exited = try run("/bin/true", environment: preload)
        #expect(exited.exitCode == 0)
        #expect(sessionFiles(directory).isEmpty, "a clean exit removes its session file")
        let sleeper = try Child("/bin/sleep", ["30"], environment: preload)
        for _ in 0..<200 where sessionFiles(directory).isEmpty { usleep(10_000) }
        #expect(sessionFiles(directory).count == 1)
        kill(sleeper.pid, SIGKILL)
        #expect(sleeper.wait(timeout: 20))
        #expect(try run(Paths.crashcap, ["replay", directory]).exitCode == 0)
        let stored = try storedEvents(in: directory)
        #expect(stored.map { $0["event"] as? String } == ["$AppStart", "$AppEnd"])
        #expect(stored.last.map { property($0, "$app_end_reason") as? String } == "killed")
        #expect(stored.allSatisfy { property($0, "$pid") as? Int == Int(sleeper.pid) })
        #expect(sessionFiles(directory).isEmpty)
    }
}

/// A memory cgroup of the test's own, under the one this process runs in, with a small limit.
struct MemoryCgroup {
    let path: String

    /// The cgroup, or why one cannot be made on this machine.
    static func make(limitBytes: Int) -> Result<MemoryCgroup, TestFailure> {
        guard let lines = try? String(contentsOfFile: "/proc/self/cgroup", encoding: .utf8) else {
            return .failure(TestFailure("/proc/self/cgroup is not readable"))
        }
        var parent: String?
        var v1 = false
        for line in lines.split(separator: "\n") {
            let fields = line.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
            guard fields.count == 3 else { continue }
            if fields[1].split(separator: ",").contains("memory") {
                parent = "/sys/fs/cgroup/memory" + fields[2]
                v1 = true
                break
            }
            if fields[0] == "0" && fields[1].isEmpty { parent = "/sys/fs/cgroup" + fields[2] }
        }
        guard let parent else { return .failure(TestFailure("this process is in no memory cgroup")) }
        let path =
            parent + (parent.hasSuffix("/") ? "" : "/")
            + "crashcapture-oom-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        guard mkdir(path, 0o755) == 0 else {
            return .failure(
                TestFailure(
                    "cannot create a memory cgroup at \(path): \(String(cString: strerror(errno))) (needs a writable cgroup v1 memory hierarchy or a delegated v2 subtree)"
                ))
        }
        let cgroup = MemoryCgroup(path: path)
        let limits = v1 ? ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes"] : ["memory.max", "memory.swap.max"]
        for (index, file) in limits.enumerated() {
            let value = index == 1 && !v1 ? "0" : "\(limitBytes)"
            let written = (try? value.write(toFile: path + "/" + file, atomically: false, encoding: .utf8)) != nil
            // Swap accounting may be off; the memory limit itself is required.
            if !written && index == 0 {
                cgroup.remove()
                return .failure(TestFailure("cannot set \(file) in \(path)"))
            }
        }
        return .success(cgroup)
    }

    func remove() {
        for _ in 0..<100 {
            if rmdir(path) == 0 || errno == ENOENT { return }
            usleep(20_000)
        }
    }
}

extension SessionJournalTests {
    @Test func aSessionEndedByTheOOMKillerSaysSo() throws {
        let cgroup = try MemoryCgroup.make(limitBytes: 96 << 20).get()
        defer { cgroup.remove() }
        let directory = makeTemporaryDirectory("oom")
        // The shell joins the cgroup, then becomes the sample: only the sample is ever in it.
        let script = "echo $$ > '\(cgroup.path)/cgroup.procs' && exec '\(Paths.swiftSample)' pipeline-oom"
        let hog = try Child(
            "/bin/sh", ["-c", script],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "20", "SWIFT_BACKTRACE": "enable=no"])
        #expect(hog.waitForOutput("ready", timeout: 30), "\(hog.stderr)")
        #expect(hog.wait(timeout: 60))
        #expect(hog.signal == SIGKILL, "the OOM killer ends a process with SIGKILL")
        let replay = try run(Paths.crashcap, ["replay", directory])
        #expect(replay.exitCode == 0, "\(replay.stdout)\(replay.stderr)")
        let stored = try storedEvents(in: directory)
        #expect(events(stored, named: "sample_event").count == 20)
        let ends = events(stored, named: "$AppEnd")
        #expect(ends.count == 1)
        #expect(ends.first.map { property($0, "$app_end_reason") as? String } == "oom_kill")
    }
}
