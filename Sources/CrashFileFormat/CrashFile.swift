internal import CCrashFileFormat
public import Foundation

/// The crash file layout: a sequence of framed records, then zeros (the space reserved at
/// install). Each record is a 16-byte little-endian header, `CCR1` magic, type, payload
/// length and a CRC-32 of (type, length, payload), followed by the JSON payload. The numbers
/// come from the C header the crash path writes with (`crashcapture_format.h`).
public enum CrashFileLayout: Sendable {
    /// The four bytes every record starts with.
    public static let magic: [UInt8] = Array(CCF_RECORD_MAGIC.utf8)
    /// Bytes before each record's payload.
    public static let headerSize = Int(CCF_RECORD_HEADER_SIZE)
    /// The largest payload a record may declare.
    public static let maximumPayload = Int(CCF_MAXIMUM_PAYLOAD)
    /// Files are read up to this size; anything past it is reported, never loaded.
    public static let maximumFileSize = Int(CCF_MAXIMUM_FILE_SIZE)
    /// Records read from one file at most; the rest is reported as damage.
    public static let maximumRecords = Int(CCF_MAXIMUM_RECORDS)
    /// Damaged places reported in one file at most before the reader gives up on the rest.
    public static let maximumProblems = Int(CCF_MAXIMUM_PROBLEMS)
    /// JSON values parsed from one file's records at most.
    public static let maximumJSONValues = Int(CCF_MAXIMUM_JSON_VALUES)
    /// Crash files are named `crash-<session>.ccr`.
    public static let fileExtension = CCF_FILE_EXTENSION
    /// The start of every crash file's name.
    public static let filePrefix = CCF_FILE_PREFIX

    /// Whether a directory entry's name is that of a crash file: `crash-…​.ccr`. Another file that
    /// merely ends in `.ccr` (a copy kept by hand, a backup) is not the tools' to import or delete.
    public static func isCrashFileName(_ name: String) -> Bool {
        name.hasPrefix(filePrefix) && name.hasSuffix("." + fileExtension)
            && name.utf8.count > filePrefix.utf8.count + fileExtension.utf8.count + 1
    }
}

/// What a record holds.
public enum CrashRecordType: UInt32, Sendable {
    /// Written at install: who the session is.
    case session = 1
    /// One event (`$AppCrashed`, `$AppEnd`).
    case event = 2
    /// The handler's timings, written after the events were made durable.
    case timing = 3
    /// Binary: every thread's registers and stack memory (``StackMemory``).
    case stacks = 4
}

/// Names of signals and of their `si_code` values, as the crash path writes them.
public enum SignalNames: Sendable {
    /// "SIGSEGV" for SIGSEGV; "signal N" for one the table does not name.
    public static func name(of signal: Int32) -> String {
        ccf_signal_name(signal).map { String(cString: $0) } ?? "signal \(signal)"
    }

    /// "SEGV_MAPERR" for SIGSEGV's code 1, "SI_USER" for a signal sent by kill; "UNKNOWN" otherwise.
    public static func codeName(signal: Int32, code: Int32) -> String {
        String(cString: ccf_code_name(signal, code))
    }
}

public struct CrashRecord: Sendable {
    public let type: CrashRecordType
    public let offset: Int
    public let payload: [UInt8]

    /// The payload's object (never for a stacks record, which is binary); nil when it is not one, or names a key of its own twice (which of
    /// two `event` names is the event is not for the reader to guess).
    public var json: [String: Any]? { type == .stacks ? nil : JSONTree.object(payload, uniqueTopLevelKeys: true) }
}

/// Damage found in a crash file: where, and what is wrong there.
public struct CrashFileProblem: Error, Sendable, Equatable, CustomStringConvertible {
    /// Byte offset in the file.
    public let offset: Int
    /// What is wrong, in words.
    public let reason: String
    /// "offset N: reason".
    public var description: String { "offset \(offset): \(reason)" }

    /// A problem at `offset`.
    public init(offset: Int, reason: String) {
        self.offset = offset
        self.reason = reason
    }
}

public struct CrashFileContents: Sendable {
    public var records: [CrashRecord] = []
    public var problems: [CrashFileProblem] = []
    public var byteCount = 0

    public var events: [CrashRecord] { records.filter { $0.type == .event } }
    /// The stacks record's payload, when the file has one.
    public var stacks: [UInt8]? { records.last { $0.type == .stacks }?.payload }
}

public enum CrashFileReader: Sendable {
    /// A symbolic link, a FIFO or anything but a regular file is refused, never followed or waited on.
    public static func read(path: String) throws -> CrashFileContents {
        let handle = FileHandle(fileDescriptor: try CaptureFile.openForReading(path), closeOnDealloc: true)
        return try read(handle)
    }

    /// Reads from an open file, from its start, into one buffer sized by the file (never more
    /// than the limit).
    public static func read(_ handle: FileHandle) throws -> CrashFileContents {
        let fd = handle.fileDescriptor
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw CrashCaptureError.system("cannot inspect the crash file", path: nil) }
        let limit = CrashFileLayout.maximumFileSize
        let size = min(max(Int(info.st_size), 0), limit + 1)
        var bytes = [UInt8](repeating: 0, count: dataEnd(fd, size: size))
        var count = 0
        while count < bytes.count {
            let got = bytes.withUnsafeMutableBytes {
                pread(fd, $0.baseAddress! + count, $0.count - count, off_t(count))
            }
            if got < 0 && errno == EINTR { continue }
            guard got >= 0 else { throw CrashCaptureError.system("cannot read the crash file", path: nil) }
            if got == 0 { break }
            count += got
        }
        let larger = size > limit
        bytes.removeLast(bytes.count - min(count, limit))
        var contents = parse(bytes)
        if larger {
            contents.problems.append(
                CrashFileProblem(
                    offset: limit, reason: "file is larger than \(limit) bytes; the rest was not read"))
        }
        return contents
    }

    /// Where the file's data ends, up to `size`. Most of a crash file is the space reserved at
    /// install, which the filesystem keeps as unwritten extents: past the last data extent the
    /// file reads as zeros by definition, so it is not read (a quarter of a replay's time went
    /// into reading and scanning those zeros). Filesystems that cannot tell say the whole file.
    static func dataEnd(_ fd: Int32, size: Int) -> Int {
        // Linux's SEEK_DATA and SEEK_HOLE, which Glibc's module leaves out (they need _GNU_SOURCE).
        let seekData: Int32 = 3
        let seekHole: Int32 = 4
        var end = 0
        var position = 0
        while position < size {
            let data = lseek(fd, off_t(position), seekData)
            if data < 0 { return errno == ENXIO ? end : size }
            let hole = lseek(fd, data, seekHole)
            guard hole >= 0 else { return size }
            end = min(Int(hole), size)
            position = Int(hole)
        }
        return end
    }

    /// Recovers every whole record. Damage is reported with its offset, and reading resumes at
    /// the next magic, so one torn record never hides the ones after it.
    public static func parse(_ bytes: [UInt8]) -> CrashFileContents {
        var contents = CrashFileContents()
        contents.byteCount = bytes.count
        var offset = 0
        // Resynchronising after damage may checksum the same bytes again; a crafted file could
        // make that quadratic. Four passes over the file are more than any honest damage needs.
        var budget = max(4 * bytes.count, 4 << 20)
        var payloadBytes = 0
        var jsonValues = 0
        while offset < bytes.count {
            if bytes[offset] == 0 {
                guard let next = firstNonZero(bytes, from: offset) else { break }
                contents.problems.append(
                    CrashFileProblem(offset: next, reason: "data after the zero-filled reserved space"))
                offset = next
                continue
            }
            guard budget > 0, contents.problems.count < CrashFileLayout.maximumProblems else {
                contents.problems.append(
                    CrashFileProblem(offset: offset, reason: "too much damage to scan further; the rest was not read"))
                break
            }
            guard contents.records.count < CrashFileLayout.maximumRecords else {
                contents.problems.append(
                    CrashFileProblem(
                        offset: offset,
                        reason: "more than \(CrashFileLayout.maximumRecords) records, more than a crash writes; "
                            + "the rest was not read"))
                break
            }
            switch parseRecord(bytes, at: offset, budget: &budget) {
            case .success(let record):
                payloadBytes += record.payload.count
                if record.type != .stacks { jsonValues += Self.jsonValueCount(record.payload) }
                guard payloadBytes <= CrashFileLayout.maximumPayload,
                    jsonValues <= CrashFileLayout.maximumJSONValues
                else {
                    contents.problems.append(
                        CrashFileProblem(
                            offset: offset,
                            reason: "records hold more than \(CrashFileLayout.maximumPayload) bytes or "
                                + "\(CrashFileLayout.maximumJSONValues) JSON values in all, more than a crash "
                                + "writes; the rest was not read"))
                    return contents
                }
                contents.records.append(record)
                offset += CrashFileLayout.headerSize + record.payload.count
            case .failure(let problem):
                contents.problems.append(problem)
                offset = nextMagic(in: bytes, after: offset) ?? bytes.count
            }
        }
        return contents
    }

    private static func parseRecord(_ bytes: [UInt8], at offset: Int, budget: inout Int) -> Result<
        CrashRecord, CrashFileProblem
    > {
        let available = bytes.count - offset
        guard available >= CrashFileLayout.headerSize else {
            return .failure(.init(offset: offset, reason: "truncated record header (\(available) bytes)"))
        }
        guard Array(bytes[offset..<offset + 4]) == CrashFileLayout.magic else {
            return .failure(.init(offset: offset, reason: "no record magic: not a CrashCapture record"))
        }
        let type = littleEndian32(bytes, offset + 4)
        let length = Int(littleEndian32(bytes, offset + 8))
        let expected = littleEndian32(bytes, offset + 12)
        guard length <= CrashFileLayout.maximumPayload else {
            return .failure(
                .init(
                    offset: offset,
                    reason: "record length \(length) exceeds the \(CrashFileLayout.maximumPayload >> 20) MiB limit"))
        }
        guard length <= available - CrashFileLayout.headerSize else {
            return .failure(
                .init(
                    offset: offset,
                    reason: "truncated record: \(length) payload bytes declared, "
                        + "\(available - CrashFileLayout.headerSize) present"))
        }
        let start = offset + CrashFileLayout.headerSize
        budget -= length + 8
        var crc = CRC32.update(0, bytes[offset + 4..<offset + 12])
        crc = CRC32.update(crc, bytes[start..<start + length])
        guard crc == expected else {
            return .failure(.init(offset: offset, reason: "checksum mismatch: torn or damaged record"))
        }
        guard let recordType = CrashRecordType(rawValue: type) else {
            return .failure(.init(offset: offset, reason: "unknown record type \(type)"))
        }
        return .success(CrashRecord(type: recordType, offset: offset, payload: Array(bytes[start..<start + length])))
    }

    /// An upper bound on the values a JSON text holds: every value but the first follows a
    /// comma or an opening bracket outside strings. Counted before parsing, which costs a
    /// hundred bytes or so per value.
    static func jsonValueCount(_ payload: [UInt8]) -> Int {
        payload.withUnsafeBufferPointer { bytes in
            var count = 1
            var inString = false
            var escaped = false
            for byte in bytes {
                if inString {
                    if escaped {
                        escaped = false
                    } else if byte == UInt8(ascii: "\\") {
                        escaped = true
                    } else if byte == UInt8(ascii: "\"") {
                        inString = false
                    }
                } else if byte == UInt8(ascii: "\"") {
                    inString = true
                } else if byte == UInt8(ascii: ",") || byte == UInt8(ascii: "[") || byte == UInt8(ascii: "{") {
                    count += 1
                }
            }
            return count
        }
    }

    /// The reserved tail is mostly zeros: scan it eight bytes at a time.
    static func firstNonZero(_ bytes: [UInt8], from start: Int) -> Int? {
        bytes.withUnsafeBytes { raw -> Int? in
            var index = start
            while index < raw.count && index % 8 != 0 {
                if raw[index] != 0 { return index }
                index += 1
            }
            while index + 8 <= raw.count {
                if raw.loadUnaligned(fromByteOffset: index, as: UInt64.self) != 0 { break }
                index += 8
            }
            while index < raw.count {
                if raw[index] != 0 { return index }
                index += 1
            }
            return nil
        }
    }

    private static func nextMagic(in bytes: [UInt8], after offset: Int) -> Int? {
        var index = offset + 1
        while index + 4 <= bytes.count {
            if bytes[index] == 0x43 && bytes[index + 1] == 0x43 && bytes[index + 2] == 0x52 && bytes[index + 3] == 0x31
            {
                return index
            }
            index += 1
        }
        return nil
    }

    private static func littleEndian32(_ bytes: [UInt8], _ at: Int) -> UInt32 {
        UInt32(bytes[at]) | UInt32(bytes[at + 1]) << 8 | UInt32(bytes[at + 2]) << 16 | UInt32(bytes[at + 3]) << 24
    }
}

/// CRC-32 as zlib computes it (IEEE polynomial, reflected).
public enum CRC32: Sendable {
    static let table: [UInt32] = (0..<256).map { index in
        var crc = UInt32(index)
        for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0xEDB8_8320 : crc >> 1 }
        return crc
    }

    public static func update(_ crc: UInt32, _ bytes: some Collection<UInt8>) -> UInt32 {
        if let result = bytes.withContiguousStorageIfAvailable({ update(crc, $0) }) { return result }
        return update(crc, Array(bytes))
    }

    static func update(_ crc: UInt32, _ bytes: UnsafeBufferPointer<UInt8>) -> UInt32 {
        table.withUnsafeBufferPointer { table in
            var value = ~crc
            for byte in bytes { value = table[Int((value ^ UInt32(byte)) & 0xff)] ^ (value >> 8) }
            return ~value
        }
    }
}
