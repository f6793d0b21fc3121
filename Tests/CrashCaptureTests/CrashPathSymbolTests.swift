import Foundation
import Testing

/// The crash path may call only async-signal-safe functions. This reads the undefined symbols
/// of the compiled crash_path.c and fails on anything outside the allowlist, so a future
/// printf or malloc in the handler fails CI instead of deadlocking a crashing process.
@Suite struct CrashPathSymbolTests {
    /// signal-safety(7), as far as the crash path uses it.
    static let signalSafe: Set<String> = [
        "abort", "clock_gettime", "fdatasync", "fsync", "getpid", "linkat", "lseek", "memcmp", "memcpy", "memmove",
        "memset", "nanosleep", "openat", "pthread_sigmask", "sigaction", "sigaddset", "sigdelset", "sigemptyset",
        "sigismember", "strlen", "write",
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
    ]

    func undefinedSymbols(ofObject path: String) throws -> Set<String> {
        let result = try run("/usr/bin/nm", ["-u", path])
        #expect(result.exitCode == 0, "nm failed: \(result.stderr)")
        return Set(result.stdout.split(separator: "\n").compactMap { $0.split(separator: " ").last.map(String.init) })
    }

    func check(_ symbols: Set<String>) {
        let forbidden = symbols.subtracting(Self.signalSafe).subtracting(Self.justified)
        #expect(
            forbidden.isEmpty, "the crash path calls functions that are not async-signal-safe: \(forbidden.sorted())")
        #expect(symbols.contains("fdatasync"), "the symbol list looks wrong: \(symbols.sorted())")
    }

    @Test func objectBuiltBySwiftPMUsesOnlyAllowedFunctions() throws {
        let object = Paths.buildDirectory + "/CCrashCapture.build/crash_path.c.o"
        try #require(FileManager.default.fileExists(atPath: object), "no object at \(object)")
        check(try undefinedSymbols(ofObject: object))
    }

    @Test(arguments: ["-O0", "-O2", "-Os"])
    func objectBuiltByTheCCompilerUsesOnlyAllowedFunctions(optimization: String) throws {
        let source = Paths.packageRoot + "/Sources/CCrashCapture"
        let object = makeTemporaryDirectory("symbols") + "/crash_path.o"
        let compile = try run(
            "/usr/bin/cc",
            [
                "-c", optimization, "-fstack-protector-strong", "-D_GNU_SOURCE", "-I", source + "/include", "-I",
                source,
                source + "/crash_path.c", "-o", object,
            ])
        try #require(compile.exitCode == 0, "cc failed: \(compile.stderr)")
        check(try undefinedSymbols(ofObject: object))
    }

    /// What creating a session's crash file adds in a forked child (session_file.c), where the
    /// same rules hold until exec: only system calls, each a single call into the kernel.
    static let forkChildExtras: Set<String> = [
        "close", "unlinkat",  // signal-safety(7)
        "getrandom", "flock",  // one system call each
        "posix_fallocate",  // fallocate(2); glibc's fallback only calls fstat, fstatfs and pwrite
    ]

    func definedSymbols(ofObject path: String) throws -> Set<String> {
        let result = try run("/usr/bin/nm", ["--defined-only", "-g", path])
        return Set(result.stdout.split(separator: "\n").compactMap { $0.split(separator: " ").last.map(String.init) })
    }

    @Test func forkChildSessionFileUsesOnlyAllowedFunctions() throws {
        let object = Paths.buildDirectory + "/CCrashCapture.build/session_file.c.o"
        let crashPath = Paths.buildDirectory + "/CCrashCapture.build/crash_path.c.o"
        try #require(FileManager.default.fileExists(atPath: object), "no object at \(object)")
        // The signal-safe formatting it shares with the crash path is allowed by construction.
        let ours = try definedSymbols(ofObject: crashPath)
        let symbols = try undefinedSymbols(ofObject: object)
        let forbidden = symbols.subtracting(Self.signalSafe).subtracting(Self.justified)
            .subtracting(Self.forkChildExtras).subtracting(ours)
        #expect(
            forbidden.isEmpty,
            "the forked-child path calls functions that are not async-signal-safe: \(forbidden.sorted())")
        #expect(symbols.contains("posix_fallocate"), "the symbol list looks wrong: \(symbols.sorted())")
    }

    @Test func allowlistRejectsAnUnsafeCall() {
        let forbidden = Set(["malloc", "printf", "write"]).subtracting(Self.signalSafe).subtracting(Self.justified)
        #expect(forbidden == ["malloc", "printf"])
    }
}
