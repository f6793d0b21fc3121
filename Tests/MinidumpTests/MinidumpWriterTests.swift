import CrashFileFormat
import Minidump
import Testing

/// The writer's layout, checked byte by byte against the minidump format's documented offsets
/// (Microsoft's minidumpapiset.h, breakpad's minidump_format.h), for both architectures: the
/// ARM64 side runs here on x86_64 from synthetic input.
@Suite struct MinidumpWriterTests {
    struct Dump {
        let bytes: [UInt8]
        func u16(_ at: Int) -> UInt16 { UInt16(bytes[at]) | UInt16(bytes[at + 1]) << 8 }
        func u32(_ at: Int) -> UInt32 { (0..<4).reduce(0) { $0 | UInt32(bytes[at + $1]) << (8 * $1) } }
        func u64(_ at: Int) -> UInt64 { (0..<8).reduce(0) { $0 | UInt64(bytes[at + $1]) << (8 * $1) } }
        /// The stream's (size, rva).
        func stream(_ type: MinidumpStream) -> (size: Int, rva: Int)? {
            let count = Int(u32(8))
            let directory = Int(u32(12))
            for index in 0..<count where u32(directory + 12 * index) == type.rawValue {
                return (Int(u32(directory + 12 * index + 4)), Int(u32(directory + 12 * index + 8)))
            }
            return nil
        }
        func string(_ rva: Int) -> String {
            let length = Int(u32(rva))
            let units = (0..<length / 2).map { u16(rva + 4 + 2 * $0) }
            return String(decoding: units, as: UTF16.self)
        }
    }

    static func input(_ architecture: StackMemory.Architecture) -> MinidumpInput {
        let count = architecture == .x86_64 ? 23 : 34
        // Each register's value says which it is: 0x1000 + its index in the record's order.
        let registers = (0..<count).map { UInt64(0x1000 + $0) }
        let floatingPoint = (0..<(architecture == .x86_64 ? 512 : 520)).map { UInt8(truncatingIfNeeded: $0) }
        let crashed = MinidumpInput.Thread(
            tid: 100, name: "main", registers: registers, floatingPoint: floatingPoint, stackStart: 0x7ff0_0000,
            stack: (0..<4096).map { UInt8(truncatingIfNeeded: $0 * 7) })
        let other = MinidumpInput.Thread(
            tid: 101, name: "worker-1", registers: registers.map { $0 + 0x100 }, stackStart: 0x7fe0_0000,
            stack: [UInt8](repeating: 0xAB, count: 1024))
        let buildID: [UInt8] = (0..<20).map { UInt8($0 + 1) }
        return MinidumpInput(
            architecture: architecture, crashedTID: 100, signal: 11, code: 1, faultAddress: 0xdead,
            threads: [crashed, other],
            modules: [.init(path: "/usr/bin/app", start: 0x5555_0000, end: 0x5556_8000, buildID: buildID)],
            time: 1_700_000_000, processorCount: 2, osVersion: "Linux 6.1", maps: "5555000-55568000 r-xp app\n",
            procStatus: "Name:\tapp\n", annotations: [("app", "app"), ("version", "1.2")])
    }

    @Test func headerAndDirectory() {
        let dump = Dump(bytes: MinidumpWriter.write(Self.input(.x86_64)))
        #expect(Array(dump.bytes[0..<4]) == Array("MDMP".utf8))
        #expect(dump.u32(4) & 0xffff == 0xA793)
        #expect(dump.u32(8) == UInt32(MinidumpStream.allCases.count))
        #expect(dump.u32(12) == 32)
        for stream in MinidumpStream.allCases {
            let found = dump.stream(stream)
            #expect(found != nil, "stream \(stream)")
            if let found { #expect(found.rva + found.size <= dump.bytes.count) }
        }
    }

    @Test(arguments: [StackMemory.Architecture.x86_64, .arm64])
    func threadsMemoryAndExceptionPointAtTheSameBytes(_ architecture: StackMemory.Architecture) throws {
        let input = Self.input(architecture)
        let dump = Dump(bytes: MinidumpWriter.write(input))
        let contextSize = architecture == .x86_64 ? 1232 : 912
        let threads = try #require(dump.stream(.threadList))
        #expect(threads.size == 4 + 48 * 2)
        #expect(dump.u32(threads.rva) == 2)
        let memory = try #require(dump.stream(.memoryList))
        #expect(memory.size == 4 + 16 * 2)
        for (index, thread) in input.threads.enumerated() {
            let entry = threads.rva + 4 + 48 * index
            #expect(dump.u32(entry) == UInt32(thread.tid))
            #expect(dump.u64(entry + 24) == thread.stackStart)
            #expect(dump.u32(entry + 32) == UInt32(thread.stack.count))
            let stackRVA = Int(dump.u32(entry + 36))
            #expect(Array(dump.bytes[stackRVA..<stackRVA + thread.stack.count]) == thread.stack)
            #expect(dump.u32(entry + 40) == UInt32(contextSize))
            // The memory list's range for this thread is the very same bytes.
            let range = memory.rva + 4 + 16 * index
            #expect(dump.u64(range) == thread.stackStart)
            #expect(dump.u32(range + 8) == UInt32(thread.stack.count))
            #expect(Int(dump.u32(range + 12)) == stackRVA)
        }
        let exception = try #require(dump.stream(.exception))
        #expect(exception.size == 168)
        #expect(dump.u32(exception.rva) == 100)
        #expect(dump.u32(exception.rva + 8) == 11)  // the raw signal number
        #expect(dump.u32(exception.rva + 12) == 1)  // si_code
        #expect(dump.u64(exception.rva + 24) == 0xdead)
        #expect(dump.u32(exception.rva + 160) == UInt32(contextSize))
        #expect(dump.u32(exception.rva + 164) == dump.u32(threads.rva + 4 + 44))
        let system = try #require(dump.stream(.systemInfo))
        #expect(system.size == 56)
        #expect(dump.u16(system.rva) == (architecture == .x86_64 ? 9 : 12))
        #expect(dump.bytes[system.rva + 6] == 2)
        #expect(dump.u32(system.rva + 20) == 0x8201)
        #expect(dump.string(Int(dump.u32(system.rva + 24))) == "Linux 6.1")
    }

    @Test func amd64ContextPlacesEachRegister() throws {
        let input = Self.input(.x86_64)
        let dump = Dump(bytes: MinidumpWriter.write(input))
        let threads = try #require(dump.stream(.threadList))
        let context = Int(dump.u32(threads.rva + 4 + 44))
        #expect(dump.u32(context + 48) == 0x0010_000B)  // CONTEXT_AMD64: control, integer, floating point
        // CONTEXT_AMD64 offsets: Rax 0x78 ... R15 0xF0, Rip 0xF8; ucontext gregs: rax 13, rcx 14,
        // rdx 12, rbx 11, rsp 15, rbp 10, rsi 9, rdi 8, r8..r15 0..7, rip 16.
        let placed: [(offset: Int, greg: Int)] = [
            (0x78, 13), (0x80, 14), (0x88, 12), (0x90, 11), (0x98, 15), (0xA0, 10), (0xA8, 9), (0xB0, 8),
            (0xB8, 0), (0xC0, 1), (0xC8, 2), (0xD0, 3), (0xD8, 4), (0xE0, 5), (0xE8, 6), (0xF0, 7), (0xF8, 16),
        ]
        for (offset, greg) in placed {
            #expect(dump.u64(context + offset) == UInt64(0x1000 + greg), "offset \(offset)")
        }
        #expect(dump.u32(context + 0x44) == 0x1000 + 17)  // EFlags
        // FltSave at 0x100 is the FXSAVE area as the kernel saved it; MxCsr (0x34) is its word at 24.
        #expect(Array(dump.bytes[context + 0x100..<context + 0x300]) == input.threads[0].floatingPoint)
        #expect(dump.u32(context + 0x34) == 0x1B1A_1918)
    }

    @Test func arm64ContextPlacesEachRegister() throws {
        let input = Self.input(.arm64)
        let dump = Dump(bytes: MinidumpWriter.write(input))
        let threads = try #require(dump.stream(.threadList))
        let context = Int(dump.u32(threads.rva + 4 + 44))
        #expect(dump.u32(threads.rva + 4 + 40) == 912)
        #expect(dump.u32(context) == 0x0040_0007)  // CONTEXT_ARM64: control, integer, floating point
        #expect(dump.u32(context + 4) == 0x1000 + 33)  // cpsr
        for index in 0..<31 { #expect(dump.u64(context + 8 + 8 * index) == UInt64(0x1000 + index)) }
        #expect(dump.u64(context + 0x100) == 0x1000 + 31)  // sp
        #expect(dump.u64(context + 0x108) == 0x1000 + 32)  // pc
        #expect(
            Array(dump.bytes[context + 0x110..<context + 0x310]) == Array(input.threads[0].floatingPoint.prefix(512)))
        // Our record keeps fpsr then fpcr after the vectors; the context wants fpcr then fpsr.
        #expect(dump.u32(context + 0x310) == 0x0706_0504)  // fpcr: the record's bytes 516-519
        #expect(dump.u32(context + 0x314) == 0x0302_0100)  // fpsr: the record's bytes 512-515
        // The other thread kept no floating point: the flag says so.
        let second = Int(dump.u32(threads.rva + 4 + 48 + 44))
        #expect(dump.u32(second) == 0x0040_0003)
    }

    @Test func moduleCarriesItsBuildIDAndSpan() throws {
        let input = Self.input(.arm64)
        let dump = Dump(bytes: MinidumpWriter.write(input))
        let modules = try #require(dump.stream(.moduleList))
        #expect(modules.size == 4 + 108)
        #expect(dump.u32(modules.rva) == 1)
        let module = modules.rva + 4
        #expect(dump.u64(module) == 0x5555_0000)
        #expect(dump.u32(module + 8) == 0x18000)
        #expect(dump.string(Int(dump.u32(module + 20))) == "/usr/bin/app")
        let cvSize = Int(dump.u32(module + 76))
        let cv = Int(dump.u32(module + 80))
        #expect(cvSize == 24)
        #expect(Array(dump.bytes[cv..<cv + 4]) == Array("LEpB".utf8))  // 'BpEL' as a little-endian word
        #expect(Array(dump.bytes[cv + 4..<cv + 24]) == input.modules[0].buildID)
        // breakpad's debug id: the GUID's first three fields byte-swapped, age 0.
        #expect(MinidumpInput.debugID(buildID: input.modules[0].buildID) == "0403020106050807090A0B0C0D0E0F100")
    }

    @Test func threadNamesAndAnnotations() throws {
        let dump = Dump(bytes: MinidumpWriter.write(Self.input(.x86_64)))
        let names = try #require(dump.stream(.threadNames))
        #expect(dump.u32(names.rva) == 2)
        #expect(dump.u32(names.rva + 4) == 100)
        #expect(dump.string(Int(dump.u64(names.rva + 8))) == "main")
        #expect(dump.u32(names.rva + 16) == 101)
        #expect(dump.string(Int(dump.u64(names.rva + 20))) == "worker-1")
        let info = try #require(dump.stream(.crashpadInfo))
        #expect(info.size == 52)
        #expect(dump.u32(info.rva) == 1)
        let dictionary = Int(dump.u32(info.rva + 40))
        #expect(dump.u32(dictionary) == 2)
        func utf8(_ rva: Int) -> String {
            String(decoding: dump.bytes[rva + 4..<rva + 4 + Int(dump.u32(rva))], as: UTF8.self)
        }
        #expect(utf8(Int(dump.u32(dictionary + 4))) == "app")
        #expect(utf8(Int(dump.u32(dictionary + 16))) == "1.2")
        let maps = try #require(dump.stream(.linuxMaps))
        #expect(String(decoding: dump.bytes[maps.rva..<maps.rva + maps.size], as: UTF8.self).hasPrefix("5555000-"))
    }

    @Test func stacksRecordRoundTrips() throws {
        let memory = StackMemory(
            architecture: .arm64,
            threads: [
                .init(
                    tid: 7, crashed: true, cut: true, registers: (0..<34).map { UInt64($0) },
                    floatingPoint: [UInt8](repeating: 1, count: 520), stackStart: 0x1000, stack: [1, 2, 3]),
                .init(
                    tid: 8, crashed: false, registers: (0..<34).map { UInt64($0 * 2) }, stackStart: 0x2000, stack: []),
            ], bound: 4096, threadsLeftOut: 3, bytesCut: 99)
        let parsed = try StackMemory.parse(memory.encoded()).get()
        #expect(parsed == memory)
        var wrongVersion = memory.encoded()
        wrongVersion[4] = 9
        #expect(throws: StackMemoryProblem.self) { try StackMemory.parse(wrongVersion).get() }
        #expect(throws: StackMemoryProblem.self) { try StackMemory.parse(Array(memory.encoded().dropLast(8))).get() }
    }
}
