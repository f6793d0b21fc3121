import CrashFileFormat
import CrashSymbolication
import Foundation
import TestSupport
import Testing

@Suite struct ELFImageTests {
    @Test func readsBuildIDAndFunctionsOfTheSample() throws {
        let image = try ELFImage(path: Paths.cSample)
        let readelf = try run("/usr/bin/readelf", ["-n", Paths.cSample])
        let buildID = try #require(image.buildID)
        #expect(readelf.stdout.contains("Build ID: \(buildID)"))
        let symbol = try #require(image.symbols.first { $0.name == "sample_null_read" })
        #expect(image.symbol(containing: symbol.address + 2)?.symbol.name == "sample_null_read")
        #expect(image.hasFullSymbolTable)
    }

    @Test func strippedLibraryFallsBackToDynamicSymbols() throws {
        let image = try ELFImage(path: "/lib/x86_64-linux-gnu/libz.so.1")
        #expect(!image.hasFullSymbolTable)
        let crc = try #require(image.symbols.first { $0.name == "crc32" })
        #expect(image.symbol(containing: crc.address + 1)?.symbol.name == "crc32")
    }

    @Test func damagedFilesAreErrors() {
        #expect(throws: CrashCaptureError.self) { try ELFImage(path: "x", bytes: Array("not elf".utf8)) }
        var header = [UInt8](repeating: 0, count: 64)
        header[0...5] = [0x7f, 0x45, 0x4c, 0x46, 2, 1]
        header[0x28] = 0xff  // section headers far past the end
        header[0x3a] = 64
        header[0x3c] = 3
        #expect(throws: CrashCaptureError.self) { try ELFImage(path: "x", bytes: header) }
    }

    @Test func demanglesSwiftNames() {
        #expect(Demangler.demangle("$s4main3fooyyF") == "main.foo() -> ()")
        #expect(Demangler.demangle("sample_null_read") == "sample_null_read")
    }

    @Test func shortSwiftNamesAreTheBacktracersQualifiedByModule() {
        // MyApp.Parser.read(_:) -> Swift.Int, and a method of a stdlib type.
        #expect(Demangler.shortName("$s5MyApp6ParserV4readySiSiF") == "MyApp.Parser.read(_:)")
        #expect(Demangler.demangle("$s5MyApp6ParserV4readySiSiF") == "MyApp.Parser.read(Swift.Int) -> Swift.Int")
        #expect(Demangler.shortName("$sSa6appendyyxnF") == "Swift.Array.append(_:)")
        #expect(Demangler.shortName("sample_null_read") == "sample_null_read")
        #expect(Demangler.shortName("_ZN6ledger7balanceEi") == "ledger::balance(int)")
    }
}

@Suite struct DemanglerTests {
    @Test func demanglesCxxFunctionsAndTypes() {
        #expect(
            Demangler.demangle("_ZN12_GLOBAL__N_124throwing_inside_noexceptEv")
                == "(anonymous namespace)::throwing_inside_noexcept()")
        #expect(Demangler.demangleCxxType("St13runtime_error") == "std::runtime_error")
        #expect(
            Demangler.demangleCxxType("N12_GLOBAL__N_114NotAnExceptionE") == "(anonymous namespace)::NotAnException")
        #expect(Demangler.demangleCxxType("not a type at all") == "not a type at all")
    }
}

@Suite struct SourceLocationTests {
    /// The 1-based line of the first line of `file` containing `text`.
    func line(of text: String, in file: String) throws -> Int {
        let source = try String(contentsOfFile: Paths.packageRoot + "/" + file, encoding: .utf8)
        let lines = source.components(separatedBy: "\n")
        return try #require(lines.firstIndex { $0.contains(text) }) + 1
    }

    @Test func swiftFramesGetFileAndLineFromDWARF4() throws {
        let directory = makeTemporaryDirectory("dwarf-swift")
        _ = try run(
            Paths.swiftSample, ["swift-null-read"],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        let top = try #require(Symbolicator().symbolicate(report).first)
        #expect(top.function?.contains("crashSwiftNullRead") == true)
        #expect(top.function?.hasPrefix("crash_sample_swift.") == true, "module-qualified: \(top.function ?? "")")
        #expect(top.file?.hasSuffix("CrashSamples/Swift/main.swift") == true)
        #expect(
            top.line
                == (try line(of: "UnsafePointer<Int>(bitPattern: opaque(0x10))", in: "CrashSamples/Swift/main.swift")))
    }

    /// Our short Swift names and source positions are the Swift backtracer's own, for the same
    /// crash (the backtracer leaves the module out; we add it). Offsets are not compared: the
    /// backtracer counts a return address's from the call (pc - 1), we from the pc we show.
    @Test func swiftFramesReadAsTheSwiftBacktracerPrintsThem() throws {
        let backtraced = try run(
            Paths.swiftSample, ["swift-null-read"],
            environment: [
                "SWIFT_BACKTRACE": "enable=yes,interactive=no,color=no,threads=crashed,registers=none,images=none"
            ], timeout: 120)
        // "  1 [ra] 0x000055… runSwiftKind(_:) + 1409 in crash-sample-swift at /…/main.swift:172:33"
        let theirs = backtraced.stderr.split(separator: "\n").compactMap { line -> String? in
            guard let address = line.range(of: " 0x"), let module = line.range(of: " in crash-sample-swift at ")
            else { return nil }
            let function = line[address.upperBound..<module.lowerBound].drop { $0 != " " }.dropFirst()
            let name = function.range(of: " + ").map { function[..<$0.lowerBound] } ?? function
            return name + " at " + line[module.upperBound...]
        }
        #expect(theirs.count >= 3, "\(backtraced.stderr)")
        let directory = makeTemporaryDirectory("backtracer-names")
        _ = try run(
            Paths.swiftSample, ["swift-null-read"],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        let ours = Symbolicator().symbolicate(report).prefix(3).map {
            "\($0.function ?? "?") at \($0.source.location ?? "?")"
        }
        #expect(ours == theirs.prefix(3).map { "crash_sample_swift." + $0 })
    }

    @Test func cFramesGetFileAndLineFromDWARF5() throws {
        let directory = makeTemporaryDirectory("dwarf-c")
        _ = try run(Paths.cSample, ["null-write"], environment: ["CRASHCAPTURE_DIR": directory])
        let report = try verifiedReport(in: directory, signal: "SIGSEGV")
        let top = try #require(Symbolicator().symbolicate(report).first)
        #expect(top.function == "sample_null_write")
        #expect(top.file?.hasSuffix("CrashSamples/Support/support.c") == true)
        let write = try line(of: "NOINLINE void sample_null_write(void) {", in: "CrashSamples/Support/support.c") + 2
        #expect(top.line == write)
    }

    @Test func librariesWithoutDebugInfoStillGetNames() throws {
        let path = "/lib/x86_64-linux-gnu/libz.so.1"
        let image = try ELFImage(path: path)
        let crc = try #require(image.symbols.first { $0.name == "crc32" })
        let symbol = Symbolicator().symbolicate(
            modulePath: path, buildID: image.buildID ?? "", offset: crc.address + 3, isReturnAddress: false)
        #expect(symbol.function == "crc32")
        #expect(symbol.offsetInFunction == 3)
    }

    @Test func elfutilsIsLoaded() {
        #expect(Symbolicator.elfutilsUnavailable == nil)
    }
}
