internal import Foundation

#if canImport(Glibc)
    internal import Glibc
#endif

/// The one way a file of a capture directory is opened for reading: never through a symbolic
/// link, never blocking (a FIFO planted under a crash file's name must not hang the app or the
/// CLI), and only when it is a regular file. Anyone who can write the directory chooses what
/// lies there.
package enum CaptureFile {
    static let readingFlags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC

    /// A descriptor for the regular file at `path`, or an error that says what lies there instead.
    package static func openForReading(_ path: String) throws -> Int32 {
        try checked(open(path, readingFlags), path: path)
    }

    /// The same, for an entry of a directory already open: see `CaptureDirectory`.
    static func checked(_ fd: Int32, path: String) throws -> Int32 {
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

/// A capture directory opened once (never through a link), its entries then reached relative
/// to that descriptor: a directory renamed, or swapped for a link to another, while a replay
/// runs does not redirect what the replay reads, moves or removes.
package final class CaptureDirectory: @unchecked Sendable {  // immutable after init
    package let path: String
    package let fd: Int32

    package init(_ path: String) throws {
        fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ELOOP || errno == ENOTDIR {
                throw CrashCaptureError.io("is not a directory (or is a symbolic link); not used", path: path)
            }
            throw CrashCaptureError.system("cannot open the capture directory", path: path)
        }
        self.path = path
    }

    /// The folder `name` of `parent`, opened the same way.
    package init(_ name: String, in parent: CaptureDirectory) throws {
        let opened = openat(parent.fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard opened >= 0 else {
            throw CrashCaptureError.system("is not a folder of ours; not used", path: parent.path(of: name))
        }
        fd = opened
        path = parent.path(of: name)
    }

    deinit { close(fd) }

    /// The path of an entry, for messages and results.
    package func path(of name: String) -> String { path + "/" + name }

    /// The names of the entries, sorted; "." and ".." left out.
    package func names() -> [String] {
        let copy = dup(fd)
        guard copy >= 0, let stream = fdopendir(copy) else {
            if copy >= 0 { close(copy) }
            return []
        }
        defer { closedir(stream) }
        rewinddir(stream)
        var names: [String] = []
        while let entry = readdir(stream) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names.sorted()
    }

    /// A descriptor for the regular file `name`, opened the one way (`CaptureFile`).
    package func openForReading(_ name: String) throws -> Int32 {
        try CaptureFile.checked(openat(fd, name, CaptureFile.readingFlags), path: path(of: name))
    }

    /// Whether anything (a link included) lies under `name`.
    package func contains(_ name: String) -> Bool {
        var info = stat()
        return fstatat(fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0
    }

    /// Removes the entry `name` (never what a link points to).
    package func remove(_ name: String) { unlinkat(fd, name, 0) }
}
