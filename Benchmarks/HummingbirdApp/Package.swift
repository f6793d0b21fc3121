// swift-tools-version:6.1
// The Hummingbird app, as a user writes it: its async route crashes three calls below
// the route. Benchmarks/server_report.sh builds it in release, with the Swift runtime shared and
// linked in, crashes it over HTTP and reads what CrashCapture reported.
import PackageDescription

let package = Package(
    name: "HummingbirdApp",
    platforms: [.macOS(.v14)],
    dependencies: [
        .package(name: "CrashCapture", path: "../..", traits: []),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
    ],
    targets: [
        .executableTarget(
            name: "hummingbird-app",
            dependencies: [
                .product(name: "CrashCapture", package: "CrashCapture"),
                .product(name: "Hummingbird", package: "hummingbird"),
            ]
        )
    ]
)
