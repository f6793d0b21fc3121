public import CrashFileFormat

/// What groups a thousand reports of one bug: a stable hash of the signal and the top frames
/// of the app's own code, and a title a person reads. Frames of libc, the loader, the C++ and
/// Swift runtimes, libunwind and CrashCapture are passed over; a named frame counts by module
/// and function (so ASLR and rebuilds that leave those functions alone change nothing), an
/// unnamed one by module and offset.
public enum CrashFingerprint: Sendable {
    /// In-app frames that make the fingerprint.
    public static let frameCount = 3

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

    /// The signal's name and the in-app frames that make the fingerprint, in order, each by
    /// its linkage name (so that how names are printed changes nothing).
    public static func key(signal: String, symbols: [Symbolicator.Symbol], frames: [CrashReport.Frame]) -> [String] {
        [signal] + places(symbols: symbols, frames: frames).map(\.key)
    }

    /// The in-app places, innermost first: `key` for the hash, `name` for people.
    static func places(symbols: [Symbolicator.Symbol], frames: [CrashReport.Frame]) -> [(key: String, name: String)] {
        var places: [(key: String, name: String)] = []
        for (index, symbol) in symbols.enumerated() where !isSystemModule(symbol.module) && symbol.module != "???" {
            // Inlined functions count as frames of their own: the bug is in them whether or
            // not the compiler inlined them in this build.
            for frame in symbol.expanded {
                if let function = frame.function {
                    places.append((symbol.module + "!" + (frame.linkageName ?? function), function))
                    if places.count == frameCount { return places }
                }
            }
            if symbol.function == nil, index < frames.count, let offset = frames[index].offset {
                let place = symbol.module + "+0x" + String(offset, radix: 16)
                places.append((place, place))
                if places.count == frameCount { return places }
            }
        }
        return places
    }

    /// 16 hex digits: FNV-1a (64 bits) of the key's lines. Not a secret, only stable.
    public static func fingerprint(signal: String, symbols: [Symbolicator.Symbol], frames: [CrashReport.Frame])
        -> String
    {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in key(signal: signal, symbols: symbols, frames: frames).joined(separator: "\n").utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        let hex = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex
    }

    /// "SIGSEGV in MyApp.Parser.read(_:)": the signal and the first in-app function (or
    /// module+offset), or the first frame at all when none is the app's.
    public static func title(signal: String, symbols: [Symbolicator.Symbol], frames: [CrashReport.Frame]) -> String {
        if let first = places(symbols: symbols, frames: frames).first { return signal + " in " + first.name }
        if let first = symbols.first { return signal + " in " + (first.function ?? first.module) }
        return signal
    }
}
