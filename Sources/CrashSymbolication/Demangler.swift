internal import Foundation

@_silgen_name("swift_demangle")
private func _swiftDemangle(
    _ mangledName: UnsafePointer<CChar>?, _ mangledNameLength: Int, _ outputBuffer: UnsafeMutablePointer<CChar>?,
    _ outputBufferSize: UnsafeMutablePointer<Int>?, _ flags: UInt32
) -> UnsafeMutablePointer<CChar>?

private typealias CxaDemangle =
    @convention(c) (
        UnsafePointer<CChar>?, UnsafeMutablePointer<CChar>?, UnsafeMutablePointer<Int>?, UnsafeMutablePointer<Int32>?
    ) -> UnsafeMutablePointer<CChar>?

/// libstdc++'s demangler, looked up at run time: the Swift runtime brings libstdc++ into the
/// process, but our binaries do not link it themselves.
private let cxaDemangle: CxaDemangle? = {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "__cxa_demangle") else { return nil }
    return unsafeBitCast(symbol, to: CxaDemangle.self)
}()

private func _cxaDemangle(
    _ name: UnsafePointer<CChar>?, _ buffer: UnsafeMutablePointer<CChar>?, _ length: UnsafeMutablePointer<Int>?,
    _ status: UnsafeMutablePointer<Int32>?
) -> UnsafeMutablePointer<CChar>? {
    guard let cxaDemangle else {
        status?.pointee = -1
        return nil
    }
    return cxaDemangle(name, buffer, length, status)
}

/// Symbol names made readable: Swift names with the Swift runtime's demangler, C++ names (and
/// C++ type names such as `St13runtime_error`) with libstdc++'s; other names unchanged.
public enum Demangler: Sendable {
    public static func demangle(_ name: String) -> String {
        if name.hasPrefix("_Z") { return demangleCxx(name) }
        guard name.hasPrefix("$s") || name.hasPrefix("_$s") || name.hasPrefix("$S") || name.hasPrefix("_T0") else {
            return name
        }
        return name.withCString { pointer in
            guard let result = _swiftDemangle(pointer, strlen(pointer), nil, nil, 0) else { return name }
            defer { free(result) }
            return String(cString: result)
        }
    }
}

@_silgen_name("_swift_backtrace_demangle")
private func _swiftBacktraceDemangle(
    _ mangledName: UnsafePointer<CChar>?, _ mangledNameLength: Int, _ outputBuffer: UnsafeMutablePointer<CChar>?,
    _ outputBufferSize: UnsafeMutablePointer<Int>?
) -> UnsafeMutablePointer<CChar>?

extension Demangler {
    /// A Swift name as the Swift backtracer prints it, qualified by its module
    /// (`MyApp.Parser.read(_:)`: argument labels but no types, no return type), from the
    /// runtime's own backtrace demangler; other names as `demangle` gives them.
    public static func shortName(_ name: String) -> String {
        guard name.hasPrefix("$s") || name.hasPrefix("_$s") || name.hasPrefix("$S") else { return demangle(name) }
        let short = name.withCString { pointer -> String? in
            guard let result = _swiftBacktraceDemangle(pointer, strlen(pointer), nil, nil) else { return nil }
            defer { free(result) }
            return String(cString: result)
        }
        let full = demangle(name)
        guard let short else { return full }
        // The backtracer leaves the module out; a crash title read away from the binary needs it.
        // An async function's resume part (where a release build's frame often is) is named
        // after `... resume partial function for`, and is that function to a reader.
        var owner = Substring(full)
        if let range = owner.range(
            of: #"^\([0-9]+\) (await|suspend) resume partial function for "#, options: .regularExpression)
        {
            owner = owner[range.upperBound...]
        }
        guard let dot = owner.firstIndex(of: "."), owner.startIndex < dot,
            owner[..<dot].allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" })
        else { return short }
        let module = owner[..<dot]
        return short.hasPrefix(module + ".") ? short : module + "." + short
    }

    /// A Swift name as the backtracer prints it, without the module: the same function in a
    /// debug and a release build (its async resume parts, its specializations) has one such
    /// name.
    public static func stableName(_ name: String) -> String {
        guard name.hasPrefix("$s") || name.hasPrefix("_$s") || name.hasPrefix("$S") else { return demangle(name) }
        var short =
            name.withCString { pointer -> String? in
                guard let result = _swiftBacktraceDemangle(pointer, strlen(pointer), nil, nil) else { return nil }
                defer { free(result) }
                return String(cString: result)
            } ?? demangle(name)
        for prefix in ["specialized ", "partial apply for ", "merged "] where short.hasPrefix(prefix) {
            short.removeFirst(prefix.count)
        }
        return short
    }

    static func demangleCxx(_ name: String) -> String {
        var status: Int32 = 0
        guard let result = name.withCString({ _cxaDemangle($0, nil, nil, &status) }), status == 0 else { return name }
        defer { free(result) }
        return String(cString: result)
    }

    /// A C++ type name as `std::type_info::name()` gives it (`St13runtime_error`), made readable.
    public static func demangleCxxType(_ name: String) -> String { demangleCxx(name) }
}
