import ArgumentParser
import CrashCapture
import CrashFileFormat
import CrashSymbolication
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

extension Crashcap {
    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List the crashes of a capture directory, newest first, as coredumpctl list does.",
            discussion: """
                One line per crash: its time, signal, title, fingerprint and id, and where it is: a \
                crash file still waiting for a replay (`pending`), or imported into the directory's \
                event store (`imported`; the store keeps the newest 1,000, after their events are \
                uploaded). `crashcap show DIR ID` shows one, by its id or its fingerprint.
                """)

        @Argument(help: "A capture directory.")
        var directory: String

        @Flag(help: "Print one JSON array instead of text.")
        var json = false

        @OptionGroup var symbols: SymbolOptions

        struct Crash {
            var timeMilliseconds: Int64
            var signal: String
            var title: String
            var fingerprint: String
            var appVersion: String
            var place: String
            /// The `$AppCrashed` event's id, which `show DIR ID` takes.
            var id: String
            /// A pending crash's file, in the directory.
            var file: String?
        }

        mutating func run() throws {
            try Crashcap.requireUTF8Path(directory)
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue
            else { throw Crashcap.fail("not a directory: \(CaptureFile.printable(directory))", code: 66) }
            let crashes = try Self.crashes(in: directory, symbolicator: symbols.symbolicator())
            if json {
                let objects = crashes.map { crash -> [String: Any] in
                    [
                        "time": crash.timeMilliseconds, "signal": crash.signal, "title": crash.title,
                        "fingerprint": crash.fingerprint, "app_version": crash.appVersion, "where": crash.place,
                        "id": crash.id,
                    ]
                }
                let data = try JSONSerialization.data(withJSONObject: objects, options: [.sortedKeys])
                print(String(decoding: data, as: UTF8.self))
                return
            }
            guard !crashes.isEmpty else {
                FileHandle.standardError.write(Data("crashcap: no crashes recorded in \(directory)\n".utf8))
                return
            }
            let formatter = DateFormatter()
            formatter.dateFormat = "yyyy-MM-dd HH:mm:ss"
            formatter.timeZone = TimeZone.current
            let signalWidth = max(6, crashes.map(\.signal.count).max() ?? 0)
            let idWidth = max(2, crashes.map(\.id.count).max() ?? 0)
            print(
                "TIME                 \("SIGNAL".padding(toLength: signalWidth, withPad: " ", startingAt: 0))  "
                    + "FINGERPRINT       WHERE     \("ID".padding(toLength: idWidth, withPad: " ", startingAt: 0))  TITLE"
            )
            for crash in crashes {
                let time = formatter.string(from: Date(timeIntervalSince1970: Double(crash.timeMilliseconds) / 1000))
                print(
                    CaptureFile.printable(
                        "\(time)  \(crash.signal.padding(toLength: signalWidth, withPad: " ", startingAt: 0))  "
                            + "\(crash.fingerprint.padding(toLength: 16, withPad: " ", startingAt: 0))  "
                            + "\(crash.place.padding(toLength: 8, withPad: " ", startingAt: 0))  "
                            + "\(crash.id.padding(toLength: idWidth, withPad: " ", startingAt: 0))  \(crash.title)"))
            }
        }

        /// Every crash of a capture directory, newest first: its pending crash files, then what
        /// its store's crash history holds.
        static func crashes(in directory: String, symbolicator: Symbolicator) throws -> [Crash] {
            var crashes = try pendingCrashes(in: directory, symbolicator: symbolicator)
            let storePath = directory + "/events.sqlite"
            if FileManager.default.fileExists(atPath: storePath) {
                do {
                    crashes += try EventStore(path: storePath).crashHistory().map {
                        Crash(
                            timeMilliseconds: $0.timeMilliseconds, signal: $0.signal, title: $0.title,
                            fingerprint: $0.fingerprint, appVersion: $0.appVersion, place: "imported", id: $0.eventID)
                    }
                } catch {
                    throw Crashcap.fail("the event store cannot be read: \(error)", code: 74)
                }
            }
            crashes.sort { $0.timeMilliseconds > $1.timeMilliseconds }
            return crashes
        }

        /// Crash files not yet imported, read and named as `show` names them.
        static func pendingCrashes(in directory: String, symbolicator: Symbolicator) throws -> [Crash] {
            let folder: CaptureDirectory
            do {
                folder = try CaptureDirectory(directory)
            } catch {
                throw Crashcap.fail("cannot list: \(CaptureFile.printable("\(error)"))", code: 66)
            }
            var crashes: [Crash] = []
            for name in folder.names().filter(CrashFileLayout.isCrashFileName) {
                guard let descriptor = try? folder.openForReading(name) else { continue }
                let handle = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
                // A running process's file, locked since its install: no crash in it yet.
                if flock(handle.fileDescriptor, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK { continue }
                guard let contents = try? CrashFileReader.read(handle) else { continue }
                let report = CrashReport(path: folder.path(of: name), contents: contents)
                guard let crashed = report.crashed else { continue }
                let summary = symbolicator.summary(of: report)
                crashes.append(
                    Crash(
                        timeMilliseconds: (crashed["time"] as? NSNumber)?.int64Value ?? 0,
                        signal: report.signalName ?? "crash", title: summary.title, fingerprint: summary.fingerprint,
                        appVersion: report.properties["$app_version"] as? String ?? "", place: "pending",
                        id: crashed["event_id"] as? String ?? "", file: name))
            }
            return crashes
        }
    }
}
