internal import CElfutils
internal import CrashFileFormat
internal import Foundation

#if canImport(Glibc)
    internal import Glibc
#endif

/// A directory of binaries and debug info keyed by GNU build-id, in the layout debuggers and
/// libdwfl search (`.build-id/xx/rest` and `.build-id/xx/rest.debug`), so that a crash still
/// names its frames after the binary that crashed was replaced.
public struct SymbolStore: Sendable {
    public let path: String

    public init(path: String) {
        self.path = path
    }

    public struct Added: Sendable, Equatable {
        public let buildID: String
        /// The separate debug file copied beside the binary, when it had one.
        public let debugFile: String?
    }

    /// Copies `binary`, and its separate debug info when the symbolicator finds some, under
    /// its build-id. A file already stored under that build-id is replaced (same build, same
    /// bytes or better debug info).
    ///
    /// Memory stays flat whatever the file's size: the build-id is read from the ELF headers and
    /// notes alone, and the copy goes 1 MiB at a time. A file over 4 GiB is refused. Folders are
    /// made 0700 and files 0600 whatever the umask: debug info planted in a store by another
    /// user would name the frames of every crash replayed with it.
    public func add(binary: String, symbolicator: Symbolicator) throws -> Added {
        guard let buildID = try ELFImage.buildID(ofFileAt: binary), buildID.count >= 4 else {
            throw CrashCaptureError.corrupt("\(binary) has no GNU build-id (link with -Wl,--build-id)")
        }
        let directory = path + "/.build-id/" + buildID.prefix(2)
        for folder in [path, path + "/.build-id", directory] {
            if mkdir(folder, 0o700) != 0 && errno != EEXIST {
                throw CrashCaptureError.io(
                    "cannot create the store folder: \(String(cString: strerror(errno)))", path: folder)
            }
            // mkdir's mode is cut by the umask; a folder made before, or by someone else's umask,
            // is tightened too.
            var info = stat()
            guard lstat(folder, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else {
                throw CrashCaptureError.io("the store folder is not a folder (a link?)", path: folder)
            }
            if info.st_mode & 0o077 != 0 && chmod(folder, 0o700) != 0 {
                throw CrashCaptureError.io(
                    "cannot make the store folder private: \(String(cString: strerror(errno)))", path: folder)
            }
        }
        let stem = directory + "/" + buildID.dropFirst(2)
        try copy(binary, to: stem)
        var separate: String?
        if case .success(let debugFile) = symbolicator.debugFile(modulePath: binary, buildID: buildID),
            URL(fileURLWithPath: debugFile).resolvingSymlinksInPath().path
                != URL(fileURLWithPath: binary).resolvingSymlinksInPath().path
        {
            try copy(debugFile, to: stem + ".debug")
            separate = debugFile
        }
        return Added(buildID: buildID, debugFile: separate)
    }

    /// Written under a temporary name (0600) and renamed, so a reader never sees half a file;
    /// 1 MiB at a time.
    private func copy(_ source: String, to destination: String) throws {
        let input = ccs_open_regular(source, CCS_MAXIMUM_MODULE_BYTES)
        guard input >= 0 else {
            let reason = errno == EFBIG ? "larger than 4 GiB, the most a store takes" : String(cString: strerror(errno))
            throw CrashCaptureError.io("cannot copy: \(reason)", path: source)
        }
        defer { close(input) }
        let temporary = destination + ".tmp-\(getpid())"
        unlink(temporary)
        let output = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard output >= 0 else {
            throw CrashCaptureError.io("cannot copy: \(String(cString: strerror(errno)))", path: temporary)
        }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var failure: String?
        while failure == nil {
            let count = buffer.withUnsafeMutableBytes { read(input, $0.baseAddress, $0.count) }
            if count == 0 { break }
            if count < 0 {
                if errno == EINTR { continue }
                failure = String(cString: strerror(errno))
                break
            }
            var written = 0
            while written < count {
                let step = buffer.withUnsafeBytes { write(output, $0.baseAddress! + written, count - written) }
                if step < 0 && errno == EINTR { continue }
                guard step > 0 else {
                    failure = String(cString: strerror(errno))
                    break
                }
                written += step
            }
        }
        if failure == nil && fsync(output) != 0 { failure = String(cString: strerror(errno)) }
        close(output)
        if let failure {
            unlink(temporary)
            throw CrashCaptureError.io("cannot copy: \(failure)", path: source)
        }
        guard rename(temporary, destination) == 0 else {
            let reason = String(cString: strerror(errno))
            try? FileManager.default.removeItem(atPath: temporary)
            throw CrashCaptureError.io("cannot store: \(reason)", path: destination)
        }
    }
}
