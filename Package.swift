// swift-tools-version:6.1
import PackageDescription

let package = Package(
    name: "CrashCapture",
    products: [
        .library(name: "CrashCapture", targets: ["CrashCapture"]),
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
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
    ],
    targets: [
        // The crash path and everything it needs prepared at install, in C. The preload
        // library is built from these same sources by Scripts/build-preload.sh, with the C
        // compiler alone, so that it carries no Swift runtime.
        .target(
            name: "CCrashCapture",
            exclude: ["preload"],
            cSettings: [.define("_GNU_SOURCE")]
        ),
        .systemLibrary(name: "CSQLite", providers: [.apt(["libsqlite3-dev"])]),
        .systemLibrary(name: "CZlib", providers: [.apt(["zlib1g-dev"])]),
        .target(
            name: "CrashCapture",
            dependencies: [
                "CCrashCapture", "CSQLite", "CZlib",
                .product(
                    name: "AsyncHTTPClient", package: "async-http-client", condition: .when(traits: ["HTTPUpload"])),
                .product(name: "NIOCore", package: "swift-nio", condition: .when(traits: ["HTTPUpload"])),
                .product(name: "NIOPosix", package: "swift-nio", condition: .when(traits: ["HTTPUpload"])),
                .product(name: "NIOHTTP1", package: "swift-nio", condition: .when(traits: ["HTTPUpload"])),
            ]
        ),
        .executableTarget(
            name: "crashcap",
            dependencies: [
                "CrashCapture",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .target(
            name: "CrashSampleSupport",
            path: "CrashSamples/Support",
            cSettings: [.define("_GNU_SOURCE")]
        ),
        .executableTarget(
            name: "crash-sample-swift",
            dependencies: ["CrashCapture", "CrashSampleSupport"],
            path: "CrashSamples/Swift"
        ),
        .executableTarget(
            name: "crash-sample-c",
            dependencies: ["CCrashCapture", "CrashSampleSupport"],
            path: "CrashSamples/C",
            cSettings: [.define("_GNU_SOURCE")],
            cxxSettings: [.define("_GNU_SOURCE")]
        ),
        .executableTarget(
            name: "crashcap-bench",
            dependencies: ["CrashCapture"],
            path: "Benchmarks/CrashBenchmarks"
        ),
        .testTarget(
            name: "CrashCaptureTests",
            dependencies: ["CrashCapture"]
        ),
    ]
)
