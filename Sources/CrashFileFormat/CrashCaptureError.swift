#if canImport(Glibc)
    internal import Glibc
#endif

/// Why CrashCapture refused or failed to do something: a kind that code can switch on, the
/// file and `errno` where they apply, and a message that says what to do.
///
/// Every module of the package throws this one type; `import CrashCapture` makes it visible.
public struct CrashCaptureError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What went wrong, for code that decides what to do next.
    public enum Kind: String, Sendable, Equatable {
        /// A value passed in breaks a documented rule; the message names the rule.
        case invalidArgument
        /// The call needs `CrashCapture.install` first.
        case notInstalled
        /// The signal handlers could not be installed; nothing was changed.
        case installFailed
        /// A file or directory could not be read, written or created.
        case io
        /// Data read from disk or the network is not in the expected format.
        case corrupt
        /// The event store (SQLite) failed.
        case database
        /// This build or this system lacks what the call needs.
        case unsupported
    }

    /// What went wrong.
    public let kind: Kind
    /// A sentence for a person, saying what failed and, where it can, what to do about it.
    public let message: String
    /// The file or directory concerned, where there is one.
    public let path: String?
    /// The system's `errno`, where a system call failed.
    public let errno: Int32?

    /// An error of `kind`; `errno` is put into words in `description`.
    public init(_ kind: Kind, _ message: String, path: String? = nil, errno: Int32? = nil) {
        self.kind = kind
        self.message = message
        self.path = path
        self.errno = errno
    }

    /// The message, then the path and the system's words for `errno` where they add something.
    public var description: String {
        var text = message
        if let path, !message.contains(path) { text += " (\(path))" }
        if let errno { text += ": " + String(cString: strerror(errno)) }
        return text
    }
}

extension CrashCaptureError {
    package static func invalidArgument(_ message: String) -> Self { Self(.invalidArgument, message) }

    /// `error` itself when it is one of ours, else wrapped as an I/O failure that keeps its
    /// description: for the typed `throws` of the public API.
    package static func wrapping(_ error: any Error) -> Self {
        error as? CrashCaptureError ?? Self(.io, "\(error)")
    }

    package static func corrupt(_ message: String, path: String? = nil) -> Self {
        Self(.corrupt, message, path: path)
    }

    /// A failed system call: `errno` is read now, so call this right after the failure.
    package static func system(_ message: String, path: String? = nil) -> Self {
        Self(.io, message, path: path, errno: Glibc.errno)
    }

    package static func io(_ message: String, path: String? = nil, errno: Int32? = nil) -> Self {
        Self(.io, message, path: path, errno: errno)
    }
}
