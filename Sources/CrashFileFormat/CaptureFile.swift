internal import Foundation

#if canImport(Glibc)
    internal import Glibc
#endif

/// The one way a file of a capture directory is opened for reading: never through a symbolic
/// link, never blocking (a FIFO planted under a crash file's name must not hang the app or the
/// CLI), and only when it is a regular file. Anyone who can write the directory chooses what
/// lies there.
package enum CaptureFile {
    /// A descriptor for the regular file at `path`, or an error that says what lies there instead.
    package static func openForReading(_ path: String) throws -> Int32 {
        let fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ELOOP {
                throw CrashCaptureError.io("is a symbolic link; links are not followed", path: path, errno: ELOOP)
            }
            throw CrashCaptureError.system("cannot open", path: path)
        }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            close(fd)
            throw CrashCaptureError.system("cannot inspect", path: path)
        }
        let kind = info.st_mode & S_IFMT
        guard kind == S_IFREG else {
            close(fd)
            throw CrashCaptureError.io("is \(describe(kind)), not a regular file; left alone", path: path)
        }
        return fd
    }

    static func describe(_ kind: mode_t) -> String {
        switch kind {
        case S_IFDIR: "a directory"
        case S_IFIFO: "a FIFO"
        case S_IFSOCK: "a socket"
        case S_IFCHR: "a character device"
        case S_IFBLK: "a block device"
        case S_IFLNK: "a symbolic link"
        default: "not a regular file"
        }
    }

    /// A file name as it may be printed or written into a note: control characters (a newline
    /// would forge a line of its own) are escaped.
    package static func printable(_ name: String) -> String {
        var out = ""
        for scalar in name.unicodeScalars {
            if scalar.value < 0x20 || scalar.value == 0x7f {
                out += "\\x" + String(scalar.value, radix: 16, uppercase: false).leftPadded(to: 2)
            } else {
                out.unicodeScalars.append(scalar)
            }
        }
        return out
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        String(repeating: "0", count: max(0, width - count)) + self
    }
}
