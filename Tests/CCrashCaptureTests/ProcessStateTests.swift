import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The process as it was at the crash, and the memory around the fault, in the report.
@Suite struct ProcessStateTests {
    @Test func theReportHoldsTheProcessAndTheMemoryNearTheFault() throws {
        let directory = makeTemporaryDirectory("process-state")
        let crashed = try run(
            Paths.cSample, ["write-readonly", "--context", "main"],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(crashed.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        let process = report.process
        #expect(process["command_line"] as? [String] == [Paths.cSample, "write-readonly", "--context", "main"])
        #expect((process["rss_bytes"] as? NSNumber)?.intValue ?? 0 > 1 << 20)
        #expect(
            (process["peak_rss_bytes"] as? NSNumber)?.intValue ?? 0 >= (process["rss_bytes"] as? NSNumber)?.intValue
                ?? 0)
        #expect((process["threads"] as? NSNumber)?.intValue == 1)
        #expect((process["open_descriptors"] as? NSNumber)?.intValue ?? 0 >= 3)
        let uptime = try #require((process["uptime_ms"] as? NSNumber)?.intValue)
        #expect(uptime >= 0 && uptime < 60_000)
        let limits = try #require(process["limits"] as? [String: Any])
        #expect(Set(limits.keys) == ["stack", "core", "nofile", "as"])
        var nofile = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &nofile)
        #expect((limits["nofile"] as? NSNumber)?.uint64Value == UInt64(nofile.rlim_cur), "the child inherits ours")
        #expect(
            ["docker", "podman", "kubernetes", "container", "none"].contains(process["container"] as? String ?? ""))

        let registers = try #require(report.crashed?["crash"] as? [String: Any])["registers"] as? [String: String]
        let sp = try #require(registers?["sp"].flatMap { UInt64($0.dropFirst(2), radix: 16) })
        let pc = try #require(registers?["pc"].flatMap { UInt64($0.dropFirst(2), radix: 16) })
        let stack = try #require(report.memory.first { $0.what == "stack" })
        #expect(stack.address == sp && stack.bytes.count == 2048)
        let code = try #require(report.memory.first { $0.what == "pc" })
        #expect(code.address == pc - 128 && code.bytes.count == 256)
        // The faulting store's page: readable (PROT_READ), zero-filled; the address is its start.
        let fault = try #require(
            UInt64((report.properties["crash_fault_address"] as? String ?? "").dropFirst(2), radix: 16))
        let around = try #require(
            report.memory.first { $0.what == "fault_address" && $0.address + UInt64($0.bytes.count) > fault })
        let offset = Int(fault - around.address)
        #expect(around.bytes[offset..<min(offset + 64, around.bytes.count)].allSatisfy { $0 == 0 })

        let show = try run(Paths.crashcap, ["show", directory, "--no-color"])
        #expect(
            show.stdout.contains("process:") && show.stdout.contains("command:     \(Paths.cSample) write-readonly"))
        // The hex dumps only when asked for.
        #expect(!show.stdout.contains("fault_address (256 bytes):"))
        let memory = try run(Paths.crashcap, ["show", directory, "--no-color", "--memory"])
        #expect(memory.stdout.contains("\nmemory:") && memory.stdout.contains("fault_address (256 bytes):"))
    }

    /// Hundreds of descriptors, past the first table sizes, are all counted: the sample lists
    /// /proc/self/fd just before it crashes, and the handler may have closed only the few it
    /// keeps for itself.
    @Test func everyOpenDescriptorIsCounted() throws {
        let directory = makeTemporaryDirectory("process-descriptors")
        let crashed = try run(
            Paths.cSample, ["write-readonly"],
            environment: [
                "CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no", "CRASH_SAMPLE_OPEN_DESCRIPTORS": "700",
                // Past install's rest, which opens the crash and session files and the kept
                // ones: the sample's listing then holds them too.
                "CRASH_SAMPLE_INSTALLED": "1",
            ])
        #expect(crashed.signal == SIGSEGV)
        let listed = try #require(
            crashed.stdout.split(separator: "\n").compactMap { line in
                line.hasPrefix("open descriptors: ") ? Int(line.dropFirst("open descriptors: ".count)) : nil
            }.first)
        #expect(listed >= 703)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        let counted = try #require((report.process["open_descriptors"] as? NSNumber)?.intValue)
        #expect(counted <= listed && counted >= listed - 4, "listed \(listed) before the crash")
    }

    @Test func argumentsCanBeLeftOut() throws {
        let directory = makeTemporaryDirectory("process-no-arguments")
        let crashed = try run(
            "/usr/bin/python3", ["-c", "import ctypes; ctypes.string_at(0)  # secret-token"],
            environment: [
                "CRASHCAPTURE_DIR": directory, "LD_PRELOAD": Paths.preloadLibrary, "CRASHCAPTURE_ARGUMENTS": "0",
            ])
        #expect(crashed.signal == SIGSEGV)
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        #expect((report.process["command_line"] as? [String])?.count == 1)
        #expect(report.process["arguments_recorded"] as? Bool == false)
        let raw = try String(
            decoding: Data(contentsOf: URL(fileURLWithPath: try #require(crashFiles(in: directory).first))),
            as: UTF8.self)
        #expect(!raw.contains("secret-token"))
    }
}
