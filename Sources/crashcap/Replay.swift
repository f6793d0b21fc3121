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

/// The options every command that works on a capture directory shares.
struct DirectoryOptions: ParsableArguments {
    @Argument(help: "The capture directory (crash files and events.sqlite).")
    var directory: String

    @Option(help: "The event store (default: DIRECTORY/events.sqlite).")
    var store: String?

    func openStore() throws -> EventStore { try Self.openStore(directory: directory, store: store) }

    /// The store of a capture directory (`store`, or DIRECTORY/events.sqlite), with clear errors.
    static func openStore(directory: String, store: String? = nil) throws -> EventStore {
        try Crashcap.requireUTF8Path(directory)
        try store.map(Crashcap.requireUTF8Path)
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw Crashcap.fail("not a directory: \(directory)", code: 66)
        }
        do {
            let opened = try EventStore(path: store ?? directory + "/events.sqlite")
            if let notice = opened.movedAsideNotice {
                FileHandle.standardError.write(Data("crashcap: \(notice)\n".utf8))
            }
            return opened
        } catch {
            throw Crashcap.fail("cannot open the event store: \(error)", code: 74)
        }
    }
}

struct UploadTarget: ParsableArguments {
    @Option(
        name: .customLong("upload"), help: "Upload pending events to this ingest URL (or set CRASHCAPTURE_SERVER_URL).")
    var url: String?

    @Option(
        help: ArgumentHelp(
            "Upload pending events as OpenTelemetry logs (OTLP/HTTP, protobuf, gzip) to this URL instead; /v1/logs is added to a URL without a path.",
            valueName: "url"))
    var otlp: String?

    @Option(
        name: .customLong("header"),
        help: ArgumentHelp(
            "A header every upload request carries, as 'Name: value' (repeatable): an OTLP backend's API key, say. With --otlp and none given, OTEL_EXPORTER_OTLP_LOGS_HEADERS or OTEL_EXPORTER_OTLP_HEADERS.",
            valueName: "header"))
    var headers: [String] = []

    @Option(
        help: ArgumentHelp(
            "Also send each crash as a minidump (multipart/form-data, upload_file_minidump) to this URL: Sentry's minidump endpoint (with ?sentry_key=), BugSplat's or Backtrace's. Each crash is sent once.",
            valueName: "url"))
    var minidumpURL: String?

    @Flag(help: "Allow plain http to a host that is not this machine.")
    var allowInsecureHTTP = false

    @Option(help: "Give up on uploading after this many seconds.")
    var uploadTimeout: Double = 60

    func validate() throws {
        if url != nil && otlp != nil {
            throw ValidationError("--upload sends the Sensors Analytics format and --otlp OpenTelemetry logs: give one")
        }
        _ = try uploadHeaders()
    }

    /// `--header` as given, or OpenTelemetry's variables for --otlp.
    func uploadHeaders() throws -> [String: String] {
        if headers.isEmpty { return otlp != nil ? Uploader.otlpHeadersFromEnvironment() : [:] }
        var parsed: [String: String] = [:]
        for header in headers {
            guard let colon = header.firstIndex(of: ":") else {
                throw ValidationError("--header \"\(header)\" is not 'Name: value'")
            }
            parsed[String(header[..<colon]).trimmingCharacters(in: .whitespaces)] =
                String(header[header.index(after: colon)...]).trimmingCharacters(in: .whitespaces)
        }
        return parsed
    }

    /// The options every upload of the CLI uses.
    func uploadOptions() throws -> UploadOptions {
        var options = UploadOptions()
        options.allowInsecureHTTP = allowInsecureHTTP
        options.headers = try uploadHeaders()
        return options
    }

    var format: UploadFormat { otlp != nil ? .openTelemetryLogs : .sensorsAnalytics }

    var endpoint: URL? {
        get throws {
            guard let text = otlp ?? url ?? ProcessInfo.processInfo.environment["CRASHCAPTURE_SERVER_URL"],
                !text.isEmpty
            else {
                return nil
            }
            guard let parsed = URL(string: text), parsed.host != nil else {
                throw Crashcap.fail("not a URL: \(text)", code: 64)
            }
            return parsed
        }
    }

    var minidumpEndpoint: URL? {
        get throws {
            guard let text = minidumpURL, !text.isEmpty else { return nil }
            guard let parsed = URL(string: text), parsed.host != nil else {
                throw Crashcap.fail("not a URL: \(text)", code: 64)
            }
            return parsed
        }
    }

    func minidumpUploader(_ store: EventStore) throws -> MinidumpUploader? {
        guard let endpoint = try minidumpEndpoint else { return nil }
        do {
            let uploader = try MinidumpUploader(endpoint: endpoint, store: store, options: try uploadOptions())
            uploader.onRetry = { failures, reason, delay in
                FileHandle.standardError.write(
                    Data(
                        ("crashcap: minidump upload attempt \(failures) failed (\(reason)); trying again in "
                            + String(format: "%.1f s", delay) + "\n").utf8))
            }
            return uploader
        } catch {
            throw Crashcap.fail("\(error)", code: 64)
        }
    }

    /// Sends each crash not sent yet as a minidump; the receiver's id of each is printed.
    /// Whether none is left.
    func sendMinidumps(with uploader: MinidumpUploader, timeout: Double? = nil, quiet: Bool = false) -> Bool {
        let result = uploader.sendPending(deadline: Date().addingTimeInterval(timeout ?? uploadTimeout))
        for (id, answer) in result.sent {
            let line =
                "minidump of \(id) sent to \(Uploader.redacted(uploader.endpoint)): event id \(answer ?? "(none given)")"
            if quiet { FileHandle.standardError.write(Data((line + "\n").utf8)) } else { print(line) }
        }
        if result.refused > 0 {
            FileHandle.standardError.write(
                Data("crashcap: \(result.refused) minidumps refused for good: \(result.lastError ?? "")\n".utf8))
        }
        if result.pending > 0 {
            FileHandle.standardError.write(
                Data(
                    "crashcap: \(result.pending) minidumps still to send: \(result.lastError ?? "time ran out")\n".utf8)
            )
        }
        return result.pending == 0
    }

    /// Sends everything pending; returns whether the store is empty afterwards. `quiet`: the
    /// summary lines go to stderr, for a stdout that holds JSON only.
    func upload(_ store: EventStore, to endpoint: URL, quiet: Bool = false) throws -> Bool {
        func say(_ line: String) {
            if quiet {
                FileHandle.standardError.write(Data((line + "\n").utf8))
            } else {
                print(line)
            }
        }
        let uploader: Uploader
        do {
            uploader = try Uploader(endpoint: endpoint, store: store, options: try uploadOptions(), format: format)
        } catch {
            throw Crashcap.fail("\(error)", code: 64)
        }
        let before = store.count
        // A server that is down must not make the tool look hung: a line per failed attempt.
        uploader.onRetry = { failures, reason, delay in
            FileHandle.standardError.write(
                Data(
                    ("crashcap: upload attempt \(failures) failed (\(reason)); trying again in "
                        + String(format: "%.1f s", delay) + "\n").utf8))
        }
        uploader.flushNow(deadline: Date().addingTimeInterval(uploadTimeout))
        let stats = uploader.statistics
        say("uploaded \(stats.acceptedEvents) of \(before) events to \(Uploader.redacted(uploader.endpoint))")
        func warn(_ line: String) { FileHandle.standardError.write(Data("crashcap: \(line)\n".utf8)) }
        if stats.refusedByReceiver > 0 {
            warn(
                "the receiver refused \(stats.refusedByReceiver) records of the batches it took (not sent again): \(stats.lastError ?? "")"
            )
        }
        if stats.splitBatches > 0 {
            say("\(stats.splitBatches) batches were too large (413) and sent again in halves")
        }
        if stats.rejectedEvents > 0 {
            warn(
                "\(stats.rejectedEvents) events were refused by the server and set aside in rejected_events: \(stats.lastError ?? "")"
            )
            throw ExitCode(65)
        }
        if store.count > 0 {
            warn("\(store.count) events still pending: \(stats.lastError ?? "time ran out")")
            return false
        }
        return true
    }
}

extension Crashcap {
    struct Replay: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Import the crash files in a directory into its event store, then upload.",
            discussion: """
                Sessions of processes that are gone without a clean end are closed first: what their \
                journals hold is imported exactly once, and each gets one $AppEnd (reason killed, oom_kill \
                or reboot) unless a crash file gives it one. Each crash file's records are verified, its \
                stack symbolicated (the session's last events attached as breadcrumbs), and its events \
                stored exactly once; the file is then deleted (or archived). Damaged files go to \
                DIRECTORY/damaged with a note of what was wrong where. Exit status 65 when any file was \
                damaged, 75 when events are left unsent.
                """)

        @OptionGroup var options: DirectoryOptions
        @OptionGroup var target: UploadTarget
        @OptionGroup var symbols: SymbolOptions

        @Flag(help: "Keep imported crash files in DIRECTORY/archive instead of deleting them.")
        var archive = false

        @Flag(help: "Print the outcome per file as JSON.")
        var json = false

        mutating func run() throws {
            let store = try options.openStore()
            let endpoint = try target.endpoint
            var replayer = CrashReplayer(
                directory: options.directory, store: store, symbolicator: try symbols.symbolicator())
            replayer.archive = archive
            let recovery = SessionRecovery(replayer: replayer)
            let bar = ProgressBar(enabled: !json && isatty(STDERR_FILENO) == 1)
            let recovered = recovery.recoverAll { done, total in bar.update(done, of: total) }
            bar.finish()
            var summary = recovered.crashFiles
            summary.files += recovered.sessions.compactMap(\.crashFile)
            summary.files.sort { $0.path < $1.path }
            let damagedSessions = recovered.sessions.filter { $0.outcome == .damaged }
            if json {
                let files = summary.files.map { file -> [String: Any] in
                    [
                        "path": file.path, "outcome": file.outcome.rawValue, "imported_events": file.importedEvents,
                        "problems": file.problems.map(\.description), "moved_to": file.movedTo ?? NSNull(),
                    ]
                }
                let sessions = recovered.sessions.map { session -> [String: Any] in
                    [
                        "path": session.path, "session_id": session.sessionID, "outcome": session.outcome.rawValue,
                        "imported_events": session.importedEvents, "skipped_stretches": session.skippedStretches,
                        "damaged_entries": session.damagedEntries.map { NSNumber(value: $0) },
                        "end_reason": session.endReason ?? NSNull(), "problem": session.problem ?? NSNull(),
                    ]
                }
                let data = try JSONSerialization.data(
                    withJSONObject: ["crash_files": files, "sessions": sessions],
                    options: [.sortedKeys, .prettyPrinted])
                print(String(decoding: data, as: UTF8.self))
            } else {
                print(
                    "\(summary.files.count) crash files: \(summary.count(.imported)) imported "
                        + "(\(summary.importedEvents) events), \(summary.count(.alreadyImported)) already imported, "
                        + "\(summary.count(.noCrash)) without a crash, \(summary.count(.skippedLive)) live, "
                        + "\(summary.count(.damaged)) damaged")
                for file in summary.files where file.outcome == .damaged {
                    print(
                        "damaged: \(CaptureFile.printable(file.path)) -> "
                            + CaptureFile.printable(file.movedTo ?? "left in place"))
                    file.problems.forEach { print("  " + CaptureFile.printable("\($0)")) }
                }
                let sessions = recovered.sessions
                let closed = sessions.filter { $0.outcome == .closed }
                let ended = Dictionary(grouping: closed.compactMap(\.endReason), by: { $0 }).mapValues(\.count)
                print(
                    "\(sessions.count) unfinished sessions: \(closed.count) closed "
                        + "(\(closed.reduce(0) { $0 + $1.importedEvents }) events from their journals"
                        + (ended.isEmpty
                            ? ""
                            : "; ended "
                                + ended.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(
                                    separator: ", "))
                        + "), \(sessions.filter { $0.outcome == .alive }.count) alive, "
                        + "\(sessions.filter { $0.outcome == .busy }.count) busy, \(damagedSessions.count) damaged")
                for session in damagedSessions {
                    print("damaged: " + CaptureFile.printable("\(session.path): \(session.problem ?? "")"))
                }
            }
            let notArchived = summary.files.filter { $0.notArchived != nil }
            for file in notArchived {
                FileHandle.standardError.write(
                    Data(
                        "crashcap: imported but not archived, left in place: \(CaptureFile.printable(file.path)): \(file.notArchived!)\n"
                            .utf8))
            }
            var complete = true
            if let endpoint { complete = try target.upload(store, to: endpoint, quiet: json) }
            if let minidumps = try target.minidumpUploader(store) {
                complete = target.sendMinidumps(with: minidumps, quiet: json) && complete
            }
            if summary.count(.damaged) > 0 || !damagedSessions.isEmpty { throw ExitCode(65) }
            if !notArchived.isEmpty { throw ExitCode(73) }  // EX_CANTCREAT: the archive took nothing
            if !complete { throw ExitCode(75) }
        }
    }

    struct Upload: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Upload the events pending in a directory's store.",
            discussion:
                "Exit status 65 when the server refused events for good (set aside in rejected_events), 75 when events are left unsent (the server failed or time ran out)."
        )

        @OptionGroup var options: DirectoryOptions
        @OptionGroup var target: UploadTarget

        mutating func run() throws {
            let endpoint = try target.endpoint
            guard endpoint != nil || target.minidumpURL != nil else {
                throw Crashcap.fail(
                    "no endpoint: pass --upload URL, --otlp URL, --minidump-url URL, or set CRASHCAPTURE_SERVER_URL",
                    code: 64)
            }
            let store = try options.openStore()
            var complete = true
            if let endpoint { complete = try target.upload(store, to: endpoint) }
            if let minidumps = try target.minidumpUploader(store) {
                complete = target.sendMinidumps(with: minidumps) && complete
            }
            if !complete { throw ExitCode(75) }
        }
    }
}

/// A one-line progress bar on a terminal; nothing otherwise.
final class ProgressBar {
    let enabled: Bool
    private var last = -1
    init(enabled: Bool) { self.enabled = enabled }

    func update(_ done: Int, of total: Int) {
        guard enabled, total > 20 else { return }
        let percent = done * 100 / total
        guard percent != last else { return }
        last = percent
        let filled = percent / 4
        let bar = String(repeating: "#", count: filled) + String(repeating: " ", count: 25 - filled)
        FileHandle.standardError.write(Data("\r[\(bar)] \(done)/\(total)".utf8))
    }

    func finish() {
        if enabled && last >= 0 { FileHandle.standardError.write(Data("\n".utf8)) }
    }
}
