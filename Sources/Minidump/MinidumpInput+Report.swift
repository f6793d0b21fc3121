public import CrashFileFormat
internal import Foundation

/// Why a crash makes no minidump.
public struct MinidumpUnavailable: Error, Sendable, CustomStringConvertible {
    public let description: String
}

extension MinidumpInput {
    /// The minidump of a crash report: its stacks record (every thread's registers and stack),
    /// with the report's threads' names, modules, signal and annotations. The maps and the
    /// process status are those the report knows: one line per module and per stack, and the
    /// process's facts (Docs/Minidump.md).
    public init(report: CrashReport) throws {
        guard let crashed = report.crashed else { throw MinidumpUnavailable(description: "no $AppCrashed event") }
        guard let stacks = report.stacks, !stacks.threads.isEmpty else {
            throw MinidumpUnavailable(
                description: "no stacks record: the crash was captured by a version before 0.2, or its stacks "
                    + "found no room")
        }
        let properties = report.properties
        func number(_ key: String) -> Int64 { (properties[key] as? NSNumber)?.int64Value ?? 0 }
        func hex(_ value: Any?) -> UInt64 {
            guard let text = value as? String else { return 0 }
            return UInt64(text.hasPrefix("0x") ? String(text.dropFirst(2)) : text, radix: 16) ?? 0
        }
        let names = Dictionary(report.threads.map { ($0.tid, $0.name) }, uniquingKeysWith: { first, _ in first })
        let crashedTID = Int(number("crash_tid"))
        var threads = stacks.threads.map { thread in
            Thread(
                tid: thread.tid, name: names[thread.tid] ?? properties["crash_thread_name"] as? String ?? "",
                registers: thread.registers, floatingPoint: thread.floatingPoint, stackStart: thread.stackStart,
                stack: thread.stack)
        }
        if let first = threads.firstIndex(where: { $0.tid == crashedTID }), first != 0 {
            threads.insert(threads.remove(at: first), at: 0)
        }
        let modules = report.modules.map { module in
            Module(
                path: module.path, start: module.start, end: module.end, buildID: Self.bytes(hex: module.buildID))
        }
        var maps = ""
        for module in report.modules.sorted(by: { $0.start < $1.start }) {
            maps += "\(Self.hex(module.start))-\(Self.hex(module.end)) r-xp 00000000 00:00 0 \(module.path)\n"
        }
        for thread in stacks.threads.sorted(by: { $0.stackStart < $1.stackStart }) where !thread.stack.isEmpty {
            let end = thread.stackStart + UInt64(thread.stack.count)
            maps += "\(Self.hex(thread.stackStart))-\(Self.hex(end)) rw-p 00000000 00:00 0 [stack:\(thread.tid)]\n"
        }
        let process = report.process
        let pid = (process["pid"] as? NSNumber)?.intValue ?? Int(number("$pid"))
        var status = "Name:\t\(properties["$app_name"] as? String ?? "")\nState:\tR (running)\nPid:\t\(pid)\n"
        status += "Tgid:\t\(pid)\nThreads:\t\(report.threadsTotal)\n"
        if let rss = (process["rss_bytes"] as? NSNumber)?.int64Value { status += "VmRSS:\t\(rss / 1024) kB\n" }
        if let peak = (process["peak_rss_bytes"] as? NSNumber)?.int64Value { status += "VmHWM:\t\(peak / 1024) kB\n" }
        var annotations: [(String, String)] = []
        for (key, property) in [
            ("app", "$app_name"), ("version", "$app_version"), ("fingerprint", "crash_fingerprint"),
            ("swift_message", "crash_swift_message"), ("reason_title", "crash_title"),
            ("exception_type", "crash_exception_type"), ("exception_what", "crash_exception_what"),
            ("session_id", "$session_id"),
        ] {
            if let value = properties[property] as? String, !value.isEmpty { annotations.append((key, value)) }
        }
        if let id = crashed["event_id"] as? String { annotations.append(("crash_id", id)) }
        if stacks.bytesCut > 0 || stacks.threadsLeftOut > 0 {
            annotations.append(
                (
                    "stacks_cut",
                    "bound \(stacks.bound) bytes; \(stacks.bytesCut) bytes cut; \(stacks.threadsLeftOut) threads left out"
                ))
        }
        let timeMilliseconds = (crashed["time"] as? NSNumber)?.int64Value ?? 0
        self.init(
            architecture: stacks.architecture, crashedTID: crashedTID, signal: UInt32(clamping: number("crash_signal")),
            code: Int32(clamping: number("crash_code")), faultAddress: hex(properties["crash_fault_address"]),
            threads: threads, modules: modules, time: UInt32(clamping: timeMilliseconds / 1000),
            processorCount: ProcessInfo.processInfo.activeProcessorCount,
            osVersion: properties["$os_version"] as? String ?? "Linux", maps: maps, procStatus: status,
            annotations: annotations)
        // The stack's own region is in the stacks already; a region that overlaps one kept
        // already (the fault address inside a stack, say) is left out: a memory list's ranges
        // do not overlap.
        var taken = threads.map { ($0.stackStart, $0.stackStart + UInt64($0.stack.count)) }
        for region in report.memory where region.what != "stack" && !region.bytes.isEmpty {
            let end = region.address + UInt64(region.bytes.count)
            guard !taken.contains(where: { region.address < $0.1 && $0.0 < end }) else { continue }
            taken.append((region.address, end))
            memory.append((region.address, region.bytes))
        }
    }

    static func hex(_ value: UInt64) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: max(0, 8 - digits.count)) + digits
    }

    static func bytes(hex: String) -> [UInt8] {
        var out: [UInt8] = []
        var index = hex.startIndex
        while let next = hex.index(index, offsetBy: 2, limitedBy: hex.endIndex), next != index {
            guard let byte = UInt8(hex[index..<next], radix: 16) else { return [] }
            out.append(byte)
            index = next
        }
        return out
    }

    /// breakpad's debug id for a build id, as readers derive it from the CodeView record: the
    /// first 16 bytes as a GUID (its first three fields byte-swapped), then age 0.
    public static func debugID(buildID: [UInt8]) -> String {
        var bytes = Array(buildID.prefix(16))
        bytes += [UInt8](repeating: 0, count: 16 - bytes.count)
        let guid = [bytes[3], bytes[2], bytes[1], bytes[0], bytes[5], bytes[4], bytes[7], bytes[6]] + bytes[8..<16]
        return guid.map { String(format: "%02X", $0) }.joined() + "0"
    }
}
