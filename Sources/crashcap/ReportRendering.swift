internal import CrashCapture
internal import CrashFileFormat
internal import CrashSymbolication
internal import Foundation

/// ANSI styling, only when asked for (a terminal); plain text otherwise. Styles are written
/// with a private-use character in place of ESC: every line is then escaped (text from a crash
/// file may hold any control character), and only after that do the styles become real
/// escape sequences (`terminalSafe`).
struct TextStyle: Sendable {
    static let escapeStandIn = "\u{E000}["
    let enabled: Bool
    init(enabled: Bool) { self.enabled = enabled }
    func bold(_ text: String) -> String { styled("1", text) }
    func red(_ text: String) -> String { styled("1;31", text) }
    func dim(_ text: String) -> String { styled("2", text) }

    private func styled(_ code: String, _ text: String) -> String {
        enabled ? "\(Self.escapeStandIn)\(code)m\(text)\(Self.escapeStandIn)0m" : text
    }

    /// A line for the terminal: every control character escaped (`\x1b`, `\x0a`...), so that no
    /// text from a file can move the cursor or forge a line; then our own styles.
    func terminalSafe(_ line: String) -> String {
        let escaped = CaptureFile.printable(line)
        return enabled ? escaped.replacingOccurrences(of: Self.escapeStandIn, with: "\u{1b}[") : escaped
    }
}

/// What `crashcap show` prints besides the essentials.
struct RenderOptions: Sendable {
    /// Frames of the crashing thread at most (0: all).
    var frames = 32
    /// Frames of libc, the loader and the runtimes too, and every frame of the other threads.
    var allFrames = false
    /// The memory near the stack pointer, the pc and the fault, as hex dumps.
    var memory = false
    /// Frames of each other thread's stack when `allFrames` is off.
    static let otherThreadFrames = 3
}

/// How `crashcap show` presents a report, as text for people or JSON for scripts.
enum ReportRendering {
    static func text(
        _ report: CrashReport, symbols: [Symbolicator.Symbol], symbolicator: Symbolicator, options: RenderOptions,
        style: TextStyle
    ) -> String {
        var lines: [String] = [style.bold("== \(report.path)")]
        for problem in report.problems { lines.append(style.red("damaged: \(problem)")) }
        if report.crashed == nil, report.hang != nil {
            return (lines + hangLines(report, symbolicator: symbolicator, options: options, style: style))
                .map(style.terminalSafe).joined(separator: "\n")
        }
        if report.crashed == nil, let end = report.events.first(where: { $0["event"] as? String == "$AppHangEnd" }) {
            let properties = end["properties"] as? [String: Any] ?? [:]
            lines.append(
                "hang \(properties["hang_id"] ?? "?") of watch \"\(properties["hang_watch"] ?? "?")\" ended after "
                    + "\(properties["hang_duration_ms"] ?? "?") ms")
            return lines.map(style.terminalSafe).joined(separator: "\n")
        }
        guard let crashed = report.crashed else {
            lines.append(report.session != nil ? "no crash recorded in this session" : "no crash record")
            return lines.map(style.terminalSafe).joined(separator: "\n")
        }
        let properties = report.properties
        let app = "\(properties["$app_name"] ?? "?") \(properties["$app_version"] ?? "")"
        let time = (crashed["time"] as? NSNumber).map { Date(timeIntervalSince1970: $0.doubleValue / 1000) }
        lines.append(
            "\(style.bold("app")):      \(app)  pid \(properties["$pid"] ?? "?")  on \(properties["$hostname"] ?? "?")")
        if let time { lines.append("\(style.bold("time")):     \(time)") }
        var signal = "\(report.signalName ?? "?") (\(report.codeName ?? "?"))"
        if let address = properties["crash_fault_address"] as? String, report.signalName != "SIGABRT" {
            signal += " at \(address)"
        }
        if let sender = properties["crash_sender_pid"] {
            signal += " sent by pid \(sender)" + (properties["crash_sender_uid"].map { " (uid \($0))" } ?? "")
        }
        lines.append("\(style.bold("signal")):   \(style.red(signal))")
        var summary = symbolicator.summary(of: report, symbols: symbols)
        if let stored = storedSummary(report) { (summary.title, summary.fingerprint) = stored }
        lines.append("\(style.bold("title")):    \(summary.title)  " + style.dim("fingerprint \(summary.fingerprint)"))
        if properties["crash_compact"] as? Bool == true {
            let first = (properties["crash_first_time"] as? NSNumber).map {
                " since \(Date(timeIntervalSince1970: $0.doubleValue / 1000))"
            }
            lines.append(
                style.dim(
                    "crash \(properties["crash_repeat_count"] ?? "?") of a crash loop\(first ?? ""): its stacks were "
                        + "left out at import"))
        }
        let threadName = properties["crash_thread_name"] as? String ?? ""
        let main = properties["crash_main_thread"] as? Bool == true ? " (main thread)" : ""
        lines.append("\(style.bold("thread")):   \(properties["crash_tid"] ?? "?") \"\(threadName)\"\(main)")
        if let message = report.swiftMessage, !message.isEmpty {
            lines.append("\(style.bold("message")):  \(message.trimmingCharacters(in: .whitespacesAndNewlines))")
        }
        if let type = report.exceptionType {
            let what = report.exceptionWhat.map { ": " + CaptureFile.printable($0) } ?? ""
            lines.append("\(style.bold("exception")): \(type)\(what)")
        }
        if !report.handlerFaults.isEmpty {
            lines.append(style.red("handler faulted in: \(report.handlerFaults.joined(separator: ", "))"))
        }
        if let timing = report.timing {
            lines.append(
                style.dim(
                    String(
                        format: "handler %.3f ms (flush %.3f ms)", Double(timing.handlerNanoseconds) / 1e6,
                        Double(timing.fdatasyncNanoseconds) / 1e6)))
        }
        lines.append(style.bold("frames") + ":")
        let frames = report.frames
        var shownModules = Set<Int>()
        lines += frameLines(
            frames, symbols: symbols, limit: options.frames, hidingSystem: !options.allFrames, style: style,
            indent: "  ", shownModules: &shownModules)
        lines += asyncLines(report, symbolicator: symbolicator, options: options, style: style)
        lines += registerLines(report, style: style)
        lines += threadLines(
            report, symbolicator: symbolicator, options: options, style: style, shownModules: &shownModules)
        lines += processLines(report, style: style)
        lines += attachmentLines(report, style: style)
        if options.memory { lines += memoryLines(report, style: style) }
        lines.append(style.bold("modules") + ":")
        for (index, module) in report.modules.enumerated() where shownModules.contains(index) {
            lines.append(
                "  [\(index)] \(module.path)  \(style.dim("build-id \(module.buildID.isEmpty ? "none" : module.buildID)"))"
            )
        }
        if !options.allFrames || !options.memory {
            let more = [options.allFrames ? nil : "--all-frames", options.memory ? nil : "--memory"].compactMap { $0 }
            lines.append(style.dim("(more with \(more.joined(separator: " and ")), or --json)"))
        }
        return lines.map(style.terminalSafe).joined(separator: "\n")
    }

    /// The title and fingerprint an imported crash was stored under (what `list` shows and
    /// `show DIR CRASH` takes); nil for a crash file, which is named here.
    static func storedSummary(_ report: CrashReport) -> (title: String, fingerprint: String)? {
        guard let title = report.properties["crash_title"] as? String,
            let fingerprint = report.properties["crash_fingerprint"] as? String
        else { return nil }
        return (title, fingerprint)
    }

    /// A hang report: the watch that missed, the hung thread's stack, any deadlock, then every
    /// thread as for a crash.
    static func hangLines(
        _ report: CrashReport, symbolicator: Symbolicator, options: RenderOptions, style: TextStyle
    ) -> [String] {
        guard let hang = report.hang else { return [] }
        let properties = hang["properties"] as? [String: Any] ?? [:]
        var lines: [String] = []
        let app = "\(properties["$app_name"] ?? "?") \(properties["$app_version"] ?? "")"
        lines.append(
            "\(style.bold("app")):      \(app)  pid \(properties["$pid"] ?? "?")  on \(properties["$hostname"] ?? "?")")
        if let time = hang["time"] as? NSNumber {
            lines.append("\(style.bold("time")):     \(Date(timeIntervalSince1970: time.doubleValue / 1000))")
        }
        let deadlock = properties["hang_deadlock"] as? Bool == true
        lines.append(
            "\(style.bold("hang")):     "
                + style.red(
                    "watch \"\(properties["hang_watch"] ?? "?")\" missed its \(properties["hang_threshold_ms"] ?? "?") ms "
                        + "threshold (no beat for \(properties["hang_stalled_ms"] ?? "?") ms)"
                        + (deadlock ? ": deadlock" : "")))
        lines += report.deadlockLines.map { "  " + $0 }
        var shownModules = Set<Int>()
        if let hung = report.hungThread {
            let symbols = symbolicator.symbolicate(hung, in: report)
            let summary = symbolicator.summary(ofHung: hung, in: report, signal: deadlock ? "Deadlock" : "Hang")
            lines.append("\(style.bold("title")):    \(summary.title)")
            let main = properties["hang_main_thread"] as? Bool == true ? " (main thread)" : ""
            lines.append("\(style.bold("thread")):   \(hung.tid) \"\(hung.name)\"\(main), the watch's")
            lines.append(style.bold("frames") + ":")
            lines += frameLines(
                hung.frames, symbols: symbols, limit: options.frames, hidingSystem: !options.allFrames, style: style,
                indent: "  ", shownModules: &shownModules)
            let asyncSymbols = symbolicator.symbolicateAsyncFrames(of: hung, in: report)
            if !asyncSymbols.isEmpty {
                if let task = hung.taskName { lines.append("  task \"\(task)\"") }
                lines += asyncFrameLines(
                    hung.asyncFrames, symbols: asyncSymbols, options: options, style: style, indent: "  ")
            }
        } else {
            lines.append(style.dim("the watch's thread was not found among the threads (it ended, or never beat)"))
        }
        lines.append(
            style.dim(
                "threads held \(properties["hang_threads_held_ms"] ?? "?") ms, report \(properties["hang_capture_ms"] ?? "?") ms"
            ))
        lines += threadLines(
            report, symbolicator: symbolicator, options: options, style: style, shownModules: &shownModules)
        lines.append(style.bold("modules") + ":")
        for (index, module) in report.modules.enumerated() where shownModules.contains(index) {
            lines.append(
                "  [\(index)] \(module.path)  \(style.dim("build-id \(module.buildID.isEmpty ? "none" : module.buildID)"))"
            )
        }
        return lines
    }

    /// The crashing task's logical callers, from its async context chain, as the Swift
    /// backtracer marks them: `[async]`.
    static func asyncLines(
        _ report: CrashReport, symbolicator: Symbolicator, options: RenderOptions, style: TextStyle
    ) -> [String] {
        let symbols = symbolicator.symbolicateAsyncFrames(of: report)
        guard !symbols.isEmpty else { return [] }
        let task = report.taskName.map { " (task \"\($0)\")" } ?? ""
        return [style.bold("async callers") + task + ":"]
            + asyncFrameLines(report.asyncFrames, symbols: symbols, options: options, style: style, indent: "  ")
    }

    /// `[async]` frames, each run of system ones folded where it stands unless `--all-frames`.
    static func asyncFrameLines(
        _ frames: [CrashReport.Frame], symbols: [Symbolicator.Symbol], options: RenderOptions, style: TextStyle,
        indent: String
    ) -> [String] {
        var lines: [String] = []
        var hidden = 0
        func flushHidden() {
            if hidden > 0 { lines.append(style.dim(indent + "... \(hidden) system frame\(hidden == 1 ? "" : "s")")) }
            hidden = 0
        }
        for (index, (frame, symbol)) in zip(frames, symbols).enumerated() {
            if !options.allFrames && isSystemFrame(symbol) {
                hidden += 1
                continue
            }
            flushHidden()
            var line = indent + String(format: "#%-3d [async] 0x%016llx ", index, frame.pc) + symbol.module
            if let function = symbol.function {
                line +=
                    "  " + style.bold(function)
                    + style.dim(marks(inlined: false, role: symbol.role, module: symbol.module))
                if let location = symbol.source.location { line += style.dim(" at " + location) }
            } else if let offset = frame.offset {
                line += " +0x" + String(offset, radix: 16)
            }
            lines.append(line)
        }
        flushHidden()
        return lines
    }

    /// The last lines of each attached file (`--json` has all that was copied).
    static func attachmentLines(_ report: CrashReport, style: TextStyle) -> [String] {
        guard let attachments = (report.crashed?["crash"] as? [String: Any])?["attachments"] as? [[String: Any]],
            !attachments.isEmpty
        else { return [] }
        var lines = [style.bold("attachments") + ":"]
        for attachment in attachments {
            let path = attachment["path"] as? String ?? "?"
            if let error = attachment["error"] as? String {
                lines.append("  \(path)  " + style.dim("(\(error))"))
                continue
            }
            // A crash file holds the bytes as base64; an imported crash, as text.
            let data =
                (attachment["base64"] as? String).flatMap { Data(base64Encoded: $0) }
                ?? (attachment["text"] as? String).map { Data($0.utf8) } ?? Data()
            let text = String(decoding: data, as: UTF8.self)
            let tail = text.split(separator: "\n", omittingEmptySubsequences: false).suffix(6).drop { $0.isEmpty }
            lines.append("  \(path)  " + style.dim("(last \(data.count) bytes, the last lines:)"))
            lines += tail.filter { !$0.isEmpty }.map { "    " + $0 }
        }
        return lines
    }

    /// A frame that is the system's through and through (``FrameRole``: libc, the loader, the
    /// runtimes wherever they were linked, inlined standard-library code), or the program's
    /// `_start`: folded unless `--all-frames`.
    static func isSystemFrame(_ symbol: Symbolicator.Symbol) -> Bool {
        symbol.roles.allSatisfy { $0 == .system } || symbol.function == "_start"
            || symbol.function == "cc_thread_trampoline"
    }

    /// The backtracer's marks for one function of a frame: `[inlined]`, `[system]`, `[thunk]`.
    /// `[system]` only where the module does not already say it: code of the standard library or
    /// the runtimes inside the app's own binary.
    static func marks(inlined: Bool, role: FrameRole, module: String) -> String {
        let system = role == .system && !CrashFingerprint.isSystemModule(module)
        return (inlined ? " [inlined]" : "") + (system ? " [system]" : role == .thunk ? " [thunk]" : "")
    }

    /// The crashing thread's registers, four to a line, in the order the architecture's
    /// manuals list them (pc, sp, fp first on every architecture).
    static func registerLines(_ report: CrashReport, style: TextStyle) -> [String] {
        guard let registers = (report.crashed?["crash"] as? [String: Any])?["registers"] as? [String: Any],
            !registers.isEmpty
        else { return [] }
        let preferred = [
            "rip", "rsp", "rbp", "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13",
            "r14", "r15", "eflags", "trapno", "err", "cr2",
        ]
        var names = preferred.filter { registers[$0] != nil }
        // Other architectures: pc, sp and fp first, then the rest in their numeric order.
        if names.isEmpty {
            names = ["pc", "sp", "fp"].filter { registers[$0] != nil }
            names += registers.keys.filter { !["pc", "sp", "fp"].contains($0) }.sorted {
                ($0.count, $0) < ($1.count, $1)
            }
        }
        var lines = [style.bold("registers") + ":"]
        for start in stride(from: 0, to: names.count, by: 4) {
            let row = names[start..<min(start + 4, names.count)].map { name in
                name.padding(toLength: 7, withPad: " ", startingAt: 0) + "\(registers[name] ?? "?")"
            }
            let padded = row.map { $0.padding(toLength: 27, withPad: " ", startingAt: 0) }.joined()
            lines.append("  " + String(padded.reversed().drop { $0 == " " }.reversed()))
        }
        return lines
    }

    /// Frames as lines, `limit` at most (0: all). `hidingSystem`: frames of libc, the loader
    /// and the runtimes (but the first, where the thread stopped) fold into one dim line.
    static func frameLines(
        _ frames: [CrashReport.Frame], symbols: [Symbolicator.Symbol], limit: Int, hidingSystem: Bool,
        style: TextStyle, indent: String, shownModules: inout Set<Int>
    ) -> [String] {
        var lines: [String] = []
        var printed = 0
        var hidden: [String] = []
        func flushHidden() {
            guard !hidden.isEmpty else { return }
            var modules: [String] = []
            for module in hidden where !modules.contains(module) { modules.append(module) }
            lines.append(
                style.dim(
                    indent
                        + "... \(hidden.count) system frame\(hidden.count == 1 ? "" : "s") (\(modules.joined(separator: ", ")))"
                ))
            hidden.removeAll()
        }
        var index = 0
        while index < frames.count && (limit <= 0 || printed < limit) {
            let frame = frames[index]
            let symbol = index < symbols.count ? symbols[index] : Symbolicator.Symbol(module: "???")
            if hidingSystem && index > 0 && isSystemFrame(symbol) {
                hidden.append(symbol.module)
                index += 1
                continue
            }
            flushHidden()
            if let module = frame.module { shownModules.insert(module) }
            var line = indent + String(format: "#%-3d 0x%016llx ", index, frame.pc) + symbol.module
            let roles = symbol.roles
            for (inlined, role) in zip(symbol.inlined, roles) {
                // The functions the compiler inlined here, innermost first, then their caller.
                lines.append(
                    line + "  " + style.bold(inlined.function ?? "?")
                        + style.dim(
                            marks(inlined: true, role: role, module: symbol.module)
                                + (inlined.location.map { " at " + $0 } ?? "")))
            }
            if let function = symbol.function {
                line += "  " + style.bold(function) + " + \(symbol.offsetInFunction ?? 0)"
                line += style.dim(marks(inlined: false, role: roles.last ?? .app, module: symbol.module))
                if let location = symbol.source.location { line += style.dim(" at " + location) }
            } else if let offset = frame.offset {
                line += " +0x" + String(offset, radix: 16)
                if let note = symbol.note { line += style.dim("  (\(note))") }
            }
            lines.append(line)
            printed += 1
            index += 1
        }
        flushHidden()
        if index < frames.count { lines.append(style.dim(indent + "... \(frames.count - index) more frames")) }
        return lines
    }

    static func processLines(_ report: CrashReport, style: TextStyle) -> [String] {
        let process = report.process
        guard !process.isEmpty else { return [] }
        var lines = [style.bold("process") + ":"]
        if let command = process["command_line"] as? [String] {
            let recorded = process["arguments_recorded"] as? Bool != false
            lines.append(
                "  command:     " + CaptureFile.printable(command.joined(separator: " "))
                    + (recorded ? "" : style.dim("  (arguments not recorded)")))
        }
        func mebibytes(_ key: String) -> String {
            (process[key] as? NSNumber).map { String(format: "%.1f MiB", $0.doubleValue / 1_048_576) } ?? "?"
        }
        lines.append("  memory:      rss \(mebibytes("rss_bytes")), peak \(mebibytes("peak_rss_bytes"))")
        var counts = "  threads:     \(process["threads"] ?? "?")"
        if let descriptors = process["open_descriptors"] { counts += "   open descriptors: \(descriptors)" }
        if let uptime = (process["uptime_ms"] as? NSNumber)?.doubleValue {
            counts += String(format: "   uptime: %.2f s", uptime / 1000)
        }
        lines.append(counts)
        if let limits = process["limits"] as? [String: Any] {
            lines.append(
                "  limits:      "
                    + ["stack", "core", "nofile", "as"].map { "\($0) \(limits[$0] ?? "?")" }.joined(separator: ", "))
        }
        if let cgroup = process["memory_cgroup"] as? [String: Any] {
            lines.append("  cgroup:      limit \(cgroup["limit"] ?? "?"), usage \(cgroup["usage"] ?? "?") bytes")
        }
        if let container = process["container"] as? String { lines.append("  container:   \(container)") }
        return lines
    }

    /// Each region as a hex dump: address, 16 bytes, their printable characters.
    static func memoryLines(_ report: CrashReport, style: TextStyle) -> [String] {
        guard !report.memory.isEmpty else { return [] }
        var lines = [style.bold("memory") + ":"]
        for region in report.memory {
            lines.append("  \(region.what) (\(region.bytes.count) bytes):")
            for start in stride(from: 0, to: region.bytes.count, by: 16) {
                let row = region.bytes[start..<min(start + 16, region.bytes.count)]
                let hex = row.map { String(format: "%02x", $0) }.joined(separator: " ")
                let text = String(row.map { $0 >= 0x20 && $0 < 0x7f ? Character(UnicodeScalar($0)) : "." })
                lines.append(
                    String(format: "    %016llx  ", region.address + UInt64(start))
                        + hex.padding(toLength: 48, withPad: " ", startingAt: 0) + " " + style.dim(text))
            }
        }
        return lines
    }

    /// The other threads, identical stacks folded into one with the threads that share it.
    static func threadLines(
        _ report: CrashReport, symbolicator: Symbolicator, options: RenderOptions, style: TextStyle,
        shownModules: inout Set<Int>
    ) -> [String] {
        guard report.threads.count > 1 else { return [] }
        var frozen = report.threadsFrozenBy.map { ", frozen by \($0)" } ?? ""
        if let note = report.threadsFreezeNote { frozen += " (\(note))" }
        var lines = [
            style.bold("threads") + ": \(report.threadsTotal) (\(report.threads.count) listed"
                + (report.hang == nil ? ", crashed first" : "") + "\(frozen))"
        ]
        func label(_ thread: CrashReport.Thread) -> String {
            "\(thread.tid) \"\(thread.name)\" \(thread.state)" + (thread.crashedToo ? style.red(" crashed too") : "")
                + (thread.tid == report.hungThread?.tid ? style.red(" hung") : "")
        }
        var groups: [(key: [UInt64], threads: [CrashReport.Thread])] = []
        for thread in report.threads {
            if thread.crashed {
                lines.append("  " + label(thread) + style.red("  crashed") + style.dim(" (frames above)"))
                continue
            }
            guard thread.captured else {
                lines.append("  " + label(thread) + style.dim("  not captured: \(thread.whyNotCaptured ?? "unknown")"))
                continue
            }
            let key = thread.frames.map(\.pc)
            if let index = groups.firstIndex(where: { $0.key == key }) {
                groups[index].threads.append(thread)
            } else {
                groups.append((key, [thread]))
            }
        }
        for group in groups {
            let first = group.threads[0]
            if group.threads.count == 1 {
                lines.append("  " + label(first) + (first.unwindFaulted ? style.red("  (unwinding faulted)") : ""))
            } else {
                let named = group.threads.prefix(8).map(label).joined(separator: ", ")
                let more = group.threads.count > 8 ? ", and \(group.threads.count - 8) more" : ""
                lines.append("  \(group.threads.count) threads with this stack: " + named + more)
            }
            lines += frameLines(
                first.frames, symbols: symbolicator.symbolicate(first, in: report),
                limit: options.allFrames ? options.frames : RenderOptions.otherThreadFrames,
                hidingSystem: !options.allFrames, style: style, indent: "    ", shownModules: &shownModules)
            let asyncSymbols = symbolicator.symbolicateAsyncFrames(of: first, in: report)
            if !asyncSymbols.isEmpty {
                if let task = first.taskName { lines.append("    task \"\(task)\"") }
                lines += asyncFrameLines(
                    first.asyncFrames, symbols: asyncSymbols, options: options, style: style, indent: "    ")
            }
        }
        return lines
    }

    /// The report as one JSON object, keys sorted, appended to `out`; `drain` takes what is in
    /// `out` (and empties it) whenever a MiB has gathered. Each thread is built and written in
    /// turn, not all first: a report at the format's maxima (513 threads of 128 frames) would
    /// otherwise hold every frame's object at once, hundreds of MB.
    static func writeJSON(
        _ report: CrashReport, symbols: [Symbolicator.Symbol], symbolicator: Symbolicator, to out: inout [UInt8],
        drain: @escaping (inout [UInt8]) -> Void
    ) {
        var object: [String: Any] = ["path": report.path, "problems": report.problems.map(\.description)]
        if let session = report.session { object["session"] = session }
        object["events"] = report.events
        object["frames"] = report.frames.enumerated().map { index, frame -> [String: Any] in
            var entry: [String: Any] = ["pc": "0x" + String(frame.pc, radix: 16)]
            if let module = frame.module { entry["module"] = module }
            if let offset = frame.offset { entry["offset"] = "0x" + String(offset, radix: 16) }
            if index < symbols.count {
                let symbol = symbols[index]
                if let note = symbol.note { entry["note"] = note }
                entry.merge(
                    CrashReplayer.frameObject(pc: frame.pc, offset: frame.offset, symbol: symbol, linkageNames: true)
                ) { old, _ in old }
            }
            return entry
        }
        let summary = symbolicator.summary(of: report, symbols: symbols)
        let stored = storedSummary(report)
        object["fingerprint"] = stored?.fingerprint ?? summary.fingerprint
        object["fingerprint_version"] = report.properties["crash_fingerprint_version"] ?? CrashFingerprint.version
        object["title"] = stored?.title ?? summary.title
        if let reason = summary.reason { object["message"] = reason }
        let asyncSymbols = symbolicator.symbolicateAsyncFrames(of: report)
        if !asyncSymbols.isEmpty {
            object["async_frames"] = zip(report.asyncFrames, asyncSymbols).map { frame, symbol in
                CrashReplayer.frameObject(pc: frame.pc, offset: frame.offset, symbol: symbol, linkageNames: true)
            }
        }
        object["threads_total"] = report.threadsTotal
        object["threads_frozen_by"] = report.threadsFrozenBy
        object["threads_freeze_note"] = report.threadsFreezeNote
        object["process"] = report.process
        object["memory"] = report.memory.map {
            [
                "what": $0.what, "address": "0x" + String($0.address, radix: 16),
                "base64": Data($0.bytes).base64EncodedString(),
            ]
        }
        func threadObject(_ thread: CrashReport.Thread) -> [String: Any] {
            var entry: [String: Any] = [
                "tid": thread.tid, "name": thread.name, "state": thread.state, "crashed": thread.crashed,
                "crashed_too": thread.crashedToo, "captured": thread.captured,
            ]
            if let why = thread.whyNotCaptured { entry["why"] = why }
            if let task = thread.taskName { entry["task_name"] = task }
            if !thread.crashed {
                let asyncNamed = symbolicator.symbolicateAsyncFrames(of: thread, in: report)
                if !asyncNamed.isEmpty {
                    entry["async_frames"] = zip(thread.asyncFrames, asyncNamed).map { frame, symbol -> [String: Any] in
                        CrashReplayer.frameObject(
                            pc: frame.pc, offset: frame.offset, symbol: symbol, linkageNames: true)
                    }
                }
                let named = symbolicator.symbolicate(thread, in: report)
                entry["frames"] = zip(thread.frames, named).map { frame, symbol -> [String: Any] in
                    CrashReplayer.frameObject(pc: frame.pc, offset: frame.offset, symbol: symbol, linkageNames: true)
                }
            }
            return entry
        }
        if let timing = report.timing {
            object["timing"] = [
                "handler_ns": timing.handlerNanoseconds, "fdatasync_ns": timing.fdatasyncNanoseconds,
                "write_ns": timing.writeNanoseconds, "publish_ns": timing.publishNanoseconds,
                "named_before_sync": timing.namedBeforeSync, "directory_flushed": timing.directoryFlushed,
            ]
        }
        object["threads"] = NSNull()  // a place in the key order; written below, a thread at a time
        out.append(UInt8(ascii: "{"))
        for (index, key) in object.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }).enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            JSONTree.writeString(key, to: &out)
            out.append(UInt8(ascii: ":"))
            guard key == "threads" else {
                JSONTree.write(object[key]!, to: &out, sortedKeys: true, drain: drain)
                continue
            }
            out.append(UInt8(ascii: "["))
            for (position, thread) in report.threads.enumerated() {
                if position > 0 { out.append(UInt8(ascii: ",")) }
                JSONTree.write(threadObject(thread), to: &out, sortedKeys: true, drain: drain)
            }
            out.append(UInt8(ascii: "]"))
        }
        out.append(UInt8(ascii: "}"))
    }
}
