package import CrashFileFormat
package import CrashSymbolication
internal import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Imports crash files left by earlier processes into the event store, exactly once:
/// verify every record, symbolicate the stack, store the events (their ids are remembered,
/// so a replay killed at any moment and run again neither loses nor duplicates), then delete
/// the file — or move it to `damaged/` with a note saying where and why, when some of it was
/// unreadable.
package struct CrashReplayer: Sendable {
    package struct FileResult: Sendable {
        package enum Outcome: String, Sendable {
            case imported, alreadyImported = "already imported", skippedLive = "skipped (live)"
            case noCrash = "no crash recorded", damaged
        }
        package var path: String
        package var outcome: Outcome
        package var importedEvents = 0
        package var problems: [CrashFileProblem] = []
        package var movedTo: String?
    }

    package struct Summary: Sendable {
        package var files: [FileResult] = []
        package var importedEvents: Int { files.reduce(0) { $0 + $1.importedEvents } }
        package func count(_ outcome: FileResult.Outcome) -> Int { files.filter { $0.outcome == outcome }.count }
    }

    package let directory: String
    /// The directory, opened once; nil (with `openProblem`) when it could not be.
    package let folder: CaptureDirectory?
    let openProblem: String?
    package let store: EventStore
    package let symbolicator: Symbolicator
    /// Keep imported files in `archive/` instead of deleting them.
    package var archive = false
    /// A crash loop: past this many crashes of one fingerprint within `crashLoopWindow`, later
    /// ones are imported as compact events (fingerprint, title, count, times; no stacks).
    package var crashLoopThreshold = 5
    package var crashLoopWindowMilliseconds: Int64 = 3_600_000

    package init(directory: String, store: EventStore, symbolicator: Symbolicator = Symbolicator()) {
        self.directory = directory
        do {
            folder = try CaptureDirectory(directory)
            openProblem = nil
        } catch {
            folder = nil
            openProblem = "\(error)"
        }
        self.store = store
        self.symbolicator = symbolicator
    }

    /// Crash files waiting in the directory, oldest first (by the time their name was given,
    /// the crash's; then by name), so that crash loops are counted in the order they happened.
    package func pendingFiles() -> [String] {
        guard let folder else { return [] }
        let names = folder.names().filter { $0.hasSuffix("." + CrashFileLayout.fileExtension) }
        let dated = names.map { name -> (name: String, time: Double) in
            var info = stat()
            let time =
                fstatat(folder.fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0
                ? Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9 : 0
            return (name, time)
        }
        return dated.sorted { ($0.time, $0.name) < ($1.time, $1.name) }.map { directory + "/" + $0.name }
    }

    package func replayAll(progress: ((Int, Int) -> Void)? = nil) -> Summary {
        var summary = Summary()
        let files = pendingFiles()
        for (index, file) in files.enumerated() {
            summary.files.append(replay(file))
            progress?(index + 1, files.count)
        }
        return summary
    }

    /// `breadcrumbs`: the session's last events, from its journal, for the $AppCrashed.
    package func replay(_ path: String, breadcrumbs: [String] = []) -> FileResult {
        var result = FileResult(path: path, outcome: .imported)
        let name = (path as NSString).lastPathComponent
        // One descriptor, locked for the whole import: a named crash file still locked belongs to
        // a live process (filesystems without O_TMPFILE), and two replays never take the same file.
        let fd: Int32
        do {
            guard let folder else { throw CrashCaptureError.io(openProblem ?? "cannot open", path: directory) }
            fd = try folder.openForReading(name)
        } catch {
            // A link, a FIFO, a directory under a crash file's name: reported, never moved or read.
            result.outcome = .damaged
            result.problems = [CrashFileProblem(offset: 0, reason: "\(error)")]
            return result
        }
        let file = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
        defer { withExtendedLifetime(file) {} }
        let contents: CrashFileContents
        do {
            if flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK {
                result.outcome = .skippedLive
                return result
            }
            contents = try CrashFileReader.read(file)
        } catch {
            result.outcome = .damaged
            result.problems = [CrashFileProblem(offset: 0, reason: "\(error)")]
            result.movedTo = moveAside(name, problems: result.problems)
            return result
        }
        let report = CrashReport(path: path, contents: contents)
        result.problems = report.problems
        if contents.records.isEmpty && contents.problems.isEmpty {
            result.problems.append(
                CrashFileProblem(
                    offset: 0, reason: "no records at all: an empty or zero-filled file, not a crash report"))
        }
        var rows: [(id: String, payload: String)] = []
        for event in report.events {
            guard let id = event["event_id"] as? String, !id.isEmpty else {
                result.problems.append(CrashFileProblem(offset: 0, reason: "an event without event_id was skipped"))
                continue
            }
            var event = event
            if event["event"] as? String == "$AppCrashed" {
                event = enrich(event, report: report, breadcrumbs: breadcrumbs)
                event = compactIfLooping(event, id: id)
            }
            rows.append((id, JSONText.serialize(event)))
        }
        do {
            let inserted = try store.insert(rows, rememberIDs: true)
            result.importedEvents = inserted.inserted
            if rows.isEmpty {
                result.outcome = result.problems.isEmpty ? .noCrash : .damaged
            } else if inserted.inserted == 0 {
                result.outcome = .alreadyImported
            }
        } catch {
            // The store could not take them: leave the file where it is for the next replay.
            result.outcome = .damaged
            result.problems.append(CrashFileProblem(offset: 0, reason: "event store: \(error)"))
            return result
        }
        if !result.problems.isEmpty {
            // Whatever was whole is imported, but part of the file was not: that is damage, and
            // it is counted (and reflected in the exit status) as such.
            result.outcome = .damaged
            result.movedTo = moveAside(name, problems: result.problems)
        } else if archive {
            result.movedTo = folder.flatMap { PrivateFiles.move(name, in: $0, into: "archive") }
        } else {
            folder?.remove(name)
        }
        return result
    }

    /// One crash of many of the same site in a short time: its count and times are kept, its
    /// stacks, registers, memory and breadcrumbs dropped, so that a program crashing at every
    /// start does not flood the upload queue and the backend.
    func compactIfLooping(_ event: [String: Any], id: String) -> [String: Any] {
        guard var properties = event["properties"] as? [String: Any],
            let fingerprint = properties["crash_fingerprint"] as? String,
            let time = (event["time"] as? NSNumber)?.int64Value,
            let seen = try? store.noteCrash(
                fingerprint: fingerprint, eventID: id, timeMilliseconds: time, window: crashLoopWindowMilliseconds)
        else { return event }
        properties["crash_repeat_count"] = seen.count
        var compacted = event
        guard seen.count > crashLoopThreshold else {
            compacted["properties"] = properties
            return compacted
        }
        properties["crash_compact"] = true
        properties["crash_first_time"] = seen.firstMilliseconds
        properties["crash_breadcrumbs"] = nil
        properties["app_crashed_reason"] =
            (properties["crash_title"] as? String ?? "crash") + " (repeated \(seen.count) times since "
            + "\(seen.firstMilliseconds); stacks left out of repeats)"
        compacted["properties"] = properties
        compacted["crash"] = nil
        return compacted
    }

    /// Symbolicated frames into the event: names on each frame, and a readable reason.
    func enrich(_ event: [String: Any], report: CrashReport, breadcrumbs: [String] = []) -> [String: Any] {
        var event = event
        let symbols = symbolicator.symbolicate(report)
        var crash = event["crash"] as? [String: Any] ?? [:]
        var frames = Array((crash["frames"] as? [[String: Any]] ?? []).prefix(CrashReport.maximumFrames))
        for index in frames.indices where index < symbols.count {
            let symbol = symbols[index]
            frames[index]["module_name"] = symbol.module
            if let function = symbol.function { frames[index]["function"] = function }
            if let within = symbol.offsetInFunction { frames[index]["function_offset"] = within }
            if let note = symbol.note { frames[index]["symbol_note"] = note }
            if let file = symbol.file { frames[index]["file"] = file }
            if let line = symbol.line { frames[index]["line"] = line }
        }
        crash["frames"] = frames
        // Every other thread's frames, named the same way: an analyst reading the event sees a
        // deadlock without the crash file.
        if var threads = crash["threads"] as? [[String: Any]] {
            for (index, thread) in report.threads.enumerated() where index < threads.count && !thread.crashed {
                let named = symbolicator.symbolicate(thread, in: report)
                threads[index]["frames"] = zip(thread.frames, named).map { frame, symbol in
                    Self.frameObject(pc: frame.pc, offset: frame.offset, symbol: symbol)
                }
            }
            crash["threads"] = threads
        }
        crash["symbolicated"] = true
        event["crash"] = crash
        var properties = event["properties"] as? [String: Any] ?? [:]
        if let timing = report.timing {
            properties["crash_handler_total_ms"] = Double(timing.handlerNanoseconds) / 1e6
            properties["crash_fdatasync_ms"] = Double(timing.fdatasyncNanoseconds) / 1e6
        }
        properties["app_crashed_reason"] = Self.reason(report: report, symbols: symbols)
        let signal = report.signalName ?? "crash"
        properties["crash_fingerprint"] = CrashFingerprint.fingerprint(
            signal: signal, symbols: symbols, frames: report.frames)
        properties["crash_title"] = CrashFingerprint.title(signal: signal, symbols: symbols, frames: report.frames)
        if !breadcrumbs.isEmpty { properties["crash_breadcrumbs"] = breadcrumbs }
        if let type = report.exceptionType {
            properties["crash_exception_type_demangled"] = Demangler.demangleCxxType(type)
        }
        event["properties"] = properties
        return event
    }

    /// `linkageNames`: also the names as the binary spells them, for tools that compare.
    package static func frameObject(
        pc: UInt64, offset: UInt64?, symbol: Symbolicator.Symbol, linkageNames: Bool = false
    ) -> [String: Any] {
        var object: [String: Any] = ["pc": "0x" + String(pc, radix: 16), "module_name": symbol.module]
        if let offset { object["offset"] = "0x" + String(offset, radix: 16) }
        if let function = symbol.function { object["function"] = function }
        if linkageNames, let linkage = symbol.linkageName { object["linkage_name"] = linkage }
        if let within = symbol.offsetInFunction { object["function_offset"] = within }
        object.merge(sourceObject(file: symbol.file, line: symbol.line, column: symbol.column)) { $1 }
        if !symbol.inlined.isEmpty {
            // Innermost first, as a debugger prints them, each positioned where it was reached.
            object["inlined"] = symbol.inlined.map { frame -> [String: Any] in
                var entry = sourceObject(file: frame.file, line: frame.line, column: frame.column)
                if let function = frame.function { entry["function"] = function }
                if linkageNames, let linkage = frame.linkageName { entry["linkage_name"] = linkage }
                return entry
            }
        }
        return object
    }

    static func sourceObject(file: String?, line: Int?, column: Int?) -> [String: Any] {
        var object: [String: Any] = [:]
        if let file { object["file"] = file }
        if let line { object["line"] = line }
        if let column { object["column"] = column }
        return object
    }

    /// The first lines of the handler's own text (signal, thread, message), then named frames,
    /// cut at 16 KiB like the Sensors SDKs' app_crashed_reason.
    static func reason(report: CrashReport, symbols: [Symbolicator.Symbol]) -> String {
        let original = report.reason ?? ""
        var lines = original.split(separator: "\n", omittingEmptySubsequences: false).prefix { !$0.hasPrefix("#") }
            .map(String.init)
        for (index, frame) in report.frames.enumerated() {
            let symbol = index < symbols.count ? symbols[index] : Symbolicator.Symbol(module: "???")
            var line = "#\(index) 0x" + String(frame.pc, radix: 16) + " " + symbol.module
            for inlined in symbol.inlined {
                lines.append(
                    line + " [inlined] " + (inlined.function ?? "?") + (inlined.location.map { " at " + $0 } ?? ""))
            }
            if let function = symbol.function {
                line += " " + function + " + \(symbol.offsetInFunction ?? 0)"
                if let location = symbol.source.location { line += " at " + location }
            } else if let offset = frame.offset {
                line += " +0x" + String(offset, radix: 16)
            }
            lines.append(line)
        }
        var text = lines.joined(separator: "\n")
        if text.utf8.count > 16 * 1024 {
            text = String(decoding: Array(text.utf8.prefix(16 * 1024 - 20)), as: UTF8.self) + "\n[truncated]"
        }
        return text
    }

    private func moveAside(_ name: String, problems: [CrashFileProblem]) -> String? {
        guard let folder else { return nil }
        return PrivateFiles.moveAside(
            name, in: folder, note: problems.map { "offset \($0.offset): \($0.reason)" }.joined(separator: "\n") + "\n")
    }
}
