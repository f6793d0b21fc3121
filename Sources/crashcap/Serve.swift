import ArgumentParser
import CrashCapture
import CrashCaptureCollector
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

extension Crashcap {
    struct Serve: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract:
                "Serve the crash browser over one app's own events.sqlite, on loopback, for a developer's machine.",
            discussion: """
                The same pages as `crashcap collect` serves (crash and hang groups, a group, a report, \
                top crashers of a version), over the crashes and hangs in DIR/events.sqlite: the events \
                still waiting for upload, and the last reports the store keeps after upload. The store is \
                only read. SIGTERM or SIGINT stops it.
                """)

        @Argument(help: "The app's CrashCapture directory (the one holding events.sqlite), or the events.sqlite file.")
        var directory: String

        @Option(help: "Port to listen on (0: any free port, printed at start).")
        var port: UInt16 = 8107

        mutating func run() throws {
            var isDirectory: ObjCBool = false
            let path =
                FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory) && isDirectory.boolValue
                ? directory + "/events.sqlite" : directory
            guard FileManager.default.fileExists(atPath: path) else {
                throw Crashcap.fail("no event store at \(path)", code: 66)
            }
            let server: IngestCollector
            do {
                server = try IngestCollector(host: "127.0.0.1", port: port, storage: .pagesOnly(path: path))
            } catch {
                throw Crashcap.fail("\(error)", code: 69)
            }
            FileHandle.standardOutput.write(Data("crash browser on http://127.0.0.1:\(server.port)/\n".utf8))
            signal(SIGPIPE, SIG_IGN)
            let signals = DispatchQueue(label: "crashcap.serve.signals")
            let sources = [SIGTERM, SIGINT].map { number in
                signal(number, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: number, queue: signals)
                source.setEventHandler { server.stop() }
                source.resume()
                return source
            }
            server.serve()
            for source in sources { source.cancel() }
        }
    }
}
