// swift-tools-version:6.2
// An app as a user writes one: it depends on the CrashCapture product and nothing else of the
// package. The tests build it (Scripts/test.sh) and check, with nm, that the binary carries
// the SDK and none of the collector, the process spawner or the harness.
import PackageDescription

let package = Package(
    name: "MinimalApp",
    dependencies: [
        // No default traits: the app does not upload, so the HTTP client is left out too.
        .package(name: "CrashCapture", path: "../..", traits: []),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
    ],
    targets: [
        .executableTarget(
            name: "minimal-app",
            dependencies: [
                .product(name: "CrashCapture", package: "CrashCapture"),
                .product(name: "Logging", package: "swift-log"),
            ]
        )
    ]
)
