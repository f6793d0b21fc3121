public import CrashFileFormat
internal import Foundation

/// What groups a thousand reports of one bug: a stable hash of the signal and the top frames
/// of the app's own code, and a title a person reads. Whose a frame is comes from the frame
/// (``FrameRole``): libc, the loader and the runtimes, and also the standard library inlined
/// into the app, `<compiler-generated>` code, thunks, and the runtimes a `--static-swift-stdlib`
/// binary carries, are passed over. The task's `[async]` callers continue the stack. A named
/// frame counts by module and function (so ASLR and rebuilds that leave those functions alone
/// change nothing), an unnamed one by module and offset. Docs/Formats.md says the rule.
public enum CrashFingerprint: Sendable {
    /// In-app frames that make the fingerprint.
    public static let frameCount = 3

    /// The rule a fingerprint was made by, in every report (`crash_fingerprint_version`): 1,
    /// the first three frames outside the toolchain's files; 2, the first three of the app's
    /// own frames, by frame, with the async callers after the stack.
    public static let version = 2

    /// Module names whose frames are never the app's. Every `libswift*` is the toolchain's
    /// (the runtime, Concurrency, Dispatch's overlay, and libswiftSwiftOnoneSupport, where a
    /// debug build's generic code is specialized); so is Foundation in each of its libraries.
    static let systemPrefixes = [
        "libc.so", "libm.so", "libpthread", "ld-linux", "libdl.so", "librt.so", "libstdc++", "libgcc_s", "libunwind",
        "liblzma", "libswift", "libdispatch", "libBlocksRuntime", "libFoundation", "lib_Foundation",
        "libcrashcapture", "libCrashCapturePreload",
    ]

    public static func isSystemModule(_ name: String) -> Bool {
        systemPrefixes.contains { name.hasPrefix($0) }
    }

    /// Title, fingerprint and reason of one crash (or hang), from its stack and its task's
    /// async callers.
    public struct Summary: Sendable, Equatable {
        /// `Index out of range in MyApp.priceOfItem(_:at:)`: the reason (or the signal) and
        /// the innermost function of the app.
        public var title: String
        /// 16 hex digits.
        public var fingerprint: String
        /// Why, in the runtime's words: a Swift fatal error's message, or the reason a release
        /// build's trap carries in its `Swift runtime failure:` frame. Nil for a plain signal.
        public var reason: String?
    }

    public static func summary(
        signal: String, swiftMessage: String? = nil, symbols: [Symbolicator.Symbol], frames: [CrashReport.Frame],
        asyncSymbols: [Symbolicator.Symbol] = []
    ) -> Summary {
        let places = places(symbols: symbols, frames: frames, asyncSymbols: asyncSymbols)
        let reason = reason(swiftMessage: swiftMessage, symbols: symbols)
        let head = reason.map(shortened) ?? signal
        let title: String
        if let first = places.first {
            title = head + " in " + first.name
        } else if let first = symbols.first {
            title = head + " in " + (first.function ?? first.module)
        } else {
            title = head
        }
        return Summary(title: title, fingerprint: hash([signal] + places.map(\.key)), reason: reason)
    }

    /// The signal's name and the in-app frames that make the fingerprint, in order.
    public static func key(
        signal: String, symbols: [Symbolicator.Symbol], frames: [CrashReport.Frame],
        asyncSymbols: [Symbolicator.Symbol] = []
    ) -> [String] {
        [signal] + places(symbols: symbols, frames: frames, asyncSymbols: asyncSymbols).map(\.key)
    }

    public static func fingerprint(signal: String, symbols: [Symbolicator.Symbol], frames: [CrashReport.Frame])
        -> String
    {
        summary(signal: signal, symbols: symbols, frames: frames).fingerprint
    }

    public static func title(signal: String, symbols: [Symbolicator.Symbol], frames: [CrashReport.Frame]) -> String {
        summary(signal: signal, symbols: symbols, frames: frames).title
    }

    /// The app's places, innermost first: `key` for the hash, `name` for people. The stack's
    /// frames (each inline chain innermost first), then the task's async callers.
    static func places(
        symbols: [Symbolicator.Symbol], frames: [CrashReport.Frame], asyncSymbols: [Symbolicator.Symbol]
    ) -> [(key: String, name: String)] {
        var places: [(key: String, name: String)] = []
        var stack = symbols.enumerated().map { ($0.element, $0.offset < frames.count ? frames[$0.offset].offset : nil) }
        // A task's callers are its async frames, not the executor thread's frames below the job.
        if !asyncSymbols.isEmpty, let job = stack.firstIndex(where: { FrameRole.runsAJob($0.0.linkageName) }) {
            stack.removeSubrange(job...)
        }
        for (symbol, offset) in stack + asyncSymbols.map({ ($0, nil) }) where symbol.module != "???" {
            if symbol.function == nil {
                // Unnamed: by module and offset, unless the module is the toolchain's.
                guard !isSystemModule(symbol.module), let offset else { continue }
                let place = symbol.module + "+0x" + String(offset, radix: 16)
                places.append((place, place))
            } else {
                for (frame, role) in zip(symbol.expanded, symbol.roles) where role == .app {
                    guard let function = frame.function else { continue }
                    places.append((symbol.module + "!" + stableName(frame.linkageName ?? function), function))
                    if places.count == frameCount { return places }
                }
            }
            if places.count == frameCount { return places }
        }
        return places
    }

    /// A function's name as it stays across builds: a debug build's function and a release
    /// build's specialization or async resume part of it are one name.
    static func stableName(_ linkage: String) -> String { Demangler.stableName(linkage) }

    /// The Swift fatal error's message without its `file:line:` and `Fatal error:`, else the
    /// reason of the first frame's `Swift runtime failure:` (what a release build's trap has).
    public static func reason(swiftMessage: String?, symbols: [Symbolicator.Symbol]) -> String? {
        if let message = swiftMessage?.trimmingCharacters(in: .whitespacesAndNewlines), !message.isEmpty {
            var text = Substring(message)
            // `Swift/Array.swift:692: Fatal error: Index out of range`
            if let range = text.range(of: #"^[^\n]*?:[0-9]+: "#, options: .regularExpression) {
                text = text[range.upperBound...]
            }
            if text.hasPrefix("Fatal error: ") { text = text.dropFirst("Fatal error: ".count) }
            let reason = text.trimmingCharacters(in: .whitespacesAndNewlines)
            if !reason.isEmpty { return reason }
        }
        guard let first = symbols.first else { return nil }
        return first.expanded.lazy.compactMap { FrameRole.runtimeFailureReason($0.function) }.first
    }

    /// A reason fit for a title: its first line, at most 160 characters.
    static func shortened(_ reason: String) -> String {
        let line = reason.prefix { $0 != "\n" }
        return line.count > 160 ? String(line.prefix(159)) + "…" : String(line)
    }

    /// FNV-1a (64 bits) of the key's lines after the rule's version, as 16 hex digits. Not a
    /// secret, only stable.
    static func hash(_ key: [String]) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in (["v\(version)"] + key).joined(separator: "\n").utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        let hex = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }
}

extension Symbolicator {
    /// The crash's title, fingerprint and reason, from its crashing thread and that thread's
    /// task (`symbols`: the crashing thread's, when already named).
    public func summary(of report: CrashReport, symbols: [Symbol]? = nil) -> CrashFingerprint.Summary {
        CrashFingerprint.summary(
            signal: report.signalName ?? "crash", swiftMessage: report.swiftMessage,
            symbols: symbols ?? symbolicate(report), frames: report.frames,
            asyncSymbols: symbolicateAsyncFrames(of: report))
    }

    /// A hang's, from the hung thread (`signal`: `Hang` or `Deadlock`).
    public func summary(ofHung thread: CrashReport.Thread, in report: CrashReport, signal: String)
        -> CrashFingerprint.Summary
    {
        CrashFingerprint.summary(
            signal: signal, symbols: symbolicate(thread, in: report), frames: thread.frames,
            asyncSymbols: symbolicateAsyncFrames(of: thread, in: report))
    }
}
