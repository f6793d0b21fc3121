import CrashFileFormat
import Foundation
import ProcessSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Children start as a person's shell would start them, whatever the test thread's state.
@Suite struct ChildProcessTests {
    @Test func childStartsWithNoSignalBlockedEvenFromAThreadThatBlocksThem() throws {
        var blocked = sigset_t()
        sigfillset(&blocked)
        var previous = sigset_t()
        pthread_sigmask(SIG_BLOCK, &blocked, &previous)
        defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
        let outcome = try run("/bin/sh", ["-c", "grep -E '^Sig(Blk|Ign):' /proc/self/status"])
        #expect(outcome.exitCode == 0)
        #expect(outcome.stdout.contains("SigBlk:\t0000000000000000"), "\(outcome.stdout)")
        // The standard signals (1 to 31) are at their default action; glibc keeps two of its
        // own real-time signals (32, 33) set aside in every process, which is not ours to change.
        let ignored = outcome.stdout.split(separator: "\n").first { $0.hasPrefix("SigIgn:") }
            .flatMap { UInt64($0.dropFirst("SigIgn:".count).trimmingCharacters(in: .whitespaces), radix: 16) }
        #expect(ignored.map { $0 & 0x7FFF_FFFF } == 0, "\(outcome.stdout)")
    }

    @Test func outcomeSaysWhichSignalEndedTheChild() throws {
        let outcome = try run("/bin/sh", ["-c", "kill -SEGV $$"])
        #expect(outcome.signal == SIGSEGV)
        #expect(outcome.exitCode == nil)
    }

    @Test func hungChildIsKilledAtTheDeadline() throws {
        let outcome = try run("/bin/sleep", ["30"], timeout: 0.5)
        #expect(outcome.timedOut)
        #expect(outcome.seconds < 10)
    }

    @Test func missingProgramIsAClearError() {
        #expect {
            _ = try run("/nonexistent/program")
        } throws: { error in
            let failure = error as? CrashCaptureError
            return failure?.kind == .io && failure?.path == "/nonexistent/program"
        }
    }
}
