internal import CrashFileFormat
internal import Foundation

#if canImport(Glibc)
    internal import Glibc
#endif

/// Files and folders in a capture directory hold every event and the user's ids: they are made
/// 0600 and 0700 whatever the process's umask, never through a symbolic link, and ones found
/// looser (made by an older version) are tightened.
enum PrivateFiles {
    /// Writes `bytes` to `path` whole or not at all (a temporary file renamed over it), mode 0600.
    @discardableResult
    static func write(_ bytes: some Collection<UInt8>, to path: String) -> Bool {
        FileSizeSignal.blocked { writeWhole(Array(bytes), to: path) }
    }

    private static func writeWhole(_ bytes: [UInt8], to path: String) -> Bool {
        let temporary = path + ".tmp-\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return false }
        let written =
            fchmod(fd, 0o600) == 0 && bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) } == bytes.count
        close(fd)
        guard written, rename(temporary, path) == 0 else {
            unlink(temporary)
            return false
        }
        return true
    }

    /// Writes `bytes` to the entry `name` of `directory`, whole or not at all, mode 0600.
    @discardableResult
    static func write(_ bytes: [UInt8], to name: String, in directory: CaptureDirectory) -> Bool {
        FileSizeSignal.blocked {
            let temporary = name + ".tmp-\(getpid())"
            let fd = openat(directory.fd, temporary, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0o600)
            guard fd >= 0 else { return false }
            let written =
                fchmod(fd, 0o600) == 0
                && bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) } == bytes.count
            close(fd)
            guard written, renameat(directory.fd, temporary, directory.fd, name) == 0 else {
                unlinkat(directory.fd, temporary, 0)
                return false
            }
            return true
        }
    }

    /// A folder of the capture directory (`damaged`, `archive`), mode 0700. Nil when the name is
    /// taken by something else than a folder of ours (a symbolic link, a file): nothing is
    /// moved into it then.
    static func folder(_ name: String, in directory: CaptureDirectory) -> CaptureDirectory? {
        if mkdirat(directory.fd, name, 0o700) != 0 && errno != EEXIST { return nil }
        guard let folder = try? CaptureDirectory(name, in: directory) else { return nil }
        var info = stat()
        guard fstat(folder.fd, &info) == 0, info.st_uid == geteuid() else { return nil }
        if info.st_mode & 0o777 != 0o700 { fchmod(folder.fd, 0o700) }
        return folder
    }

    /// An SQLite database made 0600 before SQLite first opens it: its -wal and -shm files take the
    /// database's mode. A database (and its -wal and -shm) of ours found looser is tightened.
    static func prepareDatabase(_ path: String) {
        let fd = open(path, O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0o600)
        if fd >= 0 { close(fd) }
        for file in [path, path + "-wal", path + "-shm"] { tighten(file) }
    }

    /// A small file of ours (an id), read the way every capture-directory file is read: never
    /// through a link, never blocking, regular files only. Nil when it is not that, or larger.
    static func readSmall(_ path: String, limit: Int = 4096) -> [UInt8]? {
        guard let fd = try? CaptureFile.openForReading(path) else { return nil }
        defer { close(fd) }
        var bytes = [UInt8](repeating: 0, count: limit + 1)
        let count = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count >= 0, count <= limit else { return nil }
        return Array(bytes.prefix(count))
    }

    static func isLink(_ path: String) -> Bool {
        var info = stat()
        return lstat(path, &info) == 0 && info.st_mode & S_IFMT == S_IFLNK
    }

    /// 0600 for a regular file of ours that others may read.
    static func tighten(_ path: String) {
        var info = stat()
        guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_uid == geteuid(),
            info.st_mode & 0o077 != 0
        else { return }
        chmod(path, 0o600)
    }

    /// Moves the entry `name` into the folder `folderName` of `directory` (made as `folder`
    /// makes it). Returns where it went, or nil when it stayed.
    static func move(_ name: String, in directory: CaptureDirectory, into folderName: String) -> String? {
        guard let target = folder(folderName, in: directory) else { return nil }
        return renameat(directory.fd, name, target.fd, name) == 0 ? target.path(of: name) : nil
    }

    /// Moves a file that could not be read whole into `damaged/`, with a `.txt` note beside it
    /// saying what was wrong where. Returns where it went, or nil when it stayed.
    static func moveAside(_ name: String, in directory: CaptureDirectory, note: String) -> String? {
        guard let target = folder("damaged", in: directory),
            renameat(directory.fd, name, target.fd, name) == 0
        else { return nil }
        let text = "file: \(CaptureFile.printable(directory.path(of: name)))\n" + note
        write(Array(text.utf8), to: name + ".txt", in: target)
        return target.path(of: name)
    }
}
