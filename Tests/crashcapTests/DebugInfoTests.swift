import CrashFileFormat
import CrashSymbolication
import Foundation
import Synchronization
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A release sample (`CrashSamples/Inline`, built -O2 with debug info) that crashes inside two
/// inlined functions, shipped stripped with its debug info elsewhere, crashed under the
/// preload library and named by `crashcap show --json`. Every frame of the sample must equal
/// what the toolchain's llvm-symbolizer says of the unstripped binary.
struct InlineSample: Sendable {
    enum Language: String, CaseIterable, Sendable {
        case c, cxx, swift
    }

    let language: Language
    /// Unstripped, with DWARF: the reference.
    let unstripped: String
    /// The same code under another build: other bytes, another build-id.
    let otherBuild: String
    let folder: String

    static let samples = Mutex<[Language: InlineSample]>([:])

    static func built(_ language: Language) throws -> InlineSample {
        try samples.withLock { cache in
            if let sample = cache[language] { return sample }
            let sample = try InlineSample(language: language)
            cache[language] = sample
            return sample
        }
    }

    private init(language: Language) throws {
        self.language = language
        folder = makeTemporaryDirectory("inline-\(language.rawValue)")
        unstripped = folder + "/original"
        otherBuild = folder + "/other-build"
        try Self.compile(language, output: unstripped, define: "FIRST")
        try Self.compile(language, output: otherBuild, define: "SECOND")
    }

    private static func compile(_ language: Language, output: String, define: String) throws {
        let source = Paths.packageRoot + "/CrashSamples/Inline/inline."
        let result: RunResult
        switch language {
        case .c:
            result = try run("/usr/bin/gcc", ["-O2", "-g", "-D\(define)", "-o", output, source + "c"])
        case .cxx:
            result = try run("/usr/bin/g++", ["-O2", "-g", "-D\(define)", "-o", output, source + "cpp"])
        case .swift:
            result = try run(swiftTool("swiftc"), ["-O", "-g", "-D", define, "-o", output, source + "swift"])
        }
        guard result.exitCode == 0 else { throw TestFailure("building \(language): \(result.stderr)") }
    }

    /// A tool of the Swift toolchain that runs these tests.
    static func swiftTool(_ name: String) -> String {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        for directory in path.split(separator: ":")
        where FileManager.default.isExecutableFile(atPath: "\(directory)/swiftc") {
            let resolved = URL(fileURLWithPath: "\(directory)/swiftc").resolvingSymlinksInPath()
                .deletingLastPathComponent()
            return resolved.path + "/" + name
        }
        return "/opt/swift/usr/bin/" + name
    }

    /// A copy of `binary` in `directory` without any symbol table or DWARF, and its debug
    /// info split off into `binary.debug` beside the copy (the caller moves it where it wants).
    static func strip(_ binary: String, into directory: String, name: String = "app", debuglink: Bool) throws -> (
        stripped: String, debug: String
    ) {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let stripped = directory + "/" + name
        let debug = directory + "/" + name + ".debug"
        for arguments in [
            ["--only-keep-debug", binary, debug],
            ["--strip-all", binary, stripped],
        ] {
            let result = try run("/usr/bin/objcopy", arguments)
            guard result.exitCode == 0 else { throw TestFailure("objcopy \(arguments): \(result.stderr)") }
        }
        if debuglink {
            let result = try run("/usr/bin/objcopy", ["--add-gnu-debuglink=\(debug)", stripped])
            guard result.exitCode == 0 else { throw TestFailure("debuglink: \(result.stderr)") }
        }
        chmod(stripped, 0o755)
        return (stripped, debug)
    }

    /// Runs `binary` under the preload library into a fresh capture directory: it must die of
    /// SIGSEGV with one valid report.
    static func crash(_ binary: String) throws -> (directory: String, report: CrashReport) {
        let directory = makeTemporaryDirectory("inline-crash")
        let result = try run(
            binary, [],
            environment: [
                "CRASHCAPTURE_DIR": directory, "LD_PRELOAD": Paths.preloadLibrary, "SWIFT_BACKTRACE": "enable=no",
            ])
        guard result.signal == SIGSEGV else { throw TestFailure("\(binary) ended \(result)") }
        return (directory, try verifiedReport(in: directory, signal: "SIGSEGV"))
    }
}

/// One function of an inline chain as the test compares it.
struct NamedPlace: Equatable, CustomStringConvertible {
    let function: String?
    let file: String?
    let line: Int?
    let column: Int?

    var description: String { "\(function ?? "?") at \(file ?? "?"):\(line ?? 0):\(column ?? 0)" }
}

/// `crashcap show --json` of one report: for each frame of the crashing thread, the module
/// and its inline chain, innermost first, by linkage name.
func shownChains(
    _ reportDirectory: String, arguments: [String] = [], environment: [String: String] = [:]
) throws -> [(module: String, offset: UInt64?, note: String?, chain: [NamedPlace])] {
    let shown = try run(
        Paths.crashcap, ["show", "--json"] + arguments + [reportDirectory], environment: environment, timeout: 120)
    guard shown.exitCode == 0 else { throw TestFailure("show failed: \(shown.stderr)") }
    let object = try #require(
        try JSONSerialization.jsonObject(with: Data(shown.stdout.utf8)) as? [String: Any])
    let frames = try #require(object["frames"] as? [[String: Any]])
    return frames.map { frame in
        var chain = ((frame["inlined"] as? [[String: Any]]) ?? []).map {
            NamedPlace(
                function: $0["linkage_name"] as? String, file: $0["file"] as? String, line: $0["line"] as? Int,
                column: $0["column"] as? Int)
        }
        chain.append(
            NamedPlace(
                function: frame["linkage_name"] as? String, file: frame["file"] as? String,
                line: frame["line"] as? Int, column: frame["column"] as? Int))
        let offset = (frame["offset"] as? String).flatMap { UInt64($0.dropFirst(2), radix: 16) }
        return (frame["module_name"] as? String ?? "?", offset, frame["note"] as? String, chain)
    }
}

/// llvm-symbolizer's inline chain for each address of `binary`, innermost first.
func llvmChains(_ binary: String, addresses: [UInt64]) throws -> [[NamedPlace]] {
    let result = try run(
        InlineSample.swiftTool("llvm-symbolizer"),
        ["--inlining", "--no-demangle", "--output-style=JSON", "--obj=\(binary)"]
            + addresses.map { "0x" + String($0, radix: 16) })
    guard result.exitCode == 0 else { throw TestFailure("llvm-symbolizer: \(result.stderr)") }
    let entries = try #require(try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [[String: Any]])
    return entries.map { entry in
        ((entry["Symbol"] as? [[String: Any]]) ?? []).map {
            NamedPlace(
                function: $0["FunctionName"] as? String,
                file: ($0["FileName"] as? String).flatMap { $0.isEmpty ? nil : $0 },
                line: ($0["Line"] as? Int).flatMap { $0 == 0 ? nil : $0 },
                column: ($0["Column"] as? Int).flatMap { $0 == 0 ? nil : $0 })
        }
    }
}

/// Every frame of the sample's own module in the shown report equals llvm-symbolizer on the
/// unstripped build, and the crash site's chain is the two inlined functions and their caller.
func expectMatchesLLVM(
    _ sample: InlineSample, reportDirectory: String, module: String, arguments: [String] = [],
    environment: [String: String] = [:], sourceLocation: SourceLocation = #_sourceLocation
) throws {
    let shown = try shownChains(reportDirectory, arguments: arguments, environment: environment)
    let ours = shown.enumerated().filter { $0.element.module == module }
    #expect(ours.count >= 2, "frames of \(module): \(shown.map(\.module))", sourceLocation: sourceLocation)
    let addresses = ours.map { index, frame in index == 0 ? frame.offset! : frame.offset! - 1 }
    let reference = try llvmChains(sample.unstripped, addresses: addresses)
    for ((index, frame), expected) in zip(ours, reference) {
        #expect(
            frame.chain == expected, "frame #\(index) (\(frame.note ?? "")): \(frame.chain) vs llvm \(expected)",
            sourceLocation: sourceLocation)
    }
    let top = try #require(ours.first, sourceLocation: sourceLocation)
    #expect(top.offset == 0, "the crash is in the sample, not below it", sourceLocation: sourceLocation)
    #expect(top.element.chain.count == 3, "inlined twice: \(top.element.chain)", sourceLocation: sourceLocation)
}

@Suite(.serialized) struct DebugInfoTests {
    static let languages = InlineSample.Language.allCases

    @Test(arguments: languages) func unstrippedBinaryMatchesLLVMSymbolizer(_ language: InlineSample.Language) throws {
        let sample = try InlineSample.built(language)
        let (directory, _) = try InlineSample.crash(sample.unstripped)
        try expectMatchesLLVM(sample, reportDirectory: directory, module: "original")
    }

    @Test(arguments: languages) func separateDebugFileFoundByDebuglink(_ language: InlineSample.Language) throws {
        let sample = try InlineSample.built(language)
        let install = makeTemporaryDirectory("debuglink")
        let (stripped, debug) = try InlineSample.strip(sample.unstripped, into: install, debuglink: true)
        // Where distributions put it: .debug/ beside the binary.
        try FileManager.default.createDirectory(atPath: install + "/.debug", withIntermediateDirectories: true)
        try FileManager.default.moveItem(atPath: debug, toPath: install + "/.debug/app.debug")
        let (directory, _) = try InlineSample.crash(stripped)
        try expectMatchesLLVM(sample, reportDirectory: directory, module: "app")
    }

    @Test(arguments: languages) func zlibCompressedDebugSections(_ language: InlineSample.Language) throws {
        let sample = try InlineSample.built(language)
        let install = makeTemporaryDirectory("compressed")
        let (stripped, debug) = try InlineSample.strip(sample.unstripped, into: install, debuglink: false)
        let compress = try run("/usr/bin/objcopy", ["--compress-debug-sections=zlib", debug])
        #expect(compress.exitCode == 0)
        let sections = try run("/usr/bin/readelf", ["-S", "-W", debug])
        #expect(sections.stdout.contains(" C "), "the sections are compressed")
        // The debuglink is added after compressing, so its CRC is the compressed file's.
        #expect(try run("/usr/bin/objcopy", ["--add-gnu-debuglink=\(debug)", stripped]).exitCode == 0)
        let (directory, _) = try InlineSample.crash(stripped)
        try expectMatchesLLVM(sample, reportDirectory: directory, module: "app")
    }

    /// The debug file a module's .gnu_debuglink names is a FIFO: `crashcap show` never opens it
    /// blocking, and shows the report without that debug info.
    @Test func aDebuglinkThatNamesAFIFOHangsNothing() throws {
        let sample = try InlineSample.built(.c)
        let install = makeTemporaryDirectory("debuglink-fifo")
        let (stripped, debug) = try InlineSample.strip(sample.unstripped, into: install, debuglink: true)
        let (directory, _) = try InlineSample.crash(stripped)
        try FileManager.default.removeItem(atPath: debug)
        #expect(mkfifo(debug, 0o600) == 0)
        let show = try run(Paths.crashcap, ["show", directory, "--no-color"], timeout: 20)
        #expect(!show.timedOut, "show waited on the FIFO")
        #expect(show.seconds < 5)
        #expect(show.stdout.contains("SIGSEGV"))
    }

    @Test func debuglinkWithTheWrongCRCIsNotUsed() throws {
        let sample = try InlineSample.built(.c)
        let install = makeTemporaryDirectory("badcrc")
        let (stripped, debug) = try InlineSample.strip(sample.unstripped, into: install, debuglink: true)
        // The debug info of another build under the linked name: never used to name frames.
        _ = try InlineSample.strip(sample.otherBuild, into: install + "/other", debuglink: false)
        try FileManager.default.removeItem(atPath: debug)
        try FileManager.default.moveItem(atPath: install + "/other/app.debug", toPath: debug)
        let (directory, _) = try InlineSample.crash(stripped)
        let shown = try shownChains(directory)
        let ours = shown.filter { $0.module == "app" }
        #expect(!ours.isEmpty)
        for frame in ours { #expect(frame.chain.allSatisfy { $0.file == nil }, "\(frame.chain)") }
    }

    @Test(arguments: languages) func debugFileAtTheStandardBuildIDPath(_ language: InlineSample.Language) throws {
        let sample = try InlineSample.built(language)
        let install = makeTemporaryDirectory("buildid")
        let (stripped, debug) = try InlineSample.strip(sample.unstripped, into: install, debuglink: false)
        let buildID = try #require(try ELFBuildID.read(stripped))
        // /usr/lib/debug is where Debian's -dbgsym packages put debug files; the test needs to
        // write there (CI runs as root).
        let folder = "/usr/lib/debug/.build-id/" + buildID.prefix(2)
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        let target = folder + "/" + buildID.dropFirst(2) + ".debug"
        try? FileManager.default.removeItem(atPath: target)
        try FileManager.default.copyItem(atPath: debug, toPath: target)
        defer { try? FileManager.default.removeItem(atPath: target) }
        try FileManager.default.removeItem(atPath: debug)
        let (directory, _) = try InlineSample.crash(stripped)
        try expectMatchesLLVM(sample, reportDirectory: directory, module: "app")
    }

    @Test(arguments: languages) func redeployedBinaryIsNamedFromTheSymbolStore(_ language: InlineSample.Language)
        throws
    {
        let sample = try InlineSample.built(language)
        let install = makeTemporaryDirectory("redeploy")
        let (stripped, debug) = try InlineSample.strip(sample.unstripped, into: install, debuglink: true)
        let store = makeTemporaryDirectory("store")
        let added = try run(Paths.crashcap, ["symbols", "add", "--store", store, stripped])
        #expect(added.exitCode == 0, "\(added.stderr)")
        #expect(added.stdout.contains("debug info from \(debug)"), "\(added.stdout)")
        let (directory, report) = try InlineSample.crash(stripped)
        // The next release replaces the binary (and its debug file) before the replay.
        try FileManager.default.removeItem(atPath: debug)
        try FileManager.default.removeItem(atPath: stripped)
        try FileManager.default.copyItem(atPath: sample.otherBuild, toPath: stripped)

        let unnamed = try shownChains(directory).filter { $0.module == "app" }
        #expect(!unnamed.isEmpty)
        for frame in unnamed {
            #expect(frame.chain == [NamedPlace(function: nil, file: nil, line: nil, column: nil)])
            #expect(frame.note?.contains("build-id mismatch") == true, "\(frame.note ?? "")")
            #expect(frame.note?.contains(report.modules.first { $0.path == stripped }?.buildID ?? "?") == true)
        }
        try expectMatchesLLVM(sample, reportDirectory: directory, module: "app", arguments: ["--symbols", store])
        try expectMatchesLLVM(
            sample, reportDirectory: directory, module: "app", environment: ["CRASHCAPTURE_SYMBOLS": store])
    }

    /// A 1 GiB binary (a real one, made long and sparse) is stored with memory flat, and one of
    /// 5 GiB is refused at once with a clear error.
    @Test func symbolsAddStreamsAndBoundsTheFileSize() throws {
        let store = makeTemporaryDirectory("store-large")
        let work = makeTemporaryDirectory("store-large-input")
        let large = work + "/large-true"
        try FileManager.default.copyItem(atPath: "/bin/true", toPath: large)
        #expect(truncate(large, 1 << 30) == 0)
        let (added, peak) = try runMeasuringMemory(Paths.crashcap, ["symbols", "add", "--store", store, large])
        #expect(added.exitCode == 0, "\(added.stderr)")
        #expect(peak < 64 << 20, "peak \(peak >> 20) MiB for a 1 GiB file")
        let huge = work + "/huge"
        try FileManager.default.copyItem(atPath: "/bin/true", toPath: huge)
        #expect(truncate(huge, 5 << 30) == 0)
        let (refused, hugePeak) = try runMeasuringMemory(Paths.crashcap, ["symbols", "add", "--store", store, huge])
        #expect(refused.exitCode == 65)
        #expect(refused.stderr.contains("larger than 4 GiB"), "\(refused.stderr)")
        #expect(hugePeak < 64 << 20)
        #expect(refused.seconds < 5)
    }

    /// Under umask 000 the store's folders are still 0700 and its files 0600.
    @Test func symbolsAddKeepsTheStorePrivateWhateverTheUmask() throws {
        let store = makeTemporaryDirectory("store-umask") + "/symbols"
        let added = try run(
            "/bin/sh", ["-c", "umask 000 && exec \"$0\" symbols add --store \"$1\" /bin/true", Paths.crashcap, store])
        #expect(added.exitCode == 0, "\(added.stderr)")
        var checked = 0
        for relative in try FileManager.default.subpathsOfDirectory(atPath: store) + [""] {
            var info = stat()
            #expect(lstat(store + "/" + relative, &info) == 0)
            let mode = info.st_mode & 0o777
            let directory = info.st_mode & S_IFMT == S_IFDIR
            #expect(mode == (directory ? 0o700 : 0o600), "\(relative): \(String(mode, radix: 8))")
            checked += 1
        }
        #expect(checked >= 4, "the store, .build-id, its xx folder and the binary")
    }

    @Test func symbolsAddRefusesWhatItCannotStore() throws {
        let store = makeTemporaryDirectory("store")
        let notELF = store + "/notes.txt"
        try Data("hello".utf8).write(to: URL(fileURLWithPath: notELF))
        let result = try run(Paths.crashcap, ["symbols", "add", "--store", store, notELF, "/nonexistent"])
        #expect(result.exitCode == 65)
        #expect(result.stderr.contains("not an ELF file"))
        #expect(result.stderr.contains("/nonexistent"))
        let unset = try run(Paths.crashcap, ["symbols", "add", "/bin/true"], environment: ["CRASHCAPTURE_SYMBOLS": ""])
        #expect(unset.exitCode == 64)
        #expect(unset.stderr.contains("--store"))
    }

    @Test(arguments: languages) func debugInfoFromDebuginfod(_ language: InlineSample.Language) throws {
        let sample = try InlineSample.built(language)
        let install = makeTemporaryDirectory("debuginfod")
        let (stripped, debug) = try InlineSample.strip(sample.unstripped, into: install, debuglink: false)
        let served = makeTemporaryDirectory("debuginfod-served")
        try FileManager.default.moveItem(atPath: debug, toPath: served + "/app.debug")
        let server = try DebuginfodServer(serving: served)
        defer { server.stop() }
        let buildID = try #require(try ELFBuildID.read(stripped))
        try server.waitUntilServing(buildID: buildID)
        let (directory, _) = try InlineSample.crash(stripped)
        let cache = makeTemporaryDirectory("debuginfod-cache")
        try expectMatchesLLVM(
            sample, reportDirectory: directory, module: "app",
            environment: ["DEBUGINFOD_URLS": server.url, "DEBUGINFOD_CACHE_PATH": cache])
        // Without the URL, nothing is fetched: the frames go unnamed rather than wait.
        let offline = try shownChains(directory, environment: ["DEBUGINFOD_URLS": ""])
        #expect(offline.filter { $0.module == "app" }.allSatisfy { $0.chain.allSatisfy { $0.file == nil } })
    }

    /// A debuginfod server that takes the connection and never answers: crashcap gives it
    /// 10 s (libdebuginfod's own default is 90 s), once per module, and shows the report.
    @Test func aSilentDebuginfodServerCostsTenSecondsOnce() throws {
        let sample = try InlineSample.built(.c)
        let install = makeTemporaryDirectory("debuginfod-silent")
        let (stripped, debug) = try InlineSample.strip(sample.unstripped, into: install, debuglink: false)
        try FileManager.default.removeItem(atPath: debug)
        let (directory, _) = try InlineSample.crash(stripped)
        let (listener, port) = loopbackSocket()
        defer { close(listener) }
        // The kernel completes connections into the backlog; nobody ever reads or answers.
        #expect(listen(listener, 64) == 0)
        let url = "http://127.0.0.1:\(port)"
        let start = Date()
        let shown = try shownChains(
            directory,
            environment: [
                "DEBUGINFOD_URLS": url, "DEBUGINFOD_RETRY_LIMIT": "0", "DEBUGINFOD_TIMEOUT": "",  // empty: unset
                "DEBUGINFOD_CACHE_PATH": makeTemporaryDirectory("debuginfod-silent-cache"),
            ])
        let seconds = Date().timeIntervalSince(start)
        #expect(seconds >= 9 && seconds < 40, "\(seconds) s")
        #expect(shown.filter { $0.module == "app" }.allSatisfy { $0.chain.allSatisfy { $0.file == nil } })
    }

    /// A server that timed out once is not asked again in the run. A report replayed where its
    /// module is not on the disk asked a silent server twice for it (the executable, then the
    /// debug info), a whole timeout each; now one timeout is the whole cost, whatever the number
    /// of lookups after it.
    @Test func aSilentDebuginfodServerCostsOneTimeoutARun() throws {
        let sample = try InlineSample.built(.c)
        let install = makeTemporaryDirectory("debuginfod-silent-once")
        let (stripped, debug) = try InlineSample.strip(sample.unstripped, into: install, debuglink: false)
        try FileManager.default.removeItem(atPath: debug)
        let (directory, _) = try InlineSample.crash(stripped)
        // Replayed elsewhere: the module is not on this disk either.
        try FileManager.default.removeItem(atPath: stripped)
        let (listener, port) = loopbackSocket()
        defer { close(listener) }
        #expect(listen(listener, 64) == 0)
        let start = Date()
        let replay = try run(
            Paths.crashcap, ["replay", directory],
            environment: [
                "DEBUGINFOD_URLS": "http://127.0.0.1:\(port)", "DEBUGINFOD_RETRY_LIMIT": "0", "DEBUGINFOD_TIMEOUT": "3",
                "DEBUGINFOD_CACHE_PATH": makeTemporaryDirectory("debuginfod-silent-once-cache"),
            ], timeout: 120)
        let seconds = Date().timeIntervalSince(start)
        #expect(replay.exitCode == 0, "\(replay.stdout)\(replay.stderr)")
        #expect(seconds >= 2.5 && seconds <= 5, "\(seconds) s: one timeout of 3 s, and 2 s at most besides")
    }

    @Test func miniDebugInfoNamesFunctionsOfAStrippedBinary() throws {
        let sample = try InlineSample.built(.c)
        let install = makeTemporaryDirectory("minidebuginfo")
        let (stripped, _) = try InlineSample.strip(sample.unstripped, into: install, debuglink: false)
        // Fedora's recipe: the function symbols that .dynsym lacks, in an xz-compressed ELF
        // file inside .gnu_debugdata.
        let script = """
            set -e
            cd '\(install)'
            nm -D '\(sample.unstripped)' --format=posix --defined-only | awk '{ print $1 }' | sort > dynsyms
            nm '\(sample.unstripped)' --format=posix --defined-only | awk '$2 == "T" || $2 == "t" { print $1 }' | sort > funcsyms
            comm -13 dynsyms funcsyms > keep
            objcopy --only-keep-debug --strip-debug --keep-symbols=keep '\(sample.unstripped)' mini
            xz -f mini
            objcopy --add-section .gnu_debugdata=mini.xz app
            """
        let built = try run("/bin/sh", ["-c", script])
        #expect(built.exitCode == 0, "\(built.stderr)")
        let (directory, _) = try InlineSample.crash(stripped)
        let shown = try shownChains(directory).filter { $0.module == "app" }
        #expect(shown.first?.chain.last?.function == "process", "\(shown.map(\.chain))")
        #expect(shown.dropFirst().first?.chain.last?.function == "main")
    }
}

enum ELFBuildID {
    static func read(_ path: String) throws -> String? {
        let notes = try run("/usr/bin/readelf", ["-n", path])
        guard let range = notes.stdout.range(of: "Build ID: ") else { return nil }
        return String(notes.stdout[range.upperBound...].prefix { $0.isHexDigit })
    }
}

/// Debian's debuginfod serving one folder on a loopback port, for one test.
final class DebuginfodServer {
    let child: Child
    let url: String
    let folder = makeTemporaryDirectory("debuginfod-db")

    init(serving directory: String) throws {
        // A free port: bind 0, read it, let go; debuginfod takes it a moment later.
        let (probe, port) = loopbackSocket()
        close(probe)
        url = "http://127.0.0.1:\(port)"
        child = try Child(
            "/usr/bin/debuginfod",
            ["-F", "-p", "\(port)", "-d", folder + "/index.sqlite", "-t", "1", "-g", "0", directory])
    }

    /// Until the server has scanned the folder and answers for the build-id.
    func waitUntilServing(buildID: String) throws {
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            let probe = try run(
                "/usr/bin/curl",
                ["-s", "-o", "/dev/null", "-w", "%{http_code}", "\(url)/buildid/\(buildID)/debuginfo"],
                timeout: 10)
            if probe.stdout == "200" { return }
            usleep(200_000)
        }
        throw TestFailure("debuginfod never served \(buildID): \(child.stderr)")
    }

    func stop() {
        kill(child.pid, SIGTERM)
        _ = child.waitOrKill(timeout: 10)
    }
}

/// Damaged binaries and debug files are the symbolicator's input as much as good ones: bytes
/// flipped anywhere past the program headers (sections, symbol tables, DWARF) give answers or
/// notes, never a crash or a hang. Seeded, so a failure replays.
@Suite struct HostileDebugInfoTests {
    @Test func flippedBytesInSymbolsAndDWARFNeverCrashTheSymbolicator() throws {
        let sample = try InlineSample.built(.c)
        let original = try [UInt8](Data(contentsOf: URL(fileURLWithPath: sample.unstripped)))
        let buildID = try #require(try ELFBuildID.read(sample.unstripped))
        let folder = makeTemporaryDirectory("hostile-elf")
        var generator = SplitMix(seed: 0x5eed)
        var named = 0
        for round in 0..<1000 {
            var bytes = original
            for _ in 0..<(1 + Int(generator.next() % 40)) {
                let position = bytes.count / 3 + Int(generator.next() % UInt64(bytes.count - bytes.count / 3))
                bytes[position] = UInt8(truncatingIfNeeded: generator.next())
            }
            let path = folder + "/app-\(round)"
            try Data(bytes).write(to: URL(fileURLWithPath: path))
            let symbolicator = Symbolicator()
            for offset in stride(from: UInt64(0x1000), to: 0x1400, by: 0x37) {
                let symbol = symbolicator.symbolicate(
                    modulePath: path, buildID: buildID, offset: offset, isReturnAddress: false)
                if symbol.function != nil { named += 1 }
            }
            unlink(path)
        }
        #expect(named > 0, "most damage leaves most functions readable")
    }
}

/// A small deterministic generator (SplitMix64).
struct SplitMix {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9e37_79b9_7f4a_7c15
        var value = state
        value = (value ^ (value >> 30)) &* 0xbf58_476d_1ce4_e5b9
        value = (value ^ (value >> 27)) &* 0x94d0_49bb_1331_11eb
        return value ^ (value >> 31)
    }
}

/// A TCP socket bound to a free port on 127.0.0.1, and the port.
func loopbackSocket() -> (descriptor: Int32, port: UInt16) {
    let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
            _ = bind(descriptor, $0, length)
            _ = getsockname(descriptor, $0, &length)
        }
    }
    return (descriptor, UInt16(bigEndian: address.sin_port))
}
