internal import CCrashCapture
internal import CrashFileFormat
public import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// How the app's previous run in this capture directory ended, as far as a crash goes: known
/// right after ``CrashCapture/install(_:)``, before the import of that run's report (which
/// runs on a queue of its own) is done. An app can then act on a crash loop at its start: skip
/// the step that crashed, or ask the user to report it.
public struct LastRun: Sendable, Equatable {
    /// Whether the previous run ended in a crash that this start is the first to see.
    public var crashed: Bool
    /// The crash's signal (`SIGSEGV`), when it crashed.
    public var signal: String?
    /// What crashed: the symbolicated title once the report was imported (`SIGSEGV in
    /// MyApp.Parser.read(_:)`), else the Swift runtime's message, the C++ exception, or the
    /// crashing module and offset.
    public var title: String?
    /// When it crashed.
    public var crashTime: Date?
    /// Crashes in a row since the last run that ended normally: 0 after a normal end, 1 after
    /// one crash, 2 when the run before crashed too. A run killed by SIGKILL neither adds to
    /// it nor resets it.
    public var consecutiveCrashes: Int
}

extension CrashCapture {
    /// How the previous run ended (see ``LastRun``); nil when not installed.
    public static var lastRun: LastRun? { state.withLock { state.pipeline != nil ? state.lastRun : nil } }

    /// `<directory>/last_run`: `{"clean_end_ms":…,"counted_crash_ms":…,"consecutive":…}`.
    static let lastRunFile = "last_run"

    /// The newest crash the directory knows of (a crash file not yet imported, or the store's
    /// crash history), against what the last normal end and the last start recorded.
    static func determineLastRun(directory: String, store: EventStore?, ownSessionID: String) -> LastRun {
        let saved = PrivateFiles.readSmall(directory + "/" + lastRunFile).flatMap { JSONTree.object($0) } ?? [:]
        func number(_ key: String) -> Int64 { (saved[key] as? NSNumber)?.int64Value ?? 0 }
        let cleanEnd = number("clean_end_ms")
        let counted = number("counted_crash_ms")
        let consecutive = Int(number("consecutive"))
        var newest: (time: Int64, signal: String, title: String)?
        if let imported = try? store?.crashHistory(limit: 1).first {
            newest = (imported.timeMilliseconds, imported.signal, imported.title)
        }
        if let pending = newestPendingCrash(directory: directory, excluding: ownSessionID),
            pending.time > newest?.time ?? Int64.min
        {
            newest = pending
        }
        var lastRun = LastRun(crashed: false, consecutiveCrashes: consecutive)
        if let newest, newest.time > max(cleanEnd, counted) {
            lastRun = LastRun(
                crashed: true, signal: newest.signal, title: newest.title,
                crashTime: Date(timeIntervalSince1970: Double(newest.time) / 1000),
                consecutiveCrashes: newest.time > cleanEnd ? consecutive + 1 : 1)
            writeLastRun(directory, cleanEnd: cleanEnd, counted: newest.time, consecutive: lastRun.consecutiveCrashes)
        } else if cleanEnd > counted {
            lastRun.consecutiveCrashes = 0
        }
        return lastRun
    }

    /// A normal end: the crashes in a row start again from zero.
    static func noteCleanEnd(directory: String) {
        let saved = PrivateFiles.readSmall(directory + "/" + lastRunFile).flatMap { JSONTree.object($0) } ?? [:]
        let counted = (saved["counted_crash_ms"] as? NSNumber)?.int64Value ?? 0
        writeLastRun(directory, cleanEnd: wallMilliseconds(), counted: counted, consecutive: 0)
    }

    private static func writeLastRun(_ directory: String, cleanEnd: Int64, counted: Int64, consecutive: Int) {
        let text = "{\"clean_end_ms\":\(cleanEnd),\"counted_crash_ms\":\(counted),\"consecutive\":\(consecutive)}"
        _ = PrivateFiles.write(Array(text.utf8), to: directory + "/" + lastRunFile)
    }

    /// The newest crash file of a process that is gone (its lock is free) holding a crash: its
    /// time, signal and a title that needs no symbolication. Only the newest file is read.
    static func newestPendingCrash(directory: String, excluding sessionID: String) -> (
        time: Int64, signal: String, title: String
    )? {
        guard let folder = try? CaptureDirectory(directory) else { return nil }
        let own = CrashFileLayout.filePrefix + sessionID + "." + CrashFileLayout.fileExtension
        var candidates: [(name: String, modified: Int)] = []
        for name in folder.names() where CrashFileLayout.isCrashFileName(name) && name != own {
            var info = stat()
            guard fstatat(folder.fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0, info.st_mode & S_IFMT == S_IFREG
            else { continue }
            candidates.append((name, info.st_mtim.tv_sec * 1_000_000_000 + info.st_mtim.tv_nsec))
        }
        for candidate in candidates.sorted(by: { $0.modified > $1.modified }).prefix(4) {
            guard let fd = try? folder.openForReading(candidate.name) else { continue }
            let handle = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
            // Locked: a live process's file, with no crash in it.
            if flock(fd, LOCK_SH | LOCK_NB) != 0 { continue }
            guard let contents = try? CrashFileReader.read(handle) else { continue }
            let report = CrashReport(path: folder.path(of: candidate.name), contents: contents)
            guard let crashed = report.crashed, let time = (crashed["time"] as? NSNumber)?.int64Value else { continue }
            let signal = report.signalName ?? "crash"
            var title = signal
            if let message = report.swiftMessage?.trimmingCharacters(in: .whitespacesAndNewlines), !message.isEmpty {
                title += ": " + message
            } else if let type = report.exceptionType {
                title += ": " + type
            } else if let top = report.frames.first, let index = top.module, index < report.modules.count,
                let offset = top.offset
            {
                let module = (report.modules[index].path as NSString).lastPathComponent
                title += " at \(module)+0x" + String(offset, radix: 16)
            }
            return (time, signal, title)
        }
        return nil
    }
}
