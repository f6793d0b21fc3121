// swift-tools-version:6.2
// A server-shaped app, built as users build theirs: outside this package, against the
// CrashCapture product, in debug and in release with the Swift runtime shared and static
// (`swift build -c release --static-swift-stdlib`, what Vapor's and Hummingbird's Dockerfiles
// do). Scripts/build-server-sample.sh builds the three; ServerReportTests crashes them.
import PackageDescription

let package = Package(
    name: "ServerSample",
    dependencies: [.package(name: "CrashCapture", path: "../..", traits: [])],
    targets: [
        .executableTarget(
            name: "server-sample",
            dependencies: [.product(name: "CrashCapture", package: "CrashCapture"), "ServerSampleSupport"]
        ),
        .target(name: "ServerSampleSupport"),
    ]
)
