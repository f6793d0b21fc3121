internal import CCrashFileFormat

/// The stacks record of a crash file: each thread's full registers and its stack memory, as the
/// crash path copied them (layout in `crashcapture_format.h` and Docs/Formats.md). What a
/// minidump needs beyond the report's JSON.
public struct StackMemory: Sendable, Equatable {
    /// The CPU the registers are of.
    public enum Architecture: UInt32, Sendable {
        case x86_64 = 62
        case arm64 = 183
    }

    public struct Thread: Sendable, Equatable {
        public var tid: Int
        public var crashed: Bool
        /// Fewer stack bytes were kept than wanted: the bound was reached.
        public var cut: Bool
        /// The general registers, in the record's order (x86_64: ucontext's gregs; arm64: x0–x30,
        /// sp, pc, pstate).
        public var registers: [UInt64]
        /// x86_64: the 512-byte FXSAVE area; arm64: v0–v31, fpsr, fpcr (520 bytes). Empty when not kept.
        public var floatingPoint: [UInt8]
        /// The address of `stack`'s first byte.
        public var stackStart: UInt64
        public var stack: [UInt8]

        public init(
            tid: Int, crashed: Bool, cut: Bool = false, registers: [UInt64], floatingPoint: [UInt8] = [],
            stackStart: UInt64, stack: [UInt8]
        ) {
            self.tid = tid
            self.crashed = crashed
            self.cut = cut
            self.registers = registers
            self.floatingPoint = floatingPoint
            self.stackStart = stackStart
            self.stack = stack
        }
    }

    public var architecture: Architecture
    public var threads: [Thread]
    /// The stack bytes the crash path allowed itself in all.
    public var bound: Int
    /// Threads captured but given no stack: the bound left no room for them.
    public var threadsLeftOut: Int
    /// Stack bytes wanted but not kept, over every thread (an upper bound: a stack may have ended sooner).
    public var bytesCut: UInt64

    public init(
        architecture: Architecture, threads: [Thread], bound: Int = 0, threadsLeftOut: Int = 0, bytesCut: UInt64 = 0
    ) {
        self.architecture = architecture
        self.threads = threads
        self.bound = bound
        self.threadsLeftOut = threadsLeftOut
        self.bytesCut = bytesCut
    }

    /// Registers per architecture (general, then floating point bytes).
    static func registerCount(_ architecture: Architecture) -> Int {
        architecture == .x86_64 ? Int(CCF_STACKS_X86_64_GREGS) : Int(CCF_STACKS_AARCH64_GREGS)
    }

    static func floatSize(_ architecture: Architecture) -> Int {
        architecture == .x86_64 ? Int(CCF_STACKS_X86_64_FXSAVE) : Int(CCF_STACKS_AARCH64_FPSIMD)
    }

    /// Reads a stacks record's payload; a problem in words when it is not one this reader knows.
    public static func parse(_ payload: [UInt8]) -> Result<StackMemory, StackMemoryProblem> {
        var reader = LittleEndianReader(payload)
        guard payload.count >= Int(CCF_STACKS_HEADER_SIZE), Array(payload[0..<4]) == Array(CCF_STACKS_MAGIC.utf8)
        else { return .failure(.init("not a stacks record")) }
        reader.offset = 4
        let version = reader.u32()
        guard version == UInt32(CCF_STACKS_VERSION) else {
            return .failure(.init("stacks record version \(version), this reader knows \(CCF_STACKS_VERSION)"))
        }
        guard let architecture = Architecture(rawValue: reader.u32()) else {
            return .failure(.init("stacks of an unknown machine"))
        }
        let count = Int(reader.u32())
        let bound = Int(reader.u32())
        let leftOut = Int(reader.u32())
        let cut = reader.u64()
        var threads: [Thread] = []
        let generalSize = 8 * registerCount(architecture)
        for index in 0..<count {
            guard reader.remaining >= Int(CCF_STACKS_ENTRY_HEADER_SIZE) else {
                return .failure(.init("stacks record ends inside thread \(index)'s entry"))
            }
            let tid = Int(reader.u32())
            let flags = reader.u32()
            let contextSize = Int(reader.u32())
            let stackSize = Int(reader.u32())
            let start = reader.u64()
            let hasFloat = flags & UInt32(CCF_STACK_FLOAT.rawValue) != 0
            guard contextSize == generalSize + (hasFloat ? floatSize(architecture) : 0) else {
                return .failure(.init("thread \(tid): a context of \(contextSize) bytes"))
            }
            let paddedContext = (contextSize + 7) & ~7
            let paddedStack = (stackSize + 7) & ~7
            guard reader.remaining >= paddedContext + paddedStack else {
                return .failure(.init("thread \(tid): stack runs past the record"))
            }
            let registers = (0..<registerCount(architecture)).map { _ in reader.u64() }
            let floatingPoint = hasFloat ? reader.bytes(floatSize(architecture)) : []
            reader.offset += paddedContext - contextSize
            let stack = reader.bytes(stackSize)
            reader.offset += paddedStack - stackSize
            threads.append(
                Thread(
                    tid: tid, crashed: flags & UInt32(CCF_STACK_CRASHED.rawValue) != 0,
                    cut: flags & UInt32(CCF_STACK_CUT.rawValue) != 0, registers: registers,
                    floatingPoint: floatingPoint, stackStart: start, stack: stack))
        }
        return .success(
            StackMemory(
                architecture: architecture, threads: threads, bound: bound, threadsLeftOut: leftOut, bytesCut: cut))
    }

    /// The record's payload, as the crash path writes it (for tests and for tools that make crash
    /// files of their own).
    public func encoded() -> [UInt8] {
        var out: [UInt8] = Array(CCF_STACKS_MAGIC.utf8)
        func put32(_ value: UInt32) { withUnsafeBytes(of: value.littleEndian) { out.append(contentsOf: $0) } }
        func put64(_ value: UInt64) { withUnsafeBytes(of: value.littleEndian) { out.append(contentsOf: $0) } }
        func pad() { while out.count % 8 != 0 { out.append(0) } }
        put32(UInt32(CCF_STACKS_VERSION))
        put32(architecture.rawValue)
        put32(UInt32(threads.count))
        put32(UInt32(bound))
        put32(UInt32(threadsLeftOut))
        put64(bytesCut)
        for thread in threads {
            var flags: UInt32 = 0
            if thread.crashed { flags |= UInt32(CCF_STACK_CRASHED.rawValue) }
            if thread.cut { flags |= UInt32(CCF_STACK_CUT.rawValue) }
            if !thread.floatingPoint.isEmpty { flags |= UInt32(CCF_STACK_FLOAT.rawValue) }
            put32(UInt32(thread.tid))
            put32(flags)
            put32(UInt32(8 * thread.registers.count + thread.floatingPoint.count))
            put32(UInt32(thread.stack.count))
            put64(thread.stackStart)
            thread.registers.forEach(put64)
            out.append(contentsOf: thread.floatingPoint)
            pad()
            out.append(contentsOf: thread.stack)
            pad()
        }
        return out
    }
}

/// Why a stacks record was not read.
public struct StackMemoryProblem: Error, Sendable, Equatable, CustomStringConvertible {
    public let description: String
    init(_ description: String) { self.description = description }
}

/// Little-endian integers out of bytes whose length was checked first.
struct LittleEndianReader {
    let bytes: [UInt8]
    var offset = 0
    init(_ bytes: [UInt8]) { self.bytes = bytes }
    var remaining: Int { bytes.count - offset }
    mutating func u32() -> UInt32 {
        var value: UInt32 = 0
        for index in 0..<4 { value |= UInt32(bytes[offset + index]) << (8 * index) }
        offset += 4
        return value
    }
    mutating func u64() -> UInt64 {
        var value: UInt64 = 0
        for index in 0..<8 { value |= UInt64(bytes[offset + index]) << (8 * index) }
        offset += 8
        return value
    }
    mutating func bytes(_ count: Int) -> [UInt8] {
        defer { offset += count }
        return Array(bytes[offset..<offset + count])
    }
}
