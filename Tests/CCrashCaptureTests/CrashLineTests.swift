import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The one line on stderr at a crash: what container logs keep when the capture directory is
/// lost. It must say what happened and where the report is, be switchable off, and never
/// hang the handler.
@Suite struct CrashLineTests {
    @Test func theLineNamesTheSignalTheThreadTheTopFrameAndTheReport() throws {
        let directory = makeTemporaryDirectory("crash-line")
        let crashed = try run(
            Paths.cSample, ["null-read"], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(crashed.signal == SIGSEGV)
        let file = try #require(crashFiles(in: directory).first)
        let line = try #require(crashed.stderr.split(separator: "\n").first { $0.hasPrefix("crashcapture: ") })
        #expect(line.hasPrefix("crashcapture: SIGSEGV (SEGV_MAPERR) at 0x0 in thread "), "\(line)")
        #expect(line.contains("\"crash-sample-c\" at crash-sample-c+0x"), "\(line)")
        #expect(line.hasSuffix("; report " + file), "\(line)")
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect(line.contains("in thread \(report.properties["crash_tid"] ?? "?") "))
    }

    /// A directory or thread name with ESC or a newline is escaped (\xNN) on the line: raw, it
    /// would drive the terminal that shows the log, or forge a second log line.
    @Test func controlCharactersInNamesAreEscaped() throws {
        let directory = makeTemporaryDirectory("crash-line-escape") + "/cr\u{1b}[31m\nash"
        let script = """
            import ctypes
            ctypes.CDLL(None).prctl(15, b"th\\x1b[2Jr\\nead", 0, 0, 0)
            ctypes.string_at(0)
            """
        let crashed = try run(
            "/usr/bin/python3", ["-c", script],
            environment: ["CRASHCAPTURE_DIR": directory, "LD_PRELOAD": Paths.preloadLibrary])
        #expect(crashed.signal == SIGSEGV)
        let lines = crashed.stderr.split(separator: "\n", omittingEmptySubsequences: false)
        let line = try #require(lines.first { $0.hasPrefix("crashcapture: ") }, "\(crashed.stderr)")
        #expect(!crashed.stderr.contains("\u{1b}"), "\(crashed.stderr)")
        #expect(line.contains("\"th\\x1b[2Jr\\x0aead\""), "\(line)")
        #expect(line.contains("cr\\x1b[31m\\x0aash"), "\(line)")
    }

    @Test func theLineCanBeTurnedOff() throws {
        let directory = makeTemporaryDirectory("crash-line-off")
        let crashed = try run(
            "/usr/bin/python3", ["-c", "import ctypes; ctypes.string_at(0)"],
            environment: [
                "CRASHCAPTURE_DIR": directory, "LD_PRELOAD": Paths.preloadLibrary, "CRASHCAPTURE_CRASH_LINE": "0",
            ])
        #expect(crashed.signal == SIGSEGV)
        #expect(!crashed.stderr.contains("crashcapture:"), "\(crashed.stderr)")
        _ = try verifiedReport(in: directory, signal: "SIGSEGV")
    }

    /// stderr a pipe that is full and that nobody reads: the line is left out, nothing waits.
    @Test func aFullStderrPipeHangsNothing() throws {
        let directory = makeTemporaryDirectory("crash-line-full")
        let script = """
            import fcntl, os, subprocess, sys
            read_end, write_end = os.pipe()
            fcntl.fcntl(write_end, fcntl.F_SETFL, os.O_NONBLOCK)
            try:
                while True: os.write(write_end, b"x" * 4096)
            except BlockingIOError:
                pass
            fcntl.fcntl(write_end, fcntl.F_SETFL, 0)
            child = subprocess.Popen([sys.argv[1], "null-read"], stderr=write_end)
            try:
                print(child.wait(timeout=20))
            except subprocess.TimeoutExpired:
                child.kill()
                print("hung")
            """
        let result = try run(
            "/usr/bin/python3", ["-c", script, Paths.cSample],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"], timeout: 40)
        #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "-\(SIGSEGV)", "\(result.stdout)")
        _ = try verifiedReport(in: directory, signal: "SIGSEGV")
    }
}
