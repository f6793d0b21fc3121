import ArgumentParser
import CrashCapture
import CrashFileFormat
import Foundation
import Minidump

#if canImport(Glibc)
    import Glibc
#endif

extension Crashcap {
    struct Export: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write each crash as a minidump, for lldb and crash backends.",
            discussion: """
                FILE is a crash file (.ccr); a DIR exports every crash file in it and every crash its \
                event store keeps whole (`crashcap list DIR`). Each becomes OUTPUT/<crash id>.dmp: \
                every thread's registers and stack, the modules with their build ids, the signal \
                (Docs/Minidump.md). Crashes captured before the stacks record existed make none.
                """)

        @Argument(help: "A crash file or a capture directory.")
        var path: String

        @Flag(help: "Write minidumps (the one format export writes today).")
        var minidump = false

        @Option(help: "The directory the .dmp files go to (made if missing).")
        var output: String

        mutating func run() throws {
            try Crashcap.requireUTF8Path(path)
            guard minidump else { throw Crashcap.fail("say which format: --minidump", code: 64) }
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
                throw Crashcap.fail("no such file or directory: \(path)", code: 66)
            }
            try FileManager.default.createDirectory(atPath: output, withIntermediateDirectories: true)
            var reports: [CrashReport] = []
            var failed = false
            if isDirectory.boolValue {
                let names = (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? []
                for name in names.sorted() where CrashFileLayout.isCrashFileName(name) {
                    do {
                        reports.append(try CrashReport(path: path + "/" + name))
                    } catch {
                        FileHandle.standardError.write(Data("crashcap: \(CaptureFile.printable("\(error)"))\n".utf8))
                        failed = true
                    }
                }
                reports += try Self.storedReports(in: path)
            } else {
                reports.append(try CrashReport(path: path))
            }
            var written = 0
            for report in reports where report.crashed != nil {
                let id = report.crashed?["event_id"] as? String ?? "crash"
                do {
                    let dump = MinidumpWriter.write(try MinidumpInput(report: report))
                    let file = output + "/" + id.replacingOccurrences(of: "/", with: "_") + ".dmp"
                    try Data(dump).write(to: URL(fileURLWithPath: file), options: .atomic)
                    print("\(file)  \(dump.count) bytes")
                    written += 1
                } catch {
                    FileHandle.standardError.write(
                        Data("crashcap: \(id): no minidump: \(CaptureFile.printable("\(error)"))\n".utf8))
                    failed = true
                }
            }
            if written == 0 {
                FileHandle.standardError.write(Data("crashcap: no crash to export in \(path)\n".utf8))
                throw ExitCode(failed ? 65 : 66)
            }
            if failed { throw ExitCode(65) }
        }

        /// The crashes a directory's event store keeps whole, with the stacks kept beside them.
        static func storedReports(in directory: String) throws -> [CrashReport] {
            let storePath = directory + "/events.sqlite"
            guard FileManager.default.fileExists(atPath: storePath) else { return [] }
            let store: EventStore
            do {
                store = try EventStore(path: storePath)
            } catch {
                throw Crashcap.fail("the event store cannot be read: \(error)", code: 74)
            }
            var reports: [CrashReport] = []
            for entry in try store.crashHistory() {
                guard let payload = try store.crashReport(eventID: entry.eventID),
                    let event = JSONTree.object(Array(payload.utf8))
                else { continue }
                var report = CrashReport(path: "\(storePath), imported crash \(entry.eventID)", storedEvent: event)
                if let stacks = try store.crashStacks(eventID: entry.eventID),
                    case .success(let memory) = StackMemory.parse(stacks)
                {
                    report.stacks = memory
                }
                reports.append(report)
            }
            return reports
        }
    }
}
