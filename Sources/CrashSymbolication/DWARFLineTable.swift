internal import CrashFileFormat
internal import Foundation

/// Source file and line for code addresses, from an ELF file's `.debug_line` (DWARF 4 and 5,
/// which is what Swift and clang emit here). Every line program in the section is run once
/// and its rows kept sorted by address.
struct DWARFLineTable: Sendable {
    struct Row: Sendable {
        let address: UInt64
        let line: Int
        let file: Int32  // index into `files`, -1 for the end of a sequence
    }

    private(set) var rows: [Row] = []
    private(set) var files: [String] = []

    /// The file and line of the instruction at `address` (in the file's address space).
    func location(of address: UInt64) -> (file: String, line: Int)? {
        var low = 0
        var high = rows.count
        while low < high {
            let middle = (low + high) / 2
            if rows[middle].address <= address { low = middle + 1 } else { high = middle }
        }
        guard low > 0 else { return nil }
        let row = rows[low - 1]
        guard row.file >= 0, row.line > 0, Int(row.file) < files.count else { return nil }
        return (files[Int(row.file)], row.line)
    }

    init(line: ArraySlice<UInt8>, lineStrings: ArraySlice<UInt8>?, strings: ArraySlice<UInt8>?) throws {
        var reader = DWARFReader(bytes: line)
        while !reader.atEnd {
            try readProgram(&reader, lineStrings: lineStrings, strings: strings)
        }
        rows.sort { $0.address < $1.address || ($0.address == $1.address && $0.file < 0 && $1.file >= 0) }
    }

    private mutating func readProgram(
        _ reader: inout DWARFReader, lineStrings: ArraySlice<UInt8>?, strings: ArraySlice<UInt8>?
    ) throws {
        var length = UInt64(try reader.u32())
        var offsetSize = 4
        if length == 0xffff_ffff {
            length = try reader.u64()
            offsetSize = 8
        }
        let end = reader.position + Int(clamping: length)
        guard end <= reader.endIndex, length >= 2 else {
            throw CrashCaptureError.corrupt("bad .debug_line unit length")
        }
        defer { reader.position = end }
        let version = try reader.u16()
        guard (2...5).contains(version) else { return }  // unknown version: skip this unit
        if version >= 5 {
            _ = try reader.u8()  // address_size
            _ = try reader.u8()  // segment_selector_size
        }
        let headerLength = offsetSize == 8 ? try reader.u64() : UInt64(try reader.u32())
        let programStart = reader.position + Int(clamping: headerLength)
        let minimumInstructionLength = UInt64(try reader.u8())
        if version >= 4 { _ = try reader.u8() }  // maximum_operations_per_instruction
        let defaultIsStatement = try reader.u8() != 0
        _ = defaultIsStatement
        let lineBase = Int(Int8(bitPattern: try reader.u8()))
        let lineRange = Int(try reader.u8())
        let opcodeBase = Int(try reader.u8())
        guard lineRange > 0, opcodeBase > 0 else { return }
        var standardLengths = [Int](repeating: 0, count: opcodeBase)
        for index in 1..<opcodeBase { standardLengths[index] = Int(try reader.u8()) }

        // The unit's files, as indexes into `files`; DWARF 5 counts from 0, earlier from 1.
        var unitFiles: [Int32] = []
        if version >= 5 {
            let directories = try readEntries(
                &reader, offsetSize: offsetSize, lineStrings: lineStrings, strings: strings
            )
            .map(\.path)
            let names = try readEntries(&reader, offsetSize: offsetSize, lineStrings: lineStrings, strings: strings)
            for entry in names {
                let directory = entry.directory < directories.count ? directories[entry.directory] : ""
                unitFiles.append(intern(join(directory, entry.path)))
            }
        } else {
            var directories: [String] = [""]
            while true {
                let directory = try reader.cString()
                if directory.isEmpty { break }
                directories.append(directory)
            }
            unitFiles.append(-1)
            while true {
                let name = try reader.cString()
                if name.isEmpty { break }
                let directory = Int(try reader.uleb())
                _ = try reader.uleb()
                _ = try reader.uleb()
                unitFiles.append(intern(join(directory < directories.count ? directories[directory] : "", name)))
            }
        }
        reader.position = programStart

        var address: UInt64 = 0
        var file = version >= 5 ? 0 : 1
        var line = 1
        func emit(end: Bool = false) {
            let index: Int32 = end ? -1 : (file < unitFiles.count ? unitFiles[file] : -1)
            rows.append(Row(address: address, line: line, file: index))
        }
        while reader.position < end {
            let opcode = Int(try reader.u8())
            if opcode >= opcodeBase {
                let adjusted = opcode - opcodeBase
                address &+= UInt64(adjusted / lineRange) &* minimumInstructionLength
                line += lineBase + adjusted % lineRange
                emit()
                continue
            }
            switch opcode {
            case 0:
                let size = Int(try reader.uleb())
                let next = reader.position + size
                guard size > 0, next <= end else { return }
                switch try reader.u8() {
                case 1:
                    emit(end: true)
                    address = 0
                    file = version >= 5 ? 0 : 1
                    line = 1
                case 2:
                    address = size - 1 == 8 ? try reader.u64() : UInt64(try reader.u32())
                default: break
                }
                reader.position = next
            case 1: emit()
            case 2: address &+= try reader.uleb() &* minimumInstructionLength
            case 3: line += Int(try reader.sleb())
            case 4: file = Int(try reader.uleb())
            case 8: address &+= UInt64((255 - opcodeBase) / lineRange) &* minimumInstructionLength
            case 9: address &+= UInt64(try reader.u16())
            default:
                for _ in 0..<standardLengths[opcode] { _ = try reader.uleb() }
            }
        }
    }

    private struct Entry {
        var path = ""
        var directory = 0
    }

    /// DWARF 5 directory or file entries, described by (content type, form) pairs.
    private func readEntries(
        _ reader: inout DWARFReader, offsetSize: Int, lineStrings: ArraySlice<UInt8>?, strings: ArraySlice<UInt8>?
    ) throws -> [Entry] {
        let formatCount = Int(try reader.u8())
        var format: [(type: UInt64, form: UInt64)] = []
        for _ in 0..<formatCount { format.append((try reader.uleb(), try reader.uleb())) }
        let count = Int(clamping: try reader.uleb())
        guard count < 1_000_000 else { throw CrashCaptureError.corrupt("implausible .debug_line entry count") }
        var entries: [Entry] = []
        for _ in 0..<count {
            var entry = Entry()
            for (type, form) in format {
                var text: String?
                var number: UInt64 = 0
                switch form {
                case 0x08: text = try reader.cString()  // DW_FORM_string
                case 0x1f, 0x0e:  // DW_FORM_line_strp, DW_FORM_strp
                    let offset = offsetSize == 8 ? try reader.u64() : UInt64(try reader.u32())
                    text = DWARFReader.string(in: form == 0x1f ? lineStrings : strings, at: offset)
                case 0x0f: number = try reader.uleb()  // udata
                case 0x0b: number = UInt64(try reader.u8())
                case 0x05: number = UInt64(try reader.u16())
                case 0x06: number = UInt64(try reader.u32())
                case 0x07: number = try reader.u64()
                case 0x1e: try reader.skip(16)  // data16 (MD5)
                case 0x09: try reader.skip(Int(clamping: try reader.uleb()))  // block
                default: throw CrashCaptureError.corrupt("unsupported DWARF form \(form) in .debug_line")
                }
                if type == 1, let text { entry.path = text }  // DW_LNCT_path
                if type == 2 { entry.directory = Int(clamping: number) }  // DW_LNCT_directory_index
            }
            entries.append(entry)
        }
        return entries
    }

    private var fileIndex: [String: Int32] = [:]

    private mutating func intern(_ path: String) -> Int32 {
        if let known = fileIndex[path] { return known }
        let index = Int32(files.count)
        files.append(path)
        fileIndex[path] = index
        return index
    }

    private func join(_ directory: String, _ name: String) -> String {
        if name.hasPrefix("/") || directory.isEmpty { return name }
        return directory + "/" + name
    }
}

/// Bounds-checked reads over one DWARF section.
struct DWARFReader {
    let bytes: ArraySlice<UInt8>
    var position: Int
    var endIndex: Int { bytes.endIndex }
    var atEnd: Bool { position >= bytes.endIndex }

    init(bytes: ArraySlice<UInt8>) {
        self.bytes = bytes
        position = bytes.startIndex
    }

    mutating func need(_ count: Int) throws {
        guard count >= 0, position + count <= bytes.endIndex else {
            throw CrashCaptureError.corrupt(".debug_line ends inside a record")
        }
    }

    mutating func skip(_ count: Int) throws {
        try need(count)
        position += count
    }

    mutating func u8() throws -> UInt8 {
        try need(1)
        defer { position += 1 }
        return bytes[position]
    }

    mutating func u16() throws -> UInt16 { UInt16(try u8()) | UInt16(try u8()) << 8 }
    mutating func u32() throws -> UInt32 { UInt32(try u16()) | UInt32(try u16()) << 16 }
    mutating func u64() throws -> UInt64 { UInt64(try u32()) | UInt64(try u32()) << 32 }

    mutating func uleb() throws -> UInt64 {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let byte = try u8()
            if shift < 64 { result |= UInt64(byte & 0x7f) << shift }
            shift += 7
            if byte & 0x80 == 0 { return result }
        }
    }

    mutating func sleb() throws -> Int64 {
        var result: Int64 = 0
        var shift: Int64 = 0
        var byte: UInt8 = 0
        repeat {
            byte = try u8()
            if shift < 64 { result |= Int64(byte & 0x7f) << shift }
            shift += 7
        } while byte & 0x80 != 0
        if shift < 64 && byte & 0x40 != 0 { result |= -(Int64(1) << shift) }
        return result
    }

    mutating func cString() throws -> String {
        let start = position
        while position < bytes.endIndex && bytes[position] != 0 { position += 1 }
        guard position < bytes.endIndex else { throw CrashCaptureError.corrupt("unterminated string in .debug_line") }
        defer { position += 1 }
        return String(decoding: bytes[start..<position], as: UTF8.self)
    }

    static func string(in section: ArraySlice<UInt8>?, at offset: UInt64) -> String? {
        guard let section, offset < UInt64(section.count) else { return nil }
        let start = section.startIndex + Int(offset)
        var end = start
        while end < section.endIndex && section[end] != 0 { end += 1 }
        return String(decoding: section[start..<end], as: UTF8.self)
    }
}
