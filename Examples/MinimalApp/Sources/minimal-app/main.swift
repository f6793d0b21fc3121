// minimal-app DIRECTORY [crash]
//
// Installs CrashCapture in DIRECTORY, tracks one event, and (with `crash`) dereferences a bad
// pointer. Its own log handler prefixes every line, to show the library's diagnostics
// arrive through swift-log.
import CrashCapture
import Foundation
import Logging

struct PrefixedLogHandler: LogHandler {
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]
    let label: String

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        FileHandle.standardError.write(Data("app-log [\(label)] \(event.level): \(event.message)\n".utf8))
    }
}

LoggingSystem.bootstrap { PrefixedLogHandler(label: $0) }

let arguments = CommandLine.arguments
guard arguments.count >= 2 else {
    FileHandle.standardError.write(Data("usage: minimal-app DIRECTORY [crash]\n".utf8))
    exit(64)
}
do {
    try CrashCapture.install(
        .init(
            directory: arguments[1], appName: "minimal-app", appVersion: "1.0.0",
            serverURL: URL(string: "http://127.0.0.1:9/sa")))
    try CrashCapture.track("app_ready", properties: ["step": 1])
} catch {
    // Typed throws: `error` is a CrashCaptureError here. (Swift 6.3.1's compiler crashes on
    // `catch let error as CrashCaptureError` after these calls: see Docs/Limits.md.)
    FileHandle.standardError.write(Data("not installed (\(error.kind)): \(error)\n".utf8))
    exit(1)
}
if arguments.count > 2 && arguments[2] == "crash" {
    CrashCapture.flush(timeout: .zero)
    let pointer = UnsafeMutablePointer<Int>(bitPattern: 8)!
    pointer.pointee = 42
}
print("tracked")
