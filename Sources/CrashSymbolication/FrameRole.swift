@_silgen_name("_swift_backtrace_isThunkFunction")
private func _swiftBacktraceIsThunkFunction(_ mangledName: UnsafePointer<CChar>) -> Bool

/// Whose a frame is, decided by the frame rather than by the file it was loaded from: with
/// `--static-swift-stdlib` the runtime, Concurrency, Dispatch and Foundation are inside the
/// app's own binary, and in a release build the standard library's code is inlined into the
/// app's functions. The marks are the Swift runtime backtracer's: `[system]`, `[thunk]`.
public enum FrameRole: String, Sendable {
    /// The app's own code, or its dependencies' (a framework's responders are the request's
    /// path as much as the route is).
    case app
    /// libc, the loader, the runtimes, inlined standard-library code, `<compiler-generated>`
    /// code, `Swift runtime failure:` pseudo-frames.
    case system
    /// A reabstraction thunk, a protocol witness, a `partial apply`: compiler glue between two
    /// of the app's functions.
    case thunk

    /// The role of one function of a frame's inline chain, in module `module` (a file name).
    public static func of(_ frame: Symbolicator.SourceFrame, module: String) -> FrameRole {
        if CrashFingerprint.isSystemModule(module) || module == "???" { return .system }
        // CrashCapture's own C code, linked into the app (the threads' alternate-stack trampoline).
        if frame.file?.contains("/Sources/CCrashCapture/") == true || frame.function == "cc_thread_trampoline" {
            return .system
        }
        if frame.function.map(isRuntimeFailure) == true { return .system }
        let name = frame.linkageName ?? frame.function ?? ""
        if isThunk(name) { return .thunk }
        if let file = frame.file {
            // What the compiler made up, or code with no line of its own (the backtracer's rule).
            if file.hasSuffix("<compiler-generated>") || frame.line == 0 { return .system }
            return .app
        }
        // No source position: the binary's debug info does not cover it, which is what the
        // toolchain's static libraries look like inside an app. Their names tell them apart.
        return isToolchainName(name) ? .system : .app
    }

    /// Where an executor's thread runs a task's job: the frames below it are the thread's, the
    /// task's callers are its async frames.
    static func runsAJob(_ linkageName: String?) -> Bool {
        linkageName == "swift_job_run" || linkageName == "_ZN5swift34runJobInEstablishedExecutorContextEPNS_3JobE"
    }

    /// `Swift runtime failure: Index out of range`: the name a release build gives the trap.
    static func isRuntimeFailure(_ function: String) -> Bool { function.hasPrefix(runtimeFailurePrefix) }
    static let runtimeFailurePrefix = "Swift runtime failure: "

    /// The reason a `Swift runtime failure:` pseudo-frame carries (`Index out of range`).
    public static func runtimeFailureReason(_ function: String?) -> String? {
        guard let function, isRuntimeFailure(function) else { return nil }
        let reason = function.dropFirst(runtimeFailurePrefix.count)
        return reason.isEmpty ? nil : String(reason)
    }

    /// The runtime's own test, as the backtracer uses it: reabstraction thunks, protocol
    /// witnesses, partial-apply forwarders, dispatch thunks.
    static func isThunk(_ name: String) -> Bool {
        guard name.hasPrefix("$s") || name.hasPrefix("_$s") else { return false }
        return name.withCString { _swiftBacktraceIsThunkFunction($0) }
    }

    /// The Swift modules the toolchain ships, as a mangled name's first module spells them.
    static let toolchainSwiftModules: Set<String> = [
        "Swift", "_Concurrency", "_StringProcessing", "_RegexParser", "RegexBuilder", "Foundation",
        "FoundationEssentials", "FoundationInternationalization", "FoundationNetworking", "FoundationXML",
        "_FoundationCollections", "Dispatch", "Synchronization", "Observation", "Distributed", "Glibc", "Musl",
        "_Differentiation", "Cxx", "CxxStdlib", "Runtime", "_Volatile", "_Builtin_float", "SwiftOnoneSupport",
    ]

    /// C and C++ names of the runtimes a static binary carries: the Swift runtime and
    /// Concurrency (`swift_*`, `swift::`), Dispatch, CoreFoundation and the blocks runtime.
    static let toolchainCPrefixes = [
        "swift_", "_swift_", "__swift", "_dispatch_", "dispatch_", "_os_object", "__CF", "_CF", "CF", "_Block_",
        "_NS", "__NS",
    ]

    /// Whether a linkage name belongs to the toolchain's runtimes or libraries.
    static func isToolchainName(_ name: String) -> Bool {
        if name.hasPrefix("$s") || name.hasPrefix("_$s") {
            let body = name.drop { $0 == "_" || $0 == "$" }.dropFirst()  // after `$s`
            // `$ss...` is the standard library itself; `$sS<letter>` and `$sSc<letter>` are
            // its known types (Array, String, Task...), whose methods these are.
            if body.hasPrefix("s") || body.hasPrefix("S") { return true }
            let digits = body.prefix { $0.isNumber }
            guard let length = Int(digits), length > 0 else { return false }
            let module = body.dropFirst(digits.count).prefix(length)
            return toolchainSwiftModules.contains(String(module))
        }
        if name.hasPrefix("_Z") {
            // The Swift runtime's C++: in namespace `swift`, or taking its types.
            return name.contains("N5swift") || name.contains("NK5swift") || name.hasPrefix("_ZN12_GLOBAL__N_1")
        }
        return toolchainCPrefixes.contains { name.hasPrefix($0) }
    }
}

extension Symbolicator.Symbol {
    /// Each function of the inline chain with its role, innermost first (as `expanded`).
    public var roles: [FrameRole] { expanded.map { FrameRole.of($0, module: module) } }

    /// The role of the function that holds the code (the outermost of the chain).
    public var role: FrameRole { FrameRole.of(source, module: module) }
}
