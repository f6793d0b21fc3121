public import CrashFileFormat
internal import Foundation

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
    public func add(binary: String, symbolicator: Symbolicator) throws -> Added {
        let image = try ELFImage(path: binary)
        guard let buildID = image.buildID, buildID.count >= 4 else {
            throw CrashCaptureError.corrupt("\(binary) has no GNU build-id (link with -Wl,--build-id)")
        }
        let directory = path + "/.build-id/" + buildID.prefix(2)
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw CrashCaptureError.io("cannot create the store folder: \(error.localizedDescription)", path: directory)
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

    /// Written under a temporary name and renamed, so a reader never sees half a file.
    private func copy(_ source: String, to destination: String) throws {
        let temporary = destination + ".tmp-\(getpid())"
        try? FileManager.default.removeItem(atPath: temporary)
        do {
            try FileManager.default.copyItem(atPath: source, toPath: temporary)
        } catch {
            throw CrashCaptureError.io("cannot copy: \(error.localizedDescription)", path: source)
        }
        guard rename(temporary, destination) == 0 else {
            let reason = String(cString: strerror(errno))
            try? FileManager.default.removeItem(atPath: temporary)
            throw CrashCaptureError.io("cannot store: \(reason)", path: destination)
        }
    }
}
