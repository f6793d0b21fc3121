import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The preload library captures crashes of programs nobody recompiled, without bringing the
/// Swift runtime into them. Scripts/build-preload.sh builds it (the test command runs it).
@Suite struct PreloadTests {
    func requireLibrary() throws {
        try #require(
            FileManager.default.fileExists(atPath: Paths.preloadLibrary),
            "run Scripts/build-preload.sh first (the README's test command does)")
    }

    @Test func libraryCarriesNoSwiftRuntime() throws {
        try requireLibrary()
        let result = try run("/usr/bin/readelf", ["-d", Paths.preloadLibrary])
        #expect(result.stdout.contains("libc.so.6"))
        #expect(!result.stdout.contains("swift"), "\(result.stdout)")
    }

    /// No thread-local storage of ours: a static TLS block is zeroed for every thread a
    /// program starts, and for its main thread at load, whether it ever tracks or crashes.
    /// A 64 KiB buffer there once cost every process under the library 16 page faults.
    @Test func libraryAddsNoThreadLocalStorage() throws {
        try requireLibrary()
        for library in [Paths.preloadLibrary, Paths.cLibraryDirectory + "/libcrashcapture.so"] {
            let sections = try run("/usr/bin/env", ["readelf", "-SW", library])
            #expect(sections.exitCode == 0, "\(sections.stderr)")
            #expect(sections.stdout.contains(".text"), "readelf read it")
            #expect(!sections.stdout.contains(".tbss") && !sections.stdout.contains(".tdata"), "\(library)")
        }
    }

    @Test func pythonNullReadUnderPreload() throws {
        try requireLibrary()
        let directory = makeTemporaryDirectory("python")
        let result = try run(
            "/usr/bin/env", ["python3", "-c", "import ctypes; ctypes.string_at(0)"],
            environment: ["LD_PRELOAD": Paths.preloadLibrary, "CRASHCAPTURE_DIR": directory])
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        let names = report.frames.prefix(4).compactMap { $0.module.map { report.modules[$0].path } }
        #expect(names.contains { $0.contains("_ctypes") }, "\(names)")
        #expect((report.properties["$app_name"] as? String)?.hasPrefix("python3") == true)
    }

    @Test func plainCProgramUnderPreload() throws {
        try requireLibrary()
        let work = makeTemporaryDirectory("plainc")
        let source = """
            #include <stdio.h>
            #include <stdlib.h>
            __attribute__((noinline)) void plain_program_crashes(volatile int *p) { *p = 42; }
            int main(int argc, char **argv) { (void)argv; puts("about to crash"); fflush(stdout);
                plain_program_crashes(argc > 5 ? malloc(4) : NULL); return 0; }
            """
        try source.write(toFile: work + "/plain.c", atomically: false, encoding: .utf8)
        let compile = try run("/usr/bin/cc", ["-O0", "-g", "-o", work + "/plain", work + "/plain.c"])
        try #require(compile.exitCode == 0, "\(compile.stderr)")
        let baseline = try run(work + "/plain")
        #expect(baseline.signal == SIGSEGV)
        let directory = work + "/crashes"
        let result = try run(
            work + "/plain",
            environment: [
                "LD_PRELOAD": Paths.preloadLibrary, "CRASHCAPTURE_DIR": directory, "CRASHCAPTURE_APP_VERSION": "7.1",
            ])
        #expect(result.signal == baseline.signal)
        #expect(result.stdout == "about to crash\n")
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(report.properties["$app_version"] as? String == "7.1")
        #expect(frameNames(report, count: 2).contains("plain_program_crashes"))
    }

    /// A crash in the first milliseconds, before the install's rest has run: the report is
    /// still whole (libunwind walks code built without frame pointers; the program's threads
    /// are listed, ours are not), and its file holds the report without the space reserved for
    /// a later crash.
    @Test func aCrashBeforeTheRestIsReportedWhole() throws {
        try requireLibrary()
        let work = makeTemporaryDirectory("early")
        let source = """
            #include <pthread.h>
            #include <unistd.h>
            static void *waits(void *unused) { pause(); return unused; }
            __attribute__((noinline)) void early_crash_here(volatile int *p) { *p = 42; }
            __attribute__((noinline)) void early_crash_caller(volatile int *p) { early_crash_here(p); early_crash_here(p + 1); }
            int main(int argc, char **argv) {
                (void)argv;
                pthread_t threads[2];
                for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, waits, NULL);
                early_crash_caller(argc > 5 ? (volatile int *)argv : 0);
                return 0;
            }
            """
        try source.write(toFile: work + "/early.c", atomically: false, encoding: .utf8)
        let compile = try run(
            "/usr/bin/cc", ["-O2", "-g", "-fomit-frame-pointer", "-o", work + "/early", work + "/early.c", "-lpthread"])
        try #require(compile.exitCode == 0, "\(compile.stderr)")
        let directory = work + "/crashes"
        let result = try run(
            work + "/early", environment: ["LD_PRELOAD": Paths.preloadLibrary, "CRASHCAPTURE_DIR": directory])
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        let names = frameNames(report, count: 4)
        #expect(names.starts(with: ["early_crash_here", "early_crash_caller", "main"]), "\(names)")
        #expect(report.threadsTotal == 3, "\(report.threads.map(\.name))")
        #expect(!report.threads.contains { $0.name.hasPrefix("cc-") }, "\(report.threads.map(\.name))")
        let size = try #require(try FileManager.default.attributesOfItem(atPath: report.path)[.size] as? Int)
        #expect(size < 256 * 1024, "\(size) bytes")
    }

    /// A small file-size limit (`ulimit -f`) never ends a program through our writes (SIGXFSZ,
    /// exit 153, once killed /bin/true at install): at 0 and at 4 KiB a program exits as it would,
    /// no temporary file is left, and a crash under 4 KiB, with no room for a report, is noted in
    /// the session file and replayed as a crash.
    @Test(arguments: [0, 4])
    func aSmallFileSizeLimitNeverEndsTheProgram(kilobytes: Int) throws {
        try requireLibrary()
        let work = makeTemporaryDirectory("fsize")
        let source = """
            #include <unistd.h>
            int main(int argc, char **argv) {
                (void)argv;
                usleep(80 * 1000);  // past the install's rest, which makes the files
                if (argc > 1) *(volatile int *)0 = 1;
                return 0;
            }
            """
        try source.write(toFile: work + "/waits.c", atomically: false, encoding: .utf8)
        let compile = try run("/usr/bin/cc", ["-O0", "-o", work + "/waits", work + "/waits.c"])
        try #require(compile.exitCode == 0, "\(compile.stderr)")
        for (name, program) in [("true", "/bin/true"), ("exit", work + "/waits"), ("crash", work + "/waits crash")] {
            let directory = work + "/crashes-" + name
            let result = try run(
                "/bin/sh", ["-c", "ulimit -f \(kilobytes); exec \(program)"],
                environment: ["LD_PRELOAD": Paths.preloadLibrary, "CRASHCAPTURE_DIR": directory])
            if name == "crash" {
                #expect(result.signal == SIGSEGV, "\(name): \(result.exitCode) \(result.stderr)")
            } else {
                #expect(result.exitCode == 0 && result.signal == nil, "\(name): \(result.exitCode) \(result.stderr)")
            }
            let left = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
            #expect(!left.contains { $0.hasPrefix(".") }, "\(name): a temporary file is left: \(left)")
            if name == "crash" && kilobytes > 0 {
                #expect(result.stderr.contains("noted in its session file"), "\(result.stderr)")
                let replay = try run(Paths.crashcap, ["replay", directory], timeout: 60)
                #expect(replay.exitCode == 0, "\(replay.stdout)\(replay.stderr)")
                let events = try storedEvents(in: directory)
                #expect(events.contains { $0["event"] as? String == "$AppCrashed" }, "\(events)")
            }
        }
    }

    /// A capture directory whose bytes are not UTF-8 is refused at install with a clear error
    /// (it would be named wrongly in every report), and nothing is made.
    @Test func aNonUTF8DirectoryIsRefused() throws {
        try requireLibrary()
        let base = makeTemporaryDirectory("non-utf8")
        let result = try run(
            "/bin/sh", ["-c", "CRASHCAPTURE_DIR=\"$1/crash$(printf '\\377')es\" exec /bin/true", "sh", base],
            environment: ["LD_PRELOAD": Paths.preloadLibrary])
        #expect(result.exitCode == 0)
        #expect(result.stderr.contains("not valid UTF-8"), "\(result.stderr)")
        #expect(result.stderr.contains("crash\\xffes"), "\(result.stderr)")
        #expect(try FileManager.default.contentsOfDirectory(atPath: base).isEmpty)
    }

    @Test func badDirectoryIsReportedAndTheProgramRunsOn() throws {
        try requireLibrary()
        let result = try run(
            "/bin/true", environment: ["LD_PRELOAD": Paths.preloadLibrary, "CRASHCAPTURE_DIR": "/proc/forbidden"])
        #expect(result.exitCode == 0)
        #expect(result.stderr.contains("crashcapture: not installed:"))
    }

    @Test func linkedCProgramUsesTheCAPI() throws {
        try requireLibrary()
        let work = makeTemporaryDirectory("capi")
        let source = """
            #include <crashcapture.h>
            #include <stdio.h>
            int main(int argc, char **argv) {
                crashcapture_property props[] = {{"build_flavor", "capi"}};
                crashcapture_config config = {.directory = argv[1], .app_name = "capi", .app_version = "2",
                                              .properties = props, .property_count = 1};
                if (crashcapture_install(&config) != 0) { puts(crashcapture_last_error()); return 3; }
                volatile int *volatile p = 0; return *p;
            }
            """
        try source.write(toFile: work + "/capi.c", atomically: false, encoding: .utf8)
        let compile = try run(
            "/usr/bin/cc",
            [
                "-o", work + "/capi", work + "/capi.c", "-I", Paths.packageRoot + "/Sources/CCrashCapture/include",
                "-L", Paths.cLibraryDirectory, "-Wl,-rpath," + Paths.cLibraryDirectory, "-lcrashcapture",
            ])
        try #require(compile.exitCode == 0, "\(compile.stderr)")
        let result = try run(work + "/capi", [work + "/crashes"])
        #expect(result.signal == SIGSEGV)
        let report = try verifiedReport(in: work + "/crashes", signal: "SIGSEGV")
        #expect(report.properties["build_flavor"] as? String == "capi")
    }
}
