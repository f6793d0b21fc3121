internal import CElfutils
internal import CrashFileFormat
internal import Foundation

/// The parts of an ELF64 little-endian file that naming functions needs when libdw is not
/// installed: the GNU build-id and the function symbols of `.symtab` (or, in a stripped file,
/// `.dynsym`).
public struct ELFImage: Sendable {
    public struct Symbol: Sendable, Equatable {
        public let address: UInt64
        public let size: UInt64
        public let name: String
    }

    public let path: String
    public let buildID: String?
    /// Sorted by address.
    public let symbols: [Symbol]
    /// Whether `symbols` came from the full symbol table, not only the dynamic one.
    public let hasFullSymbolTable: Bool

    /// The GNU build-id of an ELF file, from its headers and notes alone (a few KiB read,
    /// whatever the file's size): nil when it has none. Throws for a file that is not ELF64
    /// little-endian, is not a regular file, or is larger than 4 GiB.
    public static func buildID(ofFileAt path: String) throws -> String? {
        let descriptor = ccs_open_regular(path, CCS_MAXIMUM_MODULE_BYTES)
        guard descriptor >= 0 else {
            let reason = errno == EFBIG ? "larger than 4 GiB" : String(cString: strerror(errno))
            throw CrashCaptureError.io("cannot read the module file: \(reason)", path: path)
        }
        defer { close(descriptor) }
        func bytes(_ offset: UInt64, _ count: Int) -> [UInt8] {
            var out = [UInt8](repeating: 0, count: count)
            let got = out.withUnsafeMutableBytes { pread(descriptor, $0.baseAddress, count, off_t(offset)) }
            return got == count ? out : []
        }
        func u16(_ b: [UInt8], _ at: Int) -> Int { Int(b[at]) | Int(b[at + 1]) << 8 }
        func u32(_ b: [UInt8], _ at: Int) -> UInt32 { (0..<4).reduce(0) { $0 | UInt32(b[at + $1]) << (8 * $1) } }
        func u64(_ b: [UInt8], _ at: Int) -> UInt64 { (0..<8).reduce(0) { $0 | UInt64(b[at + $1]) << (8 * $1) } }
        let header = bytes(0, 64)
        guard header.count == 64, header[0..<4] == [0x7f, 0x45, 0x4c, 0x46], header[4] == 2, header[5] == 1 else {
            throw CrashCaptureError.corrupt("not an ELF file (64-bit, little-endian)", path: path)
        }
        // Notes from the program headers (PT_NOTE), else from the section headers (SHT_NOTE).
        var notes: [(offset: UInt64, size: UInt64)] = []
        let programs = (offset: u64(header, 0x20), size: u16(header, 0x36), count: u16(header, 0x38))
        let sections = (offset: u64(header, 0x28), size: u16(header, 0x3a), count: u16(header, 0x3c))
        for index in 0..<min(programs.count, 256) where programs.size >= 0x28 {
            let entry = bytes(programs.offset + UInt64(index * programs.size), 0x28)
            if entry.count == 0x28, u32(entry, 0) == 4 { notes.append((u64(entry, 0x08), u64(entry, 0x20))) }
        }
        if notes.isEmpty {
            for index in 0..<min(sections.count, 4096) where sections.size >= 0x40 {
                let entry = bytes(sections.offset + UInt64(index * sections.size), 0x40)
                if entry.count == 0x40, u32(entry, 4) == 7 { notes.append((u64(entry, 0x18), u64(entry, 0x20))) }
            }
        }
        for note in notes where note.size <= 1 << 16 {
            let data = bytes(note.offset, Int(note.size))
            var at = 0
            while at + 12 <= data.count {
                let nameSize = Int(u32(data, at)), descSize = Int(u32(data, at + 4)), type = u32(data, at + 8)
                let name = at + 12, desc = name + (nameSize + 3) & ~3, next = desc + (descSize + 3) & ~3
                guard next <= data.count else { break }
                if type == 3, nameSize == 4, data[name..<name + 4] == [0x47, 0x4e, 0x55, 0] {
                    return data[desc..<desc + descSize].map { String(format: "%02x", $0) }.joined()
                }
                at = next
            }
        }
        return nil
    }

    /// Reads the file as ccs_module_open does: without blocking, a regular file only, bounded.
    public init(path: String) throws {
        let descriptor = ccs_open_regular(path, CCS_MAXIMUM_MODULE_BYTES)
        guard descriptor >= 0 else {
            throw CrashCaptureError.io("cannot read the module file: \(String(cString: strerror(errno)))", path: path)
        }
        let file = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
        guard let data = try? file.readToEnd() else {
            throw CrashCaptureError.io("cannot read the module file", path: path)
        }
        try self.init(path: path, bytes: [UInt8](data))
    }

    public init(path: String, bytes: [UInt8]) throws {
        self.path = path
        let reader = ByteReader(bytes: bytes)
        guard bytes.count >= 64, bytes[0] == 0x7f, bytes[1] == 0x45, bytes[2] == 0x4c, bytes[3] == 0x46 else {
            throw CrashCaptureError.corrupt("\(path) is not an ELF file")
        }
        guard bytes[4] == 2, bytes[5] == 1 else {
            throw CrashCaptureError.corrupt("\(path) is not a 64-bit little-endian ELF file")
        }
        let sectionOffset = Int(try reader.u64(0x28))
        let sectionEntrySize = Int(try reader.u16(0x3a))
        let sectionCount = Int(try reader.u16(0x3c))
        guard sectionEntrySize >= 64 || sectionCount == 0 else {
            throw CrashCaptureError.corrupt("\(path): bad section header size \(sectionEntrySize)")
        }
        var sections: [Section] = []
        for index in 0..<sectionCount {
            let base = sectionOffset + index * sectionEntrySize
            sections.append(
                Section(
                    nameOffset: Int(try reader.u32(base)), type: try reader.u32(base + 4),
                    flags: try reader.u64(base + 8), offset: Int(try reader.u64(base + 0x18)),
                    size: Int(try reader.u64(base + 0x20)), link: Int(try reader.u32(base + 0x28)),
                    entrySize: Int(try reader.u64(base + 0x38))))
        }
        buildID = Self.findBuildID(sections: sections, reader: reader)
        let full = sections.filter { $0.type == 2 }  // SHT_SYMTAB
        let dynamic = sections.filter { $0.type == 11 }  // SHT_DYNSYM
        hasFullSymbolTable = !full.isEmpty
        var symbols: [Symbol] = []
        for table in full.isEmpty ? dynamic : full {
            guard table.link < sections.count else { continue }
            symbols += try Self.readSymbols(table: table, strings: sections[table.link], reader: reader)
        }
        symbols.sort { $0.address < $1.address || ($0.address == $1.address && $0.size > $1.size) }
        self.symbols = symbols
    }

    /// The function that contains `address` (an address in the file's virtual address space).
    public func symbol(containing address: UInt64) -> (symbol: Symbol, offset: UInt64)? {
        var low = 0
        var high = symbols.count
        while low < high {
            let middle = (low + high) / 2
            if symbols[middle].address <= address { low = middle + 1 } else { high = middle }
        }
        var index = low - 1
        // Among symbols at or before the address, take the nearest one that spans it.
        while index >= 0 {
            let candidate = symbols[index]
            if candidate.size == 0 || address < candidate.address + candidate.size {
                return (candidate, address - candidate.address)
            }
            if address - candidate.address > 1 << 20 { break }
            index -= 1
        }
        return nil
    }

    struct Section {
        let nameOffset: Int
        let type: UInt32
        let flags: UInt64
        let offset: Int
        let size: Int
        let link: Int
        let entrySize: Int
    }

    private static func readSymbols(table: Section, strings: Section, reader: ByteReader) throws -> [Symbol] {
        let entrySize = table.entrySize == 0 ? 24 : table.entrySize
        guard entrySize >= 24 else { throw CrashCaptureError.corrupt("bad symbol entry size \(entrySize)") }
        var result: [Symbol] = []
        let count = table.size / entrySize
        result.reserveCapacity(count / 2)
        for index in 0..<count {
            let base = table.offset + index * entrySize
            let info = try reader.u8(base + 4)
            let type = info & 0xf
            let section = try reader.u16(base + 6)
            guard type == 2 || type == 10, section != 0 else { continue }  // STT_FUNC, STT_GNU_IFUNC; defined
            let value = try reader.u64(base + 8)
            guard value != 0 else { continue }
            let nameOffset = Int(try reader.u32(base))
            guard nameOffset < strings.size else { continue }
            let name = try reader.cString(strings.offset + nameOffset, limit: strings.offset + strings.size)
            result.append(Symbol(address: value, size: try reader.u64(base + 16), name: name))
        }
        return result
    }

    private static func findBuildID(sections: [Section], reader: ByteReader) -> String? {
        for section in sections where section.type == 7 {  // SHT_NOTE
            var offset = section.offset
            let end = section.offset + section.size
            while offset + 12 <= end {
                guard let nameSize = try? Int(reader.u32(offset)), let descSize = try? Int(reader.u32(offset + 4)),
                    let type = try? reader.u32(offset + 8)
                else { return nil }
                let name = offset + 12
                let desc = name + ((nameSize + 3) & ~3)
                let next = desc + ((descSize + 3) & ~3)
                guard next <= end, next > offset else { break }
                if type == 3, nameSize == 4, let bytes = try? reader.slice(desc, descSize),
                    (try? reader.slice(name, 4)) == [0x47, 0x4e, 0x55, 0]
                {
                    return bytes.map { String(format: "%02x", $0) }.joined()
                }
                offset = next
            }
        }
        return nil
    }
}

/// Bounds-checked little-endian reads: a damaged file is an error, never a crash.
struct ByteReader {
    let bytes: [UInt8]

    func check(_ offset: Int, _ count: Int) throws {
        guard offset >= 0, count >= 0, offset <= bytes.count - count else {
            throw CrashCaptureError.corrupt("read of \(count) bytes at \(offset) is outside the file")
        }
    }

    func u8(_ offset: Int) throws -> UInt8 {
        try check(offset, 1)
        return bytes[offset]
    }

    func u16(_ offset: Int) throws -> UInt16 {
        try check(offset, 2)
        return UInt16(bytes[offset]) | UInt16(bytes[offset + 1]) << 8
    }

    func u32(_ offset: Int) throws -> UInt32 {
        try check(offset, 4)
        var value: UInt32 = 0
        for index in (0..<4).reversed() { value = value << 8 | UInt32(bytes[offset + index]) }
        return value
    }

    func u64(_ offset: Int) throws -> UInt64 {
        try check(offset, 8)
        var value: UInt64 = 0
        for index in (0..<8).reversed() { value = value << 8 | UInt64(bytes[offset + index]) }
        return value
    }

    func slice(_ offset: Int, _ count: Int) throws -> [UInt8] {
        try check(offset, count)
        return Array(bytes[offset..<offset + count])
    }

    func cString(_ offset: Int, limit: Int) throws -> String {
        try check(offset, 0)
        let end = min(limit, bytes.count)
        var stop = offset
        while stop < end && bytes[stop] != 0 { stop += 1 }
        // From a buffer, String takes its fast (vectorized) path; from a slice, a byte-by-byte one.
        return bytes.withUnsafeBufferPointer {
            String(decoding: UnsafeBufferPointer(rebasing: $0[offset..<stop]), as: UTF8.self)
        }
    }
}
