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
        /// Imported, but kept in place: `archive/` could not take it (a link, not a folder).
        package var notArchived: String?
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
        let names = folder.names().filter(CrashFileLayout.isCrashFileName)
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
        Summary(files: replay(pendingFiles(), progress: progress))
    }

    /// Files in the order given. Reading, checking, symbolicating and encoding go on for several
    /// files at once, one per core; storing, crash-loop counting and removing go one file at a
    /// time, in order, on this thread, while the next files are being prepared.
    /// `deadlineUptime` (`ProcessInfo.systemUptime` seconds): no file is begun after it (those
    /// left are not in the results).
    package func replay(
        _ paths: [String], deadlineUptime deadline: Double? = nil, progress: ((Int, Int) -> Void)? = nil
    )
        -> [FileResult]
    {
        var results: [FileResult] = []
        results.reserveCapacity(paths.count)
        // A few at a time under a deadline, so that it is looked at often.
        let chunkSize = deadline == nil ? 32 : 4
        var ready: [PreparedFile] = []
        var start = 0
        while start < paths.count || !ready.isEmpty {
            let pastDeadline = deadline.map { ProcessInfo.processInfo.systemUptime >= $0 } ?? false
            let chunk = pastDeadline ? [] : Array(paths[start..<min(start + chunkSize, paths.count)])
            if pastDeadline { start = paths.count }
            start += chunk.count
            let next = ParallelResults<PreparedFile>()
            let preparing = DispatchGroup()
            if !chunk.isEmpty {
                DispatchQueue.global().async(group: preparing) {
                    next.values = Self.parallelMap(chunk.count) { prepare(chunk[$0], breadcrumbs: []) }
                }
            }
            if !ready.isEmpty {
                results += store(&ready)
                progress?(results.count, paths.count)
            }
            preparing.wait()
            ready = next.values
        }
        return results
    }

    /// `breadcrumbs`: the session's last events and breadcrumbs, from its session file, for the
    /// $AppCrashed; `contextJSON`: the context the app set (one JSON object), from the same.
    package func replay(_ path: String, breadcrumbs: [String] = [], contextJSON: String? = nil) -> FileResult {
        var prepared = [prepare(path, breadcrumbs: breadcrumbs, contextJSON: contextJSON)]
        return store(&prepared)[0]
    }

    /// A crash file read, checked and symbolicated, its events not yet stored. Its descriptor,
    /// and with it the lock, is held until it is stored.
    struct PreparedFile {
        var result: FileResult
        var name: String
        var file: FileHandle?
        /// The events to store; crash-loop counting may still compact an `$AppCrashed`, so they
        /// are encoded when stored.
        var events: [(id: String, event: [String: Any])] = []
        /// The stacks record's payload (every thread's registers and stack), kept with the crash's
        /// report so that `crashcap export` makes its minidump after the file is gone.
        var stacks: [UInt8]?
        /// Decided already (unreadable, live): nothing to store, nothing to remove.
        var finished = false
    }

    /// Values made on another thread and read after it is waited for (a dispatch group orders
    /// the two): hence `@unchecked`.
    final class ParallelResults<Value>: @unchecked Sendable {
        var values: [Value] = []
    }

    /// `transform` of 0..<count, as many at once as there are cores, in order.
    static func parallelMap<Value>(_ count: Int, _ transform: (Int) -> Value) -> [Value] {
        let slots = UnsafeMutableBufferPointer<Value?>.allocate(capacity: count)
        slots.initialize(repeating: nil)
        defer {
            slots.deinitialize()
            slots.deallocate()
        }
        // Each index is written by one worker only, and `transform` reads what the caller
        // no longer changes while this runs.
        nonisolated(unsafe) let shared = slots
        nonisolated(unsafe) let transform = transform
        DispatchQueue.concurrentPerform(iterations: count) { shared[$0] = transform($0) }
        return slots.map { $0! }
    }

    func prepare(_ path: String, breadcrumbs: [String], contextJSON: String? = nil) -> PreparedFile {
        let name = (path as NSString).lastPathComponent
        var prepared = PreparedFile(result: FileResult(path: path, outcome: .imported), name: name)
        // One descriptor, locked for the whole import: a named crash file still locked belongs to
        // a live process (filesystems without O_TMPFILE), and two replays never take the same file.
        let fd: Int32
        do {
            guard let folder else { throw CrashCaptureError.io(openProblem ?? "cannot open", path: directory) }
            fd = try folder.openForReading(name)
        } catch {
            // A link, a FIFO, a directory under a crash file's name: reported, never moved or read.
            prepared.result.outcome = .damaged
            prepared.result.problems = [CrashFileProblem(offset: 0, reason: "\(error)")]
            prepared.finished = true
            return prepared
        }
        let file = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
        prepared.file = file
        let contents: CrashFileContents
        do {
            if flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK {
                prepared.result.outcome = .skippedLive
                prepared.finished = true
                return prepared
            }
            contents = try CrashFileReader.read(file)
        } catch {
            prepared.result.outcome = .damaged
            prepared.result.problems = [CrashFileProblem(offset: 0, reason: "\(error)")]
            prepared.result.movedTo = moveAside(name, problems: prepared.result.problems)
            prepared.finished = true
            return prepared
        }
        let report = CrashReport(path: path, contents: contents)
        prepared.stacks = report.stacks != nil ? contents.stacks : nil
        prepared.result.problems = report.problems
        if contents.records.isEmpty && contents.problems.isEmpty {
            prepared.result.problems.append(
                CrashFileProblem(
                    offset: 0, reason: "no records at all: an empty or zero-filled file, not a crash report"))
        }
        var info = stat()
        let modified =
            fstat(fd, &info) == 0 ? Int64(info.st_mtim.tv_sec) * 1000 + Int64(info.st_mtim.tv_nsec) / 1_000_000 : 0
        for var event in report.events {
            if let problem = Self.keepTimesKnown(&event, fileModified: max(0, modified)) {
                prepared.result.problems.append(CrashFileProblem(offset: 0, reason: problem))
            }
            guard let id = event["event_id"] as? String, !id.isEmpty else {
                prepared.result.problems.append(
                    CrashFileProblem(offset: 0, reason: "an event without event_id was skipped"))
                continue
            }
            if event["event"] as? String == "$AppHang" {
                prepared.events.append((id, enrichHang(event, report: report)))
                continue
            }
            guard event["event"] as? String == "$AppCrashed" else {
                prepared.events.append((id, event))
                continue
            }
            prepared.events.append(
                (id, enrich(event, report: report, breadcrumbs: breadcrumbs, contextJSON: contextJSON)))
        }
        return prepared
    }

    /// A time no clock gives (negative, or not a number) is not stored: the event takes the
    /// file's last modification, the latest it can have happened, and says so (`time_from`);
    /// a negative `$event_duration` becomes 0. What was wrong, for the note; nil when nothing.
    static func keepTimesKnown(_ event: inout [String: Any], fileModified: Int64) -> String? {
        var problems: [String] = []
        var properties = event["properties"] as? [String: Any] ?? [:]
        let time = event["time"] as? NSNumber
        if time == nil || time!.doubleValue < 0 || !time!.doubleValue.isFinite {
            problems.append("\(event["event"] ?? "an event") has time \(time.map { "\($0)" } ?? "none")")
            event["time"] = NSNumber(value: fileModified)
            properties["time_from"] = "file_mtime"
        }
        if let duration = properties["$event_duration"] as? NSNumber,
            duration.doubleValue < 0 || !duration.doubleValue.isFinite
        {
            problems.append("\(event["event"] ?? "an event") has $event_duration \(duration)")
            properties["$event_duration"] = NSNumber(value: 0)
        }
        guard !problems.isEmpty else { return nil }
        event["properties"] = properties
        return problems.joined(separator: "; ") + ": the file's last modification is used"
    }

    /// Stores the files' events in one transaction, then removes (or archives, or moves aside)
    /// each file whose events are committed. When the store cannot take them, every file stays
    /// for the next replay.
    /// The files' events are let go of as they are encoded (`files` keeps the rest): a crash's
    /// event, as dictionaries, can take many times the memory of its text.
    func store(_ files: inout [PreparedFile]) -> [FileResult] {
        var results = files.map(\.result)
        do {
            try store.transaction { transaction in
                // Crash loops are counted in order; the events, once decided, are encoded side
                // by side (most of a stored file's time), then inserted in order.
                var decided = try files.map { file in
                    try file.events.map { id, event in
                        (
                            id,
                            event["event"] as? String == "$AppCrashed"
                                ? try compactIfLooping(event, id: id, in: transaction) : event
                        )
                    }
                }
                for index in files.indices { files[index].events = [] }
                let crashes = decided.map { events in
                    Set(events.filter { $0.1["event"] as? String == "$AppCrashed" }.map(\.0))
                }
                let encoded = Self.parallelMap(decided.count) { index in
                    decided[index].map { id, event in (id: id, payload: JSONTree.encodedBytes(event)) }
                }
                decided = []
                for (index, file) in files.enumerated() where !file.finished {
                    let rows = encoded[index]
                    let inserted = try transaction.insert(bytes: rows, rememberIDs: true)
                    results[index].importedEvents = inserted.inserted
                    // Each crash's report stays readable (`crashcap show`) after its event is
                    // uploaded and deleted: the history keeps it as it was imported.
                    for row in rows where crashes[index].contains(row.id) {
                        try transaction.keepCrashReport(eventID: row.id, bytes: row.payload, stacks: file.stacks)
                    }
                    if rows.isEmpty {
                        results[index].outcome = results[index].problems.isEmpty ? .noCrash : .damaged
                    } else if inserted.inserted == 0 {
                        results[index].outcome = .alreadyImported
                    }
                }
            }
        } catch {
            for index in files.indices where !files[index].finished {
                results[index].outcome = .damaged
                results[index].importedEvents = 0
                results[index].problems.append(CrashFileProblem(offset: 0, reason: "event store: \(error)"))
            }
            return results
        }
        for (index, file) in files.enumerated() where !file.finished {
            defer { withExtendedLifetime(file.file) {} }
            if !results[index].problems.isEmpty {
                // Whatever was whole is imported, but part of the file was not: that is damage,
                // and it is counted (and reflected in the exit status) as such.
                results[index].outcome = .damaged
                results[index].movedTo = moveAside(file.name, problems: results[index].problems)
            } else if archive {
                results[index].movedTo = folder.flatMap { PrivateFiles.move(file.name, in: $0, into: "archive") }
                if results[index].movedTo == nil {
                    results[index].notArchived =
                        "archive/ is not a private folder of the directory (a link, or not a folder), or refused the file"
                }
            } else {
                folder?.remove(file.name)
            }
        }
        return results
    }

    /// One crash of many of the same site in a short time: its count and times are kept, its
    /// stacks, registers, memory and breadcrumbs dropped, so that a program crashing at every
    /// start does not flood the upload queue and the backend.
    func compactIfLooping(_ event: [String: Any], id: String, in transaction: EventStore.Transaction) throws
        -> [String: Any]
    {
        guard var properties = event["properties"] as? [String: Any],
            let fingerprint = properties["crash_fingerprint"] as? String,
            let time = (event["time"] as? NSNumber)?.int64Value
        else { return event }
        let seen = try transaction.noteCrash(
            fingerprint: fingerprint, eventID: id, timeMilliseconds: time, window: crashLoopWindowMilliseconds)
        try transaction.noteCrashInHistory(
            CrashHistoryEntry(
                eventID: id, timeMilliseconds: time, signal: properties["crash_signal_name"] as? String ?? "?",
                title: properties["crash_title"] as? String ?? "?", fingerprint: fingerprint,
                appVersion: properties["$app_version"] as? String ?? ""))
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
    func enrich(_ event: [String: Any], report: CrashReport, breadcrumbs: [String] = [], contextJSON: String? = nil)
        -> [String: Any]
    {
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
        // The task's [async] callers, named like any frame; a chain the symbolicator cannot
        // confirm (its frame's function is not async) was a word that only looked like one.
        let asyncSymbols = symbolicator.symbolicateAsyncFrames(of: report)
        crash["async_owner"] = nil
        if asyncSymbols.isEmpty {
            crash["async_frames"] = nil
        } else {
            crash["async_frames"] = zip(report.asyncFrames, asyncSymbols).map { frame, symbol in
                Self.frameObject(pc: frame.pc, offset: frame.offset, symbol: symbol, linkageNames: false)
            }
        }
        // The attached files' tails, as text for the analyst instead of the crash path's base64.
        if let attachments = crash["attachments"] as? [[String: Any]] {
            crash["attachments"] = attachments.map { attachment -> [String: Any] in
                var attachment = attachment
                if let encoded = attachment.removeValue(forKey: "base64") as? String,
                    let data = Data(base64Encoded: encoded)
                {
                    attachment["text"] = String(decoding: data, as: UTF8.self)
                }
                return attachment
            }
        }
        // Every other thread's frames, named the same way: an analyst reading the event sees a
        // deadlock without the crash file.
        if let threads = crash["threads"] as? [[String: Any]] {
            crash["threads"] = namedThreads(threads, report: report)
        }
        crash["symbolicated"] = true
        event["crash"] = crash
        var properties = event["properties"] as? [String: Any] ?? [:]
        if let timing = report.timing {
            properties["crash_handler_total_ms"] = Double(timing.handlerNanoseconds) / 1e6
            properties["crash_fdatasync_ms"] = Double(timing.fdatasyncNanoseconds) / 1e6
        }
        properties["app_crashed_reason"] = Self.reason(report: report, symbols: symbols)
        let summary = symbolicator.summary(of: report, symbols: symbols)
        properties["crash_fingerprint"] = summary.fingerprint
        properties["crash_fingerprint_version"] = CrashFingerprint.version
        properties["crash_title"] = summary.title
        if let reason = summary.reason { properties["crash_message"] = String(reason.prefix(1024)) }
        if !breadcrumbs.isEmpty { properties["crash_breadcrumbs"] = breadcrumbs }
        if let context = contextJSON.flatMap({ JSONTree.object(Array($0.utf8)) }), !context.isEmpty {
            properties["crash_context"] = context
        }
        if let type = report.exceptionType {
            properties["crash_exception_type_demangled"] = Demangler.demangleCxxType(type)
        }
        event["properties"] = properties
        return event
    }

    /// Each thread's frames (but the crashing one's, which are the report's own) and [async]
    /// callers as frame objects with names. A thread's frames are kept as their JSON text: as
    /// dictionaries, a report of 513 threads of 128 frames took hundreds of MB to replay.
    func namedThreads(_ threads: [[String: Any]], report: CrashReport) -> [[String: Any]] {
        var threads = threads
        for (index, thread) in report.threads.enumerated() where index < threads.count && !thread.crashed {
            let named = symbolicator.symbolicate(thread, in: report)
            threads[index]["frames"] = JSONTree.Encoded(
                zip(thread.frames, named).map { frame, symbol in
                    Self.frameObject(pc: frame.pc, offset: frame.offset, symbol: symbol)
                } as [Any])
            let asyncNamed = symbolicator.symbolicateAsyncFrames(of: thread, in: report)
            threads[index]["async_owner"] = nil
            threads[index]["async_frames"] =
                asyncNamed.isEmpty
                ? nil
                : zip(thread.asyncFrames, asyncNamed).map { frame, symbol in
                    Self.frameObject(pc: frame.pc, offset: frame.offset, symbol: symbol)
                }
        }
        return threads
    }

    /// A hang report's `$AppHang`: every thread's frames named; a reason that shows the hung
    /// thread's stack and any deadlock; a title and fingerprint from the hung thread's stack, as
    /// a crash's come from the crashing thread's.
    func enrichHang(_ event: [String: Any], report: CrashReport) -> [String: Any] {
        var event = event
        var hang = event["hang"] as? [String: Any] ?? [:]
        var properties = event["properties"] as? [String: Any] ?? [:]
        if let threads = hang["threads"] as? [[String: Any]] {
            hang["threads"] = namedThreads(threads, report: report)
        }
        hang["symbolicated"] = true
        let watch = properties["hang_watch"] as? String ?? "?"
        let threshold = (properties["hang_threshold_ms"] as? NSNumber)?.intValue ?? 0
        let stalled = (properties["hang_stalled_ms"] as? NSNumber)?.intValue ?? 0
        var lines = ["watch \"\(watch)\" missed its \(threshold) ms threshold (no beat for \(stalled) ms)"]
        lines += report.deadlockLines.map { "deadlock: " + $0 }
        let signal = (properties["hang_deadlock"] as? Bool ?? false) ? "Deadlock" : "Hang"
        if let hung = report.hungThread {
            let symbols = symbolicator.symbolicate(hung, in: report)
            lines.append(
                "thread \(hung.tid) \"\(hung.name)\"\(hung.tid == (properties["$pid"] as? NSNumber)?.intValue ? " (main)" : "")"
            )
            for (index, symbol) in symbols.prefix(32).enumerated() {
                var line =
                    "#\(index) \(symbol.function ?? "0x" + String(hung.frames[index].pc, radix: 16)) (\(symbol.module))"
                if let file = symbol.file { line += " \(file)" + (symbol.line.map { ":\($0)" } ?? "") }
                lines.append(line)
            }
            let summary = symbolicator.summary(ofHung: hung, in: report, signal: signal)
            properties["hang_fingerprint"] = summary.fingerprint
            properties["hang_fingerprint_version"] = CrashFingerprint.version
            properties["hang_title"] = summary.title
        } else {
            properties["hang_title"] = signal + ": watch " + watch
        }
        properties["app_hang_reason"] = lines.joined(separator: "\n")
        event["properties"] = properties
        event["hang"] = hang
        return event
    }

    private func moveAside(_ name: String, problems: [CrashFileProblem]) -> String? {
        guard let folder else { return nil }
        return PrivateFiles.moveAside(
            name, in: folder, note: problems.map { "offset \($0.offset): \($0.reason)" }.joined(separator: "\n") + "\n")
    }
}
