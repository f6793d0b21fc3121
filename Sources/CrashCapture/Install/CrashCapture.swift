internal import CCrashCapture
internal import CCrashFileFormat
internal import CrashFileFormat
internal import CrashSymbolication
internal import Foundation
internal import Logging

#if canImport(Glibc)
    internal import Glibc
#endif

/// Crash capture for this process: install once, early.
///
/// ```swift
/// try CrashCapture.install(.init(directory: "/var/lib/myapp/crashes", appName: "myapp", appVersion: "1.4.2"))
/// ```
///
/// From then on a SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE, SIGTRAP or SIGSYS (a Swift trap, an
/// uncaught C++ exception) leaves a checksummed crash report, flushed to disk, in the directory,
/// and the process still dies of the same signal. The next install in that directory replays
/// it into the event store, and the uploader sends it with the app's own events.
public enum CrashCapture: Sendable {
    /// The library's version, as `$lib_version` of every event carries it.
    public static let version = CRASHCAPTURE_VERSION

    /// Installs the crash handlers, opens the event store, tracks $AppStart and starts the
    /// uploader. A second call while installed does nothing.
    public static func install(_ configuration: Configuration) throws(CrashCaptureError) {
        do {
            try installAnyError(configuration)
        } catch {
            throw CrashCaptureError.wrapping(error)
        }
    }

    static func installAnyError(_ configuration: Configuration) throws {
        var configuration = configuration
        // Resolved once, against the working directory now: a later chdir changes nothing.
        if !configuration.directory.isEmpty && !configuration.directory.hasPrefix("/") {
            configuration.directory =
                FileManager.default.currentDirectoryPath + "/" + configuration.directory
        }
        try state.withLock {
            if state.pipeline != nil && isInstalled {
                guard let installed = state.directory, installed == configuration.directory else {
                    throw CrashCaptureError.invalidArgument(
                        "already installed with directory \(state.directory ?? "?"); call uninstall() first to "
                            + "install with \(configuration.directory)")
                }
                return
            }
            try installCrashPath(configuration)
            do {
                state.pipeline = try makePipeline(configuration)
            } catch let failure as SQLiteError {
                crashcapture_uninstall()
                var limit = rlimit()
                let small =
                    getrlimit(__rlimit_resource_t(RLIMIT_FSIZE.rawValue), &limit) == 0 && limit.rlim_cur < 64 << 20
                let advice =
                    small
                    ? "the file-size limit (ulimit -f) of \(limit.rlim_cur) bytes is too small for it"
                    : "move it away or set eventStorePath"
                throw CrashCaptureError(
                    .database, "the event store cannot be used (\(failure)); \(advice)",
                    path: configuration.eventStorePath ?? configuration.directory + "/events.sqlite")
            } catch {
                crashcapture_uninstall()
                throw error
            }
        }
    }

    static func installCrashPath(_ configuration: Configuration) throws {
        try PropertyRules.validate(configuration.staticProperties)
        // A path read from bytes that are not UTF-8 (an environment variable, say) comes to a
        // String with U+FFFD in their place: it names another directory than the one meant,
        // and is refused rather than used.
        for (name, path) in [
            ("directory", configuration.directory), ("eventStorePath", configuration.eventStorePath ?? ""),
        ]
        where path.unicodeScalars.contains("\u{FFFD}") {
            throw CrashCaptureError.invalidArgument(
                "\(name) \(CaptureFile.printable(path)) holds U+FFFD, the mark of bytes that were not UTF-8 when it "
                    + "was decoded: it would name another directory than the one meant; give a UTF-8 path")
        }
        guard configuration.reservedBytes >= 0 else {
            throw CrashCaptureError.invalidArgument("reservedBytes must not be negative")
        }
        guard configuration.fullJournalWait >= .zero else {
            throw CrashCaptureError.invalidArgument("fullJournalWait must not be negative")
        }
        guard configuration.journalBytes >= 64 << 10, configuration.journalBytes <= Int(CCF_SESSION_MAXIMUM_RING) else {
            throw CrashCaptureError.invalidArgument(
                "journalBytes must be between 64 KiB and \(CCF_SESSION_MAXIMUM_RING >> 20) MiB")
        }
        let members = JSONText.members(configuration.staticProperties)
        let status = configuration.directory.withCString { directory in
            configuration.appName.withCString { appName in
                configuration.appVersion.withCString { appVersion in
                    members.withCString { members in
                        withOptionalCString(configuration.distinctID) { distinctID in
                            var config = crashcapture_config()
                            config.directory = directory
                            config.app_name = appName
                            config.app_version = appVersion
                            config.distinct_id = distinctID
                            config.prevalidated_properties_json = members
                            config.reserved_bytes = configuration.reservedBytes
                            config.no_crash_line = configuration.crashLineOnStderr ? 0 : 1
                            config.omit_arguments = configuration.recordArguments ? 0 : 1
                            config.maximum_crash_files = max(1, configuration.maximumCrashFiles)
                            config.maximum_crash_bytes = max(1, configuration.maximumCrashBytes)
                            return crashcapture_install_sdk(
                                &config, configuration.journalBytes, configuration.trackLifecycle ? 1 : 0)
                        }
                    }
                }
            }
        }
        guard status == 0 else {
            throw CrashCaptureError(
                .installFailed, String(cString: crashcapture_last_error()), path: configuration.directory)
        }
        // A Swift runtime linked into the program exports nothing: its symbol table is read by a
        // thread of ours, and one task's own metadata names the tasks of a report. Elsewhere
        // both return at once.
        crashcapture_read_static_runtime_in_background()
        // Only then: a task would start a thread of the cooperative pool in an app that has none.
        if crashcapture_task_metadata_known() == 0 {
            Task.detached(priority: .utility) { _ = crashcapture_note_current_task() }
        }
    }

    /// Restores the handlers that were there before, unless someone replaced ours since, and
    /// removes this session's crash file. The session ends ($AppEnd, reason `uninstall`, when
    /// lifecycle events are tracked) and every event tracked is written to the store first.
    public static func uninstall() {
        state.withLock {
            if let pipeline = state.pipeline {
                if pipeline.tracksLifecycle {
                    pipeline.end(reason: "uninstall", uploadDeadline: 0)
                } else {
                    pipeline.flushToStore()
                }
            }
            state.pipeline = nil
            crashcapture_uninstall()
        }
    }

    /// Tracks one of the app's own events. Names and keys: `[A-Za-z_][A-Za-z0-9_]*`, at most 100
    /// bytes, no `$` prefix (reserved for presets), no reserved name, not the key of a static
    /// property; text values at most 8191 bytes. Never blocks on disk or network: the event is written by a background writer.
    public static func track(_ event: String, properties: [String: PropertyValue] = [:]) throws(CrashCaptureError) {
        do {
            try PropertyRules.validateName(event, kind: "event name")
            try PropertyRules.validate(properties)
        } catch {
            throw CrashCaptureError.wrapping(error)
        }
        guard let pipeline = state.current else { throw CrashCaptureError.notInstalled }
        // The event's properties follow the static ones in one object: a key of both would be
        // named twice, and the collector refuses the whole batch such an event travels in.
        for key in properties.keys where crashcapture_is_static_property(key) != 0 {
            throw CrashCaptureError.invalidArgument(
                "property key \"\(key)\" is a static property of this session already; give it another name")
        }
        pipeline.enqueue(
            PendingEvent(name: event, properties: properties, timeMilliseconds: wallMilliseconds(), method: "code"))
    }

    /// From now on events (crash reports included) carry this id as distinct_id; a `$SignUp`
    /// event links it to the anonymous id. Kept across restarts until `logout()`.
    public static func login(_ loginID: String) throws(CrashCaptureError) {
        guard let pipeline = state.current, let directory = state.directory else {
            throw CrashCaptureError.notInstalled
        }
        let anonymous = state.anonymousID ?? ""
        guard loginID != pipeline.currentLoginID else { return }
        guard crashcapture_set_distinct_id(loginID) == 0 else {
            throw CrashCaptureError.invalidArgument(
                "login id must be 1 to 255 printable bytes without quotes or backslashes")
        }
        crashcapture_set_logged_in(1)
        pipeline.setLoginID(loginID, distinctID: loginID)
        PrivateFiles.write(Array(loginID.utf8), to: directory + "/login_id")
        // As every official SDK sends a login: a track_signup record with the anonymous id as
        // its top-level original_id.
        pipeline.enqueue(
            PendingEvent(
                name: "$SignUp", properties: [:], timeMilliseconds: wallMilliseconds(), method: "code",
                type: "track_signup", recordMembers: "\"original_id\":" + JSONText.quoted(anonymous)))
    }

    /// Back to the anonymous distinct id. Does nothing when not installed.
    public static func logout() {
        guard let pipeline = state.current, let directory = state.directory else { return }
        let anonymous = state.anonymousID ?? ""
        pipeline.setLoginID(nil, distinctID: anonymous)
        _ = crashcapture_set_distinct_id(anonymous)
        crashcapture_set_logged_in(0)
        try? FileManager.default.removeItem(atPath: directory + "/login_id")
    }

    /// Writes every tracked event to the store and, if an endpoint is set, uploads what is cached.
    public static func flush(timeout: Duration = .seconds(10)) {
        guard let pipeline = state.current else { return }
        pipeline.flushToStore()
        pipeline.uploader?.flushNow(deadline: Date().addingTimeInterval(timeout.seconds))
    }

    /// Events track() dropped: the journal stayed full for `fullJournalWait` (the writer could
    /// not store them), or an event was larger than the whole journal.
    public static var droppedBeforeStore: Int { state.current?.droppedBeforeStore ?? 0 }

    /// The event store of the installed session, for the package's tools and tests.
    package static var eventStore: EventStore? { state.current?.store }
    package static var uploader: Uploader? { state.current?.uploader }
    /// The installed session's journal: bytes handed out so far, its size, and whether it is
    /// in the session file (false: in memory only). For the benchmarks.
    package static var journalUsage: (reserved: UInt64, size: UInt64, persistent: Bool)? {
        guard let journal = state.current?.journal else { return nil }
        return (
            crashcapture_journal_reserved(journal), crashcapture_journal_size(journal),
            crashcapture_journal_is_persistent(journal) != 0
        )
    }

    /// Whether the crash handlers are in place.
    public static var isInstalled: Bool { crashcapture_is_installed() != 0 }

    /// Whether this build can send events: false when the package trait `HTTPUpload` was
    /// turned off, and events then wait in the store for `crashcap upload`.
    public static var canUpload: Bool { Uploader.canUpload }

    /// Gives the calling thread an alternate signal stack so that a stack overflow on it is
    /// captured. Threads created after install get one automatically.
    public static func installAlternateStackForCurrentThread() throws(CrashCaptureError) {
        guard crashcapture_install_thread_stack() == 0 else {
            throw CrashCaptureError.system("cannot set up an alternate signal stack for this thread")
        }
    }

    /// Re-reads the loaded modules. Optional: modules loaded later are also found at crash time.
    public static func refreshModules() {
        _ = crashcapture_refresh_modules()
    }

    /// This session's crash file, or nil when not installed.
    public static var crashFilePath: String? { crashcapture_crash_file_path().map { String(cString: $0) } }
    /// This session's id (32 hex digits), or nil when not installed.
    public static var sessionID: String? { crashcapture_session_id().map { String(cString: $0) } }
    /// The distinct id events carry now (the login id after `login`), or nil when not installed.
    public static var distinctID: String? { crashcapture_distinct_id().map { String(cString: $0) } }
    /// Whether stacks come from libunwind; without it they are walked through frame pointers.
    public static var hasLibunwind: Bool { crashcapture_has_libunwind() != 0 }
}

extension CrashCapture {
    /// Process-wide state behind one lock. `@unchecked`: every stored property is read and
    /// written only inside `withLock`.
    final class State: @unchecked Sendable {
        private let lock = NSRecursiveLock()
        var pipeline: EventPipeline?
        var directory: String?
        var anonymousID: String?
        var terminationSource: DispatchSourceRead?
        var lastRun = LastRun(crashed: false, consecutiveCrashes: 0)
        /// Imports the hang reports this process writes (HangWatch).
        var hangReplayer: CrashReplayer?

        func withLock<T>(_ body: () throws -> T) rethrows -> T {
            lock.lock()
            defer { lock.unlock() }
            return try body()
        }

        var current: EventPipeline? { withLock { pipeline } }
    }

    static let state = State()

    static func wallMilliseconds() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        return Int64(now.tv_sec) * 1000 + Int64(now.tv_nsec) / 1_000_000
    }

    static func monotonicNanoseconds() -> Int64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return Int64(now.tv_sec) * 1_000_000_000 + Int64(now.tv_nsec)
    }

    static func makePipeline(_ configuration: Configuration) throws -> EventPipeline {
        let directory = configuration.directory
        // The full integrity read waits for the writer queue (below): not on the caller's thread.
        // A new store is made off it too (its first user waits): only a folder that cannot
        // hold it is an error here, as it was when the store was made on this thread.
        // Under a small file-size limit it is made here as before, for its failure to be
        // install's error.
        let storePath = configuration.eventStorePath ?? directory + "/events.sqlite"
        var fileSizeLimit = rlimit()
        let roomy =
            getrlimit(__rlimit_resource_t(RLIMIT_FSIZE.rawValue), &fileSizeLimit) == 0
            && fileSizeLimit.rlim_cur >= 64 << 20
        let storeIsNew = roomy && access(storePath, F_OK) != 0
        if storeIsNew {
            let parent = (storePath as NSString).deletingLastPathComponent
            guard access(parent.isEmpty ? "." : parent, W_OK | X_OK) == 0 else {
                throw CrashCaptureError.system(
                    "cannot make the event store: its folder is missing or not writable", path: storePath)
            }
        }
        let store = try EventStore(
            path: storePath, limits: configuration.storeLimits, verifyNow: false, openInBackground: storeIsNew)
        if !storeIsNew, let notice = store.movedAsideNotice { logger.warning("\(notice)") }
        if configuration.otlpURL != nil && configuration.serverURL != nil {
            throw CrashCaptureError.invalidArgument(
                "serverURL (Sensors Analytics) and otlpURL (OpenTelemetry logs) are both set: events go to one of them")
        }
        var endpoint = configuration.otlpURL ?? configuration.serverURL
        if configuration.otlpURL == nil,
            let fromEnvironment = ProcessInfo.processInfo.environment["CRASHCAPTURE_SERVER_URL"],
            !fromEnvironment.isEmpty
        {
            guard let url = URL(string: fromEnvironment) else {
                throw CrashCaptureError.invalidArgument(
                    "CRASHCAPTURE_SERVER_URL is not a URL: \(fromEnvironment); set it to an http(s) URL or unset it")
            }
            endpoint = url
        }
        if let unsent = endpoint, !Uploader.canUpload {
            // Capture matters more than upload: install goes on, and the events wait in the store.
            logger.warning(
                "built without HTTP upload; events stay in the store",
                metadata: ["endpoint": "\(Uploader.redacted(unsent))"])
            endpoint = nil
        }
        let format: UploadFormat = configuration.otlpURL != nil ? .openTelemetryLogs : .sensorsAnalytics
        var upload = configuration.upload
        if format == .openTelemetryLogs && upload.headers.isEmpty {
            upload.headers = Uploader.otlpHeadersFromEnvironment()
        }
        let uploader = try endpoint.map {
            try Uploader(endpoint: $0, store: store, options: upload, format: format)
        }
        let identity = EventPipeline.Identity(
            sessionID: String(cString: crashcapture_session_id()), appVersion: configuration.appVersion,
            staticProperties: String(cString: crashcapture_static_properties_json()),
            distinctID: String(cString: crashcapture_distinct_id()))
        let journal = crashcapture_session_journal()
        if crashcapture_journal_is_persistent(journal) == 0 {
            logger.warning(
                "no room for the journal in the session file; tracked events wait in memory until stored",
                metadata: ["directory": "\(directory)"])
        }
        let pipeline = EventPipeline(
            store: store, identity: identity, uploader: uploader, journal: journal,
            tracksLifecycle: configuration.trackLifecycle, fullJournalWait: configuration.fullJournalWait)
        state.directory = directory
        // A new store holds no crash history: not waiting for it to be made.
        state.lastRun = determineLastRun(
            directory: directory, store: storeIsNew ? nil : store, ownSessionID: identity.sessionID)
        for name in ["login_id", "distinct_id"] { PrivateFiles.tighten(directory + "/" + name) }
        state.anonymousID = String(cString: crashcapture_distinct_id())
        if let saved = PrivateFiles.readSmall(directory + "/login_id").map({ String(decoding: $0, as: UTF8.self) }),
            !saved.isEmpty,
            crashcapture_set_distinct_id(saved) == 0
        {
            crashcapture_set_logged_in(1)
            pipeline.setLoginID(saved, distinctID: saved)
        }
        // The sessions and crash files of earlier processes, on a queue of their own, local files
        // only and within a time budget: track(), the writer and the exit never wait for them.
        // Separate debug info (a path a report names, a debuginfod server) is left to `crashcap`.
        let recovery = SessionRecovery(
            replayer: CrashReplayer(
                directory: directory, store: store,
                symbolicator: Symbolicator(
                    options: .fromEnvironment(adding: configuration.symbolStores, searchesSeparateDebugInfo: false))))
        state.hangReplayer = CrashReplayer(
            directory: directory, store: store,
            symbolicator: Symbolicator(
                options: .fromEnvironment(adding: configuration.symbolStores, searchesSeparateDebugInfo: false)))
        pipeline.startBackgroundWork()
        let budget = configuration.replayBudget.seconds
        // Entered now, so that a flush or an exit that comes before the import starts waits for it.
        pipeline.replay.enter()
        pipeline.onWriter {
            if (try? store.checkIntegrity()) == true, let notice = store.movedAsideNotice {
                logger.warning("\(notice)")
            }
            try? store.pruneContexts()
            // Started once the integrity check is done, which may move the store aside.
            DispatchQueue(label: "CrashCapture.replay").async {
                defer { pipeline.replay.leave() }
                let summary = recovery.recoverAll(excluding: identity.sessionID, budget: budget)
                for session in summary.sessions where session.outcome == .damaged {
                    logger.error(
                        "session file could not be closed",
                        metadata: ["file": "\(session.path)", "problem": "\(session.problem ?? "")"])
                }
                let crashFiles = summary.crashFiles.files + summary.sessions.compactMap(\.crashFile)
                for file in crashFiles where file.outcome == .damaged {
                    logger.error(
                        "damaged crash file set aside",
                        metadata: ["file": "\(file.path)", "moved_to": "\(file.movedTo ?? "left in place")"])
                }
                if summary.leftForLater > 0 {
                    logger.notice(
                        "replay stopped at its time budget; the rest waits for the next start or `crashcap replay`",
                        metadata: ["left": "\(summary.leftForLater)", "budget_seconds": "\(budget)"])
                }
                sendMinidumps(configuration, store: store)
            }
        }
        if configuration.trackLifecycle {
            pipeline.enqueue(
                PendingEvent(
                    name: "$AppStart", properties: [:], timeMilliseconds: crashcapture_start_wall_ms(),
                    method: "autoTrack", eventID: identity.sessionID + "-start",
                    extra: "\"$resume_from_background\":false"))
            registerLifecycleHooks(exitFlushTimeout: configuration.upload.exitFlushTimeout.seconds)
        }
        uploader?.start()
        uploader?.requestFlush()
        return pipeline
    }

    /// The crashes imported and not sent yet, as minidumps, on a queue of their own (the
    /// replay's group is not held for them). Each receiver's answer is logged.
    static func sendMinidumps(_ configuration: Configuration, store: EventStore) {
        var url = configuration.minidumpURL
        if let text = ProcessInfo.processInfo.environment["CRASHCAPTURE_MINIDUMP_URL"], !text.isEmpty {
            url = URL(string: text)
        }
        guard let url, Uploader.canUpload else { return }
        let uploader: MinidumpUploader
        do {
            uploader = try MinidumpUploader(endpoint: url, store: store, options: configuration.upload)
        } catch {
            logger.error("minidumps not sent", metadata: ["error": "\(error)"])
            return
        }
        DispatchQueue(label: "CrashCapture.minidumps", qos: .utility).async {
            let result = uploader.sendPending(deadline: Date().addingTimeInterval(60))
            for (id, answer) in result.sent {
                logger.notice(
                    "minidump sent",
                    metadata: [
                        "crash_id": "\(id)", "event_id": "\(answer ?? "")",
                        "endpoint": "\(Uploader.redacted(uploader.endpoint))",
                    ])
            }
            if result.pending > 0 || result.refused > 0 {
                logger.warning(
                    "minidumps not all sent",
                    metadata: [
                        "pending": "\(result.pending)", "refused": "\(result.refused)",
                        "error": "\(result.lastError ?? "")",
                    ])
            }
        }
    }

    private static let hooksRegistered = Box(false)

    static func registerLifecycleHooks(exitFlushTimeout: Double) {
        exitTimeout.value = exitFlushTimeout
        if !hooksRegistered.value {
            hooksRegistered.value = true
            atexit {
                let bound = CrashCapture.exitTimeout.value
                CrashCapture.state.current?.end(reason: "exit", uploadDeadline: bound, exitBound: bound)
            }
        }
        let fd = crashcapture_watch_termination()
        guard fd >= 0, state.terminationSource == nil else { return }
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: DispatchQueue.global())
        source.setEventHandler {
            var signal: UInt8 = 0
            guard read(fd, &signal, 1) == 1 else { return }
            let name = signal == UInt8(SIGTERM) ? "SIGTERM" : "SIGINT"
            let bound = CrashCapture.exitTimeout.value
            CrashCapture.state.current?.end(reason: name, uploadDeadline: bound, exitBound: bound)
            crashcapture_finish_termination(Int32(signal))
        }
        source.resume()
        state.terminationSource = source
    }

    static let exitTimeout = Box(2.0)

    /// The library's diagnostics, through whatever logging backend the app bootstrapped.
    static var logger: Logger { Logger(label: "crashcapture") }
}

extension CrashCaptureError {
    static let notInstalled = CrashCaptureError(
        .notInstalled, "CrashCapture is not installed: call CrashCapture.install first")
}

private func withOptionalCString<R>(_ text: String?, _ body: (UnsafePointer<CChar>?) -> R) -> R {
    guard let text else { return body(nil) }
    return text.withCString { body($0) }
}
