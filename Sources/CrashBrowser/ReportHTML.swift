internal import CrashCapture
internal import CrashSymbolication
internal import Foundation

/// A stored crash or hang event as HTML, the way `crashcap show` prints a report: the crashed
/// (or hung) thread first, the app's own frames stressed, runs of system frames folded, the
/// task's `[async]` callers after its frames, every other thread collapsed. Every string in
/// the event is text to escape, whoever wrote it.
enum ReportHTML {
    typealias Object = [String: Any]

    /// The crash (or hang) object of an event and the event's properties.
    static func parts(_ event: Object) -> (details: Object, properties: Object) {
        ((event["crash"] ?? event["hang"]) as? Object ?? [:], event["properties"] as? Object ?? [:])
    }

    static func string(_ value: Any?) -> String {
        switch value {
        case nil, is NSNull: return ""
        case let text as String: return text
        case let number as NSNumber: return number.stringValue
        case let other?:
            guard JSONSerialization.isValidJSONObject(other),
                let data = try? JSONSerialization.data(withJSONObject: other, options: [.sortedKeys])
            else { return "\(other)" }
            return String(decoding: data, as: UTF8.self)
        }
    }

    /// As `crashcap show` decides: every function of the frame is libc's, the loader's or a
    /// runtime's (`FrameRole`, from the frame's module and names), or it is a thread's entry.
    static func isSystem(_ frame: Object) -> Bool {
        let symbol = CrashReplayer.symbol(fromFrameObject: frame)
        return symbol.roles.allSatisfy { $0 == .system } || symbol.function == "_start"
            || symbol.function == "cc_thread_trampoline"
    }

    /// One frame's line (and its inlined functions', innermost first, each on a line of its own).
    static func frameLines(_ frame: Object, number: Int, async: Bool = false) -> String {
        var html = ""
        for inlined in frame["inlined"] as? [Object] ?? [] {
            let role = inlined["role"] as? String
            html +=
                "<li class=\"\(role == "system" ? "system" : "app")\">#\(number) "
                + HTML.escape(inlined["function"] as? String ?? "?") + sourceText(inlined)
                + " <span class=\"mark\">[inlined]\(role.map { " [\(HTML.escape($0))]" } ?? "")</span></li>"
        }
        let system = isSystem(frame)
        let role = frame["role"] as? String
        var line = "#\(number) "
        if !async { line += "<span class=\"dim\">\(HTML.escape(string(frame["pc"])))</span> " }
        line += HTML.escape(frame["function"] as? String ?? "???")
        if let offset = frame["function_offset"] { line += " + " + HTML.escape(string(offset)) }
        line += " <span class=\"dim\">in " + HTML.escape(string(frame["module_name"])) + "</span>" + sourceText(frame)
        var marks: [String] = []
        if async { marks.append("[async]") }
        if let role { marks.append("[\(role)]") }
        if !marks.isEmpty { line += " <span class=\"mark\">" + HTML.escape(marks.joined(separator: " ")) + "</span>" }
        return html + "<li class=\"\(system ? "system" : "app")\">\(line)</li>"
    }

    static func sourceText(_ frame: Object) -> String {
        guard let file = frame["file"] as? String, !file.isEmpty else { return "" }
        let line = frame["line"].map { ":" + string($0) } ?? ""
        return " <span class=\"dim\">at " + HTML.escape(file + line) + "</span>"
    }

    /// Frames innermost first; with `folding`, each run of two or more system frames is one
    /// collapsed `<details>`, as `crashcap show` hides them behind a count.
    static func frames(_ frames: [Object], asyncFrames: [Object] = [], folding: Bool) -> String {
        var html = "<ol class=\"frames\">"
        var run: [String] = []
        func flush() {
            if run.count >= 2 && folding {
                html +=
                    "<li class=\"system\"><details><summary>\(run.count) system frames</summary><ol class=\"frames\">"
                    + run.joined() + "</ol></details></li>"
            } else {
                html += run.joined()
            }
            run = []
        }
        for (index, frame) in frames.enumerated() {
            let line = frameLines(frame, number: index)
            if isSystem(frame) {
                run.append(line)
            } else {
                flush()
                html += line
            }
        }
        flush()
        for (index, frame) in asyncFrames.enumerated() {
            html += frameLines(frame, number: frames.count + index, async: true)
        }
        return html + "</ol>"
    }

    /// The thread the report is about, and the others.
    static func threads(_ details: Object) -> (main: (Object, [Object], [Object]), others: [Object]) {
        var threads = details["threads"] as? [Object] ?? []
        if let frames = details["frames"] as? [Object] {
            // A crash: the crashing thread's frames are the report's own.
            let index = threads.firstIndex { $0["crashed"] as? Bool == true }
            let thread = index.map { threads.remove(at: $0) } ?? [:]
            return ((thread, frames, details["async_frames"] as? [Object] ?? []), threads)
        }
        // A hang: the hung thread first.
        let index = threads.firstIndex { $0["hung"] as? Bool == true } ?? (threads.isEmpty ? nil : 0)
        let thread = index.map { threads.remove(at: $0) } ?? [:]
        return (
            (thread, thread["frames"] as? [Object] ?? [], thread["async_frames"] as? [Object] ?? []), threads
        )
    }

    static func threadLabel(_ thread: Object) -> String {
        "thread " + string(thread["tid"]) + " \"" + string(thread["name"]) + "\""
            + (thread["state"].map { " " + string($0) } ?? "")
    }

    /// The report as the group page shows it (`all`: every frame of every thread open, for the report page).
    static func report(_ event: Object, all: Bool) -> String {
        let (details, properties) = parts(event)
        let (main, others) = threads(details)
        var html = "<section class=\"report\">"
        var head: [(String, String)] = []
        let signal = string(properties["crash_signal_name"])
        if !signal.isEmpty { head.append(("signal", signal + " (" + string(properties["crash_code_name"]) + ")")) }
        if let address = properties["crash_fault_address"] { head.append(("fault address", string(address))) }
        if let reason = properties["crash_message"] ?? properties["hang_watch"].map({ "watch " + string($0) }) {
            head.append(("message", string(reason)))
        }
        if let type = properties["crash_exception_type_demangled"] ?? properties["crash_exception_type"] {
            head.append(("exception", string(type)))
        }
        head.append(("app", string(properties["$app_name"]) + " " + string(properties["$app_version"])))
        head.append(("host", string(properties["$hostname"]) + " · pid " + string(properties["$pid"])))
        if !head.isEmpty {
            html +=
                "<table class=\"facts\">"
                + head.map { "<tr><th>\(HTML.escape($0.0))</th><td>\(HTML.escape($0.1))</td></tr>" }.joined()
                + "</table>"
        }
        html +=
            "<h2 class=\"crashed\">" + HTML.escape(threadLabel(main.0))
            + (details["frames"] != nil ? " crashed" : " hung") + "</h2>"
        html += frames(main.1, asyncFrames: main.2, folding: !all)
        if !others.isEmpty {
            html += "<h2>Other threads (\(others.count))</h2>"
            for thread in others {
                let threadFrames = thread["frames"] as? [Object] ?? []
                html +=
                    "<details class=\"thread\"\(all ? " open" : "")><summary>" + HTML.escape(threadLabel(thread))
                    + " <span class=\"dim\">\(threadFrames.count) frames</span></summary>"
                    + frames(threadFrames, asyncFrames: thread["async_frames"] as? [Object] ?? [], folding: !all)
                    + "</details>"
            }
        }
        html += breadcrumbs(properties) + context(properties) + attachments(details)
        return html + "</section>"
    }

    static func breadcrumbs(_ properties: Object) -> String {
        let crumbs = properties["crash_breadcrumbs"] as? [Any] ?? []
        guard !crumbs.isEmpty else { return "" }
        var html = "<h2>Breadcrumbs (\(crumbs.count))</h2><ol class=\"frames crumbs\">"
        for crumb in crumbs { html += "<li>" + HTML.escape(string(crumb)) + "</li>" }
        return html + "</ol>"
    }

    static func context(_ properties: Object) -> String {
        guard let context = properties["crash_context"] as? Object, !context.isEmpty else { return "" }
        return "<h2>Context</h2><table class=\"facts\">"
            + context.keys.sorted().map {
                "<tr><th>\(HTML.escape($0))</th><td><code>\(HTML.escape(string(context[$0])))</code></td></tr>"
            }.joined() + "</table>"
    }

    static func attachments(_ details: Object) -> String {
        let attachments = details["attachments"] as? [Object] ?? []
        guard !attachments.isEmpty else { return "" }
        return "<h2>Attachments</h2>"
            + attachments.map { attachment in
                let name = string(attachment["path"] ?? attachment["name"])
                let text = string(attachment["text"] ?? attachment["base64"])
                return "<details><summary>" + HTML.escape(name) + "</summary><pre>" + HTML.escape(text)
                    + "</pre></details>"
            }.joined()
    }

    /// What only the report page shows: registers, modules, memory near the fault, the process.
    static func everythingElse(_ event: Object) -> String {
        let (details, _) = parts(event)
        var html = ""
        var registers = details["registers"] as? Object ?? [:]
        if registers.isEmpty { registers = threads(details).main.0["registers"] as? Object ?? [:] }
        if !registers.isEmpty {
            html +=
                "<h2>Registers</h2><pre>"
                + registers.keys.sorted().map {
                    HTML.escape($0.padding(toLength: 7, withPad: " ", startingAt: 0) + string(registers[$0]))
                }
                .joined(separator: "\n") + "</pre>"
        }
        let modules = details["modules"] as? [Object] ?? []
        if !modules.isEmpty {
            html +=
                "<h2>Modules (\(modules.count))</h2><table><tr><th>start</th><th>end</th><th>build id</th><th>path</th></tr>"
                + modules.map { module in
                    "<tr><td><code>\(HTML.escape(string(module["start"])))</code></td><td><code>\(HTML.escape(string(module["end"])))</code></td><td><code>\(HTML.escape(string(module["build_id"])))</code></td><td class=\"title\">\(HTML.escape(string(module["path"])))</td></tr>"
                }.joined() + "</table>"
        }
        for region in details["memory"] as? [Object] ?? [] {
            html +=
                "<h2>Memory near the " + HTML.escape(string(region["what"])) + " at "
                + HTML.escape(string(region["address"])) + "</h2><pre>"
                + HTML.escape(hexDump(region["base64"] as? String ?? "", address: string(region["address"]))) + "</pre>"
        }
        if let process = details["process"] {
            html += "<h2>Process</h2><pre>" + HTML.escape(pretty(process)) + "</pre>"
        }
        return html
    }

    static func hexDump(_ base64: String, address: String) -> String {
        let bytes = [UInt8](Data(base64Encoded: base64) ?? Data())
        let start = UInt64(address.hasPrefix("0x") ? String(address.dropFirst(2)) : address, radix: 16) ?? 0
        var lines: [String] = []
        for offset in stride(from: 0, to: min(bytes.count, 4096), by: 16) {
            let row = bytes[offset..<min(offset + 16, bytes.count)]
            let hex = row.map { String(format: "%02x", $0) }.joined(separator: " ")
            let text = String(row.map { (0x20..<0x7f).contains($0) ? Character(Unicode.Scalar($0)) : "." })
            lines.append(
                String(format: "%016llx  ", start &+ UInt64(offset))
                    + hex.padding(toLength: 48, withPad: " ", startingAt: 0)
                    + " " + text)
        }
        return lines.joined(separator: "\n")
    }

    static func pretty(_ value: Any) -> String {
        guard JSONSerialization.isValidJSONObject(value),
            let data = try? JSONSerialization.data(withJSONObject: value, options: [.prettyPrinted, .sortedKeys])
        else { return string(value) }
        return String(decoding: data, as: UTF8.self)
    }
}
