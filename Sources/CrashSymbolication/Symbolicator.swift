public import CrashFileFormat
internal import Foundation

/// Turns module + offset into function names, matching each module by GNU build-id so that a
/// rebuilt binary is never used to name the frames of another build. Images are read once and
/// cached per path.
/// `@unchecked`: the two caches are its only mutable state, and every access holds `lock`.
public final class Symbolicator: @unchecked Sendable {
    public struct Symbol: Sendable, Equatable {
        public var function: String?
        public var offsetInFunction: UInt64?
        public var module: String
        /// Why there is no function name, when there is none.
        public var note: String?
        /// From DWARF line tables, where the module has them.
        public var file: String?
        public var line: Int?

        public init(
            function: String? = nil, offsetInFunction: UInt64? = nil, module: String, note: String? = nil,
            file: String? = nil, line: Int? = nil
        ) {
            self.function = function
            self.offsetInFunction = offsetInFunction
            self.module = module
            self.note = note
            self.file = file
            self.line = line
        }
    }

    private var images: [String: Result<ELFImage, CrashCaptureError>] = [:]
    private var names: [String: String] = [:]
    private let lock = NSLock()

    public init() {}

    func image(at path: String) -> Result<ELFImage, CrashCaptureError> {
        lock.lock()
        defer { lock.unlock() }
        if let cached = images[path] { return cached }
        let loaded: Result<ELFImage, CrashCaptureError>
        do {
            loaded = .success(try ELFImage(path: path))
        } catch let error as CrashCaptureError {
            loaded = .failure(error)
        } catch {
            loaded = .failure(.io("\(error)"))
        }
        images[path] = loaded
        return loaded
    }

    private func moduleName(_ path: String) -> String {
        lock.lock()
        defer { lock.unlock() }
        if let known = names[path] { return known }
        let name = path.split(separator: "/").last.map(String.init) ?? path
        names[path] = name
        return name
    }

    /// `isReturnAddress`: every frame but the first holds the address after a call; look one
    /// byte back so the call's own function is named, not whatever follows it.
    public func symbolicate(
        modulePath: String, buildID: String, offset: UInt64, isReturnAddress: Bool
    ) -> Symbol {
        let name = moduleName(modulePath)
        guard !modulePath.isEmpty, modulePath.hasPrefix("/") else {
            return Symbol(module: name.isEmpty ? "???" : name, note: "no file for this module")
        }
        switch image(at: modulePath) {
        case .failure(let error):
            return Symbol(module: name, note: "\(error)")
        case .success(let image):
            if !buildID.isEmpty, let fileID = image.buildID, fileID != buildID {
                return Symbol(module: name, note: "build-id mismatch: the file on disk is another build")
            }
            let address = isReturnAddress && offset > 0 ? offset - 1 : offset
            guard let (symbol, within) = image.symbol(containing: address) else {
                return Symbol(module: name, note: "no symbol covers this address")
            }
            let adjusted = isReturnAddress && offset > 0 ? within + 1 : within
            let location = image.location(of: address)
            return Symbol(
                function: Demangler.demangle(symbol.name), offsetInFunction: adjusted, module: name,
                file: location?.file, line: location?.line)
        }
    }

    /// Every frame of a report's crashing thread, named.
    public func symbolicate(_ report: CrashReport) -> [Symbol] {
        symbolicate(report.frames, modules: report.modules)
    }

    /// Every frame of one thread (from `CrashReport.threads`), named.
    public func symbolicate(_ thread: CrashReport.Thread, in report: CrashReport) -> [Symbol] {
        symbolicate(thread.frames, modules: report.modules)
    }

    /// Frames of one stack, the first the interrupted instruction, the others return addresses.
    public func symbolicate(_ frames: [CrashReport.Frame], modules: [CrashReport.Module]) -> [Symbol] {
        frames.enumerated().map { index, frame in
            guard let moduleIndex = frame.module, moduleIndex < modules.count, let offset = frame.offset else {
                return Symbol(module: "???", note: "address outside every known module")
            }
            let module = modules[moduleIndex]
            return symbolicate(
                modulePath: module.path, buildID: module.buildID, offset: offset, isReturnAddress: index > 0)
        }
    }
}
