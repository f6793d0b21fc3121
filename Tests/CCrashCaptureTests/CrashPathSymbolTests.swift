import Foundation
import TestSupport
import Testing

/// Everything in `Sources/CCrashCapture/signal_safe/` runs after a signal arrives or in a
/// forked child, so it may call only async-signal-safe functions. This reads the undefined
/// symbols of every object built from that folder (found by folder, so a new file is checked
/// without anyone listing it) and fails on anything outside the allowlist: a future printf or
/// malloc in the handler fails CI instead of deadlocking a crashing process.
@Suite struct CrashPathSymbolTests {
    /// signal-safety(7), as far as the folder uses it.
    static let signalSafe: Set<String> = [
        "abort", "clock_gettime", "close", "fdatasync", "fstat", "fsync", "ftruncate", "getpid", "linkat", "lseek",
        "memcmp",
        "memcpy",
        "memmove", "mkdir", "memset", "nanosleep", "openat", "poll", "pthread_sigmask", "raise", "read", "sigaction",
        "sigaddset",
        "sigdelset",
        "sigemptyset", "sigismember", "signal", "strlen", "unlinkat", "write",
        "readlink", "fstatat",
    ]
    /// Not in the list, and why each is still safe here.
    static let justified: Set<String> = [
        "__errno_location",  // how glibc reaches errno, which a handler must save and restore
        "__sigsetjmp", "siglongjmp",  // the stage guard: jumping out of a nested fault in our own handler
        "syscall",  // gettid, tgkill, rt_tgsigqueueinfo: raw system calls, no library state
        "prctl",  // PR_GET_NAME: one system call
        "__stack_chk_fail",  // stack protector builds: aborts, which is signal-safe
        "_r_debug",  // data: the loader's public module list, read without locks
        "cc_global",  // data: our own state, prepared at install
        "getrandom", "flock",  // the forked child's new crash file: one system call each
        "posix_fallocate",  // fallocate(2); glibc's fallback only calls fstat, fstatfs and pwrite
        "getrlimit", "setrlimit",  // prlimit64(2): the file-size limit lifted for the report's writes
        // clone(2) for the helper that freezes the other threads with ptrace: glibc's wrapper is
        // the system call and a jump to the helper's function on the stack given, nothing more.
        "clone",
    ]

    static var folder: String { Paths.packageRoot + "/Sources/CCrashCapture/signal_safe" }

    /// The C files of the folder, by name; at least the crash path and the session file.
    static func sources() throws -> [String] {
        let names = try FileManager.default.contentsOfDirectory(atPath: folder).filter { $0.hasSuffix(".c") }.sorted()
        return names
    }

    func symbols(_ arguments: [String], ofObject path: String) throws -> Set<String> {
        let result = try run("/usr/bin/nm", arguments + [path])
        #expect(result.exitCode == 0, "nm failed: \(result.stderr)")
        return Set(result.stdout.split(separator: "\n").compactMap { $0.split(separator: " ").last.map(String.init) })
    }

    /// Fails on any call out of the folder's objects that is not on the allowlist; what one
    /// object of the folder defines, another may call.
    func check(objects: [String]) throws {
        var defined: Set<String> = []
        var undefined: [String: Set<String>] = [:]
        for object in objects {
            defined.formUnion(try symbols(["--defined-only", "-g"], ofObject: object))
            undefined[object] = try symbols(["-u"], ofObject: object)
        }
        for (object, symbols) in undefined {
            let forbidden = symbols.subtracting(Self.signalSafe).subtracting(Self.justified).subtracting(defined)
            #expect(
                forbidden.isEmpty,
                "\(object) calls functions that are not async-signal-safe: \(forbidden.sorted())")
        }
        let all = undefined.values.reduce(into: Set<String>()) { $0.formUnion($1) }
        #expect(all.contains("fdatasync") && all.contains("sigaction"), "the symbol list looks wrong: \(all.sorted())")
    }

    @Test func folderHoldsTheSignalSideOfEveryHandler() throws {
        let names = try Self.sources()
        for expected in [
            "crash_path.c", "encoding.c", "stack_walk.c", "report_events.c", "report_file.c", "session_file.c",
            "termination_signal.c", "thread_capture.c", "thread_freeze.c",
        ] {
            #expect(names.contains(expected), "\(expected) is not in signal_safe/: \(names)")
        }
    }

    @Test func objectsBuiltBySwiftPMUseOnlyAllowedFunctions() throws {
        let objects = try Self.sources().map { Paths.buildDirectory + "/CCrashCapture.build/signal_safe/\($0).o" }
        for object in objects {
            try #require(FileManager.default.fileExists(atPath: object), "no object at \(object)")
        }
        try check(objects: objects)
    }

    @Test(arguments: ["-O0", "-O2", "-Os"])
    func objectsBuiltByTheCCompilerUseOnlyAllowedFunctions(optimization: String) throws {
        let target = Paths.packageRoot + "/Sources/CCrashCapture"
        let output = makeTemporaryDirectory("symbols")
        var objects: [String] = []
        for name in try Self.sources() {
            let object = output + "/" + name + ".o"
            let compile = try run(
                "/usr/bin/cc",
                [
                    "-c", optimization, "-fstack-protector-strong", "-D_GNU_SOURCE", "-I", target + "/include", "-I",
                    Paths.packageRoot + "/Sources/CCrashFileFormat/include", "-I", target, Self.folder + "/" + name,
                    "-o", object,
                ])
            try #require(compile.exitCode == 0, "cc failed: \(compile.stderr)")
            objects.append(object)
        }
        try check(objects: objects)
    }

    @Test func allowlistRejectsAnUnsafeCall() {
        let forbidden = Set(["malloc", "printf", "write"]).subtracting(Self.signalSafe).subtracting(Self.justified)
        #expect(forbidden == ["malloc", "printf"])
    }

    /// A call from the handler into install-time code (which may lock or allocate) is caught:
    /// install/ defines it, not signal_safe/, so it is not allowed by being ours.
    @Test func callIntoInstallTimeCodeIsRejected() throws {
        let output = makeTemporaryDirectory("symbols-negative")
        let source = output + "/bad.c"
        try "int crashcapture_install(void *); void cc_bad(void) { crashcapture_install(0); }".write(
            toFile: source, atomically: false, encoding: .utf8)
        let compile = try run("/usr/bin/cc", ["-c", source, "-o", output + "/bad.o"])
        try #require(compile.exitCode == 0, "cc failed: \(compile.stderr)")
        let symbols = try symbols(["-u"], ofObject: output + "/bad.o")
        #expect(symbols.subtracting(Self.signalSafe).subtracting(Self.justified) == ["crashcapture_install"])
    }
}
