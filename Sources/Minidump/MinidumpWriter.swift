public import CrashFileFormat

/// What a minidump is made of, architecture-neutral: the crash, every thread with its registers
/// and stack, the modules, and the texts of the Linux streams. Built from a crash file's report
/// and stacks record (``MinidumpInput/init(report:)``) or by hand (tests, other producers).
public struct MinidumpInput: Sendable {
    public struct Thread: Sendable {
        public var tid: Int
        public var name: String
        /// Registers as the stacks record holds them (``StackMemory/Thread/registers``).
        public var registers: [UInt64]
        public var floatingPoint: [UInt8]
        public var stackStart: UInt64
        public var stack: [UInt8]

        public init(
            tid: Int, name: String, registers: [UInt64], floatingPoint: [UInt8] = [], stackStart: UInt64,
            stack: [UInt8]
        ) {
            self.tid = tid
            self.name = name
            self.registers = registers
            self.floatingPoint = floatingPoint
            self.stackStart = stackStart
            self.stack = stack
        }
    }

    public struct Module: Sendable {
        public var path: String
        /// The lowest loadable segment's address, and one past the highest segment's end.
        public var start: UInt64
        public var end: UInt64
        /// The GNU build id, whole (usually 20 bytes); empty when the module has none.
        public var buildID: [UInt8]

        public init(path: String, start: UInt64, end: UInt64, buildID: [UInt8]) {
            self.path = path
            self.start = start
            self.end = end
            self.buildID = buildID
        }
    }

    public var architecture: StackMemory.Architecture
    public var crashedTID: Int
    public var signal: UInt32
    public var code: Int32
    public var faultAddress: UInt64
    /// The crashing thread first.
    public var threads: [Thread]
    public var modules: [Module]
    /// Seconds since 1970, for the header.
    public var time: UInt32
    public var processorCount: Int
    public var osVersion: String
    /// /proc/PID/maps and /proc/PID/status as far as the report knows them.
    public var maps: String
    public var procStatus: String
    /// The report's own facts (app, version, fingerprint, Swift message), as crashpad's simple annotations.
    public var annotations: [(String, String)]
    /// Memory beyond the stacks, for the memory list: the code around the crashing pc, the bytes
    /// at the fault address (what the report kept of them).
    public var memory: [(address: UInt64, bytes: [UInt8])] = []

    public init(
        architecture: StackMemory.Architecture, crashedTID: Int, signal: UInt32, code: Int32, faultAddress: UInt64,
        threads: [Thread], modules: [Module], time: UInt32 = 0, processorCount: Int = 1, osVersion: String = "Linux",
        maps: String = "", procStatus: String = "", annotations: [(String, String)] = []
    ) {
        self.architecture = architecture
        self.crashedTID = crashedTID
        self.signal = signal
        self.code = code
        self.faultAddress = faultAddress
        self.threads = threads
        self.modules = modules
        self.time = time
        self.processorCount = processorCount
        self.osVersion = osVersion
        self.maps = maps
        self.procStatus = procStatus
        self.annotations = annotations
    }
}

/// The stream types written, and their numbers (Microsoft's minidump format; the Linux ones are
/// breakpad's, the annotations crashpad's).
public enum MinidumpStream: UInt32, Sendable, CaseIterable {
    case threadList = 3
    case moduleList = 4
    case memoryList = 5
    case exception = 6
    case systemInfo = 7
    case threadNames = 24
    case linuxProcStatus = 0x4767_0004
    case linuxMaps = 0x4767_0009
    case crashpadInfo = 0x4350_0001
}

/// Lays a minidump out: the header, the stream directory, then each stream and what it points to.
/// Every offset is known when it is written; nothing is patched but the directory.
public enum MinidumpWriter: Sendable {
    /// The AMD64 context's size (CONTEXT_AMD64) and the ARM64 one's (ARM64_NT_CONTEXT).
    public static let amd64ContextSize = 1232
    public static let arm64ContextSize = 912
    static let headerSize = 32
    static let directoryEntrySize = 12

    public static func write(_ input: MinidumpInput) -> [UInt8] {
        var out = ByteWriter()
        let streams: [MinidumpStream] = [
            .systemInfo, .threadList, .memoryList, .moduleList, .exception, .threadNames, .linuxMaps,
            .linuxProcStatus, .crashpadInfo,
        ]
        // Header: MDMP, version 0xA793, streams, directory right after the header.
        out.bytes(Array("MDMP".utf8))
        out.u32(0xA793)
        out.u32(UInt32(streams.count))
        out.u32(UInt32(headerSize))
        out.u32(0)  // checksum: none
        out.u32(input.time)
        out.u64(0)
        let directory = out.count
        out.zeros(streams.count * directoryEntrySize)
        func entry(_ index: Int, _ type: MinidumpStream, start: Int) {
            out.set32(directory + index * directoryEntrySize, type.rawValue)
            out.set32(directory + index * directoryEntrySize + 4, UInt32(out.count - start))
            out.set32(directory + index * directoryEntrySize + 8, UInt32(start))
        }

        // Each thread's stack bytes once; the thread list and the memory list both point to them
        // (lldb reads memory only through the memory list).
        let contextSize = input.architecture == .x86_64 ? amd64ContextSize : arm64ContextSize
        var stackRVAs: [Int] = []
        var contextRVAs: [Int] = []
        for thread in input.threads {
            out.align(16)
            stackRVAs.append(out.count)
            out.bytes(thread.stack)
        }
        var memoryRVAs: [Int] = []
        for region in input.memory {
            out.align(16)
            memoryRVAs.append(out.count)
            out.bytes(region.bytes)
        }
        for thread in input.threads {
            out.align(16)
            contextRVAs.append(out.count)
            out.bytes(context(thread, input.architecture))
        }
        var streamStart = 0
        for (index, stream) in streams.enumerated() {
            out.align(8)
            streamStart = out.count
            switch stream {
            case .systemInfo:
                let versionRVA = streamStart + 56
                out.u16(input.architecture == .x86_64 ? 9 : 12)  // PROCESSOR_ARCHITECTURE_AMD64 / _ARM64
                out.u16(0)
                out.u16(0)
                out.u8(UInt8(clamping: max(input.processorCount, 1)))
                out.u8(1)  // workstation
                out.u32(0)
                out.u32(0)
                out.u32(0)
                out.u32(0x8201)  // Linux (breakpad's platform id)
                out.u32(UInt32(versionRVA))
                out.u16(0)
                out.u16(0)
                out.zeros(24)  // CPU_INFORMATION
                entry(index, stream, start: streamStart)
                out.minidumpString(input.osVersion)
                continue
            case .threadList:
                out.u32(UInt32(input.threads.count))
                for (at, thread) in input.threads.enumerated() {
                    out.u32(UInt32(thread.tid))
                    out.u32(0)
                    out.u32(0)
                    out.u32(0)
                    out.u64(0)  // TEB
                    out.u64(thread.stackStart)
                    out.u32(UInt32(thread.stack.count))
                    out.u32(UInt32(stackRVAs[at]))
                    out.u32(UInt32(contextSize))
                    out.u32(UInt32(contextRVAs[at]))
                }
            case .memoryList:
                out.u32(UInt32(input.threads.count + input.memory.count))
                for (at, thread) in input.threads.enumerated() {
                    out.u64(thread.stackStart)
                    out.u32(UInt32(thread.stack.count))
                    out.u32(UInt32(stackRVAs[at]))
                }
                for (at, region) in input.memory.enumerated() {
                    out.u64(region.address)
                    out.u32(UInt32(region.bytes.count))
                    out.u32(UInt32(memoryRVAs[at]))
                }
            case .moduleList:
                // The names and CodeView records follow the list; their offsets are known from
                // the sizes before them.
                let listSize = 4 + 108 * input.modules.count
                var next = streamStart + listSize
                var places: [(name: Int, cv: Int, cvSize: Int)] = []
                for module in input.modules {
                    let name = next
                    next += 4 + 2 * module.path.utf16.count + 2
                    next = (next + 3) & ~3
                    let cv = next
                    let cvSize = 4 + module.buildID.count
                    next += (cvSize + 3) & ~3
                    places.append((name, cv, cvSize))
                }
                out.u32(UInt32(input.modules.count))
                for (at, module) in input.modules.enumerated() {
                    out.u64(module.start)
                    out.u32(UInt32(clamping: module.end - module.start))
                    out.u32(0)
                    out.u32(0)
                    out.u32(UInt32(places[at].name))
                    out.zeros(52)  // VS_FIXEDFILEINFO
                    out.u32(UInt32(places[at].cvSize))
                    out.u32(UInt32(places[at].cv))
                    out.zeros(8 + 16)  // misc record, reserved
                }
                entry(index, stream, start: streamStart)
                for (at, module) in input.modules.enumerated() {
                    precondition(out.count == places[at].name)
                    out.minidumpString(module.path)
                    out.align(4)
                    out.u32(0x4270_454C)  // 'BpEL': an ELF build id follows
                    out.bytes(module.buildID)
                    out.align(4)
                }
                continue
            case .exception:
                let crashed = input.threads.firstIndex { $0.tid == input.crashedTID } ?? 0
                out.u32(UInt32(input.crashedTID))
                out.u32(0)
                out.u32(input.signal)  // the raw signal number, as breakpad and crashpad write it on Linux
                out.u32(UInt32(bitPattern: input.code))
                out.u64(0)
                out.u64(input.faultAddress)
                out.u32(0)
                out.u32(0)
                out.zeros(15 * 8)
                out.u32(UInt32(contextSize))
                out.u32(UInt32(contextRVAs.isEmpty ? 0 : contextRVAs[crashed]))
            case .threadNames:
                let namesStart = streamStart + 4 + 12 * input.threads.count
                var next = namesStart
                out.u32(UInt32(input.threads.count))
                for thread in input.threads {
                    out.u32(UInt32(thread.tid))
                    out.u64(UInt64(next))
                    next += (4 + 2 * thread.name.utf16.count + 2 + 3) & ~3
                }
                entry(index, stream, start: streamStart)
                for thread in input.threads {
                    out.minidumpString(thread.name)
                    out.align(4)
                }
                continue
            case .linuxMaps:
                out.bytes(Array(input.maps.utf8))
            case .linuxProcStatus:
                out.bytes(Array(input.procStatus.utf8))
            case .crashpadInfo:
                // MinidumpCrashpadInfo: version, report and client UUIDs, the simple annotations'
                // location, the module list's (an empty list).
                let infoSize = 4 + 16 + 16 + 8 + 8
                let dictionary = streamStart + infoSize
                let dictionarySize = 4 + 8 * input.annotations.count
                let moduleList = dictionary + dictionarySize
                out.u32(1)
                out.zeros(32)
                out.u32(UInt32(dictionarySize))
                out.u32(UInt32(dictionary))
                out.u32(4)
                out.u32(UInt32(moduleList))
                entry(index, stream, start: streamStart)
                var next = moduleList + 4
                var strings: [Int] = []
                for (key, value) in input.annotations {
                    for text in [key, value] {
                        strings.append(next)
                        next += (4 + text.utf8.count + 1 + 3) & ~3
                    }
                }
                out.u32(UInt32(input.annotations.count))
                for pair in 0..<input.annotations.count {
                    out.u32(UInt32(strings[2 * pair]))
                    out.u32(UInt32(strings[2 * pair + 1]))
                }
                out.u32(0)
                for (key, value) in input.annotations {
                    for text in [key, value] {
                        out.u32(UInt32(text.utf8.count))
                        out.bytes(Array(text.utf8))
                        out.u8(0)
                        out.align(4)
                    }
                }
                continue
            }
            entry(index, stream, start: streamStart)
        }
        return out.data
    }

    /// A thread's registers in the minidump's CPU context layout.
    public static func context(_ thread: MinidumpInput.Thread, _ architecture: StackMemory.Architecture) -> [UInt8] {
        var out = ByteWriter()
        let r = thread.registers
        func reg(_ index: Int) -> UInt64 { index < r.count ? r[index] : 0 }
        switch architecture {
        case .x86_64:
            // ucontext's gregs order: r8..r15 0-7, rdi 8, rsi 9, rbp 10, rbx 11, rdx 12, rax 13,
            // rcx 14, rsp 15, rip 16, eflags 17, csgsfs 18.
            let hasFloat = thread.floatingPoint.count >= 512
            out.zeros(48)  // P1Home..P6Home
            out.u32(0x0010_0000 | 0x1 | 0x2 | (hasFloat ? 0x8 : 0))  // CONTEXT_AMD64 | CONTROL | INTEGER | FLOATING_POINT
            out.u32(hasFloat ? littleEndian32(thread.floatingPoint, 24) : 0x1F80)  // MxCsr
            let csgsfs = reg(18)
            let cs = UInt16(truncatingIfNeeded: csgsfs) == 0 ? 0x33 : UInt16(truncatingIfNeeded: csgsfs)
            out.u16(cs)
            out.u16(0)  // ds
            out.u16(0)  // es
            out.u16(UInt16(truncatingIfNeeded: csgsfs >> 32))  // fs
            out.u16(UInt16(truncatingIfNeeded: csgsfs >> 16))  // gs
            out.u16(0x2B)  // ss
            out.u32(UInt32(truncatingIfNeeded: reg(17)))
            out.zeros(6 * 8)  // debug registers
            for index in [13, 14, 12, 11, 15, 10, 9, 8, 0, 1, 2, 3, 4, 5, 6, 7, 16] { out.u64(reg(index)) }
            if hasFloat { out.bytes(Array(thread.floatingPoint.prefix(512))) } else { out.zeros(512) }
            out.zeros(26 * 16 + 6 * 8)  // vector registers and controls, last branches
            precondition(out.count == amd64ContextSize)
        case .arm64:
            // x0..x30 0-30, sp 31, pc 32, pstate 33.
            let hasFloat = thread.floatingPoint.count >= 520
            out.u32(0x0040_0000 | 0x1 | 0x2 | (hasFloat ? 0x4 : 0))  // CONTEXT_ARM64 | CONTROL | INTEGER | FLOATING_POINT
            out.u32(UInt32(truncatingIfNeeded: reg(33)))  // cpsr
            for index in 0..<33 { out.u64(reg(index)) }
            if hasFloat {
                out.bytes(Array(thread.floatingPoint.prefix(512)))
                out.u32(littleEndian32(thread.floatingPoint, 516))  // fpcr
                out.u32(littleEndian32(thread.floatingPoint, 512))  // fpsr
            } else {
                out.zeros(512 + 8)
            }
            out.zeros(8 * 4 + 8 * 8 + 2 * 4 + 2 * 8)  // breakpoint and watchpoint registers
            precondition(out.count == arm64ContextSize)
        }
        return out.data
    }

    static func littleEndian32(_ bytes: [UInt8], _ at: Int) -> UInt32 {
        guard at + 4 <= bytes.count else { return 0 }
        return UInt32(bytes[at]) | UInt32(bytes[at + 1]) << 8 | UInt32(bytes[at + 2]) << 16 | UInt32(bytes[at + 3])
            << 24
    }
}

/// Little-endian bytes, appended.
struct ByteWriter {
    var data: [UInt8] = []
    var count: Int { data.count }
    mutating func u8(_ value: UInt8) { data.append(value) }
    mutating func u16(_ value: UInt16) { withUnsafeBytes(of: value.littleEndian) { data.append(contentsOf: $0) } }
    mutating func u32(_ value: UInt32) { withUnsafeBytes(of: value.littleEndian) { data.append(contentsOf: $0) } }
    mutating func u64(_ value: UInt64) { withUnsafeBytes(of: value.littleEndian) { data.append(contentsOf: $0) } }
    mutating func bytes(_ value: [UInt8]) { data.append(contentsOf: value) }
    mutating func zeros(_ count: Int) { data.append(contentsOf: repeatElement(0, count: count)) }
    mutating func align(_ boundary: Int) { zeros((boundary - count % boundary) % boundary) }
    mutating func set32(_ at: Int, _ value: UInt32) {
        for index in 0..<4 { data[at + index] = UInt8(truncatingIfNeeded: value >> (8 * index)) }
    }
    /// MINIDUMP_STRING: the length in bytes, then UTF-16LE and a NUL.
    mutating func minidumpString(_ text: String) {
        let units = Array(text.utf16)
        u32(UInt32(units.count * 2))
        for unit in units { u16(unit) }
        u16(0)
    }
}
