internal import CCrashCapture
internal import Foundation

extension CrashCapture {
    /// Context for the report of a crash: `key` set to `value`, or removed with nil. Kept in
    /// the session file as it changes (at most 4 KiB of context in all), so a crash costs
    /// nothing more: the replayed `$AppCrashed` carries every key as `crash_context`. Keys follow
    /// the property rules (letters, digits and `_`, not starting with a digit).
    public static func setContext(_ key: String, _ value: PropertyValue?) throws(CrashCaptureError) {
        var json: String?
        if let value {
            do {
                try PropertyRules.validate([key: value])
            } catch {
                throw CrashCaptureError.wrapping(error)
            }
            var text = ""
            JSONText.appendValue(value, to: &text)
            json = text
        }
        guard crashcapture_set_context_json(key, json) == 0 else {
            let message = String(cString: crashcapture_last_error())
            throw message == "not installed"
                ? CrashCaptureError.notInstalled : CrashCaptureError.invalidArgument(message)
        }
    }

    /// A breadcrumb for the report of a crash: a line of text (at most 232 bytes are kept),
    /// with the time. The last 64 are kept in the session file; the replayed `$AppCrashed`
    /// lists them among `crash_breadcrumbs`, in time order with the session's last events.
    /// Breadcrumbs are not events: they are never uploaded on their own. Does nothing when not
    /// installed.
    public static func addBreadcrumb(_ message: String) {
        _ = crashcapture_add_breadcrumb(message)
    }

    /// At a crash, the last `maxBytes` (at most 64 KiB) of the file at `path` (a log file,
    /// say) are copied into the report, as `attachments` of the `$AppCrashed`. Up to 4 files.
    /// The file is opened only at the crash, so it may be rotated, or made, after this call.
    public static func attachFile(_ path: String, maxBytes: Int = 16 << 10) throws(CrashCaptureError) {
        let absolute = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        guard maxBytes > 0 else { throw CrashCaptureError.invalidArgument("maxBytes must be positive") }
        guard crashcapture_attach_file(absolute, maxBytes) == 0 else {
            throw CrashCaptureError.invalidArgument(String(cString: crashcapture_last_error()))
        }
    }
}
