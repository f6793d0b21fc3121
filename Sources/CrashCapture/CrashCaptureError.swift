/// Why CrashCapture refused or failed to do something, in words a person can act on.
public enum CrashCaptureError: Error, Equatable, CustomStringConvertible {
    case invalidArgument(String)
    case installFailed(String)
    case io(String)
    case corrupt(String)

    public var description: String {
        switch self {
        case .invalidArgument(let text): return "invalid argument: \(text)"
        case .installFailed(let text): return "install failed: \(text)"
        case .io(let text): return text
        case .corrupt(let text): return "corrupt data: \(text)"
        }
    }
}
