internal import CCrashFileFormat
internal import CrashFileFormat
internal import Foundation

/// A value of an event property, as the Sensors Analytics data model allows: text, numbers,
/// booleans and lists of text. Literals work too: `["plan": "pro", "seats": 3]`.
public enum PropertyValue: Sendable, Equatable {
    /// UTF-8 text of at most 8191 bytes.
    case string(String)
    /// A whole number.
    case int(Int)
    /// A finite number.
    case double(Double)
    /// True or false.
    case bool(Bool)
    /// A list of at most 500 texts, each at most 8191 bytes.
    case strings([String])
}

extension PropertyValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByArrayLiteral
{
    /// `"text"` is `.string("text")`.
    public init(stringLiteral value: String) { self = .string(value) }
    /// `3` is `.int(3)`.
    public init(integerLiteral value: Int) { self = .int(value) }
    /// `1.5` is `.double(1.5)`.
    public init(floatLiteral value: Double) { self = .double(value) }
    /// `true` is `.bool(true)`.
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    /// `["a", "b"]` is `.strings(["a", "b"])`.
    public init(arrayLiteral elements: String...) { self = .strings(elements) }
}

/// The naming and size rules shared by static properties and tracked events.
package enum PropertyRules {
    package static let maximumKeyLength = 100
    package static let maximumStringBytes = 8191
    package static let maximumListCount = 500
    /// Checks a property key or an event name: `[A-Za-z_$][A-Za-z0-9_$]*`, at most 100 bytes, not a
    /// reserved name; `$` starts only the SDK's own preset names.
    package static func validateName(_ name: String, kind: String, allowDollar: Bool = false) throws {
        guard !name.isEmpty, name.utf8.count <= maximumKeyLength else {
            throw CrashCaptureError.invalidArgument("\(kind) \"\(name)\" must be 1 to \(maximumKeyLength) bytes")
        }
        if name.hasPrefix("$") && !allowDollar {
            throw CrashCaptureError.invalidArgument("\(kind) \"\(name)\": names starting with $ are reserved")
        }
        for (index, byte) in name.utf8.enumerated() {
            let letter = (byte >= 0x41 && byte <= 0x5a) || (byte >= 0x61 && byte <= 0x7a) || byte == 0x5f
            let digit = byte >= 0x30 && byte <= 0x39
            let dollar = byte == 0x24 && allowDollar
            guard letter || dollar || (digit && index > 0) else {
                throw CrashCaptureError.invalidArgument("\(kind) \"\(name)\" must match [A-Za-z_][A-Za-z0-9_]*")
            }
        }
        if isReserved(name) {
            throw CrashCaptureError.invalidArgument("\(kind) \"\(name)\" is a reserved name")
        }
    }

    /// Case-insensitive, without allocating: track() runs this on the caller's thread. The list
    /// is the one the C install checks static properties against (crashcapture_format.h).
    static func isReserved(_ name: String) -> Bool {
        var name = name
        return name.withUTF8 { bytes in
            bytes.withMemoryRebound(to: CChar.self) { ccf_is_reserved_name($0.baseAddress, $0.count) != 0 }
        }
    }

    package static func validate(_ properties: [String: PropertyValue]) throws {
        for (key, value) in properties {
            try validateName(key, kind: "property key")
            switch value {
            case .string(let text):
                try validateText(text, key: key)
            case .strings(let list):
                guard list.count <= maximumListCount else {
                    throw CrashCaptureError.invalidArgument(
                        "property \"\(key)\" has \(list.count) items; at most \(maximumListCount)")
                }
                for text in list { try validateText(text, key: key) }
            case .double(let number):
                guard number.isFinite else {
                    throw CrashCaptureError.invalidArgument("property \"\(key)\" is not a finite number")
                }
            case .int, .bool:
                break
            }
        }
    }

    private static func validateText(_ text: String, key: String) throws {
        guard text.utf8.count <= maximumStringBytes else {
            throw CrashCaptureError.invalidArgument(
                "property \"\(key)\" is \(text.utf8.count) bytes; at most \(maximumStringBytes)")
        }
    }
}

package enum JSONText {
    package static func quoted(_ text: String) -> String {
        var out = [UInt8]()
        out.reserveCapacity(text.utf8.count + 16)
        JSONTree.writeString(text, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Object members without braces, keys sorted so the output is stable.
    static func members(_ properties: [String: PropertyValue]) -> String {
        var json = ""
        for (index, key) in properties.keys.sorted().enumerated() {
            if index > 0 { json += "," }
            appendQuoted(key, to: &json)
            json += ":"
            appendValue(properties[key]!, to: &json)
        }
        return json
    }
}
