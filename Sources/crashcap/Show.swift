import ArgumentParser
import CrashCapture
import CrashCaptureCollector
import CrashFileFormat
import CrashSymbolication
import Foundation
import ProcessSupport

#if canImport(Glibc)
    import Glibc
#endif

extension Crashcap {
    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print crash reports a person reads at a glance.",
            discussion: """
                FILE is a crash file (.ccr); a DIR shows every crash file in it, oldest first. Once \
                a replay or the app's next start has imported them, DIR shows the newest crash kept \
                in its event store instead, and DIR CRASH any crash that `crashcap list DIR` lists.
                """)

        @Argument(help: "A crash file or a capture directory.")
        var path: String

        @Argument(
            help: """
                With a directory: the crash to show, by the id `crashcap list` prints (or its start) \
                or by fingerprint (the newest crash with it), pending or imported.
                """)
        var crash: String?

        @Flag(help: "Print JSON (one object per crash file) instead of text.")
        var json = false

        @Option(help: "Frames of the crashing thread to print (0: all).")
        var frames = 32

        @Flag(help: "Also print frames of libc, the loader and the runtimes, and every frame of the other threads.")
        var allFrames = false

        @Flag(help: "Also print the memory near the stack pointer, the pc and the fault address, as hex.")
        var memory = false

        @Flag(help: "Never use colour, even on a terminal.")
        var noColor = false

        @OptionGroup var symbols: SymbolOptions

        mutating func run() throws {
            try Crashcap.requireUTF8Path(path)
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else {
                throw Crashcap.fail("no such file or directory: \(path)", code: 66)
            }
            if crash != nil && !isDirectory.boolValue {
                throw Crashcap.fail("a crash is chosen within a directory: crashcap show DIR CRASH", code: 64)
            }
            let symbolicator = try symbols.symbolicator()
            if let missing = Symbolicator.elfutilsUnavailable, !json {
                FileHandle.standardError.write(
                    Data("crashcap: \(missing); functions are named from symbol tables only\n".utf8))
            }
            // A directory is opened once and its entries read relative to it.
            var folder: CaptureDirectory?
            var files: [String]
            if isDirectory.boolValue {
                do {
                    folder = try CaptureDirectory(path)
                } catch {
                    throw Crashcap.fail("cannot list: \(CaptureFile.printable("\(error)"))", code: 66)
                }
                files = (folder?.names() ?? []).filter(CrashFileLayout.isCrashFileName)
                if let crash {
                    let chosen = try choose(crash, among: List.crashes(in: path, symbolicator: symbolicator))
                    guard let file = chosen.file else {
                        return try show(imported(chosen.id), symbolicator: symbolicator)
                    }
                    files = [file]
                } else if files.isEmpty {
                    guard let newest = try List.crashes(in: path, symbolicator: symbolicator).first else {
                        FileHandle.standardError.write(
                            Data(
                                ("crashcap: no crash files in \(path), and no crash in its store (a replay, or the "
                                    + "app's next start, imports and removes them)\n").utf8))
                        return
                    }
                    FileHandle.standardError.write(
                        Data(
                            ("crashcap: no crash files in \(path): the newest crash its store keeps follows "
                                + "(`crashcap list \(path)` lists them all, `crashcap show \(path) ID` shows one)\n")
                                .utf8))
                    return try show(imported(newest.id), symbolicator: symbolicator)
                }
            } else {
                files = [path]
            }
            let style = style
            var damaged = false
            var live = 0
            for file in files {
                // One unreadable entry (a link, a FIFO, a directory under a crash file's name) is
                // reported and passed over: the reports beside it are still shown.
                let report: CrashReport
                do {
                    if let folder {
                        let handle = FileHandle(fileDescriptor: try folder.openForReading(file), closeOnDealloc: true)
                        // A running process holds its crash file locked from install on: no crash yet.
                        if flock(handle.fileDescriptor, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK {
                            live += 1
                            continue
                        }
                        report = CrashReport(path: folder.path(of: file), contents: try CrashFileReader.read(handle))
                    } else {
                        report = try CrashReport(path: file)
                    }
                } catch {
                    FileHandle.standardError.write(Data("crashcap: \(CaptureFile.printable("\(error)"))\n".utf8))
                    damaged = true
                    continue
                }
                // A session's crash file with no crash in it (the process was killed, or ended
                // in a way that left it) is shown as such, not counted as damage; a file with
                // neither a session nor a crash record is.
                damaged = damaged || !report.problems.isEmpty || (report.crashed == nil && report.session == nil)
                render(report, symbolicator: symbolicator, style: style)
            }
            if live > 0 {
                FileHandle.standardError.write(
                    Data("crashcap: \(live) crash file(s) of running processes skipped: no crash in them yet\n".utf8))
            }
            if damaged { throw ExitCode(65) }
        }

        /// NO_COLOR (no-color.org): present and not empty turns colour off, as --no-color does.
        var style: TextStyle {
            let noColorAsked = !(ProcessInfo.processInfo.environment["NO_COLOR"] ?? "").isEmpty
            return TextStyle(enabled: !noColor && !noColorAsked && !json && isatty(STDOUT_FILENO) == 1)
        }

        static func writeToStandardOutput(_ bytes: inout [UInt8]) {
            bytes.withUnsafeBytes { buffer in
                var done = 0
                while done < buffer.count {
                    let wrote = write(STDOUT_FILENO, buffer.baseAddress! + done, buffer.count - done)
                    if wrote < 0 && errno == EINTR { continue }
                    if wrote <= 0 { break }
                    done += wrote
                }
            }
            bytes.removeAll(keepingCapacity: true)
        }

        func render(_ report: CrashReport, symbolicator: Symbolicator, style: TextStyle) {
            if json {
                // Written as it is made, from the bytes: a String or Data of the whole would be
                // another copy of what can be tens of MB.
                fflush(nil)
                var out: [UInt8] = []
                ReportRendering.writeJSON(
                    report, symbols: symbolicator.symbolicate(report), symbolicator: symbolicator, to: &out,
                    drain: Self.writeToStandardOutput)
                out.append(UInt8(ascii: "\n"))
                Self.writeToStandardOutput(&out)
            } else {
                print(
                    ReportRendering.text(
                        report, symbols: symbolicator.symbolicate(report), symbolicator: symbolicator,
                        options: RenderOptions(frames: frames, allFrames: allFrames, memory: memory), style: style))
            }
        }

        /// A stored crash, named as the modules here name it and, where they name nothing (the
        /// binary is gone, or another build by now), as it was named at import.
        func show(_ report: CrashReport, symbolicator: Symbolicator) throws {
            CrashReplayer.rememberNames(of: report, in: symbolicator)
            render(report, symbolicator: symbolicator, style: style)
        }

        /// The crash `selector` names among a directory's (newest first): the one with that id,
        /// the only one whose id starts so, or the newest with that fingerprint.
        func choose(_ selector: String, among crashes: [List.Crash]) throws -> List.Crash {
            if let exact = crashes.first(where: { $0.id == selector || $0.fingerprint == selector }) { return exact }
            let started = crashes.filter { $0.id.hasPrefix(selector) }
            if started.count > 1 {
                throw Crashcap.fail(
                    "\(started.count) crashes' ids start with \(selector): give more of it (`crashcap list \(path)`)",
                    code: 64)
            }
            guard let only = started.first, !selector.isEmpty else {
                throw Crashcap.fail(
                    "no crash \(CaptureFile.printable(selector)) in \(path): `crashcap list \(path)` lists them with "
                        + "their ids and fingerprints", code: 66)
            }
            return only
        }

        /// An imported crash's report, read from the directory's event store.
        func imported(_ id: String) throws -> CrashReport {
            let storePath = path + "/events.sqlite"
            let payload: String?
            do {
                payload = try EventStore(path: storePath).crashReport(eventID: id)
            } catch {
                throw Crashcap.fail("the event store cannot be read: \(error)", code: 74)
            }
            guard var payload else {
                throw Crashcap.fail(
                    "crash \(id)'s report is no longer kept (the store keeps the newest "
                        + "\(EventStore.crashReportsKept) whole); `crashcap list` still lists it", code: 66)
            }
            // Read from the text where it is: a copy of a large report's text is tens of MB more.
            // Each thread's frames (a thread is an object 4 deep: event, crash, threads, thread)
            // stay text until read.
            guard let event = payload.withUTF8({ JSONTree.object($0, keepingAsText: ("frames", 4)) }) else {
                throw Crashcap.fail("crash \(id)'s report in \(storePath) is not a JSON object", code: 65)
            }
            return CrashReport(path: "\(storePath), imported crash \(id)", storedEvent: event)
        }
    }
}
