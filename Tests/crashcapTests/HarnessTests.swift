import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The harness is the acceptance test: the whole matrix runs here, through the built binary.
@Suite struct HarnessTests {
    func harness(_ arguments: [String], timeout: Double = 600) throws -> (RunResult, Any?) {
        let result = try run(Paths.crashcap, ["harness"] + arguments, timeout: timeout)
        let json = try? JSONSerialization.jsonObject(with: Data(result.stdout.utf8))
        return (result, json)
    }

    func expectAllPassed(_ result: RunResult, _ json: Any?, minimumCases: Int) throws {
        let summary = try #require(json as? [String: Any], "no JSON: \(result.stdout.prefix(500)) \(result.stderr)")
        let cases = try #require(summary["cases"] as? [[String: Any]])
        #expect(cases.count >= minimumCases)
        for failed in cases where failed["passed"] as? Bool != true {
            Issue.record("\(failed["case"] ?? "?"): \(failed["failures"] ?? "?")")
        }
        #expect(result.exitCode == 0)
    }

    @Test func wholeMatrixPassesWithDebugSamples() throws {
        let (result, json) = try harness(["--json"])
        try expectAllPassed(result, json, minimumCases: 60)
        #expect((json as? [String: Any])?["build"] as? String == "debug")
    }

    @Test func wholeMatrixPassesWithReleaseSamples() throws {
        let release = Paths.packageRoot + "/.build/release"
        try #require(
            FileManager.default.fileExists(atPath: release + "/crash-sample-swift"),
            "no release samples: the README's test command builds them")
        let (result, json) = try harness(["--json", "--build-dir", release])
        try expectAllPassed(result, json, minimumCases: 60)
        #expect((json as? [String: Any])?["build"] as? String == "release")
    }

    @Test func repeatedStressRunsMissNothing() throws {
        // The eight classic stress kinds and a stack overflow while the main thread sleeps.
        let (result, json) = try harness([
            "--repeat", "10", "--json", "--filter", "concurrent-8", "--filter", "stack-overflow",
        ])
        let rows = try #require(json as? [[String: Any]], "\(result.stdout.prefix(300))")
        #expect(rows.count == 9, "\(rows.map { $0["case"] ?? "?" })")
        for row in rows {
            #expect(row["runs"] as? Int == 10)
            #expect(row["misses"] as? Int == 0, "\(row)")
        }
        #expect(result.exitCode == 0)
    }

    /// The wait that a crash reporter's signals end with EINTR, while another thread crashes:
    /// under the preload, the C API, both at once, ptrace refused, and in every Swift context.
    @Test func crashWhileMainWaitsInEpollIsNeverLost() throws {
        let (result, json) = try harness(["--repeat", "20", "--json", "--filter", "main-in-epoll_wait"])
        let rows = try #require(json as? [[String: Any]], "\(result.stdout.prefix(300))")
        #expect(rows.count >= 8, "\(rows.map { $0["case"] ?? "?" })")
        for row in rows {
            #expect(row["runs"] as? Int == 20)
            #expect(row["misses"] as? Int == 0, "\(row)")
        }
        #expect(result.exitCode == 0)
    }

    @Test func tableNamesEveryCaseAndCounts() throws {
        let (result, _) = try harness(["--filter", "c/abort", "--filter", "swift/swift-fatal-error"])
        #expect(result.exitCode == 0)
        #expect(result.stdout.contains("c/abort@pthread"))
        #expect(result.stdout.contains("swift/swift-fatal-error"))
        #expect(result.stdout.contains("SIGABRT → SIGABRT"))
        #expect(
            result.stdout.contains("4 passed, 0 failed"),
            "c/abort, c/abort@pthread, c/abort+previous-plain, swift/swift-fatal-error")
    }

    @Test func harnessFailsWhenCaptureIsBroken() throws {
        // Samples that never crash: every case must fail, with reasons, and the exit status say so.
        // Links to /bin/true, not scripts written here: exec'ing a file just written races with
        // children forked by other tests that inherit its open descriptor (ETXTBSY).
        let fake = makeTemporaryDirectory("fake")
        for name in ["crash-sample-swift", "crash-sample-c"] {
            try FileManager.default.createSymbolicLink(atPath: fake + "/" + name, withDestinationPath: "/bin/true")
        }
        let (result, json) = try harness(["--json", "--build-dir", fake, "--filter", "c/null-read", "--timeout", "10"])
        #expect(result.exitCode == 1)
        let cases = try #require((json as? [String: Any])?["cases"] as? [[String: Any]])
        #expect(!cases.isEmpty)
        for failed in cases {
            #expect(failed["passed"] as? Bool == false)
            let reasons = (failed["failures"] as? [String] ?? []).joined(separator: "; ")
            #expect(reasons.contains("ended by exit 0, expected SIGSEGV"), "\(reasons)")
        }
    }

    @Test func badArgumentsAreClearErrors() throws {
        let (noMatch, _) = try harness(["--filter", "no-such-case"])
        #expect(noMatch.exitCode == 64)
        #expect(noMatch.stderr.contains("no case matches"))
        let (badRepeat, _) = try harness(["--repeat", "0"])
        #expect(badRepeat.exitCode != 0)
        #expect(badRepeat.stderr.contains("--repeat must be at least 1"))
        let (missing, _) = try harness(["--build-dir", "/nonexistent"])
        #expect(missing.exitCode == 66)
        #expect(missing.stderr.contains("no crash-sample-swift in /nonexistent"))
    }

    @Test func listShowsTheMatrix() throws {
        let (result, _) = try harness(["--list"])
        let names = result.stdout.split(separator: "\n")
        #expect(names.count >= 60)
        #expect(Set(names).count == names.count, "case names are unique")
    }
}
