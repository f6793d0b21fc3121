// swift-tools-version:6.2
import PackageDescription

// Every Swift target: imports are internal unless a public declaration needs the module, and
// every public type says whether it is Sendable.
let strictSwift: [SwiftSetting] = [
    .enableUpcomingFeature("InternalImportsByDefault"),
    .treatWarning("ExplicitSendable", as: .error),
]

let package = Package(
    name: "CrashCapture",
    products: [
        // What an app links: install, events, store, upload, replay. No server, no spawner.
        .library(name: "CrashCapture", targets: ["CrashCapture"]),
        // A hang watch on every loop of a SwiftNIO EventLoopGroup: a product of its own, so that
        // an app without SwiftNIO does not link it.
        .library(name: "CrashCaptureNIO", targets: ["CrashCaptureNIO"]),
        // Reading crash files, and naming their frames, for tools of your own.
        .library(name: "CrashFileFormat", targets: ["CrashFileFormat"]),
        .library(name: "CrashSymbolication", targets: ["CrashSymbolication"]),
        // Minidumps of crash reports, for lldb and any crash backend (Sentry, Socorro, BugSplat, Backtrace).
        .library(name: "Minidump", targets: ["Minidump"]),
        .executable(name: "crashcap", targets: ["crashcap"]),
    ],
    traits: [
        .trait(
            name: "HTTPUpload",
            description:
                "The uploader's HTTP client (async-http-client on SwiftNIO and BoringSSL). Without it, events stay in the store for another process to upload."
        ),
        .default(enabledTraits: ["HTTPUpload"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        // OTLP's logs messages (Sources/OTLPLogs, generated from Protos/otlp_logs.proto).
        .package(url: "https://github.com/apple/swift-protobuf", from: "1.39.0"),
        // `swift package generate-documentation --target CrashCapture`: the DocC catalog in
        // Sources/CrashCapture/CrashCapture.docc, built by Scripts/test.sh.
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
    ],
    targets: [
        // The crash-file layout and the names of signals, as C constants and inline functions:
        // the crash path writes with them and the Swift reader reads with them.
        .target(name: "CCrashFileFormat"),
        // The crash path (signal_safe/) and everything it needs prepared at install (install/),
        // in C. The preload library is built from these same sources by Scripts/build-preload.sh,
        // with the C compiler alone, so that it carries no Swift runtime.
        .target(
            name: "CCrashCapture",
            dependencies: ["CCrashFileFormat"],
            exclude: ["preload", "testing"],
            cSettings: [.define("_GNU_SOURCE"), .headerSearchPath(".")]
        ),
        .systemLibrary(name: "CSQLite", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CZlib", providers: [.apt(["zlib1g-dev"])]),
        .target(
            name: "CrashFileFormat",
            dependencies: ["CCrashFileFormat"],
            swiftSettings: strictSwift
        ),
        // elfutils (libdw, libdebuginfod) reached through dlopen: nothing links against it.
        .target(name: "CElfutils", cSettings: [.define("_GNU_SOURCE")]),
        .target(
            name: "CrashSymbolication",
            dependencies: ["CrashFileFormat", "CElfutils"],
            swiftSettings: strictSwift
        ),
        // A crash report and its stacks record as a minidump: plain Swift over CrashFileFormat.
        .target(
            name: "Minidump",
            dependencies: ["CrashFileFormat"],
            swiftSettings: strictSwift
        ),
        // The OTLP/HTTP logs messages the uploader sends with --otlp; made by Scripts/generate-otlp.sh.
        .target(
            name: "OTLPLogs",
            dependencies: [.product(name: "SwiftProtobuf", package: "swift-protobuf")]
        ),
        .target(
            name: "CrashCapture",
            dependencies: [
                "CCrashCapture", "CCrashFileFormat", "CrashFileFormat", "CrashSymbolication", "CSQLite", "CZlib",
                // The minidumps Configuration.minidumpURL sends.
                "Minidump",
                .product(name: "Logging", package: "swift-log"),
                .product(
                    name: "AsyncHTTPClient", package: "async-http-client", condition: .when(traits: ["HTTPUpload"])),
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["HTTPUpload"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["HTTPUpload"])),
                .product(name: "NIOHTTP1", package: "swift-nio", condition: .when(traits: ["HTTPUpload"])),
                .target(name: "OTLPLogs", condition: .when(traits: ["HTTPUpload"])),
                .product(name: "SwiftProtobuf", package: "swift-protobuf", condition: .when(traits: ["HTTPUpload"])),
            ],
            swiftSettings: strictSwift
        ),
        .target(
            name: "CrashCaptureNIO",
            dependencies: ["CrashCapture", .product(name: "NIOCore", package: "swift-nio")],
            swiftSettings: strictSwift
        ),
        // The crash browser's pages (HTML, inline SVG, one stylesheet), over a small protocol of
        // queries with a SQLite answer here and a ClickHouse one in the collector. Apps never link it.
        .target(
            name: "CrashBrowser",
            dependencies: ["CrashCapture", "CrashSymbolication"],
            swiftSettings: strictSwift
        ),
        // The ingest server `crashcap collect` runs. Apps never link it.
        .target(
            name: "CrashCaptureCollector",
            dependencies: [
                "CrashCapture", "CrashFileFormat", "CZlib", "CrashBrowser",
                // ClickHouse's HTTP interface, for `crashcap collect --clickhouse`.
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: strictSwift
        ),
        // Children with a clean signal state, for the CLI's harness, the benchmarks and the tests.
        .target(
            name: "ProcessSupport",
            dependencies: ["CrashFileFormat"],
            swiftSettings: strictSwift
        ),
        .executableTarget(
            name: "crashcap",
            dependencies: [
                "CrashBrowser", "CrashCapture", "CrashCaptureCollector", "CrashFileFormat", "CrashSymbolication", "Minidump",
                "ProcessSupport",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSwift
        ),
        .target(
            name: "CrashSampleSupport",
            path: "CrashSamples/Support",
            cSettings: [.define("_GNU_SOURCE")]
        ),
        .executableTarget(
            name: "crash-sample-swift",
            dependencies: [
                "CrashCapture", "CrashSampleSupport", .product(name: "Logging", package: "swift-log"),
                // A SwiftNIO event loop to wait on, where the package's trait brings SwiftNIO anyway.
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["HTTPUpload"])),
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["HTTPUpload"])),
                .target(name: "CrashCaptureNIO", condition: .when(traits: ["HTTPUpload"])),
            ],
            path: "CrashSamples/Swift"
        ),
        .executableTarget(
            name: "crash-sample-c",
            dependencies: ["CCrashCapture", "CrashSampleSupport"],
            path: "CrashSamples/C",
            cSettings: [.define("_GNU_SOURCE"), .headerSearchPath("../../Sources/CCrashCapture/testing")],
            cxxSettings: [.define("_GNU_SOURCE")]
        ),
        .executableTarget(
            name: "crashcap-bench",
            dependencies: [
                "CrashCapture", "CrashCaptureCollector", "CrashFileFormat", "CrashSymbolication", "Minidump",
                "ProcessSupport",
                // A ClickHouse server of its own, for the ingest figure.
                "TestSupport",
                // A receiver that only answers, for the OTLP export's figure.
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            path: "Benchmarks/CrashBenchmarks"
        ),
        // Paths to the built samples and helpers to run them, a ClickHouse server of their own,
        // shared by the test targets and the benchmarks. Not in ProcessSupport, which crashcap
        // links: its URLSession would bring FoundationNetworking, and with it libcurl, into crashcap.
        .target(
            name: "TestSupport",
            dependencies: ["CrashCapture", "CrashFileFormat", "CrashSymbolication", "ProcessSupport"],
            path: "Tests/TestSupport"
        ),
        .testTarget(
            name: "CCrashCaptureTests",
            dependencies: ["CrashFileFormat", "ProcessSupport", "TestSupport"]
        ),
        .testTarget(
            name: "CrashFileFormatTests",
            dependencies: ["CrashFileFormat", "TestSupport"]
        ),
        .testTarget(
            name: "MinidumpTests",
            dependencies: ["CrashFileFormat", "Minidump", "TestSupport"]
        ),
        .testTarget(
            name: "CrashSymbolicationTests",
            dependencies: ["CrashFileFormat", "CrashSymbolication", "TestSupport"]
        ),
        .testTarget(
            name: "CrashCaptureTests",
            dependencies: ["CrashCapture", "CrashFileFormat", "TestSupport"]
        ),
        .testTarget(
            name: "CrashCaptureCollectorTests",
            dependencies: ["CrashBrowser", "CrashCaptureCollector", "CrashCapture", "CrashFileFormat", "TestSupport"]
        ),
        .testTarget(
            name: "ProcessSupportTests",
            dependencies: ["CrashFileFormat", "ProcessSupport", "TestSupport"]
        ),
        .testTarget(
            name: "crashcapTests",
            dependencies: [
                "CrashCapture", "CrashFileFormat", "CrashSymbolication", "Minidump", "ProcessSupport", "TestSupport",
            ]
        ),
    ]
)

// Warnings are errors in this package's own builds, never in an app's. Scripts/test.sh and
// Scripts/demo.sh set CRASHCAPTURE_WARNINGS_AS_ERRORS=1, and then every target of ours, Swift and
// C, tests and samples included, fails on a warning (the dependencies are not ours and are left as
// they are). An app that depends on CrashCapture builds it without: Xcode and SwiftPM's newer build
// system compile a dependency with -suppress-warnings, which the compiler refuses beside
// -warnings-as-errors (swift-package-manager#10192), and a newer compiler's new warning must not
// stop someone else's build.
if Context.environment["CRASHCAPTURE_WARNINGS_AS_ERRORS"] == "1" {
    for target in package.targets where target.type != .system && target.type != .plugin {
        target.swiftSettings = (target.swiftSettings ?? []) + [.treatAllWarnings(as: .error)]
        target.cSettings = (target.cSettings ?? []) + [.treatAllWarnings(as: .error)]
        target.cxxSettings = (target.cxxSettings ?? []) + [.treatAllWarnings(as: .error)]
    }
}
