internal import CElfutils
public import CrashFileFormat
internal import Foundation

/// Turns module + offset into functions, source positions and inline chains, on elfutils
/// (libdw, loaded at first use). Each module is matched by GNU build-id, so a rebuilt binary is
/// never used to name the frames of another build: when the file on disk is another build, the
/// original is looked for by build-id in the symbol stores, the debug directories and, when
/// `DEBUGINFOD_URLS` is set, on debuginfod. Without libdw, functions are still named from the
/// symbol tables. Modules are opened once and every answer is cached.
/// `@unchecked`: its caches are its only mutable state, and every access holds `lock` (libdw
/// is not safe for concurrent use of one module either).
public final class Symbolicator: @unchecked Sendable {
    /// Where debug info is looked for, and how names are written.
    public struct Options: Sendable, Equatable {
        /// Directories `crashcap symbols add` fills: `.build-id/xx/rest` (the binary) and
        /// `.build-id/xx/rest.debug` (its separate debug info).
        public var symbolStores: [String]
        /// Searched by build-id and by `.gnu_debuglink`, after the symbol stores.
        public var debugDirectories: [String]
        /// Swift names in full (`MyApp.Parser.read(Swift.Int) -> Swift.String`) rather than as
        /// the Swift backtracer prints them (`Parser.read(_:)`).
        public var fullSwiftNames: Bool
        /// Whether separate debug info is looked for (`.gnu_debuglink`, the debug directories by
        /// build-id, debuginfod). Off inside an app's own process, where nothing may wait on a
        /// file named by a report's contents or on a server: the modules' own symbol tables and
        /// DWARF, and the symbol stores, still serve, and `crashcap` names the rest later.
        public var searchesSeparateDebugInfo: Bool

        public init(
            symbolStores: [String] = [], debugDirectories: [String] = ["/usr/lib/debug"], fullSwiftNames: Bool = false,
            searchesSeparateDebugInfo: Bool = true
        ) {
            self.symbolStores = symbolStores
            self.debugDirectories = debugDirectories
            self.fullSwiftNames = fullSwiftNames
            self.searchesSeparateDebugInfo = searchesSeparateDebugInfo
        }

        /// The symbol stores of `CRASHCAPTURE_SYMBOLS` (a colon-separated list), and `extra`.
        public static func fromEnvironment(
            adding extra: [String] = [], fullSwiftNames: Bool = false, searchesSeparateDebugInfo: Bool = true
        ) -> Options {
            let listed = (ProcessInfo.processInfo.environment["CRASHCAPTURE_SYMBOLS"] ?? "").split(separator: ":")
                .map(String.init).filter { !$0.isEmpty }
            return Options(
                symbolStores: extra + listed, fullSwiftNames: fullSwiftNames,
                searchesSeparateDebugInfo: searchesSeparateDebugInfo)
        }
    }

    /// Sets debuginfod's limits where the environment sets none (10 s to connect and start,
    /// 60 s a download, 512 MiB a file, no retry) instead of libdebuginfod's own (90 s, none,
    /// none, two retries). Call
    /// it at a tool's start, before other threads read the environment.
    public static func boundNetworkLookups() { ccs_bound_debuginfod() }

    /// One function of an inline chain, with the source position reached in it.
    public struct SourceFrame: Sendable, Equatable {
        public var function: String?
        /// As the binary spells it (mangled for Swift and C++).
        public var linkageName: String?
        public var file: String?
        public var line: Int?
        public var column: Int?

        /// `file:line:column` (or `file:line`), when the line is known.
        public var location: String? {
            guard let file, let line else { return nil }
            return "\(file):\(line)" + (column.map { ":\($0)" } ?? "")
        }

        public init(function: String?, linkageName: String?, file: String?, line: Int?, column: Int?) {
            self.function = function
            self.linkageName = linkageName
            self.file = file
            self.line = line
            self.column = column
        }
    }

    public struct Symbol: Sendable, Equatable {
        /// The function that holds the code (the outermost of an inline chain).
        public var function: String?
        public var linkageName: String?
        public var offsetInFunction: UInt64?
        public var module: String
        /// Why there is no function name, or less than a full answer.
        public var note: String?
        /// Where in `function` the frame is, from DWARF line tables.
        public var file: String?
        public var line: Int?
        public var column: Int?
        /// Functions the compiler inlined at this place, innermost first; `function` is their
        /// caller.
        public var inlined: [SourceFrame]

        public init(
            function: String? = nil, linkageName: String? = nil, offsetInFunction: UInt64? = nil, module: String,
            note: String? = nil, file: String? = nil, line: Int? = nil, column: Int? = nil, inlined: [SourceFrame] = []
        ) {
            self.function = function
            self.linkageName = linkageName
            self.offsetInFunction = offsetInFunction
            self.module = module
            self.note = note
            self.file = file
            self.line = line
            self.column = column
            self.inlined = inlined
        }

        /// The inline chain and then the function itself, innermost first.
        public var expanded: [SourceFrame] { inlined + [source] }

        /// The function that holds the code, as one of an inline chain's frames.
        public var source: SourceFrame {
            SourceFrame(function: function, linkageName: linkageName, file: file, line: line, column: column)
        }
    }

    public let options: Options
    private var modules: [String: LoadedModule] = [:]
    private var answers: [AnswerKey: Symbol] = [:]
    /// Names a report brought with it (`remember`), for where the modules here name nothing.
    private var remembered: [AnswerKey: Symbol] = [:]
    private let lock = NSLock()

    public init(options: Options = Options()) {
        self.options = options
    }

    /// Why functions are named from symbol tables only (no source positions, no inline
    /// frames), or nil when libdw is loaded.
    public static var elfutilsUnavailable: String? {
        ccs_libdw_unavailable().map { String(cString: $0) }
    }

    /// `isReturnAddress`: every frame but the first holds the address after a call; look one
    /// byte back so the call's own function and line are named, not whatever follows it.
    public func symbolicate(
        modulePath: String, buildID: String, offset: UInt64, isReturnAddress: Bool
    ) -> Symbol {
        lock.lock()
        defer { lock.unlock() }
        let key = AnswerKey(module: modulePath, buildID: buildID, offset: offset, isReturnAddress: isReturnAddress)
        if let known = answers[key] { return known }
        var answer = lookUp(modulePath: modulePath, buildID: buildID, offset: offset, isReturnAddress: isReturnAddress)
        if answer.function == nil, let named = remembered[key] { answer = named }
        answers[key] = answer
        return answer
    }

    /// A name a report already carries for this address (a stored crash's frames, named when it
    /// was imported), used where the module found here names nothing: the binary is gone, or
    /// is another build by now. Call it before the address is first looked up.
    public func remember(
        _ symbol: Symbol, modulePath: String, buildID: String, offset: UInt64, isReturnAddress: Bool
    ) {
        lock.lock()
        defer { lock.unlock() }
        remembered[AnswerKey(module: modulePath, buildID: buildID, offset: offset, isReturnAddress: isReturnAddress)] =
            symbol
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

    /// The crashing thread's [async] callers, named: each address is a resume function's entry,
    /// not a return address. Empty when the function that held the chain is not a Swift async
    /// function, so a word that only looked like an async context names nothing.
    public func symbolicateAsyncFrames(of report: CrashReport) -> [Symbol] {
        symbolicateAsyncFrames(
            report.asyncFrames, owner: report.asyncOwner, confirmed: report.asyncChainConfirmed, stack: report.frames,
            modules: report.modules)
    }

    /// The same for one of the other threads.
    public func symbolicateAsyncFrames(of thread: CrashReport.Thread, in report: CrashReport) -> [Symbol] {
        symbolicateAsyncFrames(
            thread.asyncFrames, owner: thread.asyncOwner, confirmed: report.asyncChainConfirmed, stack: thread.frames,
            modules: report.modules)
    }

    /// `owner` is a pc of the function whose frame record held the chain: the stack's first
    /// frame, or a return address below it. When it is the first frame, that function may have
    /// a frame of its own (an async function that trapped) or none (a leaf of libc or the
    /// runtime that a task called): then the record is that of the first frame below it that
    /// is not the system's. `confirmed`: a stored crash's chains, confirmed when it was imported.
    func symbolicateAsyncFrames(
        _ frames: [CrashReport.Frame], owner: CrashReport.Frame?, confirmed: Bool = false, stack: [CrashReport.Frame],
        modules: [CrashReport.Module]
    ) -> [Symbol] {
        guard !frames.isEmpty else { return [] }
        if !confirmed {
            guard let owner, asyncChainHolds(owner: owner, stack: stack, modules: modules) else { return [] }
        }
        return frames.map { frame in
            guard let index = frame.module, index < modules.count, let offset = frame.offset else {
                return Symbol(module: "???", note: "address outside every known module")
            }
            let module = modules[index]
            return symbolicate(modulePath: module.path, buildID: module.buildID, offset: offset, isReturnAddress: false)
        }
    }

    /// Whether the function whose frame held the chain is a Swift async function.
    func asyncChainHolds(owner: CrashReport.Frame, stack: [CrashReport.Frame], modules: [CrashReport.Module]) -> Bool {
        func named(_ frame: CrashReport.Frame, returnAddress: Bool) -> Symbol? {
            guard let index = frame.module, index < modules.count, let offset = frame.offset else { return nil }
            let module = modules[index]
            return symbolicate(
                modulePath: module.path, buildID: module.buildID, offset: offset, isReturnAddress: returnAddress)
        }
        func isAsync(_ symbol: Symbol?) -> Bool {
            guard let symbol else { return false }
            return Self.isSwiftAsync(symbol.expanded.last?.linkageName ?? symbol.linkageName)
        }
        var holder = named(owner, returnAddress: stack.first?.pc != owner.pc)
        if stack.first?.pc == owner.pc, !isAsync(holder) {
            holder = stack.dropFirst().prefix(8).lazy.compactMap { named($0, returnAddress: true) }
                .first { $0.role != .system }
        }
        return isAsync(holder)
    }

    /// Whether a mangled Swift name is an async function or one of its resume partial
    /// functions (`Ya` in its type; `TQn_` and `TYn_` for the partial functions).
    static func isSwiftAsync(_ linkageName: String?) -> Bool {
        guard let name = linkageName, name.hasPrefix("$s") || name.hasPrefix("_$s") else { return false }
        if name.contains("Ya") { return true }
        guard let last = name.lastIndex(where: { $0 == "Q" || $0 == "Y" }), last > name.startIndex,
            name[name.index(before: last)] == "T"
        else { return false }
        return name.hasSuffix("_")
    }

    /// The file whose debug info names a module's frames, or why there is none; for
    /// `crashcap symbols` and for saying what is missing.
    public func debugFile(modulePath: String, buildID: String) -> Result<String, CrashCaptureError> {
        lock.lock()
        defer { lock.unlock() }
        switch module(path: modulePath, buildID: buildID) {
        case .elfutils(let module):
            return module.debugFile()
        case .symbolTable:
            return .failure(.io(Self.elfutilsUnavailable ?? "no debug info"))
        case .missing(let why):
            return .failure(.io(why))
        }
    }

    // MARK: - Lookup

    private struct AnswerKey: Hashable {
        let module: String
        let buildID: String
        let offset: UInt64
        let isReturnAddress: Bool
    }

    private enum LoadedModule {
        case elfutils(ElfutilsModule)
        case symbolTable(ELFImage)
        case missing(String)
    }

    private func lookUp(modulePath: String, buildID: String, offset: UInt64, isReturnAddress: Bool) -> Symbol {
        let name = modulePath.split(separator: "/").last.map(String.init) ?? modulePath
        guard !modulePath.isEmpty, modulePath.hasPrefix("/") else {
            return Symbol(module: name.isEmpty ? "???" : name, note: "no file for this module")
        }
        let address = isReturnAddress && offset > 0 ? offset - 1 : offset
        switch module(path: modulePath, buildID: buildID) {
        case .missing(let why):
            return Symbol(module: name, note: why)
        case .symbolTable(let image):
            guard let (symbol, within) = image.symbol(containing: address) else {
                return Symbol(module: name, note: "no symbol covers this address")
            }
            return Symbol(
                function: displayName(symbol.name, file: nil, module: name), linkageName: symbol.name,
                offsetInFunction: isReturnAddress && offset > 0 ? within + 1 : within, module: name)
        case .elfutils(let module):
            var symbol = Symbol(module: name)
            let chain = module.frames(at: address)
            if let outer = chain.last {
                // DWARF names the function when the symbol table does not (a stripped binary
                // with its debug info elsewhere) and is the better name for local symbols.
                if let linkage = outer.function, let start = outer.start, start <= address {
                    symbol.linkageName = linkage
                    symbol.function = displayName(linkage, file: outer.file, module: name)
                    symbol.offsetInFunction = isReturnAddress && offset > 0 ? address - start + 1 : address - start
                }
                symbol.file = outer.file
                symbol.line = outer.line
                symbol.column = outer.column
                symbol.inlined = chain.dropLast().map { frame in
                    SourceFrame(
                        function: frame.function.map { displayName($0, file: frame.file, module: name) },
                        linkageName: frame.function, file: frame.file, line: frame.line, column: frame.column)
                }
            }
            // The symbol tables (.symtab, .dynsym, MiniDebugInfo) only where DWARF had no name:
            // libdwfl searches them linearly.
            if symbol.function == nil, let (linkage, within) = module.symbol(at: address) {
                symbol.linkageName = linkage
                symbol.function = displayName(linkage, file: nil, module: name)
                symbol.offsetInFunction = isReturnAddress && offset > 0 ? within + 1 : within
            }
            if symbol.function == nil { symbol.note = "no symbol covers this address" }
            return symbol
        }
    }

    /// `file`, `module`: where the function is, to name a top-level closure (`naming(closure:)`).
    private func displayName(_ linkage: String, file: String?, module: String) -> String {
        let name = options.fullSwiftNames ? Demangler.demangle(linkage) : Demangler.shortName(linkage)
        return Self.naming(closure: name, file: file, module: module)
    }

    /// A closure of top-level code has an empty parent context (`closure #7 in `): it is named
    /// by its file instead (`closure #7 in main.swift`), or by its module when no file is known.
    static func naming(closure name: String, file: String?, module: String) -> String {
        guard name.hasSuffix(" in ") || name.hasSuffix(" in") else { return name }
        let place = file.map { ($0 as NSString).lastPathComponent } ?? module
        return name.hasSuffix(" ") ? name + place : name + " " + place
    }

    private func module(path: String, buildID: String) -> LoadedModule {
        let key = path + "\u{0}" + buildID
        if let known = modules[key] { return known }
        let loaded = load(path: path, buildID: buildID)
        modules[key] = loaded
        return loaded
    }

    private var searchPath: String {
        // libdwfl's syntax: the module's directory, its .debug/, then each directory by
        // build-id and by debuglink; CRCs of debuglinked files are checked.
        ([":.debug"] + (options.symbolStores + options.debugDirectories).filter { $0.hasPrefix("/") })
            .joined(separator: ":")
    }

    private func load(path: String, buildID: String) -> LoadedModule {
        guard Self.elfutilsUnavailable == nil else {
            do {
                let image = try ELFImage(path: path)
                if !buildID.isEmpty, let fileID = image.buildID, fileID != buildID {
                    return .missing("build-id mismatch: the file on disk is another build")
                }
                return .symbolTable(image)
            } catch let error as CrashCaptureError {
                return .missing("\(error)")
            } catch {
                return .missing("\(error)")
            }
        }
        var why = "the file is gone"
        switch ElfutilsModule.open(path: path, searchPath: searchPath, localOnly: !options.searchesSeparateDebugInfo) {
        case .success(let module):
            if buildID.isEmpty || module.buildID == nil || module.buildID == buildID {
                return .elfutils(module)
            }
            why = "build-id mismatch: the file on disk is another build"
        case .failure(let error):
            why = "\(error)"
        }
        guard buildID.count >= 4, buildID.allSatisfy(\.isHexDigit) else { return .missing(why) }
        // The build that crashed, by its build-id: stores first, then the debug directories.
        let prefix = String(buildID.prefix(2))
        let rest = String(buildID.dropFirst(2))
        for directory in options.symbolStores + options.debugDirectories {
            for candidate in [
                "\(directory)/.build-id/\(prefix)/\(rest)", "\(directory)/.build-id/\(prefix)/\(rest).debug",
            ]
            where FileManager.default.fileExists(atPath: candidate) {
                if case .success(let module) = ElfutilsModule.open(
                    path: candidate, searchPath: searchPath, localOnly: !options.searchesSeparateDebugInfo),
                    module.buildID == buildID
                {
                    return .elfutils(module)
                }
            }
        }
        if options.searchesSeparateDebugInfo, let urls = ProcessInfo.processInfo.environment["DEBUGINFOD_URLS"],
            !urls.isEmpty
        {
            for executable in [true, false] {
                guard
                    case .success(let downloaded) = ElfutilsModule.debuginfod(buildID: buildID, executable: executable)
                else { continue }
                if case .success(let module) = ElfutilsModule.open(
                    path: downloaded, searchPath: searchPath, localOnly: false),
                    module.buildID == buildID
                {
                    return .elfutils(module)
                }
            }
            why += ", and debuginfod has no build \(buildID)"
        } else {
            why += ", and no symbol store has build \(buildID)"
        }
        return .missing(why)
    }
}

/// A C string written into `buffer`, up to its NUL.
private func text(_ buffer: [CChar]) -> String {
    String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// One ELF file opened with libdwfl, with its debug info found on first use.
final class ElfutilsModule {
    private let handle: OpaquePointer
    let buildID: String?

    private init(handle: OpaquePointer) {
        self.handle = handle
        var hex = [CChar](repeating: 0, count: 2 * 64 + 1)
        buildID = ccs_module_build_id(handle, &hex, hex.count) != 0 ? text(hex) : nil
    }

    deinit { ccs_module_close(handle) }

    static func open(path: String, searchPath: String, localOnly: Bool) -> Result<ElfutilsModule, CrashCaptureError> {
        var error = [CChar](repeating: 0, count: 256)
        guard let handle = ccs_module_open(path, searchPath, localOnly ? 1 : 0, &error, error.count) else {
            return .failure(.io(text(error), path: path))
        }
        return .success(ElfutilsModule(handle: handle))
    }

    /// Downloads by build-id into libdebuginfod's cache; the cached file's path. The cache is
    /// kept within its bound first (once a process).
    static func debuginfod(buildID: String, executable: Bool) -> Result<String, CrashCaptureError> {
        DebuginfodCache.pruneOnce()
        var bytes: [UInt8] = []
        var index = buildID.startIndex
        while let next = buildID.index(index, offsetBy: 2, limitedBy: buildID.endIndex), index != next {
            guard let byte = UInt8(buildID[index..<next], radix: 16) else { break }
            bytes.append(byte)
            index = next
        }
        var path = [CChar](repeating: 0, count: Int(PATH_MAX))
        var why = [CChar](repeating: 0, count: 256)
        guard ccs_debuginfod_find(bytes, bytes.count, executable ? 1 : 0, &path, path.count, &why, why.count) != 0
        else { return .failure(.io("debuginfod: " + text(why))) }
        return .success(text(path))
    }

    func debugFile() -> Result<String, CrashCaptureError> {
        var why = [CChar](repeating: 0, count: 256)
        guard let file = ccs_module_debug_file(handle, &why, why.count) else {
            return .failure(.io(text(why)))
        }
        return .success(String(cString: file))
    }

    func symbol(at address: UInt64) -> (name: String, offset: UInt64)? {
        var offset: UInt64 = 0
        guard let name = ccs_module_symbol(handle, address, &offset) else { return nil }
        return (String(cString: name), offset)
    }

    struct Frame {
        let function: String?
        let file: String?
        let line: Int?
        let column: Int?
        /// Where the out-of-line function starts.
        let start: UInt64?
    }

    /// Innermost first; the last is the function that holds the code.
    func frames(at address: UInt64) -> [Frame] {
        var frames = [ccs_frame](repeating: ccs_frame(), count: 64)
        let count = Int(ccs_module_frames(handle, address, &frames, Int32(frames.count)))
        return frames.prefix(count).map {
            Frame(
                function: $0.function.map { String(cString: $0) }, file: $0.file.map { String(cString: $0) },
                line: $0.line > 0 ? Int($0.line) : nil, column: $0.column > 0 ? Int($0.column) : nil,
                start: $0.has_start != 0 ? $0.start : nil)
        }
    }
}

/// libdebuginfod's cache ($DEBUGINFOD_CACHE_PATH, else $XDG_CACHE_HOME/debuginfod_client, else
/// ~/.cache/debuginfod_client) only forgets by age (a week unused), never by size: a server that
/// answers with large files would fill the disk. Before the first download of a process, the
/// build-ids used least recently are removed until it holds at most
/// CRASHCAPTURE_DEBUGINFOD_CACHE_BYTES (2 GiB by default).
enum DebuginfodCache {
    static let defaultBound: UInt64 = 2 << 30
    private static let once: Void = prune()

    static func pruneOnce() { _ = once }

    static var directory: String? {
        let environment = ProcessInfo.processInfo.environment
        if let path = environment["DEBUGINFOD_CACHE_PATH"], !path.isEmpty { return path }
        if let cache = environment["XDG_CACHE_HOME"], !cache.isEmpty { return cache + "/debuginfod_client" }
        if let home = environment["HOME"], !home.isEmpty { return home + "/.cache/debuginfod_client" }
        return nil
    }

    static func prune() {
        let bound =
            ProcessInfo.processInfo.environment["CRASHCAPTURE_DEBUGINFOD_CACHE_BYTES"].flatMap { UInt64($0) }
            ?? defaultBound
        guard let directory, let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }
        // One folder a build-id; its files, the downloads. Links are not followed.
        var entries: [(path: String, bytes: UInt64, used: Int)] = []
        for name in names where name.count >= 8 && name.allSatisfy(\.isHexDigit) {
            let path = directory + "/" + name
            var info = stat()
            guard lstat(path, &info) == 0, info.st_mode & S_IFMT == S_IFDIR else { continue }
            var bytes: UInt64 = 0
            var used = Int(info.st_mtim.tv_sec)
            for file in (try? FileManager.default.contentsOfDirectory(atPath: path)) ?? [] {
                var fileInfo = stat()
                guard lstat(path + "/" + file, &fileInfo) == 0 else { continue }
                bytes += UInt64(max(0, Int64(fileInfo.st_blocks) * 512))
                used = max(used, Int(fileInfo.st_atim.tv_sec), Int(fileInfo.st_mtim.tv_sec))
            }
            entries.append((path, bytes, used))
        }
        var total = entries.reduce(0) { $0 + $1.bytes }
        for entry in entries.sorted(by: { $0.used < $1.used }) where total > bound {
            try? FileManager.default.removeItem(atPath: entry.path)
            total -= entry.bytes
        }
    }
}
