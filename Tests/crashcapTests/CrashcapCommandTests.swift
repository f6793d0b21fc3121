import CrashCapture
import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The CLI as people run it.
@Suite struct CrashcapCommandTests {
    @Test func replayAndShowExitCodes() throws {
        let missing = try run(Paths.crashcap, ["replay", "/nonexistent/dir"])
        #expect(missing.exitCode == 66 && missing.stderr.contains("not a directory"))
        let showMissing = try run(Paths.crashcap, ["show", "/nonexistent/file.ccr"])
        #expect(showMissing.exitCode == 66)
        let noEndpoint = try run(Paths.crashcap, ["upload", makeTemporaryDirectory("up")])
        #expect(noEndpoint.exitCode == 64 && noEndpoint.stderr.contains("no endpoint"))
        let badURL = try run(
            Paths.crashcap, ["upload", makeTemporaryDirectory("up"), "--upload", "http://example.com/sa"])
        #expect(badURL.exitCode == 64 && badURL.stderr.contains("https"))
        #expect(badURL.stderr.contains("--allow-insecure-http"), "the error names the flag: \(badURL.stderr)")
        let damagedDirectory = makeTemporaryDirectory("cli-damaged")
        try Data("garbage".utf8).write(to: URL(fileURLWithPath: damagedDirectory + "/crash-x.ccr"))
        let damaged = try run(Paths.crashcap, ["replay", damagedDirectory])
        #expect(damaged.exitCode == 65)
        #expect(damaged.stdout.contains("damaged: "))
    }

    /// A report at the format's maxima (513 threads, each 140 calls deep, cut to 128 frames):
    /// shown as JSON from the crash file, replayed, and shown again from the store, whole. Its
    /// time and memory are Benchmarks/max_report.sh's.
    @Test func aReportAtTheMaximaIsShownAndReplayedWhole() throws {
        let directory = makeTemporaryDirectory("max-report")
        let crashed = try run(
            Paths.cSample, ["parked-threads"],
            environment: [
                "CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_THREADS": "513", "CRASH_SAMPLE_DEPTH": "140",
                "SWIFT_BACKTRACE": "enable=no",
            ], timeout: 120)
        #expect(crashed.signal == SIGSEGV)
        func shown() throws -> [String: Any] {
            let show = try run(Paths.crashcap, ["show", directory, "--json"], timeout: 120)
            #expect(show.exitCode == 0, "\(show.stderr)")
            return try #require(
                try JSONSerialization.jsonObject(with: Data(show.stdout.utf8)) as? [String: Any])
        }
        for report in [
            try shown(),
            try { () throws -> [String: Any] in
                let replay = try run(Paths.crashcap, ["replay", directory], timeout: 120)
                #expect(replay.exitCode == 0, "\(replay.stdout) \(replay.stderr)")
                return try shown()
            }(),
        ] {
            let threads = report["threads"] as? [[String: Any]] ?? []
            #expect(threads.count == 513)
            let others = threads.filter { $0["crashed"] as? Bool != true }
            #expect(others.count == 512)
            for thread in others {
                let functions = (thread["frames"] as? [[String: Any]] ?? []).compactMap { $0["function"] as? String }
                #expect(functions.count == 128, "\(thread["tid"] ?? "?"): \(functions.count) frames")
                #expect(functions.filter { $0.hasPrefix("sample_deep_") }.count >= 120)
            }
            let own = (report["frames"] as? [[String: Any]] ?? []).compactMap { $0["function"] as? String }
            #expect(own.first == "sample_null_read", "\(own.prefix(3))")
        }
    }

    /// `crashcap list`: every crash of a directory, newest first, imported ones (from the
    /// store, after replay removed their files) and pending ones alike.
    @Test func listShowsImportedAndPendingCrashesNewestFirst() throws {
        let directory = makeTemporaryDirectory("list")
        let empty = try run(Paths.crashcap, ["list", directory, "--json"])
        #expect(empty.exitCode == 0 && empty.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "[]")
        for kind in ["abort", "null-read"] {
            let crashed = try run(
                Paths.cSample, [kind], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
            #expect(crashed.signal != nil)
        }
        let replay = try run(Paths.crashcap, ["replay", directory], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stdout)")
        let show = try run(Paths.crashcap, ["show", directory])
        #expect(show.stderr.contains("crashcap list"), "the empty show points at list: \(show.stderr)")
        usleep(20_000)
        let pending = try run(
            Paths.cSample, ["int-divide-by-zero"],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(pending.signal == SIGFPE)
        let text = try run(Paths.crashcap, ["list", directory], timeout: 60)
        #expect(text.exitCode == 0, "\(text.stderr)")
        let lines = text.stdout.split(separator: "\n")
        #expect(lines.count == 4, "a header and three crashes: \(text.stdout)")
        #expect(lines.dropFirst().first?.contains("SIGFPE") == true && lines[1].contains("pending"), "\(text.stdout)")
        #expect(lines.dropFirst(2).allSatisfy { $0.contains("imported") }, "\(text.stdout)")
        #expect(text.stdout.contains("in sample_null_read") && text.stdout.contains("in sample_abort"))
        let json = try run(Paths.crashcap, ["list", directory, "--json"], timeout: 60)
        let crashes = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [[String: Any]])
        #expect(crashes.map { $0["signal"] as? String } == ["SIGFPE", "SIGSEGV", "SIGABRT"])
        let times = crashes.compactMap { ($0["time"] as? NSNumber)?.int64Value }
        #expect(times == times.sorted(by: >))
        #expect(crashes.allSatisfy { ($0["fingerprint"] as? String)?.count == 16 })
    }

    /// An upload to a collector that is down says so at every failed attempt, instead of
    /// staying silent until its time runs out.
    @Test func anUploadToACollectorThatIsDownSaysSoAtEachAttempt() throws {
        let directory = makeTemporaryDirectory("upload-down")
        let crashed = try run(Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": directory])
        #expect(crashed.signal == SIGABRT)
        #expect(try run(Paths.crashcap, ["replay", directory]).exitCode == 0)
        // Port 9 (discard) on loopback: nothing listens there, every connection is refused.
        let upload = try run(
            Paths.crashcap, ["upload", directory, "--upload", "http://127.0.0.1:9/sa", "--upload-timeout", "4"],
            timeout: 30)
        #expect(upload.exitCode == 75, "\(upload.stderr)")
        #expect(upload.stderr.contains("upload attempt 1 failed"), "\(upload.stderr)")
        #expect(upload.stderr.contains("trying again in"))
    }

    /// A mistyped command gets the one it was most likely meant to be.
    @Test func aMistypedCommandGetsASuggestion() throws {
        let typo = try run(Paths.crashcap, ["shwo", "/tmp"])
        #expect(typo.exitCode == 64)
        #expect(typo.stderr.contains("did you mean 'show'"), "\(typo.stderr)")
        let prefix = try run(Paths.crashcap, ["repl"])
        #expect(prefix.stderr.contains("did you mean 'replay'"), "\(prefix.stderr)")
        let unrelated = try run(Paths.crashcap, ["zzzzzzzz"])
        #expect(unrelated.exitCode != 0 && !unrelated.stderr.contains("did you mean"))
    }

    /// On a terminal `show` is in colour, unless NO_COLOR is set (or --no-color given).
    @Test func showHonoursNoColor() throws {
        let directory = makeTemporaryDirectory("no-color")
        let crashed = try run(Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": directory])
        #expect(crashed.signal == SIGABRT)
        // util-linux's script gives the command a terminal of its own.
        let command = "'\(Paths.crashcap)' show '\(directory)'"
        // Empty: unset, whatever the test runner set.
        let coloured = try run(
            "/usr/bin/script", ["-qec", command, "/dev/null"], environment: ["NO_COLOR": "", "TERM": "xterm"],
            timeout: 30)
        #expect(coloured.stdout.contains("\u{1b}["), "colour on a terminal")
        let plain = try run(
            "/usr/bin/script", ["-qec", command, "/dev/null"], environment: ["NO_COLOR": "1"], timeout: 30)
        #expect(plain.stdout.contains("SIGABRT"))
        #expect(!plain.stdout.contains("\u{1b}["), "NO_COLOR: no escape sequence")
    }

    /// `replay --upload --json`: stdout is the JSON alone, the upload's summary goes to stderr.
    @Test func replayWithUploadAndJSONPrintsOnlyJSON() throws {
        let directory = makeTemporaryDirectory("replay-json-upload")
        let crashed = try run(Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": directory])
        #expect(crashed.signal == SIGABRT)
        let collector = try CollectorProcess()
        let replay = try run(Paths.crashcap, ["replay", directory, "--upload", collector.url, "--json"], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stderr)")
        #expect((try? JSONSerialization.jsonObject(with: Data(replay.stdout.utf8))) != nil, "\(replay.stdout)")
        #expect(replay.stderr.contains("uploaded 3 of 3 events"), "$AppStart, $AppCrashed, $AppEnd: \(replay.stderr)")
    }

    /// 256 threads parked on one line of code: one stack, printed once with its count.
    @Test func showFoldsIdenticalThreadStacks() throws {
        let directory = makeTemporaryDirectory("show-threads")
        let crashed = try run(
            Paths.cSample, ["threads-256"],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"],
            timeout: 30)
        #expect(crashed.signal == SIGSEGV)
        let text = try run(Paths.crashcap, ["show", directory, "--no-color"])
        #expect(text.exitCode == 0)
        #expect(
            text.stdout.contains("threads: 257 (257 listed, crashed first, frozen by ptrace)"),
            "\(text.stdout.prefix(2000))")
        #expect(text.stdout.contains("256 threads with this stack: "))
        #expect(text.stdout.contains("and 248 more"))
        #expect(text.stdout.components(separatedBy: "sample_park_in_nanosleep").count == 2, "the stack printed once")
        let json = try run(Paths.crashcap, ["show", directory, "--json"])
        let object = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
        let threads = object?["threads"] as? [[String: Any]] ?? []
        #expect(threads.count == 257 && (object?["threads_total"] as? NSNumber)?.intValue == 257)
        #expect(threads.dropFirst().allSatisfy { ($0["frames"] as? [[String: Any]])?.isEmpty == false })
    }

    /// A debug build's index out of range, as the Swift backtracer would show it: the title
    /// names the app's function (not the standard library's specialized subscript), registers
    /// are there, libc and runtime frames fold into one line each, memory only when asked for;
    /// all of it in at most 80 lines.
    @Test func showReadsLikeABacktrace() throws {
        let directory = makeTemporaryDirectory("show-backtrace")
        let crashed = try run(
            Paths.swiftSample, ["swift-array-index"],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"], timeout: 30)
        #expect(crashed.signal != nil)
        let text = try run(Paths.crashcap, ["show", directory, "--no-color"], timeout: 60)
        #expect(text.exitCode == 0, "\(text.stderr)")
        let lines = text.stdout.split(separator: "\n", omittingEmptySubsequences: false)
        #expect(lines.count <= 80, "\(lines.count) lines:\n\(text.stdout)")
        #expect(
            text.stdout.contains(" in crash_sample_swift.crashSwiftArrayIndex()  fingerprint"), "\(text.stdout)")
        #expect(text.stdout.contains("registers:\n  rip"))
        #expect(text.stdout.contains("system frames (libc.so.6"))
        #expect(!text.stdout.contains("__libc_start_main"))
        #expect(!text.stdout.contains("\nmemory:"))
        let everything = try run(
            Paths.crashcap, ["show", directory, "--no-color", "--all-frames", "--memory"], timeout: 60)
        #expect(everything.stdout.contains("__libc_start_main"))
        #expect(everything.stdout.contains("\nmemory:\n  stack ("))
        #expect(everything.stdout.split(separator: "\n").count > lines.count)
    }

    @Test func showPrintsAReadableReportWithoutColourWhenPiped() throws {
        let directory = makeTemporaryDirectory("show")
        _ = try run(Paths.cSample, ["cxx-runtime-error"], environment: ["CRASHCAPTURE_DIR": directory])
        let text = try run(Paths.crashcap, ["show", directory])
        #expect(text.exitCode == 0)
        #expect(text.stdout.contains("signal:   SIGABRT (SI_TKILL)"))
        #expect(text.stdout.contains("exception: St13runtime_error"))
        #expect(text.stdout.contains("sample_throw_runtime_error"))
        #expect(!text.stdout.contains("\u{1b}["), "no colour codes when stdout is not a terminal")
        let json = try run(Paths.crashcap, ["show", directory, "--json"])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        let frames = try #require(object["frames"] as? [[String: Any]])
        #expect(frames.contains { $0["function"] as? String == "sample_throw_runtime_error" })
    }

    /// A crash the app's next start imported (its file is gone, its events uploaded and deleted)
    /// is still shown, from the store, as its crash file was: the newest by default, any other by
    /// the id `list` prints, a unique start of it, or its fingerprint.
    @Test func showReadsACrashTheAppAlreadyImported() throws {
        let directory = makeTemporaryDirectory("show-imported")
        let environment = ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"]
        let crashed = try run(Paths.swiftSample, ["swift-async-deep"], environment: environment, timeout: 30)
        #expect(crashed.signal == SIGSEGV, "\(crashed.stderr)")
        let pending = try run(Paths.crashcap, ["show", directory, "--no-color"], timeout: 60)
        #expect(pending.exitCode == 0, "\(pending.stderr)")
        // The app's next start imports the crash file; an upload then empties the event queue.
        let nextStart = try run(
            Paths.swiftSample, ["pipeline-track"],
            environment: environment.merging(["CRASH_SAMPLE_EVENTS": "1"]) { $1 },
            timeout: 30)
        #expect(nextStart.exitCode == 0, "\(nextStart.stderr)")
        #expect(crashFiles(in: directory).isEmpty, "the next start imported and removed the crash file")
        let collector = try CollectorProcess()
        let upload = try run(Paths.crashcap, ["upload", directory, "--upload", collector.url], timeout: 60)
        #expect(upload.exitCode == 0, "\(upload.stderr)")
        let rows = try run("/usr/bin/env", ["sqlite3", directory + "/events.sqlite", "SELECT COUNT(*) FROM events"])
        #expect(rows.stdout == "0\n", "nothing left in the queue, show reads the crash history: \(rows.stdout)")

        let stored = try run(Paths.crashcap, ["show", directory, "--no-color"], timeout: 60)
        #expect(stored.exitCode == 0, "\(stored.stderr)")
        #expect(stored.stderr.contains("crashcap list"), "it says where the crash came from: \(stored.stderr)")
        // Everything but the first line (which names the file, or the store and the crash's id)
        // reads as the crash file did.
        let body = { (text: String) in text.split(separator: "\n", omittingEmptySubsequences: false).dropFirst() }
        #expect(
            Array(body(stored.stdout)) == Array(body(pending.stdout)),
            "pending:\n\(pending.stdout)\nstored:\n\(stored.stdout)")
        #expect(stored.stdout.contains("async callers (task \"checkout-flow\")"), "\(stored.stdout)")

        let list = try run(Paths.crashcap, ["list", directory, "--json"], timeout: 60)
        let crashes = try #require(try JSONSerialization.jsonObject(with: Data(list.stdout.utf8)) as? [[String: Any]])
        let crash = try #require(crashes.first)
        let id = try #require(crash["id"] as? String)
        let fingerprint = try #require(crash["fingerprint"] as? String)
        let text = try run(Paths.crashcap, ["list", directory], timeout: 60)
        #expect(text.stdout.contains(id), "the text list shows the id to pass: \(text.stdout)")
        for selector in [id, String(id.prefix(8)), fingerprint] {
            let one = try run(Paths.crashcap, ["show", directory, selector, "--no-color"], timeout: 60)
            #expect(one.exitCode == 0, "\(selector): \(one.stderr)")
            #expect(Array(body(one.stdout)) == Array(body(stored.stdout)), "\(selector): \(one.stdout)")
        }
        let json = try run(Paths.crashcap, ["show", directory, id, "--json"], timeout: 60)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        #expect(object["title"] as? String == crash["title"] as? String)
        #expect(object["fingerprint"] as? String == fingerprint)
        let unknown = try run(Paths.crashcap, ["show", directory, "0123456789abcdef"], timeout: 60)
        #expect(unknown.exitCode == 66 && unknown.stderr.contains("no crash"), "\(unknown.stderr)")
        let onFile = try run(Paths.crashcap, ["show", directory + "/events.sqlite", id], timeout: 60)
        #expect(onFile.exitCode == 64, "a crash is chosen within a directory: \(onFile.stderr)")
    }

    /// A crash imported from a binary that is gone since (redeployed, or another machine's) keeps
    /// the names it was given at import.
    @Test func anImportedCrashKeepsItsNamesWhenTheBinaryIsGone() throws {
        let directory = makeTemporaryDirectory("show-gone")
        let binaries = makeTemporaryDirectory("show-gone-bin")
        let copy = binaries + "/crash-sample-c"
        // cp, not a copy by this process: a child another test forks meanwhile would inherit the
        // copy's descriptor open for writing, and the exec would fail (ETXTBSY).
        #expect(try run("/bin/cp", [Paths.cSample, copy]).exitCode == 0)
        let crashed = try run(copy, ["null-read"], environment: ["CRASHCAPTURE_DIR": directory], timeout: 30)
        #expect(crashed.signal == SIGSEGV)
        #expect(try run(Paths.crashcap, ["replay", directory], timeout: 60).exitCode == 0)
        try FileManager.default.removeItem(atPath: copy)
        let shown = try run(Paths.crashcap, ["show", directory, "--no-color"], timeout: 60)
        #expect(shown.exitCode == 0, "\(shown.stderr)")
        #expect(shown.stdout.contains("title:    SIGSEGV in sample_null_read"), "\(shown.stdout)")
        let frames = shown.stdout.components(separatedBy: "frames:\n").dropFirst().first ?? ""
        #expect(
            frames.hasPrefix("  #0 ") && frames.prefix { $0 != "\n" }.contains("sample_null_read"), "\(shown.stdout)")
    }

    @Test func replayJSONReportsEachFile() throws {
        let directory = makeTemporaryDirectory("json")
        _ = try run(Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": directory])
        let result = try run(Paths.crashcap, ["replay", directory, "--json"])
        #expect(result.exitCode == 0)
        let object = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        let files = try #require(object["crash_files"] as? [[String: Any]])
        #expect(files.count == 1 && files[0]["outcome"] as? String == "imported")
        #expect(files[0]["imported_events"] as? Int == 2)
        // The C session's own file: closed with the crash, its $AppEnd came from the crash file.
        let sessions = try #require(object["sessions"] as? [[String: Any]])
        #expect(sessions.count == 1 && sessions[0]["outcome"] as? String == "closed")
        #expect(sessions[0]["end_reason"] is NSNull)
    }
}

/// A crash three async calls deep, each call suspended once: the callers are on no stack, only
/// in the task's async context chain. The report lists them as [async] callers, as the Swift
/// backtracer does, named in `show` and in the replayed $AppCrashed.
@Suite struct AsyncFramesTests {
    /// The Swift sample's `kind` crashed into a directory of its own, and `show` of it.
    func crashAndShow(_ kind: String) throws -> (directory: String, text: RunResult) {
        let directory = makeTemporaryDirectory(kind)
        let crashed = try run(
            Paths.swiftSample, [kind], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"],
            timeout: 30)
        #expect(crashed.signal == SIGSEGV, "\(crashed.stderr)")
        return (directory, try run(Paths.crashcap, ["show", directory, "--no-color"], timeout: 60))
    }

    @Test func aCrashThreeAsyncCallsDeepNamesItsAsyncCallers() throws {
        let (directory, text) = try crashAndShow("swift-async-deep")
        let section =
            text.stdout.components(separatedBy: "async callers (task \"checkout-flow\"):\n").dropFirst().first ?? ""
        let asyncLines = section.split(separator: "\n").prefix { $0.hasPrefix("  ") }
        #expect(
            asyncLines.first?.contains("[async]") == true && asyncLines.first?.contains("asyncLevel2()") == true,
            "\(text.stdout)")
        #expect(asyncLines.dropFirst().first?.contains("asyncLevel1()") == true, "\(text.stdout)")
        let replay = try run(Paths.crashcap, ["replay", directory], timeout: 60)
        #expect(replay.exitCode == 0)
        let events = try EventStore(path: directory + "/events.sqlite").events(limit: 100).compactMap {
            try JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any]
        }
        let crash = try #require(events.first { $0["event"] as? String == "$AppCrashed" }?["crash"] as? [String: Any])
        let names = (crash["async_frames"] as? [[String: Any]] ?? []).compactMap { $0["function"] as? String }
        #expect(
            names.prefix(2).map { $0.contains("asyncLevel2") || $0.contains("asyncLevel1") } == [true, true], "\(names)"
        )
        #expect(crash["async_owner"] == nil)
        #expect(crash["task_name"] as? String == "checkout-flow", "Task(name:) in the event")
    }

    /// Another thread runs a task three async calls deep (blocked in the kernel inside it) when
    /// the main thread crashes: its stack in the report carries the task's [async] callers too.
    @Test func anotherThreadRunningATaskShowsItsAsyncCallers() throws {
        let (_, text) = try crashAndShow("swift-async-other-task")
        let threads = text.stdout.components(separatedBy: "\nthreads: ").dropFirst().first ?? ""
        let asyncLines = threads.split(separator: "\n").filter { $0.contains("[async]") }
        #expect(asyncLines.first?.contains("spinLevel2()") == true, "\(text.stdout)")
        #expect(asyncLines.dropFirst().first?.contains("spinLevel1()") == true, "\(text.stdout)")
        #expect(threads.contains("    task \"spinner\""), "the other thread's task, by its name: \(text.stdout)")
        #expect(!text.stdout.contains("async callers:"), "the crashing thread runs no task")
    }

    /// A C crash has no task: whatever the stack held, no [async] caller is named.
    @Test func aCrashOutsideATaskHasNoAsyncCallers() throws {
        let directory = makeTemporaryDirectory("no-async")
        let crashed = try run(Paths.cSample, ["deep-stack-64"], environment: ["CRASHCAPTURE_DIR": directory])
        #expect(crashed.signal == SIGSEGV)
        let text = try run(Paths.crashcap, ["show", directory, "--no-color"], timeout: 60)
        #expect(!text.stdout.contains("[async]"), "\(text.stdout)")
    }
}
