package import CrashFileFormat
package import CrashSymbolication
internal import Foundation

/// How replay writes a named frame and a crash's readable reason into the imported event.
extension CrashReplayer {
    /// `linkageNames`: also the names as the binary spells them, for tools that compare.
    package static func frameObject(
        pc: UInt64, offset: UInt64?, symbol: Symbolicator.Symbol, linkageNames: Bool = false
    ) -> [String: Any] {
        var object: [String: Any] = ["pc": "0x" + String(pc, radix: 16), "module_name": symbol.module]
        if let offset { object["offset"] = "0x" + String(offset, radix: 16) }
        if let function = symbol.function { object["function"] = function }
        if linkageNames, let linkage = symbol.linkageName { object["linkage_name"] = linkage }
        if let within = symbol.offsetInFunction { object["function_offset"] = within }
        object.merge(sourceObject(file: symbol.file, line: symbol.line, column: symbol.column)) { $1 }
        // Whose each function is (FrameRole): `system` or `thunk`; the app's are unmarked.
        let roles = symbol.roles
        if let role = roles.last, role != .app { object["role"] = role.rawValue }
        if !symbol.inlined.isEmpty {
            // Innermost first, as a debugger prints them, each positioned where it was reached.
            object["inlined"] = zip(symbol.inlined, roles).map { frame, role -> [String: Any] in
                var entry = sourceObject(file: frame.file, line: frame.line, column: frame.column)
                if let function = frame.function { entry["function"] = function }
                if linkageNames, let linkage = frame.linkageName { entry["linkage_name"] = linkage }
                if role != .app { entry["role"] = role.rawValue }
                return entry
            }
        }
        return object
    }

    /// A frame object read back (`frameObject`'s inverse, but for the roles, which follow from
    /// the names).
    package static func symbol(fromFrameObject object: [String: Any]) -> Symbolicator.Symbol {
        func int(_ key: String, in object: [String: Any]) -> Int? { (object[key] as? NSNumber)?.intValue }
        return Symbolicator.Symbol(
            function: object["function"] as? String, linkageName: object["linkage_name"] as? String,
            offsetInFunction: (object["function_offset"] as? NSNumber)?.uint64Value,
            module: object["module_name"] as? String ?? "???", note: object["symbol_note"] as? String,
            file: object["file"] as? String, line: int("line", in: object), column: int("column", in: object),
            inlined: (object["inlined"] as? [[String: Any]] ?? []).map { frame in
                Symbolicator.SourceFrame(
                    function: frame["function"] as? String, linkageName: frame["linkage_name"] as? String,
                    file: frame["file"] as? String, line: int("line", in: frame), column: int("column", in: frame))
            })
    }

    /// Gives `symbolicator` the names a stored crash was given at import (`CrashReport(path:storedEvent:)`),
    /// for every address of its stacks: where the modules found here name nothing (the binary
    /// is gone, or another build by now), the report still reads as it did.
    package static func rememberNames(of report: CrashReport, in symbolicator: Symbolicator) {
        let details = report.crashed?["crash"] as? [String: Any] ?? [:]
        func remember(_ frames: [CrashReport.Frame], _ objects: Any?, returnAddresses: Bool) {
            for (index, (frame, object)) in zip(frames, objects as? [[String: Any]] ?? []).enumerated() {
                guard let module = frame.module, module < report.modules.count, let offset = frame.offset,
                    object["function"] != nil
                else { continue }
                symbolicator.remember(
                    symbol(fromFrameObject: object), modulePath: report.modules[module].path,
                    buildID: report.modules[module].buildID, offset: offset,
                    isReturnAddress: returnAddresses && index > 0
                )
            }
        }
        remember(report.frames, details["frames"], returnAddresses: true)
        remember(report.asyncFrames, details["async_frames"], returnAddresses: false)
        for (thread, object) in zip(report.threads, details["threads"] as? [[String: Any]] ?? []) where !thread.crashed
        {
            remember(thread.frames, JSONTree.materialized(object["frames"]), returnAddresses: true)
            remember(thread.asyncFrames, object["async_frames"], returnAddresses: false)
        }
    }

    static func sourceObject(file: String?, line: Int?, column: Int?) -> [String: Any] {
        var object: [String: Any] = [:]
        if let file { object["file"] = file }
        if let line { object["line"] = line }
        if let column { object["column"] = column }
        return object
    }

    /// The first lines of the handler's own text (signal, thread, message), then named frames,
    /// cut at 16 KiB like the Sensors SDKs' app_crashed_reason.
    static func reason(report: CrashReport, symbols: [Symbolicator.Symbol]) -> String {
        let original = report.reason ?? ""
        var text = String(handlerHeader(original))
        text.reserveCapacity(text.utf8.count + report.frames.count * 96)
        // Lines are joined by newlines; a reason of frame lines only starts with its first frame.
        var separator = original.utf8.first == UInt8(ascii: "#") ? "" : "\n"
        for (index, frame) in report.frames.enumerated() {
            let symbol = index < symbols.count ? symbols[index] : Symbolicator.Symbol(module: "???")
            let start = "#\(index) 0x" + String(frame.pc, radix: 16) + " " + symbol.module
            for inlined in symbol.inlined {
                text += separator
                separator = "\n"
                text += start
                text += " [inlined] "
                text += inlined.function ?? "?"
                if let location = inlined.location { text += " at " + location }
            }
            text += separator
            separator = "\n"
            text += start
            if let function = symbol.function {
                text += " " + function + " + " + String(symbol.offsetInFunction ?? 0)
                if let location = symbol.source.location { text += " at " + location }
            } else if let offset = frame.offset {
                text += " +0x" + String(offset, radix: 16)
            }
        }
        if text.utf8.count > 16 * 1024 {
            text = String(decoding: Array(text.utf8.prefix(16 * 1024 - 20)), as: UTF8.self) + "\n[truncated]"
        }
        return text
    }

    /// The handler's own lines (signal, thread, message): those before the first frame line.
    static func handlerHeader(_ reason: String) -> Substring {
        let utf8 = reason.utf8
        var lineStart = utf8.startIndex
        while lineStart < utf8.endIndex {
            if utf8[lineStart] == UInt8(ascii: "#") {
                // The newline that ends the last header line is the frame lines' own.
                return reason[..<(lineStart == utf8.startIndex ? lineStart : utf8.index(before: lineStart))]
            }
            guard let newline = utf8[lineStart...].firstIndex(of: UInt8(ascii: "\n")) else { break }
            lineStart = utf8.index(after: newline)
        }
        return reason[...]
    }
}
