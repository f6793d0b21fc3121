import CrashFileFormat
import Foundation
import ProcessSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `crashcap watch` as a sidecar: a crash reaches the collector without the app starting
/// again, even when the collector restarts in the middle, and SIGTERM stops it cleanly.
@Suite struct WatchTests {
    func waitFor(_ condition: () throws -> Bool, seconds: Double) rethrows -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if try condition() { return true }
            usleep(50_000)
        }
        return try condition()
    }

    @Test func aCrashIsDeliveredWhileTheCollectorRestarts() throws {
        let directory = makeTemporaryDirectory("watch")
        var first: CollectorProcess? = try CollectorProcess()
        let url = first!.url
        let port = String(first!.base.split(separator: ":").last!)
        let watch = try Child(Paths.crashcap, ["watch", directory, "--upload", url])
        #expect(watch.waitForOutput("watching"))
        // A crash delivered at once while the collector is up.
        let crashed = try run(
            Paths.cSample, ["null-read"], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(crashed.signal == SIGSEGV, "exit \(crashed.exitCode ?? -1): \(crashed.stderr)")
        #expect(
            try waitFor({ try first!.events().contains { $0["event"] as? String == "$AppCrashed" } }, seconds: 10),
            "\(watch.stdout)")
        // The collector goes away; a second crash waits in the store, retried with backoff.
        first = nil
        let again = try run(
            Paths.cSample, ["abort"], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(again.signal == SIGABRT, "exit \(again.exitCode ?? -1): \(again.stderr)")
        #expect(
            waitFor({ watch.stdout.components(separatedBy: "crash file imported").count == 3 }, seconds: 10),
            "imported while the collector is down: \(watch.stdout)")
        usleep(1_500_000)
        let second = try CollectorProcess(["--port", port])
        #expect(
            try waitFor(
                {
                    try second.events().contains {
                        ($0["properties"] as? [String: Any])?["crash_signal_name"] as? String == "SIGABRT"
                    }
                },
                seconds: 20),
            "\(watch.stdout) \(watch.stderr)")
        #expect(crashFiles(in: directory).isEmpty, "both crash files imported")
        kill(watch.pid, SIGTERM)
        #expect(watch.wait(timeout: 10))
        #expect(watch.exitCode == 0)
        #expect(watch.stdout.hasSuffix("stopped\n"), "\(watch.stdout)")
    }

    /// The watch wakes the moment a session file appears: the app installing it must never
    /// find its own session file taken (it was created, then locked: in between, a replay could
    /// lock it first and install failed).
    @Test func processesStartingUnderTheWatchAllInstall() throws {
        let directory = makeTemporaryDirectory("watch-race")
        let watch = try Child(Paths.crashcap, ["watch", directory])
        #expect(watch.waitForOutput("watching"))
        for _ in 0..<20 {
            let crashed = try run(
                Paths.cSample, ["null-read"],
                environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
            #expect(crashed.signal == SIGSEGV, "exit \(crashed.exitCode ?? -1): \(crashed.stderr)")
        }
        #expect(
            waitFor({ crashFiles(in: directory).isEmpty && !watch.stdout.contains("alive") }, seconds: 20),
            "every crash imported: \(crashFiles(in: directory)) \(watch.stdout)")
        kill(watch.pid, SIGTERM)
        #expect(watch.wait(timeout: 10) && watch.exitCode == 0)
        #expect(
            try FileManager.default.contentsOfDirectory(atPath: directory).allSatisfy { !$0.hasPrefix(".session-") })
    }
}
