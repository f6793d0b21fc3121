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
            discussion: "FILE is a crash file (.ccr); a DIR shows every crash file in it, oldest first.")

        @Argument(help: "A crash file or a directory of them.")
        var path: String

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
            // A directory is opened once and its entries read relative to it.
            var folder: CaptureDirectory?
            let files: [String]
            if isDirectory.boolValue {
                do {
                    folder = try CaptureDirectory(path)
                } catch {
                    throw Crashcap.fail("cannot list: \(CaptureFile.printable("\(error)"))", code: 66)
                }
                files = (folder?.names() ?? []).filter(CrashFileLayout.isCrashFileName)
                if files.isEmpty {
                    FileHandle.standardError.write(
                        Data(
                            ("crashcap: no crash files in \(path) (a replay imports and removes them: "
                                + "`crashcap list` lists the crashes imported, `crashcap replay --archive` keeps "
                                + "the files)\n").utf8))
                    return
                }
            } else {
                files = [path]
            }
            let symbolicator = try symbols.symbolicator()
            if let missing = Symbolicator.elfutilsUnavailable, !json {
                FileHandle.standardError.write(
                    Data("crashcap: \(missing); functions are named from symbol tables only\n".utf8))
            }
            // NO_COLOR (no-color.org): present and not empty turns colour off, as --no-color does.
            let noColorAsked = !(ProcessInfo.processInfo.environment["NO_COLOR"] ?? "").isEmpty
            let style = TextStyle(enabled: !noColor && !noColorAsked && !json && isatty(STDOUT_FILENO) == 1)
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
                if json {
                    print(
                        ReportRendering.json(
                            report, symbols: symbolicator.symbolicate(report), symbolicator: symbolicator))
                } else {
                    print(
                        ReportRendering.text(
                            report, symbols: symbolicator.symbolicate(report), symbolicator: symbolicator,
                            options: RenderOptions(frames: frames, allFrames: allFrames, memory: memory), style: style))
                }
            }
            if live > 0 {
                FileHandle.standardError.write(
                    Data("crashcap: \(live) crash file(s) of running processes skipped: no crash in them yet\n".utf8))
            }
            if damaged { throw ExitCode(65) }
        }
    }
}
