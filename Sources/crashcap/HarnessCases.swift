import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// One way a Linux process dies, and what a correct capture of it looks like.
struct HarnessCase: Sendable {
    enum Program: String, Sendable {
        case swiftSample = "swift"
        case cSample = "c"
        case python = "python3+preload"
        case plainC = "plain-c+preload"
    }

    struct Expectation: Sendable {
        /// nil: the process is expected to live on and exit 0.
        var signal: Int32?
        var code: String? = nil
        /// A substring of the Swift fatal-error message.
        var message: String? = nil
        var messageInRelease = false
        /// A substring of the C++ exception's (mangled) type name.
        var exception: String? = nil
        /// The what() of an uncaught std::exception.
        var exceptionWhat: String? = nil
        /// A substring of a function name among the first `topFrames` frames.
        var frame: String? = nil
        /// Functions that must be among the report's [async] callers, in this order.
        var asyncCallers: [String] = []
        /// The name the crashing task was given (`Task(name:)`), as the report must carry it.
        var taskName: String? = nil
        /// A substring of the module path of one of the first `topFrames` frames.
        var library: String? = nil
        var topFrames = 8
        /// What a handler installed before (or after) us must have written.
        var marker: String? = nil
        /// A substring of the captured run's stderr (the Swift backtracer's report, say).
        var stderr: String? = nil
        var report = true
        var handlerFaults: [String] = []
        /// Sent by the harness, with kill(2), once the process prints "ready".
        var sendSignal: Int32? = nil
        /// The report comes from a forked child, not from the process we started.
        var fromChild = false
        var sentValue: Int? = nil
        /// Other threads that must be in the report, by name, each with a substring of a function
        /// on its stack ("": listed and captured is enough).
        var threads: [String: String] = [:]
        /// Threads that must be listed as not captured, by name, with a substring of why.
        var threadsNotCaptured: [String: String] = [:]
        /// At least this many threads listed, every one captured.
        var allCapturedOf: Int? = nil
        /// A substring of a function on the stack of another thread that was crashing at the same
        /// time (listed as crashed too, or still on its way into the fault when it was asked).
        var crashedToo: String? = nil
        /// A hang case: no crash, a hang report instead (see `Hang`).
        var hang: Hang? = nil
    }

    /// What a hang's report must show. A hang that `ends` lets the process exit 0 with a
    /// `$AppHangEnd`; one that does not is killed by the harness (SIGKILL) once its report is
    /// on disk, or after 2 s without capture, as an orchestrator would.
    struct Hang: Sendable {
        /// A substring of a function on the hung thread's stack.
        var function: String
        /// A prefix of the hung thread's name.
        var threadName: String? = nil
        var deadlock = false
        var ends = true
        /// A substring the sample's stdout must hold (`eintr=0`: no thread saw EINTR).
        var stdout: String? = nil
    }

    /// Who installs the capture in the sample: its own call (the C API or the Swift SDK), the
    /// preload library alone, or both at once (which must still give one report).
    enum Installer: String, Sendable {
        case own, preload, both
    }

    var program: Program
    var kind: String
    var context = "main"
    var chain = "none"
    /// The crash comes on another thread while the main thread waits once in this way, then
    /// returns from main (sample_main_wait): a wait ended by the capture would let it exit.
    var mainWaits: String? = nil
    var installer = Installer.own
    var environment: [String: String] = [:]
    var expect: Expectation

    var name: String {
        var name = "\(program.rawValue)/\(kind)"
        if context != "main" { name += "@\(context)" }
        if let mainWaits { name += "@main-in-\(mainWaits)" }
        if installer != .own { name += "+\(installer == .both ? "preload+own" : "preload")" }
        if chain != "none" { name += "+\(chain)" }
        if let backtrace = environment["SWIFT_BACKTRACE"], backtrace.hasPrefix("enable=yes") {
            name += "+swift-backtracer"
        }
        if environment["SWIFT_BACKTRACE"] == "unset" { name += "+swift-backtrace-unset" }
        if environment["CRASH_SAMPLE_DENY_PTRACE"] != nil { name += "+ptrace-denied" }
        if let workers = environment["CRASH_SAMPLE_DISPATCH_WORKERS"] { name += "+\(workers)-dispatch-workers" }
        if environment["CRASH_SAMPLE_FAULT_IN_HANDLER"] != nil { name += "+fault-in-handler" }
        return name
    }

    /// The Swift sample waits on a SwiftNIO future: only where it was built with SwiftNIO.
    var needsNIO: Bool { mainWaits == "nio-wait" || kind == "hang-nio" }

    /// Kinds whose repeated runs measure the capture rate under the most stress.
    var isStressKind: Bool { kind == "concurrent-8" || kind.hasSuffix("stack-overflow") || mainWaits != nil }
}

enum HarnessMatrix {
    static func all() -> [HarnessCase] {
        swiftCases() + cCases() + chainCases() + preloadCases() + mainWaitCases() + hangCases()
    }

    /// Hangs a watch catches, each with every thread's stack: the hung thread must show the
    /// app's function that blocks.
    static func hangCases() -> [HarnessCase] {
        [
            // A SwiftNIO event loop blocked for 3 s by a handler's sleep (CrashCaptureNIO).
            HarnessCase(
                program: .swiftSample, kind: "hang-nio",
                expect: .init(
                    signal: nil,
                    hang: .init(function: "handleRequestBlockingInSleep", threadName: "NIO-ELT"))),
            // The C API's watch on a main loop whose handler sleeps, while four threads wait in
            // epoll_wait, nanosleep, poll and sigtimedwait: none of them may see EINTR.
            HarnessCase(
                program: .cSample, kind: "hang-sleep",
                expect: .init(
                    signal: nil,
                    hang: .init(function: "sample_handler_blocked_in_sleep", stdout: "eintr=0"))),
            // Two locks taken in opposite orders: named a deadlock; the process is then killed.
            HarnessCase(
                program: .cSample, kind: "hang-deadlock",
                expect: .init(
                    signal: SIGKILL,
                    hang: .init(function: "sample_deadlock_take_a_then_b", deadlock: true, ends: false))),
            // A thread waits for a task stuck on a continuation nobody resumes; killed.
            HarnessCase(
                program: .swiftSample, kind: "hang-continuation",
                expect: .init(signal: SIGKILL, hang: .init(function: "waitForTaskAnswer", ends: false))),
        ]
    }

    /// A crash on one thread while the main thread waits as real programs' main threads do.
    /// Every run: one report, with the main thread's stack, and death by the crash's signal.
    static func mainWaitCases() -> [HarnessCase] {
        let waits = ["sleep", "nanosleep", "pause", "poll", "epoll_wait", "select", "read", "sigwait", "futex", "join"]
        let mainThread = ["crash-sample-c": "sample_main_wait"]
        func c(_ wait: String, _ installer: HarnessCase.Installer, environment: [String: String] = [:]) -> HarnessCase {
            HarnessCase(
                program: .cSample, kind: "null-read", mainWaits: wait, installer: installer, environment: environment,
                expect: .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read", threads: mainThread))
        }
        var cases = waits.map { c($0, .own) }
        cases += ["sleep", "epoll_wait", "pause", "sigwait"].map { c($0, .preload) }
        cases += ["sleep", "epoll_wait"].map { c($0, .both) }
        // ptrace refused (a seccomp filter): the signal fallback must lose nothing either.
        cases += ["sleep", "epoll_wait", "poll"].map { c($0, .own, environment: ["CRASH_SAMPLE_DENY_PTRACE": "1"]) }
        let swiftMain = ["crash-sample-sw": "sample_main_wait"]
        for context in ["pthread", "dispatch", "thread", "task"] {
            for wait in ["sleep", "epoll_wait"] {
                // Every thread captured, the runtime's and Dispatch's (which block every signal) too.
                cases.append(
                    HarnessCase(
                        program: .swiftSample, kind: "swift-null-read", context: context, mainWaits: wait,
                        expect: .init(
                            signal: SIGSEGV, frame: "crashSwiftNullRead", threads: swiftMain, allCapturedOf: 3)))
            }
        }
        // A SwiftNIO server: the main thread waits on a future, the event loop in epoll_wait.
        cases.append(
            HarnessCase(
                program: .swiftSample, kind: "swift-null-read", context: "dispatch", mainWaits: "nio-wait",
                expect: .init(
                    signal: SIGSEGV, frame: "crashSwiftNullRead",
                    threads: ["crash-sample-sw": "EventLoopFuture", "nio-loop": "epoll_wait"], allCapturedOf: 4)))
        // The preload library and the Swift SDK in one process: one report.
        cases.append(
            HarnessCase(
                program: .swiftSample, kind: "swift-null-read", context: "pthread", mainWaits: "epoll_wait",
                installer: .both, expect: .init(signal: SIGSEGV, frame: "crashSwiftNullRead", threads: swiftMain)))
        // Four Dispatch workers parked in sleep: each in the report, with its stack.
        cases.append(
            HarnessCase(
                program: .swiftSample, kind: "swift-null-read", context: "thread", mainWaits: "sleep",
                environment: ["CRASH_SAMPLE_DISPATCH_WORKERS": "4"],
                expect: .init(signal: SIGSEGV, frame: "crashSwiftNullRead", threads: swiftMain, allCapturedOf: 6)))
        cases.append(
            HarnessCase(
                program: .swiftSample, kind: "swift-stack-overflow", context: "thread", mainWaits: "sleep",
                expect: .init(signal: SIGSEGV, frame: "crashSwiftRecursion", topFrames: 3, threads: swiftMain)))
        cases.append(
            HarnessCase(
                program: .swiftSample, kind: "swift-force-unwrap", context: "dispatch", mainWaits: "dispatchMain",
                expect: .init(signal: SIGILL, code: "ILL_ILLOPN", frame: "crashSwiftForceUnwrap")))
        // The Swift runtime's backtracer left as the runtime sets it (on), and chained to. With
        // the main thread in a join: the backtracer's own signals end a sleep or an epoll_wait,
        // and without us such a program exits 0 (seen); the harness compares with that run.
        for wait in ["join"] {
            cases.append(
                HarnessCase(
                    program: .swiftSample, kind: "swift-force-unwrap", context: "pthread", mainWaits: wait,
                    environment: ["SWIFT_BACKTRACE": "unset"],
                    expect: .init(
                        signal: SIGILL, code: "ILL_ILLOPN", frame: "crashSwiftForceUnwrap", threads: swiftMain)))
        }
        return cases
    }

    static func swiftCases() -> [HarnessCase] {
        func trap(_ kind: String, _ frame: String, message: String?, inRelease: Bool = false) -> HarnessCase {
            HarnessCase(
                program: .swiftSample, kind: kind,
                expect: .init(
                    signal: SIGILL, code: "ILL_ILLOPN", message: message, messageInRelease: inRelease, frame: frame))
        }
        var cases = [
            trap(
                "swift-fatal-error", "crashSwiftFatalError", message: "Fatal error: sample fatal error", inRelease: true
            ),
            trap("swift-force-unwrap", "crashSwiftForceUnwrap", message: "Unexpectedly found nil"),
            trap("swift-array-index", "crashSwiftArrayIndex", message: "Index out of range"),
            trap("swift-integer-overflow", "crashSwiftIntegerOverflow", message: nil),
            trap("swift-divide-by-zero", "crashSwiftDivideByZero", message: "Division by zero"),
            trap("swift-precondition", "crashSwiftPrecondition", message: "sample precondition"),
            trap("swift-try-bang", "crashSwiftTryBang", message: "'try!' expression unexpectedly raised an error"),
            HarnessCase(
                program: .swiftSample, kind: "swift-unowned",
                expect: .init(
                    signal: SIGABRT, message: "Attempted to read an unowned reference", frame: "crashSwiftUnowned",
                    topFrames: 12)),
            HarnessCase(
                program: .swiftSample, kind: "swift-null-read",
                expect: .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "crashSwiftNullRead")),
            HarnessCase(
                program: .swiftSample, kind: "swift-async-deep",
                expect: .init(
                    signal: SIGSEGV, code: "SEGV_MAPERR", frame: "crashSwiftNullRead",
                    asyncCallers: ["asyncLevel2", "asyncLevel1"], taskName: "checkout-flow")),
        ]
        for context in ["main", "pthread", "dispatch", "thread", "task"] {
            cases.append(
                HarnessCase(
                    program: .swiftSample, kind: "swift-stack-overflow", context: context,
                    expect: .init(signal: SIGSEGV, frame: "crashSwiftRecursion", topFrames: 3)))
        }
        for context in ["pthread", "dispatch", "thread", "task"] {
            cases.append(
                HarnessCase(
                    program: .swiftSample, kind: "swift-force-unwrap", context: context,
                    expect: .init(
                        signal: SIGILL, code: "ILL_ILLOPN", message: "Unexpectedly found nil",
                        frame: "crashSwiftForceUnwrap")))
            cases.append(
                HarnessCase(
                    program: .swiftSample, kind: "swift-null-read", context: context,
                    expect: .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "crashSwiftNullRead")))
        }
        // The Swift runtime's backtracer as the previous handler: its report must still print.
        cases.append(
            HarnessCase(
                program: .swiftSample, kind: "swift-force-unwrap",
                environment: ["SWIFT_BACKTRACE": "enable=yes,interactive=no"],
                expect: .init(
                    signal: SIGILL, message: "Unexpectedly found nil", frame: "crashSwiftForceUnwrap",
                    stderr: "Backtracing from")))
        cases.append(
            HarnessCase(
                program: .swiftSample, kind: "swift-null-read", context: "dispatch",
                environment: ["SWIFT_BACKTRACE": "enable=yes,interactive=no"],
                expect: .init(
                    signal: SIGSEGV, frame: "crashSwiftNullRead", stderr: "*** Program crashed: Bad pointer dereference"
                )))
        return cases
    }

    static func cCases() -> [HarnessCase] {
        func c(_ kind: String, _ expect: HarnessCase.Expectation, context: String = "main") -> HarnessCase {
            HarnessCase(program: .cSample, kind: kind, context: context, expect: expect)
        }
        return [
            c("null-read", .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read")),
            c("null-read", .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read"), context: "pthread"),
            c("null-write", .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_write")),
            c("wild-pointer", .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_wild_pointer")),
            c("noncanonical-pointer", .init(signal: SIGSEGV, code: "SI_KERNEL", frame: "sample_noncanonical_pointer")),
            c("write-readonly", .init(signal: SIGSEGV, code: "SEGV_ACCERR", frame: "sample_write_readonly")),
            c("jump-nonexec", .init(signal: SIGSEGV, code: "SEGV_ACCERR", frame: "sample_jump_nonexec", topFrames: 3)),
            c(
                "null-function",
                .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_function", topFrames: 3)),
            c("bus-truncated-mmap", .init(signal: SIGBUS, code: "BUS_ADRERR", frame: "sample_bus_truncated_mmap")),
            c("int-divide-by-zero", .init(signal: SIGFPE, code: "FPE_INTDIV", frame: "sample_int_divide_by_zero")),
            c("builtin-trap", .init(signal: SIGILL, code: "ILL_ILLOPN", frame: "sample_builtin_trap")),
            c("forbidden-syscall", .init(signal: SIGSYS, code: "SYS_SECCOMP", frame: "sample_forbidden_syscall")),
            c("abort", .init(signal: SIGABRT, code: "SI_TKILL", frame: "sample_abort")),
            c("abort", .init(signal: SIGABRT, code: "SI_TKILL", frame: "sample_abort"), context: "pthread"),
            c("assert", .init(signal: SIGABRT, code: "SI_TKILL", frame: "sample_assert_fail")),
            c(
                "cxx-runtime-error",
                .init(
                    signal: SIGABRT, exception: "St13runtime_error", exceptionWhat: "sample runtime_error",
                    frame: "sample_throw_runtime_error", topFrames: 14, stderr: "what():  sample runtime_error")),
            c(
                "cxx-non-std",
                .init(signal: SIGABRT, exception: "NotAnException", frame: "sample_throw_non_std", topFrames: 14)),
            c(
                "cxx-noexcept",
                .init(
                    signal: SIGABRT, exception: "St11logic_error", exceptionWhat: "thrown from noexcept",
                    frame: "throwing_inside_noexcept", topFrames: 14)),
            c("raise-segv", .init(signal: SIGSEGV, code: "SI_TKILL", frame: "sample_raise_segv")),
            c(
                "sigqueue-segv",
                .init(signal: SIGSEGV, code: "SI_QUEUE", frame: "sample_sigqueue_segv", sentValue: 4242)),
            c("pthread-kill", .init(signal: SIGSEGV, code: "SI_TKILL")),
            c("kill-from-outside", .init(signal: SIGSEGV, code: "SI_USER", sendSignal: SIGSEGV)),
            c("dlopen-library", .init(signal: SIGSEGV, code: "SEGV_MAPERR", library: "libz.so", topFrames: 1)),
            c("concurrent-8", .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read")),
            c("fork-child", .init(signal: nil, frame: "sample_null_read", fromChild: true)),
            c("stack-overflow", .init(signal: SIGSEGV, frame: "sample_recurse_forever", topFrames: 3)),
            c(
                "stack-overflow", .init(signal: SIGSEGV, frame: "sample_recurse_forever", topFrames: 3),
                context: "pthread"),
            c(
                "threads-parked",
                .init(
                    signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read",
                    threads: [
                        "park-futex": "sample_park_in_futex", "park-read": "sample_park_in_read",
                        "park-sleep": "sample_park_in_nanosleep", "park-poll": "sample_park_in_poll",
                    ])),
            c(
                "thread-blocks-signals",
                .init(
                    signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read",
                    threads: ["park-sleep": "sample_park_in_nanosleep", "blocker": "sample_block_everything"])),
            HarnessCase(
                program: .cSample, kind: "thread-blocks-signals", environment: ["CRASH_SAMPLE_DENY_PTRACE": "1"],
                expect: .init(
                    signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read",
                    threads: ["park-sleep": "sample_park_in_nanosleep"],
                    threadsNotCaptured: ["blocker": "blocks every signal"])),
            c(
                "threads-256",
                .init(
                    signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read",
                    threads: ["park-sleep": "sample_park_in_nanosleep"], allCapturedOf: 257)),
            c(
                "threads-churning",
                .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read", threads: ["churn": ""])),
            c(
                "malloc-other-thread",
                .init(
                    signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read",
                    threads: ["mallocer": "sample_malloc_forever"])),
            c(
                "concurrent-2",
                .init(
                    signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read", crashedToo: "sample_crash_together"
                )),
            c("heap-corrupt", .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read")),
            c("malloc-lock", .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read")),
            // On a thread of its own: libunwind has never run there, so nothing it keeps per
            // thread exists yet when the handler unwinds.
            c(
                "double-free",
                .init(signal: SIGABRT, code: "SI_TKILL", frame: "sample_double_free", topFrames: 10),
                context: "pthread"),
            c("loader-lock", .init(signal: SIGSEGV, frame: "sample_crash_in_phdr_callback")),
            HarnessCase(
                program: .cSample, kind: "null-read", environment: ["CRASH_SAMPLE_FAULT_IN_HANDLER": "1"],
                expect: .init(signal: SIGSEGV, code: "SEGV_MAPERR", topFrames: 1, handlerFaults: ["unwind"])),
        ]
    }

    static func chainCases() -> [HarnessCase] {
        [
            HarnessCase(
                program: .cSample, kind: "null-read", chain: "previous-siginfo",
                expect: .init(
                    signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read",
                    marker: "previous-siginfo signo=11 code=1 addr=(nil)")),
            HarnessCase(
                program: .cSample, kind: "abort", chain: "previous-plain",
                expect: .init(signal: SIGABRT, frame: "sample_abort", marker: "previous-plain signo=6")),
            HarnessCase(
                program: .cSample, kind: "null-read", chain: "ignore",
                expect: .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "sample_null_read")),
            HarnessCase(
                program: .cSample, kind: "raise-segv", chain: "ignore", expect: .init(signal: nil, report: false)),
            HarnessCase(
                program: .cSample, kind: "null-read", chain: "after-capture",
                expect: .init(signal: SIGSEGV, frame: "sample_null_read", marker: "after-capture signo=11")),
            HarnessCase(
                program: .swiftSample, kind: "swift-null-read", chain: "previous-siginfo",
                expect: .init(
                    signal: SIGSEGV, frame: "crashSwiftNullRead", marker: "previous-siginfo signo=11 code=1 addr=0x10")
            ),
        ]
    }

    static func preloadCases() -> [HarnessCase] {
        [
            HarnessCase(
                program: .python, kind: "ctypes-null-read",
                expect: .init(signal: SIGSEGV, code: "SEGV_MAPERR", library: "_ctypes", topFrames: 4)),
            HarnessCase(
                program: .plainC, kind: "null-write",
                expect: .init(signal: SIGSEGV, code: "SEGV_MAPERR", frame: "plain_program_crashes", topFrames: 2)),
        ]
    }
}
