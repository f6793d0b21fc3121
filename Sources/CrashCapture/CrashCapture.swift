import CCrashCapture

/// Crash capture for this process: install once, early.
///
/// ```swift
/// try CrashCapture.install(.init(directory: "/var/lib/myapp/crashes", appName: "myapp", appVersion: "1.4.2"))
/// ```
public enum CrashCapture {
    public struct Configuration: Sendable {
        /// Where crash files, the distinct id and the event store live. Created 0700 if missing.
        public var directory: String
        public var appName: String
        public var appVersion: String
        /// nil: a random id persisted in the directory.
        public var distinctID: String?
        /// Added to every event of this process. Keys may not start with `$`.
        public var staticProperties: [String: PropertyValue]
        /// Disk space reserved at install for the crash report; 0 for the default (256 KiB).
        public var reservedBytes: Int

        public init(
            directory: String, appName: String, appVersion: String, distinctID: String? = nil,
            staticProperties: [String: PropertyValue] = [:], reservedBytes: Int = 0
        ) {
            self.directory = directory
            self.appName = appName
            self.appVersion = appVersion
            self.distinctID = distinctID
            self.staticProperties = staticProperties
            self.reservedBytes = reservedBytes
        }
    }

    /// Installs the crash handlers. A second call while installed does nothing.
    public static func install(_ configuration: Configuration) throws {
        try PropertyRules.validate(configuration.staticProperties)
        guard configuration.reservedBytes >= 0 else {
            throw CrashCaptureError.invalidArgument("reservedBytes must not be negative")
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
                            return crashcapture_install(&config)
                        }
                    }
                }
            }
        }
        guard status == 0 else {
            throw CrashCaptureError.installFailed(String(cString: crashcapture_last_error()))
        }
    }

    /// Restores the handlers that were there before, unless someone replaced ours since, and
    /// removes this session's crash file.
    public static func uninstall() {
        crashcapture_uninstall()
    }

    public static var isInstalled: Bool { crashcapture_is_installed() != 0 }

    /// Gives the calling thread an alternate signal stack so that a stack overflow on it is
    /// captured. Threads created after install get one automatically.
    public static func installAlternateStackForCurrentThread() throws {
        guard crashcapture_install_thread_stack() == 0 else {
            throw CrashCaptureError.io("cannot set up an alternate signal stack")
        }
    }

    /// Re-reads the loaded modules. Optional: modules loaded later are also found at crash time.
    public static func refreshModules() {
        _ = crashcapture_refresh_modules()
    }

    public static var crashFilePath: String? { crashcapture_crash_file_path().map { String(cString: $0) } }
    public static var sessionID: String? { crashcapture_session_id().map { String(cString: $0) } }
    public static var distinctID: String? { crashcapture_distinct_id().map { String(cString: $0) } }
    /// Whether stacks come from libunwind; without it they are walked through frame pointers.
    public static var hasLibunwind: Bool { crashcapture_has_libunwind() != 0 }
}

private func withOptionalCString<R>(_ text: String?, _ body: (UnsafePointer<CChar>?) -> R) -> R {
    guard let text else { return body(nil) }
    return text.withCString { body($0) }
}
