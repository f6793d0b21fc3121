import CrashFileFormat
import Foundation
import ProcessSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Real processes crash under capture; each test checks how the process died and what it wrote.
@Suite struct CrashPathTests {
    func crash(
        _ sample: String, _ kind: String, context: String = "main", chain: String = "none",
        environment: [String: String] = [:]
    ) throws -> (RunResult, String) {
        let directory = makeTemporaryDirectory(kind)
        var env = environment
        env["CRASHCAPTURE_DIR"] = directory
        env["CRASH_SAMPLE_MARKER"] = directory + "/marker"
        let result = try run(sample, [kind, "--context", context, "--chain", chain], environment: env)
        #expect(!result.timedOut, "\(kind) hung")
        return (result, directory)
    }

    /// The crash path's CRC-32 folds 64 bytes a step with carry-less multiplication from 4 KiB
    /// up (a crash's stacks record), the tables below that: both held to Python's zlib.crc32 at
    /// lengths around each boundary (16, 64, the 4 KiB switch) and at random ones up to 1 MiB.
    @Test func theCrashPathsCRC32IsZlibsAtEveryLength() throws {
        let directory = makeTemporaryDirectory("crc32")
        var generator = SystemRandomNumberGenerator()
        var lengths = [0, 1, 7, 8, 15, 16, 63, 64, 65, 4095, 4096, 4097, 4111, 4112, 4159, 4160, 4161, 819_200]
        lengths += (0..<24).map { _ in Int.random(in: 4096...1_048_576, using: &generator) }
        var paths: [String] = []
        for (index, length) in lengths.enumerated() {
            let path = directory + "/\(index)"
            try Data((0..<length).map { _ in UInt8.random(in: 0...255, using: &generator) }).write(
                to: URL(fileURLWithPath: path))
            paths.append(path)
        }
        let ours = try run(Paths.cSample, ["crc32"] + paths)
        #expect(ours.exitCode == 0, "\(ours.stderr)")
        let zlib = try run(
            "/usr/bin/env",
            [
                "python3", "-c",
                "import sys, zlib\nfor p in sys.argv[1:]: print('%08x' % zlib.crc32(open(p, 'rb').read()))",
            ]
                + paths)
        #expect(zlib.exitCode == 0, "\(zlib.stderr)")
        let pairs = zip(lengths, zip(ours.stdout.split(separator: "\n"), zlib.stdout.split(separator: "\n")))
        #expect(
            pairs.count { $0.1.0 != $0.1.1 } == 0, "lengths that differ: \(pairs.filter { $0.1.0 != $0.1.1 }.map(\.0))")
        #expect(ours.stdout.split(separator: "\n").count == lengths.count)
    }

    @Test func segfaultInSwiftOnTheMainThread() throws {
        let (result, directory) = try crash(Paths.swiftSample, "swift-null-read")
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.codeName == "SEGV_MAPERR")
        #expect(report.properties["crash_fault_address"] as? String == "0x10")
        #expect(report.properties["crash_main_thread"] as? Bool == true)
        #expect(frameNames(report, count: 3).contains { $0.contains("crashSwiftNullRead") })
        #expect(report.properties["crash_unwinder"] as? String == "libunwind")
    }

    /// A SIGSEGV sent (kill, sigqueue: si_code <= 0) has no fault address: the siginfo's address
    /// field holds the sender's pid and uid, which the report names as the sender's.
    @Test func aSentSignalNamesItsSenderNotAnAddress() throws {
        let (result, directory) = try crash(Paths.cSample, "sigqueue-segv")
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.codeName == "SI_QUEUE")
        #expect(report.properties["crash_fault_address"] == nil, "\(report.properties)")
        let pid = (report.properties["$pid"] as? NSNumber)?.int32Value
        #expect(pid != nil && (report.properties["crash_sender_pid"] as? NSNumber)?.int32Value == pid)
        #expect((report.properties["crash_sender_uid"] as? NSNumber)?.uint32Value == getuid())
        let reason = report.reason ?? ""
        #expect(reason.contains("sent by pid \(pid ?? -1) (uid \(getuid()))"), "\(reason)")
        #expect(!reason.contains(" at 0x"), "\(reason)")
    }

    /// A system call the process's seccomp filter traps (a container's profile does this to a
    /// forbidden call): SIGSYS, caught like any crash, with the call's number in the report,
    /// and the process dies of SIGSYS as it would have.
    @Test func aSyscallForbiddenBySeccompIsReportedWithItsNumber() throws {
        let (result, directory) = try crash(Paths.cSample, "forbidden-syscall")
        #expect(result.signal == SIGSYS, "ended by \(String(describing: result.signal))")
        let report = try verifiedReport(in: directory, signal: "SIGSYS")
        #expect(report.codeName == "SYS_SECCOMP")
        #if arch(x86_64)
            let acct = 163
        #else
            let acct = 89
        #endif
        #expect(report.properties["crash_syscall"] as? Int == acct, "acct(2)")
        #expect(report.properties["crash_syscall_arch"] as? String != nil)
        #expect(report.frames.count > 1)
    }

    @Test func segfaultOnAPthread() throws {
        let (result, directory) = try crash(Paths.swiftSample, "swift-null-read", context: "pthread")
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.properties["crash_main_thread"] as? Bool == false)
        #expect(frameNames(report, count: 3).contains { $0.contains("crashSwiftNullRead") })
    }

    @Test func abortFromC() throws {
        let (result, directory) = try crash(Paths.cSample, "abort")
        #expect(result.signal == SIGABRT)
        let report = try verifiedReport(in: directory, signal: "SIGABRT")
        #expect(report.codeName == "SI_TKILL")
        #expect(frameNames(report, count: 6).contains("sample_abort"))
    }

    @Test func swiftForceUnwrapTrapCarriesTheFatalErrorMessage() throws {
        let (result, directory) = try crash(Paths.swiftSample, "swift-force-unwrap")
        #expect(result.signal == SIGILL)
        let report = try verifiedReport(in: directory, signal: "SIGILL")
        #expect(report.codeName == "ILL_ILLOPN")
        #expect(report.swiftMessage?.contains("Unexpectedly found nil while unwrapping an Optional value") == true)
        #expect(report.reason?.contains("Unexpectedly found nil") == true)
        #expect(frameNames(report, count: 6).contains { $0.contains("crashSwiftForceUnwrap") })
    }

    @Test func uncaughtCxxExceptionRecordsItsType() throws {
        let (result, directory) = try crash(Paths.cSample, "cxx-runtime-error")
        #expect(result.signal == SIGABRT)
        let report = try verifiedReport(in: directory, signal: "SIGABRT")
        #expect(report.exceptionType == "St13runtime_error")
        #expect(result.stderr.contains("what():  sample runtime_error"), "libstdc++'s own terminate handler still ran")
        #expect(frameNames(report, count: 12).contains("sample_throw_runtime_error"))
    }

    @Test(arguments: ["pthread", "dispatch", "thread", "task"])
    func stackOverflowOnASecondaryThread(context: String) throws {
        let (result, directory) = try crash(Paths.swiftSample, "swift-stack-overflow", context: context)
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.properties["crash_main_thread"] as? Bool == false)
        #expect(frameNames(report, count: 3).contains { $0.contains("crashSwiftRecursion") })
    }

    @Test func previousSigInfoHandlerIsCalledWithTheOriginalSigInfo() throws {
        let (result, directory) = try crash(Paths.cSample, "null-read", chain: "previous-siginfo")
        #expect(result.signal == SIGSEGV)
        _ = try verifiedReport(in: directory, signal: "SIGSEGV")
        let marker = try String(contentsOfFile: directory + "/marker", encoding: .utf8)
        #expect(marker == "previous-siginfo signo=11 code=1 addr=(nil)\n")
    }

    @Test func previousPlainHandlerIsCalled() throws {
        let (result, directory) = try crash(Paths.cSample, "abort", chain: "previous-plain")
        #expect(result.signal == SIGABRT)
        _ = try verifiedReport(in: directory, signal: "SIGABRT")
        let marker = try String(contentsOfFile: directory + "/marker", encoding: .utf8)
        #expect(marker.hasPrefix("previous-plain signo=6"))
    }

    @Test func handlerInstalledAfterOursStillReachesUs() throws {
        let (result, directory) = try crash(Paths.cSample, "null-read", chain: "after-capture")
        #expect(result.signal == SIGSEGV)
        _ = try verifiedReport(in: directory, signal: "SIGSEGV")
        let marker = try String(contentsOfFile: directory + "/marker", encoding: .utf8)
        #expect(marker.hasPrefix("after-capture signo=11"))
    }

    @Test func ignoredSentSignalIsStillIgnored() throws {
        let (result, directory) = try crash(Paths.cSample, "raise-segv", chain: "ignore")
        #expect(result.exitCode == 0, "raise(SIGSEGV) under SIG_IGN must not kill: \(result.stderr)")
        #expect(result.stdout.contains("survived raise-segv"))
        #expect(crashFiles(in: directory).isEmpty)
    }

    @Test func ignoredHardwareFaultStillKills() throws {
        let (result, directory) = try crash(Paths.cSample, "null-read", chain: "ignore")
        #expect(result.signal == SIGSEGV)
        _ = try verifiedReport(in: directory, signal: "SIGSEGV")
    }

    @Test func swiftRuntimeBacktracerStillReportsAfterUs() throws {
        let (result, directory) = try crash(
            Paths.swiftSample, "swift-null-read", environment: ["SWIFT_BACKTRACE": "enable=yes,interactive=no"])
        #expect(result.signal == SIGSEGV)
        #expect(
            result.stderr.contains("*** Program crashed: Bad pointer dereference"),
            "the Swift runtime's report is missing: \(result.stderr.prefix(500))")
        #expect(result.seconds < 30)
        _ = try verifiedReport(in: directory, signal: "SIGSEGV")
    }

    @Test func swiftRuntimeBacktracerDisabled() throws {
        let (result, directory) = try crash(
            Paths.swiftSample, "swift-force-unwrap", environment: ["SWIFT_BACKTRACE": "enable=no"])
        #expect(result.signal == SIGILL)
        #expect(!result.stderr.contains("*** Program crashed"))
        _ = try verifiedReport(in: directory, signal: "SIGILL")
    }

    @Test func faultInsideOurHandlerStillLeavesARecordAndReRaises() throws {
        let (result, directory) = try crash(
            Paths.cSample, "null-read", environment: ["CRASH_SAMPLE_FAULT_IN_HANDLER": "1"])
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.handlerFaults == ["unwind"])
        #expect(report.frames.count >= 1)
    }

    /// The other threads are unwound inside their stage, each under a guard of its own; a
    /// fault later in that stage must still cost that stage only.
    @Test func faultInTheThreadsStageAfterUnwindingThemStillLeavesTheReport() throws {
        let (result, directory) = try crash(
            Paths.cSample, "parked-threads",
            environment: ["CRASH_SAMPLE_FAULT_IN_HANDLER": "threads", "CRASH_SAMPLE_THREADS": "4"])
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.handlerFaults == ["threads"])
        #expect(report.frames.count >= 1)
    }

    @Test func eightThreadsCrashingAtOnceGiveOneReport() throws {
        // Without the Swift runtime's backtracer, as in the harness: on its own (no CrashCapture
        // in the process) it hangs in about one run in ten when several threads crash at once
        // (8 of 80 runs of this sample), in its second thread's backtrace.
        let (result, directory) = try crash(
            Paths.cSample, "concurrent-8", environment: ["SWIFT_BACKTRACE": "enable=no"])
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(frameNames(report, count: 3).contains("sample_null_read"))
    }

    @Test func crashInADlopenedLibraryIsAttributedToIt() throws {
        let (result, directory) = try crash(Paths.cSample, "dlopen-library")
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        let first = try #require(report.frames.first?.module)
        #expect(report.modules[first].path.contains("libz.so"))
        #expect(!report.modules[first].buildID.isEmpty)
    }

    @Test func forkedChildReportsInItsOwnFile() throws {
        let (result, directory) = try crash(Paths.cSample, "fork-child")
        #expect(result.exitCode == 0)
        let words = result.stdout.split(whereSeparator: { $0 == " " || $0 == "\n" })
        let childPID = try #require(words.firstIndex(of: "child-pid").flatMap { Int(words[$0 + 1]) })
        #expect(result.stdout.contains("child-signal 11"))
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect((report.properties["$pid"] as? NSNumber)?.intValue == childPID)
        #expect(report.session?["pid"] as? Int == childPID)
    }

    @Test func normalExitLeavesNoCrashFile() throws {
        let directory = makeTemporaryDirectory("clean")
        let result = try run(Paths.swiftSample, ["--list"], environment: ["CRASHCAPTURE_DIR": directory])
        #expect(result.exitCode == 0)
        #expect(crashFiles(in: directory).isEmpty)
    }

    @Test func withoutLibunwindStacksComeFromFramePointers() throws {
        let (result, directory) = try crash(Paths.cSample, "null-read", environment: ["CRASHCAPTURE_NO_LIBUNWIND": "1"])
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.properties["crash_unwinder"] as? String == "frame-pointer")
        let names = frameNames(report, count: 8)
        #expect(names.first == "sample_null_read")
        #expect(names.contains("main"), "the walk reaches main: \(names)")
    }

    @Test func handlerTimeIsRecorded() throws {
        let (_, directory) = try crash(Paths.cSample, "null-read")
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        let timing = try #require(report.timing)
        #expect(timing.fdatasyncSucceeded)
        #expect(timing.handlerNanoseconds > timing.fdatasyncNanoseconds)
        #expect(timing.fdatasyncNanoseconds > 0)
        let parts = [timing.keptFilesNanoseconds, timing.unwindNanoseconds, timing.eventsNanoseconds]
        #expect(parts.allSatisfy { $0 > 0 }, "\(parts)")
        #expect(parts.reduce(0, +) < timing.handlerNanoseconds)
        #expect((report.properties["crash_handler_ms"] as? Double ?? -1) >= 0)
    }

    /// The crash file is named at install, so a crash only writes and flushes it; on ext4 that
    /// flush makes the name durable too, elsewhere (tmpfs here) the directory is flushed after
    /// it. A forked child's file is unnamed until its crash links it in: on ext4 linked first
    /// and flushed once, elsewhere flushed, linked, and the directory flushed. The filesystem is
    /// read from the kernel's mount table, not from our own detection.
    @Test(arguments: [NSTemporaryDirectory(), "/dev/shm/"], ["null-read", "fork-child"])
    func theReportIsFlushedOnceWhereTheFilesystemAllows(parent: String, kind: String) throws {
        let directory = parent + "crashcapture-tests-flush-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        chmod(directory, 0o700)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let ext4 = try #require(mountedFilesystemType(of: directory)) == "ext4"
        let result = try run(
            Paths.cSample, [kind], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        if kind == "fork-child" {
            #expect(result.stdout.contains("child-signal 11"), "\(result.stdout)")
        } else {
            #expect(result.signal == SIGSEGV)
        }
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        let timing = try #require(report.timing)
        #expect(timing.fdatasyncSucceeded)
        #expect(timing.namedBeforeSync == (kind == "null-read" || ext4), "\(directory), ext4: \(ext4)")
        #expect(timing.directoryFlushed == !ext4, "\(directory), ext4: \(ext4)")
    }

    /// A live process's crash file is named and locked, so that a replay leaves it alone; once
    /// the process is killed (SIGKILL: no handler runs), the next replay finds it holding no
    /// crash and removes it.
    @Test func aLiveProcesssCrashFileIsLockedAndAKilledOnesIsRemovedByReplay() throws {
        let directory = makeTemporaryDirectory("live")
        var environment = ProcessInfo.processInfo.environment
        environment["CRASHCAPTURE_DIR"] = directory
        let child = try ChildProcess(path: Paths.cSample, arguments: ["kill-from-outside"], environment: environment)
        #expect(child.waitForOutput("ready"))
        // A C install makes its files a few milliseconds after it returns (deferred_install.c).
        let deadline = Date().addingTimeInterval(5)
        while crashFiles(in: directory).isEmpty && Date() < deadline { usleep(5000) }
        let live = crashFiles(in: directory)
        #expect(live.count == 1, "the live process's crash file")
        let file = try #require(live.first)
        let fd = open(file, O_RDONLY)
        #expect(fd >= 0)
        #expect(flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK, "locked by the live process")
        close(fd)
        let whileLive = try run(Paths.crashcap, ["replay", directory], timeout: 20)
        #expect(whileLive.stdout.contains("0 imported"), "\(whileLive.stdout)")
        #expect(FileManager.default.fileExists(atPath: file), "a replay leaves a live file alone")
        let shown = try run(Paths.crashcap, ["show", directory], timeout: 20)
        #expect(shown.exitCode == 0, "a live file is no damaged report: \(shown.stderr)")
        #expect(shown.stderr.contains("1 crash file(s) of running processes skipped"), "\(shown.stderr)")
        kill(child.pid, SIGKILL)
        #expect(child.wait(timeout: 20))
        let afterKill = try run(Paths.crashcap, ["replay", directory], timeout: 20)
        #expect(afterKill.stdout.contains("1 without a crash"), "\(afterKill.stdout)")
        #expect(crashFiles(in: directory).isEmpty, "removed by the replay")
    }

    /// A crash in an atexit handler that runs after ours: the session ended normally and its
    /// crash file was removed, so the report goes into the file made again under its name,
    /// with the $AppCrashed and no second $AppEnd.
    @Test func aCrashAfterTheSessionEndedIsReportedWithoutASecondAppEnd() throws {
        let (result, directory) = try crash(
            Paths.cSample, "crash-at-exit", environment: ["SWIFT_BACKTRACE": "enable=no"])
        #expect(result.signal == SIGSEGV)
        let all = try reports(in: directory)
        #expect(all.count == 1)
        let report = try #require(all.first)
        #expect(report.problems.isEmpty, "\(report.problems)")
        #expect(report.crashedEvents.count == 1)
        #expect(report.endEvents.isEmpty, "the session's own end was tracked before the crash")
        #expect(frameNames(report).contains("crash_after_the_session_ended"))
    }

    @Test func appEndCarriesTheSessionDuration() throws {
        let (_, directory) = try crash(Paths.cSample, "abort")
        let report = try verifiedReport(in: directory, signal: "SIGABRT")
        let end = try #require(report.endEvents.first)
        let properties = try #require(end["properties"] as? [String: Any])
        let duration = try #require(properties["$event_duration"] as? Double)
        #expect(duration >= 0 && duration < 60)
        #expect(end["event_id"] as? String != report.crashed?["event_id"] as? String)
        #expect(end["distinct_id"] as? String == report.crashed?["distinct_id"] as? String)
        #expect(properties["sample_kind"] as? String == "abort")
    }
}

/// The type of the filesystem mounted where `path` lies, from /proc/self/mountinfo (the
/// longest mount point that contains it).
func mountedFilesystemType(of path: String) -> String? {
    guard let table = try? String(contentsOfFile: "/proc/self/mountinfo", encoding: .utf8) else { return nil }
    let resolved = URL(fileURLWithPath: path).resolvingSymlinksInPath().path
    var best: (point: String, type: String)?
    for line in table.split(separator: "\n") {
        let halves = line.components(separatedBy: " - ")
        let fields = halves[0].split(separator: " ")
        guard halves.count == 2, fields.count > 4, let type = halves[1].split(separator: " ").first else { continue }
        let point = String(fields[4]).replacingOccurrences(of: "\\040", with: " ")
        let contains = point == "/" || resolved == point || resolved.hasPrefix(point + "/")
        if contains && point.count >= (best?.point.count ?? -1) { best = (point, String(type)) }
    }
    return best?.type
}
