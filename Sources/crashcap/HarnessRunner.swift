import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

/// What one case did with capture off and on, and every way the captured run fell short.
struct HarnessResult: Sendable {
    var name: String
    var context: String
    var baseline: String
    var captured: String
    var captureOK: Bool
    var chained: String
    var topFrame: String
    var handlerMilliseconds: Double?
    var failures: [String]
    var seconds: Double

    var passed: Bool { failures.isEmpty }

    var json: [String: Any] {
        var object: [String: Any] = [
            "case": name, "context": context, "baseline": baseline, "captured": captured, "report_ok": captureOK,
            "chained": chained, "top_frame": topFrame, "passed": passed, "failures": failures, "seconds": seconds,
        ]
        if let handlerMilliseconds { object["handler_ms"] = handlerMilliseconds }
        return object
    }
}

/// Finds the programs a case runs: the samples next to crashcap, the preload library, python3
/// and a C program compiled on the spot that knows nothing of us.
struct HarnessEnvironment {
    var buildDirectory: String
    var preloadLibrary: String?
    var plainProgram: String?
    var plainProgramProblem: String?
    var swiftBuildConfiguration: String
    /// Whether crash-sample-swift was built with SwiftNIO (the default trait brings it).
    var swiftSampleHasNIO = false
    var timeout: Double
    var baseEnvironment: [String: String]

    static func make(buildDirectory: String?, preload: String?, timeout: Double) throws -> HarnessEnvironment {
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().path
        let directory = buildDirectory ?? exe
        for sample in ["crash-sample-swift", "crash-sample-c"] {
            guard FileManager.default.isExecutableFile(atPath: directory + "/" + sample) else {
                throw CommandFailure(
                    "no \(sample) in \(directory): run `swift build` first, or pass --build-dir", code: 66)
            }
        }
        var environment = ProcessInfo.processInfo.environment
        environment.removeValue(forKey: "CRASHCAPTURE_DIR")
        environment.removeValue(forKey: "LD_PRELOAD")
        environment["SWIFT_BACKTRACE"] = "enable=no"
        let candidates =
            [preload, ProcessInfo.processInfo.environment["CRASHCAPTURE_PRELOAD"]].compactMap { $0 }
            + [directory + "/../lib", directory + "/../../lib", exe + "/../lib", exe + "/../../lib"].map {
                $0 + "/libCrashCapturePreload.so"
            }
        // realpath, not lexical "..": the build directories are symbolic links.
        let library = candidates.lazy.compactMap { candidate -> String? in
            guard let resolved = realpath(candidate, nil) else { return nil }
            defer { free(resolved) }
            return String(cString: resolved)
        }.first
        let configuration = try ChildProcess.run(
            path: directory + "/crash-sample-swift", arguments: ["--build-config"], environment: environment,
            timeout: timeout
        ).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        var harness = HarnessEnvironment(
            buildDirectory: directory, preloadLibrary: library, swiftBuildConfiguration: configuration,
            timeout: timeout, baseEnvironment: environment)
        harness.swiftSampleHasNIO =
            (try? ChildProcess.run(
                path: directory + "/crash-sample-swift", arguments: ["--has-nio"], environment: environment,
                timeout: timeout
            ).stdout.hasPrefix("yes")) ?? false
        harness.compilePlainProgram()
        return harness
    }

    /// Where the plain program is built; removed by `cleanUp()` when the harness is done.
    var plainDirectory: String?

    func cleanUp() {
        if let plainDirectory { try? FileManager.default.removeItem(atPath: plainDirectory) }
    }

    /// A program built without any reference to CrashCapture, for the preload case.
    mutating func compilePlainProgram() {
        let directory = NSTemporaryDirectory() + "crashcap-plain-\(getpid())"
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        plainDirectory = directory
        let source = """
            #include <stdio.h>
            __attribute__((noinline)) void plain_program_crashes(volatile int *p) { *p = 42; }
            int main(void) { puts("about to crash"); fflush(stdout); plain_program_crashes(0); return 0; }
            """
        do {
            try source.write(toFile: directory + "/plain.c", atomically: false, encoding: .utf8)
            guard
                let cc = ["/usr/bin/cc", "/usr/bin/gcc", "/usr/bin/clang"].first(where: {
                    FileManager.default.isExecutableFile(atPath: $0)
                })
            else {
                plainProgramProblem = "no C compiler (cc, gcc or clang) to build the plain C program"
                return
            }
            let result = try ChildProcess.run(
                path: cc, arguments: ["-O0", "-g", "-o", directory + "/plain", directory + "/plain.c"],
                environment: baseEnvironment, timeout: 30)
            if result.exitCode == 0 {
                plainProgram = directory + "/plain"
            } else {
                plainProgramProblem = "compiling the plain C program failed: \(result.stderr)"
            }
        } catch {
            plainProgramProblem = "\(error)"
        }
    }
}

struct HarnessRunner {
    let environment: HarnessEnvironment

    /// The command line of a case, or why it cannot run here.
    func invocation(_ test: HarnessCase, captured: Bool) -> Result<(String, [String], [String: String]), CommandFailure>
    {
        var env = environment.baseEnvironment
        for (key, value) in test.environment { env[key] = value }
        switch test.program {
        case .swiftSample, .cSample:
            let sample = test.program == .swiftSample ? "crash-sample-swift" : "crash-sample-c"
            if !captured { env.removeValue(forKey: "CRASH_SAMPLE_FAULT_IN_HANDLER") }
            if env["SWIFT_BACKTRACE"] == "unset" { env.removeValue(forKey: "SWIFT_BACKTRACE") }
            if captured && test.installer != .own {
                guard let library = environment.preloadLibrary else {
                    return .failure(CommandFailure("libCrashCapturePreload.so not found: run Scripts/build-preload.sh"))
                }
                env["LD_PRELOAD"] = library
                if test.installer == .preload { env["CRASH_SAMPLE_NO_INSTALL"] = "1" }
            }
            var arguments = [test.kind, "--context", test.context, "--chain", test.chain]
            if let wait = test.mainWaits { arguments += ["--main-waits", wait] }
            return .success((environment.buildDirectory + "/" + sample, arguments, env))
        case .python, .plainC:
            guard let library = environment.preloadLibrary else {
                return .failure(CommandFailure("libCrashCapturePreload.so not found: run Scripts/build-preload.sh"))
            }
            if captured { env["LD_PRELOAD"] = library }
            if test.program == .python {
                return .success(("/usr/bin/env", ["python3", "-c", "import ctypes; ctypes.string_at(0)"], env))
            }
            guard let program = environment.plainProgram else {
                return .failure(CommandFailure(environment.plainProgramProblem ?? "no plain C program"))
            }
            return .success((program, [], env))
        }
    }

    func execute(_ test: HarnessCase, captured: Bool, directory: String) throws -> ChildProcess.Outcome {
        switch invocation(test, captured: captured) {
        case .failure(let failure):
            throw failure
        case .success(let (path, arguments, base)):
            var env = base
            env["CRASH_SAMPLE_MARKER"] = directory + (captured ? "/marker-captured" : "/marker-baseline")
            if captured { env["CRASHCAPTURE_DIR"] = directory + "/crashes" }
            if let hang = test.expect.hang, !hang.ends {
                // An orchestrator's kill: once the hang is on disk, or after 2 s without capture.
                let crashes = directory + "/crashes"
                return try ChildProcess.run(
                    path: path, arguments: arguments, environment: env, timeout: environment.timeout,
                    whileRunning: { child in
                        let deadline = Date().addingTimeInterval(captured ? 20 : 2)
                        while Date() < deadline && !(captured && Self.hangReported(in: crashes)) { usleep(20_000) }
                        kill(child.pid, SIGKILL)
                    })
            }
            let signalWhenReady = test.expect.sendSignal.map { signal in
                { (child: ChildProcess) in
                    // Wait for the sample to say it is ready (handlers installed), then signal it.
                    _ = child.waitForOutput("ready", timeout: 5)
                    kill(child.pid, signal)
                }
            }
            return try ChildProcess.run(
                path: path, arguments: arguments, environment: env, timeout: environment.timeout,
                whileRunning: signalWhenReady)
        }
    }

    /// Runs the case with capture off, then on, and checks the captured run against both the
    /// baseline and the expectation.
    func run(_ test: HarnessCase, repeatCapturedOnly: Bool = false) -> HarnessResult {
        let started = Date()
        let directory = NSTemporaryDirectory() + "crashcap-harness-\(UUID().uuidString)"
        try? FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var result = HarnessResult(
            name: test.name, context: test.context, baseline: "-", captured: "-", captureOK: false, chained: "-",
            topFrame: "-", handlerMilliseconds: nil, failures: [], seconds: 0)
        do {
            let expected = test.expect.signal.map(signalName) ?? "exit 0"
            if !repeatCapturedOnly {
                let baseline = try execute(test, captured: false, directory: directory)
                result.baseline = baseline.ending
                if baseline.ending != expected {
                    result.failures.append("without capture it ended by \(baseline.ending), expected \(expected)")
                }
            }
            let captured = try execute(test, captured: true, directory: directory)
            result.captured = captured.ending
            if captured.timedOut {
                result.failures.append("hung: killed after \(Int(environment.timeout)) s")
            } else if captured.ending != expected {
                result.failures.append("with capture it ended by \(captured.ending), expected \(expected)")
            } else if !repeatCapturedOnly && captured.ending != result.baseline {
                result.failures.append(
                    "capture changed how it ended: \(result.baseline) without, \(captured.ending) with")
            }
            if let needle = test.expect.stderr, !captured.stderr.contains(needle) {
                result.failures.append("stderr lacks \"\(needle)\"")
            }
            checkMarker(test, directory: directory, into: &result)
            if let hang = test.expect.hang {
                checkHang(hang, directory: directory + "/crashes", outcome: captured, into: &result)
            } else {
                checkReport(test, directory: directory + "/crashes", outcome: captured, into: &result)
            }
        } catch {
            result.failures.append("\(error)")
        }
        result.seconds = Date().timeIntervalSince(started)
        return result
    }

    /// A hang report on disk: its file (a C program), or its event already in the store (the
    /// Swift SDK imports its own at once).
    static func hangReported(in directory: String) -> Bool {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
        if names.contains(where: { $0.contains("-hang-") && $0.hasSuffix(".ccr") }) { return true }
        guard names.contains("events.sqlite"), let store = try? EventStore(path: directory + "/events.sqlite")
        else { return false }
        return ((try? store.events(limit: 10_000)) ?? []).contains { $0.payload.contains("\"$AppHang\"") }
    }

    /// A hang case's report, as an analyst gets it: what the process left replayed into its
    /// store (the SDK's own imports are there already), then the `$AppHang` read back.
    func checkHang(
        _ hang: HarnessCase.Hang, directory: String, outcome: ChildProcess.Outcome, into result: inout HarnessResult
    ) {
        var problems: [String] = []
        if let stdout = hang.stdout, !outcome.stdout.contains(stdout) {
            problems.append("stdout lacks \"\(stdout)\": \(outcome.stdout.suffix(200))")
        }
        let events: [[String: Any]]
        do {
            let store = try EventStore(path: directory + "/events.sqlite")
            _ = CrashReplayer(directory: directory, store: store).replayAll()
            events = try store.events(limit: 100_000).compactMap {
                try JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any]
            }
        } catch {
            result.failures.append("the store could not be read: \(error)")
            return
        }
        let hangs = events.filter { $0["event"] as? String == "$AppHang" }
        guard hangs.count == 1 else {
            result.failures.append("expected 1 $AppHang, found \(hangs.count)")
            return
        }
        let properties = hangs[0]["properties"] as? [String: Any] ?? [:]
        let details = hangs[0]["hang"] as? [String: Any] ?? [:]
        result.topFrame = String((properties["hang_title"] as? String ?? "-").prefix(48))
        if details["threads_frozen_by"] as? String != "ptrace" {
            problems.append("threads frozen by \(details["threads_frozen_by"] ?? "nothing said"), expected ptrace")
        }
        let threads = details["threads"] as? [[String: Any]] ?? []
        if let hung = threads.first(where: { $0["hung"] as? Bool == true }) {
            let functions = (hung["frames"] as? [[String: Any]] ?? []).compactMap { $0["function"] as? String }
            if !functions.contains(where: { $0.contains(hang.function) }) {
                problems.append("the hung thread's stack lacks \(hang.function): \(functions.prefix(12))")
            }
            if let name = hang.threadName, !(hung["name"] as? String ?? "").hasPrefix(name) {
                problems.append("the hung thread is \(hung["name"] ?? "?"), expected \(name)…")
            }
        } else {
            problems.append("no thread marked hung among \(threads.count)")
        }
        if threads.contains(where: { $0["captured"] as? Bool != true }) {
            problems.append(
                "threads not captured: \(threads.filter { $0["captured"] as? Bool != true }.map { $0["name"] ?? "?" })")
        }
        if (properties["hang_deadlock"] as? Bool ?? false) != hang.deadlock {
            problems.append("hang_deadlock is \(properties["hang_deadlock"] ?? "missing"), expected \(hang.deadlock)")
        }
        let ended = events.contains { $0["event"] as? String == "$AppHangEnd" }
        if ended != hang.ends {
            problems.append(hang.ends ? "no $AppHangEnd" : "a $AppHangEnd for a hang that never ended")
        }
        result.handlerMilliseconds = properties["hang_capture_ms"] as? Double
        result.captureOK = problems.isEmpty
        result.failures += problems
    }

    func checkMarker(_ test: HarnessCase, directory: String, into result: inout HarnessResult) {
        guard let marker = test.expect.marker else { return }
        let text = (try? String(contentsOfFile: directory + "/marker-captured", encoding: .utf8)) ?? ""
        if text.hasPrefix(marker) {
            result.chained = "yes"
        } else {
            result.chained = "NO"
            result.failures.append("the other handler did not run as expected: wanted \"\(marker)\", got \"\(text)\"")
        }
    }

    /// Every report lists its threads, the crashing one first; a case may ask for more.
    func threadProblems(_ expect: HarnessCase.Expectation, report: CrashReport) -> [String] {
        var problems: [String] = []
        guard report.threads.first?.crashed == true else { return ["the crashing thread is not listed first"] }
        let symbolicator = Symbolicator()
        func functions(_ thread: CrashReport.Thread) -> [String] {
            symbolicator.symbolicate(thread, in: report).compactMap(\.function)
        }
        for (name, function) in expect.threads.sorted(by: { $0.key < $1.key }) {
            let named = report.threads.filter { $0.name == name && !$0.crashed }
            if named.isEmpty {
                problems.append("no thread named \(name): \(report.threads.map(\.name))")
            } else if !named.contains(where: {
                $0.captured && (function.isEmpty || functions($0).contains { $0.contains(function) })
            }) {
                problems.append("thread \(name) captured without \(function): \(named.first.map(functions) ?? [])")
            }
        }
        for (name, why) in expect.threadsNotCaptured {
            if !report.threads.contains(where: {
                $0.name == name && !$0.captured && $0.whyNotCaptured?.contains(why) == true
            }) {
                problems.append("thread \(name) not listed as not captured (\(why))")
            }
        }
        if let count = expect.allCapturedOf {
            let captured = report.threads.filter { $0.captured && !$0.frames.isEmpty }.count
            if report.threads.count < count || captured != report.threads.count {
                problems.append("\(captured) of \(report.threads.count) threads captured, expected all of \(count)")
            }
        }
        if let function = expect.crashedToo,
            !report.threads.contains(where: { !$0.crashed && functions($0).contains { $0.contains(function) } })
        {
            problems.append("no other thread shows \(function)")
        }
        return problems
    }

    /// Every report with other threads says how they were frozen: by ptrace, or, where a case
    /// refuses ptrace, by the signal fallback with the reason.
    func freezeProblems(_ test: HarnessCase, report: CrashReport) -> [String] {
        guard report.threads.count > 1, !test.expect.fromChild else { return [] }
        let denied = test.environment["CRASH_SAMPLE_DENY_PTRACE"] != nil
        let expected = denied ? "signal" : "ptrace"
        var problems: [String] = []
        if report.threadsFrozenBy != expected {
            problems.append("threads frozen by \(report.threadsFrozenBy ?? "nothing said"), expected \(expected)")
        }
        if denied && report.threadsFreezeNote?.contains("ptrace refused") != true {
            problems.append("no note of ptrace refused: \(report.threadsFreezeNote ?? "none")")
        }
        return problems
    }

    func checkReport(
        _ test: HarnessCase, directory: String, outcome: ChildProcess.Outcome, into result: inout HarnessResult
    ) {
        let expect = test.expect
        let files = ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter {
            $0.hasSuffix(".ccr")
        }
        guard expect.report else {
            if !files.isEmpty {
                result.failures.append("a report was written, but the signal should have been ignored")
            }
            result.captureOK = files.isEmpty
            return
        }
        guard files.count == 1 else {
            result.failures.append("expected 1 crash file, found \(files.count)")
            return
        }
        guard let report = try? CrashReport(path: directory + "/" + files[0]) else {
            result.failures.append("crash file unreadable")
            return
        }
        var problems: [String] = report.problems.map { "damaged: \($0)" }
        if report.crashedEvents.count != 1 { problems.append("\(report.crashedEvents.count) $AppCrashed events") }
        if report.endEvents.count != 1 { problems.append("\(report.endEvents.count) $AppEnd events") }
        let expectedSignal = expect.signal.map(signalName) ?? "SIGSEGV"
        if report.signalName != expectedSignal {
            problems.append("report says \(report.signalName ?? "nothing"), expected \(expectedSignal)")
        }
        if let code = expect.code, report.codeName != code {
            problems.append("si_code \(report.codeName ?? "none"), expected \(code)")
        }
        let wantsMessage = environment.swiftBuildConfiguration == "debug" || expect.messageInRelease
        if let message = expect.message, wantsMessage, report.swiftMessage?.contains(message) != true {
            problems.append("Swift message \"\(report.swiftMessage ?? "")\" lacks \"\(message)\"")
        }
        if let exception = expect.exception, report.exceptionType?.contains(exception) != true {
            problems.append("exception type \(report.exceptionType ?? "none"), expected \(exception)")
        }
        if report.exceptionWhat != expect.exceptionWhat {
            problems.append(
                "exception what() \(report.exceptionWhat ?? "none"), expected \(expect.exceptionWhat ?? "none")")
        }
        if report.handlerFaults != expect.handlerFaults {
            problems.append("handler faults \(report.handlerFaults), expected \(expect.handlerFaults)")
        }
        if let value = expect.sentValue, (report.properties["crash_signal_value"] as? NSNumber)?.intValue != value {
            problems.append("sigqueue value not recorded")
        }
        if expect.sendSignal != nil, (report.properties["crash_sender_pid"] as? NSNumber)?.int32Value != getpid() {
            problems.append("sender pid not recorded as the harness's")
        }
        if expect.fromChild, let pid = report.session?["pid"] as? Int,
            outcome.stdout.contains("child-pid \(pid) ") == false
        {
            problems.append("report is not the forked child's (pid \(pid)): \(outcome.stdout)")
        }
        let symbols = Symbolicator().symbolicate(report)
        let top = Array(symbols.prefix(expect.topFrames))
        let modulePaths = report.frames.prefix(expect.topFrames).map { frame in
            frame.module.flatMap { $0 < report.modules.count ? report.modules[$0].path : nil } ?? ""
        }
        result.topFrame =
            top.first { $0.function != nil }.map { "\($0.function!.prefix(48))" } ?? top.first?.module ?? "-"
        if let frame = expect.frame {
            if let hit = top.first(where: { $0.function?.contains(frame) == true }) {
                result.topFrame = String(hit.function!.prefix(48))
            } else {
                problems.append(
                    "\(frame) is not among the top \(expect.topFrames) frames: \(top.map { $0.function ?? $0.module })")
            }
        }
        if !expect.asyncCallers.isEmpty {
            let callers = Symbolicator().symbolicateAsyncFrames(of: report).compactMap(\.function)
            var remaining = callers[...]
            for wanted in expect.asyncCallers {
                guard let at = remaining.firstIndex(where: { $0.contains(wanted) }) else {
                    problems.append("\(wanted) is not among the [async] callers, in order: \(callers)")
                    break
                }
                remaining = remaining[(at + 1)...]
            }
        }
        if let name = expect.taskName, report.taskName != name {
            problems.append("the task's name is \(report.taskName ?? "missing"), expected \(name)")
        }
        if let library = expect.library {
            if let path = modulePaths.first(where: { $0.contains(library) }) {
                result.topFrame = (path as NSString).lastPathComponent
            } else {
                problems.append("no frame in \(library) among the top \(expect.topFrames): \(modulePaths)")
            }
        }
        problems += threadProblems(expect, report: report)
        problems += freezeProblems(test, report: report)
        result.handlerMilliseconds = report.timing.map { Double($0.handlerNanoseconds) / 1e6 }
        result.captureOK = problems.isEmpty
        result.failures += problems
    }
}
