public import Foundation

extension CrashCapture {
    /// What `install` needs: where reports and events live, who the app is, where events go.
    public struct Configuration: Sendable {
        /// Where crash files, the distinct id and the event store live. Created 0700 if missing,
        /// made 0700 if others could read it; its files are 0600 whatever the umask.
        public var directory: String
        /// `$app_name` of every event.
        public var appName: String
        /// `$app_version` of every event.
        public var appVersion: String
        /// nil: a random id persisted in the directory.
        public var distinctID: String?
        /// Added to every event of this process. Keys may not start with `$`.
        public var staticProperties: [String: PropertyValue]
        /// Disk space reserved at install for the crash report; 0 for the default (2 MiB + 80 KiB,
        /// the largest report: every thread's stack and registers).
        public var reservedBytes: Int
        /// One line on stderr at a crash (signal, thread, top frame, the report's path), so that
        /// logs show the crash even when the capture directory is lost.
        public var crashLineOnStderr: Bool
        /// The report's command line holds the program's arguments (false: the program alone,
        /// for arguments that may carry secrets). The environment is never recorded.
        public var recordArguments: Bool
        /// Where events are sent. `CRASHCAPTURE_SERVER_URL` in the environment wins over this;
        /// with neither, events stay in the store.
        public var serverURL: URL?
        /// Send events as OpenTelemetry logs (OTLP/HTTP, protobuf, gzip) to this URL instead of
        /// the Sensors Analytics format to `serverURL`: an OpenTelemetry Collector's
        /// `http://host:4318` (its `/v1/logs` is added to a URL without a path). A crash is a
        /// record named `app.crash`, severity FATAL, with `exception.*` attributes. Setting both
        /// this and `serverURL` is an error at install.
        public var otlpURL: URL?
        /// Also send each crash imported at start as a minidump to this URL (Sentry's minidump
        /// endpoint with `?sentry_key=`, BugSplat's, Backtrace's), once, off the app's threads
        /// after the start's replay, with `upload`'s headers and retries (Docs/Minidump.md).
        /// `CRASHCAPTURE_MINIDUMP_URL` in the environment wins over this.
        public var minidumpURL: URL?
        /// When and how stored events are sent.
        public var upload: UploadOptions
        /// The cap on cached events; the oldest are dropped (and counted) beyond it.
        public var storeLimits: StoreLimits
        /// nil: `<directory>/events.sqlite`.
        public var eventStorePath: String?
        /// $AppStart at install and $AppEnd at exit, SIGTERM and SIGINT (and, at the next start,
        /// for a session that was killed).
        public var trackLifecycle: Bool
        /// Bytes of the journal that holds tracked events until the writer stores them (in the
        /// session file, reserved on disk at install; default 1 MiB, about 4,000 events). It only
        /// has to hold what the writer has not stored yet: when it is full, track() waits for
        /// room, at most `fullJournalWait`.
        public var journalBytes: Int
        /// How long track() waits for room in a full journal before it drops the event (counted
        /// in `droppedBeforeStore`, logged once). Once a wait has run out, track() drops without
        /// waiting until the writer stores again, so a stuck store never stalls the app for long.
        public var fullJournalWait: Duration = .seconds(1)
        /// Symbol stores (`crashcap symbols add`) for naming the frames of earlier crashes at
        /// replay, besides those of `CRASHCAPTURE_SYMBOLS`: a binary redeployed since the crash
        /// is then still named from the build that crashed.
        public var symbolStores: [String]
        /// The crash directory's bound: past this many crash files, or bytes of crash and
        /// session files, found at install, a crash keeps no report of its own and is replayed
        /// as a compact `$AppCrashed` (`crash_not_kept`). The oldest reports are the ones kept.
        public var maximumCrashFiles: Int
        /// Bytes of crash and session files in the directory, at install, past which a crash
        /// keeps no report of its own (see `maximumCrashFiles`).
        public var maximumCrashBytes: Int
        /// How long the import of earlier crashes and sessions may take at install, on a queue of
        /// its own: what is left waits for the next start or `crashcap replay`. Nothing of the
        /// app waits for it.
        public var replayBudget: Duration = .seconds(5)

        /// A configuration with the defaults for everything but where and who.
        public init(
            directory: String, appName: String, appVersion: String, distinctID: String? = nil,
            staticProperties: [String: PropertyValue] = [:], reservedBytes: Int = 0, serverURL: URL? = nil,
            upload: UploadOptions = UploadOptions(), storeLimits: StoreLimits = StoreLimits(),
            eventStorePath: String? = nil, trackLifecycle: Bool = true, journalBytes: Int = 1 << 20,
            crashLineOnStderr: Bool = true, recordArguments: Bool = true, symbolStores: [String] = [],
            maximumCrashFiles: Int = 64, maximumCrashBytes: Int = 256 << 20
        ) {
            self.symbolStores = symbolStores
            self.maximumCrashFiles = maximumCrashFiles
            self.maximumCrashBytes = maximumCrashBytes
            self.crashLineOnStderr = crashLineOnStderr
            self.recordArguments = recordArguments
            self.directory = directory
            self.appName = appName
            self.appVersion = appVersion
            self.distinctID = distinctID
            self.staticProperties = staticProperties
            self.reservedBytes = reservedBytes
            self.serverURL = serverURL
            self.upload = upload
            self.storeLimits = storeLimits
            self.eventStorePath = eventStorePath
            self.trackLifecycle = trackLifecycle
            self.journalBytes = journalBytes
        }
    }

    /// How many events the store keeps before it drops the oldest.
    public struct StoreLimits: Sendable {
        /// Events cached at most.
        public var maximumEvents: Int
        /// Bytes of event text cached at most.
        public var maximumBytes: Int
        /// The defaults: 100,000 events and 64 MiB.
        public init(maximumEvents: Int = 100_000, maximumBytes: Int = 64 << 20) {
            self.maximumEvents = maximumEvents
            self.maximumBytes = maximumBytes
        }
    }
}
