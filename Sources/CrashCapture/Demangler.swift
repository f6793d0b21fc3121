import Foundation

@_silgen_name("swift_demangle")
private func _swiftDemangle(
    _ mangledName: UnsafePointer<CChar>?, _ mangledNameLength: Int, _ outputBuffer: UnsafeMutablePointer<CChar>?,
    _ outputBufferSize: UnsafeMutablePointer<Int>?, _ flags: UInt32
) -> UnsafeMutablePointer<CChar>?

/// Swift symbol names made readable with the runtime's own demangler; other names unchanged.
public enum Demangler {
    public static func demangle(_ name: String) -> String {
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
