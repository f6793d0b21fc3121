import CrashFileFormat
import Testing

@testable import CrashSymbolication

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
        #expect(CrashFingerprint.version == 2, "a new rule is a new version: groups made by the old one are told apart")
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

    typealias Source = Symbolicator.SourceFrame

    func source(_ function: String, linkage: String? = nil, file: String? = nil, line: Int? = nil) -> Source {
        Source(function: function, linkageName: linkage, file: file, line: line, column: nil)
    }

    /// A release build's index out of range: one frame of the app's function with the standard
    /// library inlined into it, its reason only in the pseudo-frame's name; the task's callers
    /// after it. The title names the reason and the app's function; the inlined standard
    /// library, the executor thread and the thunks are not the app's.
    @Test func aReleaseTrapIsNamedByItsReasonAndTheAppsFunction() {
        let app = "/src/Sources/Shop/main.swift"
        let trap = Symbol(
            function: "Shop.priceOrder(_:)", linkageName: "$s13server_sample10priceOrderySiAA0D0VYaKFTY5_", offsetInFunction: 87,
            module: "shop", file: app, line: 114,
            inlined: [
                source("Swift runtime failure: Index out of range", file: "<compiler-generated>", line: 0),
                source(
                    "specialized Array.subscript.getter", linkage: "$sSayxSicigSi_Tg5", file: "<compiler-generated>"),
                source(
                    "Shop.priceOfItem(_:at:)", linkage: "$s13server_sample11priceOfItem_2atSiSaySiG_SitF", file: app, line: 98),
            ])
        let executor = [
            Symbol(
                function: "swift::runJobInEstablishedExecutorContext(swift::Job*)",
                linkageName: "_ZN5swift34runJobInEstablishedExecutorContextEPNS_3JobE", module: "shop"),
            Symbol(function: "swift_job_run", linkageName: "swift_job_run", module: "shop"),
            Symbol(function: "_dispatch_worker_thread", linkageName: "_dispatch_worker_thread", module: "shop"),
            Symbol(
                function: "Shop.threadEntry()", linkageName: "$s13server_sample11threadEntryyyF", module: "shop", file: app,
                line: 3),
        ]
        let callers = [
            Symbol(
                function: "Shop.handleCheckout(_:)", linkageName: "$s13server_sample14handleCheckoutyS2SYaKFTQ2_", module: "shop",
                file: app, line: 120),
            Symbol(
                function: "protocol witness for Responder.respond(to:)",
                linkageName:
                    "$s13server_sample17CallbackResponderVyxGAA13HTTPResponderA2aEP7respond2to7contextAA8ResponseVAA7RequestV_7ContextQztYaKFTWTQ0_",
                module: "shop"),
        ]
        let summary = CrashFingerprint.summary(
            signal: "SIGILL", symbols: [trap] + executor, frames: [], asyncSymbols: callers)
        #expect(summary.title == "Index out of range in Shop.priceOfItem(_:at:)")
        #expect(summary.reason == "Index out of range")
        #expect(
            CrashFingerprint.key(signal: "SIGILL", symbols: [trap] + executor, frames: [], asyncSymbols: callers) == [
                "SIGILL", "shop!priceOfItem(_:at:)", "shop!priceOrder(_:)", "shop!handleCheckout(_:)",
            ])
        #expect(trap.roles == [.system, .system, .app, .app])
        #expect(executor.map(\.role) == [.system, .system, .system, .app])
        #expect(callers.map(\.role) == [.app, .thunk])
    }

    /// A debug build of the same bug: the message names the reason, the functions are frames of
    /// their own and the resume parts have other suffixes; the group is the same.
    @Test func aDebugAndAReleaseBuildOfOneBugAreOneGroup() {
        let app = "/src/Sources/Shop/main.swift"
        let release = [
            Symbol(
                function: "Shop.priceOrder(_:)", linkageName: "$s13server_sample10priceOrderySiAA0D0VYaKFTY5_", module: "shop",
                file: app, line: 114,
                inlined: [
                    source(
                        "Shop.priceOfItem(_:at:)", linkage: "$s13server_sample11priceOfItem_2atSiSaySiG_SitF", file: app, line: 98
                    )
                ])
        ]
        let debug = [
            Symbol(function: "Swift._assertionFailure(_:_:file:line:flags:)", module: "libswiftCore.so"),
            Symbol(
                function: "Shop.priceOfItem(_:at:)", linkageName: "$s13server_sample11priceOfItem_2atSiSaySiG_SitF",
                module: "shop", file: app, line: 98),
        ]
        let debugCallers = [
            Symbol(
                function: "Shop.priceOrder(_:)", linkageName: "$s13server_sample10priceOrderySiAA0D0VYaKFTQ2_", module: "shop",
                file: app, line: 114)
        ]
        let fromRelease = CrashFingerprint.summary(signal: "SIGILL", symbols: release, frames: [])
        let fromDebug = CrashFingerprint.summary(
            signal: "SIGILL", swiftMessage: "Swift/ContiguousArrayBuffer.swift:692: Fatal error: Index out of range",
            symbols: debug, frames: [], asyncSymbols: debugCallers)
        #expect(fromRelease.fingerprint == fromDebug.fingerprint)
        #expect(fromDebug.title == "Index out of range in Shop.priceOfItem(_:at:)")
        #expect(fromDebug.reason == "Index out of range")
    }

    @Test func theReasonComesFromTheMessageWithoutItsPlace() {
        #expect(
            CrashFingerprint.reason(
                swiftMessage:
                    "Shop/main.swift:35: Fatal error: Unexpectedly found nil while unwrapping an Optional value\n",
                symbols: []) == "Unexpectedly found nil while unwrapping an Optional value")
        #expect(CrashFingerprint.reason(swiftMessage: "Fatal error: out of stock", symbols: []) == "out of stock")
        #expect(
            CrashFingerprint.reason(swiftMessage: "main.swift:9: Precondition failed: n > 0", symbols: [])
                == "Precondition failed: n > 0")
        #expect(CrashFingerprint.reason(swiftMessage: nil, symbols: [Symbol(function: "f", module: "app")]) == nil)
        let long = String(repeating: "x", count: 500)
        #expect(
            CrashFingerprint.summary(signal: "SIGILL", swiftMessage: long, symbols: [], frames: []).title.count == 160)
    }

    /// With the runtime linked into the app, no file name tells whose a frame is: names do.
    @Test func theRuntimesLinkedIntoTheAppAreTheSystems() {
        for name in [
            "swift_job_run", "_dispatch_worker_thread", "dispatch_async", "__CFRunLoopRun",
            "_ZL23completeTaskWithClosurePN5swift12AsyncContextEPNS_10SwiftErrorE",
            "$ss17_assertionFailure__4file4line5flagss5NeverOs12StaticStringV_A2HSus6UInt32VtF", "$sSayxSicigSi_Tg5",
            "$sScT5valuexvgTY0_", "$s10Foundation4DataV5countSivg", "$s20FoundationEssentials4DateV3nowACvgZ",
            "$s8Dispatch0A5QueueC5async5group3qos5flags7executeySo011OS_dispatch_D0CSg_AA0D3QoSVAA0dH5FlagsVyyctF",
        ] {
            #expect(FrameRole.of(source(name, linkage: name), module: "shop") == .system, "\(name)")
        }
        for name in ["$s13server_sample11priceOfItem_2atSiSaySiG_SitF", "main", "handle_request", "_ZN4shop5Cache3getEv"] {
            #expect(FrameRole.of(source(name, linkage: name), module: "shop") == .app, "\(name)")
        }
        // With a source position, the position decides.
        #expect(FrameRole.of(source("f", file: "<compiler-generated>", line: 0), module: "shop") == .system)
        #expect(FrameRole.of(source("f", file: "/src/a.swift", line: 0), module: "shop") == .system)
        #expect(
            FrameRole.of(source("swift_thing", linkage: "swift_thing", file: "/src/a.c", line: 4), module: "shop")
                == .app)
        #expect(FrameRole.of(source("cc_thread_trampoline"), module: "shop") == .system)
    }

    /// A closure of top-level code has an empty parent (`closure #7 in `): its file names it.
    @Test func aTopLevelClosureIsNamedByItsFile() {
        #expect(
            Symbolicator.naming(closure: "closure #7 in ", file: "/src/Sources/App/main.swift", module: "app")
                == "closure #7 in main.swift")
        #expect(Symbolicator.naming(closure: "closure #7 in", file: nil, module: "app") == "closure #7 in app")
        #expect(
            Symbolicator.naming(closure: "closure #1 in App.run()", file: "/x.swift", module: "app")
                == "closure #1 in App.run()")
    }
}
