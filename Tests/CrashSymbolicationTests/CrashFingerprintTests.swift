import CrashFileFormat
import CrashSymbolication
import Testing

@Suite struct CrashFingerprintTests {
    typealias Symbol = Symbolicator.Symbol

    func frame(_ offset: UInt64) -> CrashReport.Frame {
        CrashReport.Frame(pc: 0x7000_0000 + offset, module: 0, offset: offset)
    }

    /// Offsets move with every rebuild and load address; named frames count by name only, and
    /// runtime frames not at all.
    @Test func namedFramesCountByNameAndRuntimeFramesNotAtAll() {
        let symbols = [
            Symbol(function: "raise", module: "libc.so.6"),
            Symbol(function: "abort", module: "libc.so.6"),
            Symbol(function: "MyApp.Parser.read(_:)", offsetInFunction: 12, module: "MyApp"),
            Symbol(function: "MyApp.main()", offsetInFunction: 40, module: "MyApp"),
        ]
        let moved = symbols.map { symbol -> Symbol in
            var symbol = symbol
            symbol.offsetInFunction = (symbol.offsetInFunction ?? 0) + 100
            return symbol
        }
        let first = CrashFingerprint.fingerprint(signal: "SIGABRT", symbols: symbols, frames: [1, 2, 3, 4].map(frame))
        let second = CrashFingerprint.fingerprint(signal: "SIGABRT", symbols: moved, frames: [9, 8, 7, 6].map(frame))
        #expect(first == second)
        #expect(
            CrashFingerprint.key(signal: "SIGABRT", symbols: symbols, frames: []) == [
                "SIGABRT", "MyApp!MyApp.Parser.read(_:)", "MyApp!MyApp.main()",
            ])
        #expect(
            CrashFingerprint.title(signal: "SIGABRT", symbols: symbols, frames: [])
                == "SIGABRT in MyApp.Parser.read(_:)")
        let otherSignal = CrashFingerprint.fingerprint(signal: "SIGSEGV", symbols: symbols, frames: [])
        #expect(otherSignal != first)
    }

    /// A debug build's index out of range traps in the standard library's specialized
    /// subscript, in libswiftSwiftOnoneSupport: the title names the app's function, as it does
    /// for every other toolchain library.
    @Test func theToolchainsSwiftLibrariesAreNeverTheApp() {
        let symbols = [
            Symbol(function: "Swift._assertionFailure(_:_:file:line:flags:)", module: "libswiftCore.so"),
            Symbol(function: "specialized Array.subscript.getter", module: "libswiftSwiftOnoneSupport.so"),
            Symbol(function: "Foundation.Data.init()", module: "libFoundationEssentials.so"),
            Symbol(function: "_CFRunLoopRun", module: "lib_FoundationICU.so"),
            Symbol(function: "MyApp.Parser.read(_:)", offsetInFunction: 12, module: "MyApp"),
        ]
        #expect(
            CrashFingerprint.title(signal: "SIGTRAP", symbols: symbols, frames: [])
                == "SIGTRAP in MyApp.Parser.read(_:)")
        for module in ["libswiftSwiftOnoneSupport.so", "libswiftDispatch.so", "libswiftSynchronization.so"] {
            #expect(CrashFingerprint.isSystemModule(module), "\(module)")
        }
        #expect(!CrashFingerprint.isSystemModule("MyApp"))
    }

    @Test func unnamedFramesCountByModuleAndOffset() {
        let symbols = [Symbol(module: "MyApp", note: "no symbol"), Symbol(module: "MyApp", note: "no symbol")]
        let a = CrashFingerprint.fingerprint(signal: "SIGSEGV", symbols: symbols, frames: [frame(0x10), frame(0x20)])
        let b = CrashFingerprint.fingerprint(signal: "SIGSEGV", symbols: symbols, frames: [frame(0x10), frame(0x30)])
        #expect(a != b)
        #expect(
            CrashFingerprint.title(signal: "SIGSEGV", symbols: symbols, frames: [frame(0x10)])
                == "SIGSEGV in MyApp+0x10")
    }
}
