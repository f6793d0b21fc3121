internal import Foundation

/// One crash file, decoded: the session it belongs to, its `$AppCrashed` and `$AppEnd` events
/// and the handler's timings. Built from the verified records of a `CrashFileContents`.
/// `@unchecked`: every field is immutable after init; the `[String: Any]` values come from
/// JSONSerialization and are immutable Foundation values (strings, numbers, arrays, dictionaries).
public struct CrashReport: @unchecked Sendable {
    public struct Frame: Sendable, Equatable {
        public let pc: UInt64
        public let module: Int?
        /// pc minus the module's load bias: an address in the module file's own address space.
        public let offset: UInt64?

        public init(pc: UInt64, module: Int?, offset: UInt64?) {
            self.pc = pc
            self.module = module
            self.offset = offset
        }
    }

    public struct Module: Sendable, Equatable {
        public let path: String
        public let loadBias: UInt64
        public let start: UInt64
        public let end: UInt64
        public let buildID: String
    }

    /// One thread of the crashed process. The crashing thread comes first; its frames are the
    /// report's own `frames`.
    public struct Thread: Sendable, Equatable {
        public let tid: Int
        public let name: String
        /// From the thread's `stat`: R running, S sleeping, D in the kernel, T stopped, ...
        public let state: String
        public let crashed: Bool
        /// It crashed as well while the first crash was being reported.
        public let crashedToo: Bool
        public let captured: Bool
        public let whyNotCaptured: String?
        public let frames: [Frame]
        public let unwindFaulted: Bool
        /// Its task's [async] callers when it ran one (see `CrashReport.asyncFrames`).
        public var asyncFrames: [Frame] = []
        public var asyncOwner: Frame? = nil
        /// The name of the Swift task it ran, when one was given (`Task(name:)`).
        public var taskName: String? = nil
    }

    /// Bytes read at the crash where they were readable: the top of the crashing thread's
    /// stack, around the PC, around the fault address.
    public struct MemoryRegion: Sendable, Equatable {
        /// "stack", "pc" or "fault_address".
        public let what: String
        public let address: UInt64
        public let bytes: [UInt8]
    }

    public struct Timing: Sendable, Equatable {
        public let handlerNanoseconds: Int64
        public let writeNanoseconds: Int64
        public let fdatasyncNanoseconds: Int64
        public let publishNanoseconds: Int64
        public let fdatasyncSucceeded: Bool
        /// The file had its name before the flush: named since install, or linked first on ext4,
        /// where the file's flush makes a new name durable too.
        public let namedBeforeSync: Bool
        /// The directory was flushed on its own after the file (filesystems other than ext4).
        public let directoryFlushed: Bool
        /// Of the handler's time, what the other threads took (listing, asking, unwinding).
        public let otherThreadsNanoseconds: Int64
        /// Of the handler's time: reading the process-state files kept since install, unwinding
        /// the crashing thread, building the events (the process's state and the memory near the
        /// fault among them). 0 in files written before these were recorded.
        public let keptFilesNanoseconds: Int64
        public let unwindNanoseconds: Int64
        public let eventsNanoseconds: Int64
    }

    public let path: String
    public let session: [String: Any]?
    /// Every event record, in file order (normally `$AppCrashed` then `$AppEnd`).
    public let events: [[String: Any]]
    public let timing: Timing?
    public let problems: [CrashFileProblem]

    public init(path: String, contents: CrashFileContents) {
        var session: [String: Any]?
        var events: [[String: Any]] = []
        var timing: Timing?
        var problems = contents.problems
        var stacks: StackMemory?
        for record in contents.records {
            if record.type == .stacks {
                switch StackMemory.parse(record.payload) {
                case .success(let memory): stacks = memory
                case .failure(let problem):
                    problems.append(CrashFileProblem(offset: record.offset, reason: problem.description))
                }
                continue
            }
            guard let json = record.json else {
                let reason: String
                do {
                    _ = try JSONTree.parse(record.payload, uniqueTopLevelKeys: true)
                    reason = "record payload is not a JSON object"
                } catch {
                    reason = "record payload is not a JSON object (\(error))"
                }
                problems.append(CrashFileProblem(offset: record.offset, reason: reason))
                continue
            }
            switch record.type {
            case .session: session = json
            case .event: events.append(json)
            case .timing:
                timing = Timing(
                    handlerNanoseconds: Self.int64(json["handler_ns"]),
                    writeNanoseconds: Self.int64(json["write_ns"]),
                    fdatasyncNanoseconds: Self.int64(json["fdatasync_ns"]),
                    publishNanoseconds: Self.int64(json["publish_ns"]),
                    fdatasyncSucceeded: json["fdatasync_ok"] as? Bool ?? false,
                    namedBeforeSync: json["named_before_sync"] as? Bool ?? false,
                    directoryFlushed: json["directory_flushed"] as? Bool ?? false,
                    otherThreadsNanoseconds: Self.int64(json["threads_ns"]),
                    keptFilesNanoseconds: Self.int64(json["kept_files_ns"]),
                    unwindNanoseconds: Self.int64(json["unwind_ns"]),
                    eventsNanoseconds: Self.int64(json["events_ns"]))
            case .stacks: break
            }
        }
        self.init(path: path, session: session, events: events, timing: timing, problems: problems)
        self.stacks = stacks
    }

    /// A crash as an event store keeps it once imported: its `$AppCrashed` event, frames named
    /// and other threads' stacks as frame objects, the handler's timings among its properties.
    /// `crashcap show` reads it after the crash file is gone. `path` says where it was found.
    public init(path: String, storedEvent event: [String: Any]) {
        let properties = event["properties"] as? [String: Any] ?? [:]
        func nanoseconds(_ key: String) -> Int64 {
            Int64((((properties[key] as? NSNumber)?.doubleValue ?? 0) * 1e6).rounded())
        }
        let timing =
            properties["crash_handler_total_ms"] == nil
            ? nil
            : Timing(
                handlerNanoseconds: nanoseconds("crash_handler_total_ms"), writeNanoseconds: 0,
                fdatasyncNanoseconds: nanoseconds("crash_fdatasync_ms"), publishNanoseconds: 0,
                fdatasyncSucceeded: true, namedBeforeSync: false, directoryFlushed: false, otherThreadsNanoseconds: 0,
                keptFilesNanoseconds: 0, unwindNanoseconds: 0, eventsNanoseconds: 0)
        self.init(path: path, session: nil, events: [event], timing: timing, problems: [])
        // The import kept a task's [async] callers only once it had confirmed them.
        asyncChainConfirmed = true
    }

    private init(
        path: String, session: [String: Any]?, events: [[String: Any]], timing: Timing?, problems: [CrashFileProblem]
    ) {
        self.path = path
        var problems = problems
        self.session = session
        self.events = events
        self.timing = timing
        // A crash's details, or a hang report's (its threads, modules and how they were held).
        let details =
            events.first { $0["event"] as? String == "$AppCrashed" }?["crash"] as? [String: Any]
            ?? events.first { $0["event"] as? String == "$AppHang" }?["hang"] as? [String: Any] ?? [:]
        frames = Self.decodeFrames(details)
        modules = Self.decodeModules(details)
        // A stored crash's [async] frames are named frame objects, with no module index: each is
        // placed by its address, as other threads' frames are.
        let placed = Self.placer(modules)
        asyncFrames = Self.decodeFrames(["frames": details["async_frames"] ?? []]).map {
            $0.module == nil ? placed($0.pc) : $0
        }
        if let owner = details["async_owner"] as? [String: Any] {
            asyncOwner = Self.decodeFrames(["frames": [owner]]).first
        }
        taskName = details["task_name"] as? String
        threads = Self.decodeThreads(details, frames: frames, modules: modules)
        threadsTotal = (details["threads_total"] as? NSNumber)?.intValue ?? threads.count
        threadsFrozenBy = details["threads_frozen_by"] as? String
        threadsFreezeNote = details["threads_freeze_note"] as? String
        memory = (details["memory"] as? [[String: Any]] ?? []).prefix(16).compactMap { region in
            guard let what = region["what"] as? String, let address = Self.hex(region["address"]),
                let text = region["base64"] as? String, let data = Data(base64Encoded: text)
            else { return nil }
            return MemoryRegion(what: what, address: address, bytes: Array(data.prefix(4096)))
        }
        for (key, limit) in [
            ("frames", Self.maximumFrames), ("modules", Self.maximumModules), ("threads", Self.maximumThreads),
        ] {
            let count = (details[key] as? [Any])?.count ?? 0
            if count > limit {
                problems.append(
                    CrashFileProblem(
                        offset: 0,
                        reason: "\(count) \(key), more than a crash writes; only the first \(limit) were read"))
            }
        }
        self.problems = problems
    }

    public init(path: String) throws {
        self.init(path: path, contents: try CrashFileReader.read(path: path))
    }

    public var crashedEvents: [[String: Any]] { events.filter { $0["event"] as? String == "$AppCrashed" } }
    public var endEvents: [[String: Any]] { events.filter { $0["event"] as? String == "$AppEnd" } }
    public var crashed: [String: Any]? { crashedEvents.first }
    /// The `$AppHang` of a hang report (`crash-<session>-hang-<n>.ccr`); nil in a crash file.
    public var hang: [String: Any]? { events.first { $0["event"] as? String == "$AppHang" } }
    /// A hang report's deadlock, one line a thread on the cycle: `thread 12 "worker" waits for lock
    /// 0x… held by thread 13 "loader"`. Empty when there is none.
    public var deadlockLines: [String] {
        let details = hang?["hang"] as? [String: Any] ?? [:]
        let names = Dictionary(threads.map { ($0.tid, $0.name) }, uniquingKeysWith: { first, _ in first })
        return (details["deadlock"] as? [[String: Any]] ?? []).map { link in
            let tid = (link["tid"] as? NSNumber)?.intValue ?? 0
            let owner = (link["waits_for"] as? NSNumber)?.intValue ?? 0
            return "thread \(tid) \"\(names[tid] ?? "?")\" waits for lock \(link["lock"] as? String ?? "?") held by "
                + "thread \(owner) \"\(names[owner] ?? "?")\""
        }
    }

    /// The thread that beat the hung watch last, when the report found it.
    public var hungThread: Thread? {
        guard let tid = (hang?["properties"] as? [String: Any])?["hang_tid"] as? NSNumber else { return nil }
        return threads.first { $0.tid == tid.intValue }
    }
    public var properties: [String: Any] { crashed?["properties"] as? [String: Any] ?? [:] }
    private var details: [String: Any] { crashed?["crash"] as? [String: Any] ?? [:] }

    public var signalName: String? { properties["crash_signal_name"] as? String }
    public var signal: Int? { (properties["crash_signal"] as? NSNumber)?.intValue }
    public var codeName: String? { properties["crash_code_name"] as? String }
    public var swiftMessage: String? { properties["crash_swift_message"] as? String }
    public var exceptionType: String? { properties["crash_exception_type"] as? String }
    /// what() of an uncaught std::exception.
    public var exceptionWhat: String? { properties["crash_exception_what"] as? String }
    public var reason: String? { properties["app_crashed_reason"] as? String }
    public var handlerFaults: [String] { properties["crash_handler_faults"] as? [String] ?? [] }

    /// Decoded once, at init: replay and rendering read them several times.
    public private(set) var frames: [Frame] = []
    /// The crashing thread's logical [async] callers (the resume functions of its Swift task's
    /// async context chain), innermost first; empty outside a task.
    public private(set) var asyncFrames: [Frame] = []
    /// A pc of the function whose frame held the first async context: the chain is the task's
    /// only when that function is async (the symbolicator decides).
    public private(set) var asyncOwner: Frame?
    /// The [async] callers were confirmed as the task's when the crash was imported (a stored
    /// crash keeps them only then, without the owner they were confirmed by).
    public private(set) var asyncChainConfirmed = false
    /// The name of the crashing thread's Swift task, when one was given (`Task(name:)`).
    public private(set) var taskName: String?
    public private(set) var modules: [Module] = []
    /// Every thread listed, the crashing one first; empty in reports of older versions.
    public private(set) var threads: [Thread] = []
    /// Threads the process had, including any past the ones listed.
    public private(set) var threadsTotal = 0
    /// How the other threads were held still: "ptrace", "signal" (the fallback) or "none"; nil in
    /// reports written before 2026-11-25.
    public private(set) var threadsFrozenBy: String?
    /// Why the fallback was taken, when it was.
    public private(set) var threadsFreezeNote: String?
    public private(set) var memory: [MemoryRegion] = []
    /// Every thread's registers and stack memory (the stacks record), when the file has it:
    /// what a minidump is made of. Files of older versions, and a crash imported into a store, have none.
    public var stacks: StackMemory?
    /// The process at the crash: command line, memory, threads, uptime, descriptors, limits,
    /// memory cgroup, container (as the crash path wrote it; empty in older reports).
    public var process: [String: Any] { details["process"] as? [String: Any] ?? [:] }

    /// The crash path writes at most this many frames and modules; a file that claims more is not
    /// followed past them (each frame costs a symbol lookup at replay).
    public static let maximumFrames = 256
    public static let maximumModules = 512
    /// The crashing thread and 512 others; 128 frames each.
    public static let maximumThreads = 513
    public static let maximumThreadFrames = 128

    /// Other threads' frames are bare addresses: each is placed in the module that holds it.
    static func decodeThreads(_ details: [String: Any], frames: [Frame], modules: [Module]) -> [Thread] {
        let frame = placer(modules)
        return (details["threads"] as? [[String: Any]] ?? []).prefix(maximumThreads).map { thread in
            let crashed = thread["crashed"] as? Bool ?? false
            let addresses = (JSONTree.materialized(thread["frames"]) as? [Any] ?? []).prefix(maximumThreadFrames)
                .compactMap(address)
            return Thread(
                tid: (thread["tid"] as? NSNumber)?.intValue ?? 0, name: thread["name"] as? String ?? "",
                state: thread["state"] as? String ?? "?", crashed: crashed,
                crashedToo: thread["crashed_too"] as? Bool ?? false,
                captured: crashed || thread["captured"] as? Bool ?? false, whyNotCaptured: thread["why"] as? String,
                frames: crashed ? frames : addresses.map(frame),
                unwindFaulted: thread["unwind_faulted"] as? Bool ?? false,
                asyncFrames: (thread["async_frames"] as? [Any] ?? []).prefix(maximumThreadFrames).compactMap(address)
                    .map(frame),
                asyncOwner: hex(thread["async_owner"]).map(frame),
                taskName: thread["task_name"] as? String)
        }
    }

    /// Places an address in the module that holds it.
    static func placer(_ modules: [Module]) -> (UInt64) -> Frame {
        let order = modules.indices.sorted { modules[$0].start < modules[$1].start }
        return { pc in
            var low = 0
            var high = order.count
            while low < high {
                let middle = (low + high) / 2
                if modules[order[middle]].start <= pc { low = middle + 1 } else { high = middle }
            }
            guard low > 0, pc < modules[order[low - 1]].end else { return Frame(pc: pc, module: nil, offset: nil) }
            let index = order[low - 1]
            return Frame(pc: pc, module: index, offset: pc &- modules[index].loadBias)
        }
    }

    /// A frame's address: "0x…" in a crash file, a frame object's "pc" once a store named it.
    static func address(_ frame: Any) -> UInt64? {
        hex(frame) ?? hex((frame as? [String: Any])?["pc"])
    }

    static func decodeFrames(_ details: [String: Any]) -> [Frame] {
        (details["frames"] as? [[String: Any]] ?? []).prefix(maximumFrames).map { frame in
            Frame(
                pc: Self.hex(frame["pc"]) ?? 0, module: (frame["module"] as? NSNumber)?.intValue,
                offset: Self.hex(frame["offset"]))
        }
    }

    static func decodeModules(_ details: [String: Any]) -> [Module] {
        (details["modules"] as? [[String: Any]] ?? []).prefix(maximumModules).map { module in
            Module(
                path: module["path"] as? String ?? "", loadBias: Self.hex(module["load_bias"]) ?? 0,
                start: Self.hex(module["start"]) ?? 0, end: Self.hex(module["end"]) ?? 0,
                buildID: module["build_id"] as? String ?? "")
        }
    }

    /// "0x1f" as 31; nil for anything else. Over UTF-8 bytes: there is one per frame and module field.
    static func hex(_ value: Any?) -> UInt64? {
        guard var text = value as? String else { return nil }
        return text.withUTF8 { bytes -> UInt64? in
            guard bytes.count > 2, bytes.count <= 18, bytes[0] == UInt8(ascii: "0"), bytes[1] == UInt8(ascii: "x")
            else { return nil }
            var number: UInt64 = 0
            for byte in bytes[2...] {
                switch byte {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): number = number << 4 | UInt64(byte - UInt8(ascii: "0"))
                case UInt8(ascii: "a")...UInt8(ascii: "f"): number = number << 4 | UInt64(byte - UInt8(ascii: "a") + 10)
                case UInt8(ascii: "A")...UInt8(ascii: "F"): number = number << 4 | UInt64(byte - UInt8(ascii: "A") + 10)
                default: return nil
                }
            }
            return number
        }
    }

    static func int64(_ value: Any?) -> Int64 { (value as? NSNumber)?.int64Value ?? 0 }
}
