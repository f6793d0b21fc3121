internal import CCrashFileFormat
internal import Foundation

#if canImport(Glibc)
    internal import Glibc
#endif

/// A stretch of the ring read into memory, moved forward as the reader goes: large enough for
/// any one entry, small whatever the ring's size. Bytes past the end of a file cut short read
/// as zeros, which no entry matches.
final class RingWindow {
    static let capacity = 2 * Int(CCF_MAXIMUM_PAYLOAD)
    let fd: Int32
    let path: String
    let fileOffset: Int
    let size: UInt64
    var buffer: [UInt8] = []
    var start: UInt64 = 0  // the ring offset of buffer[0]

    /// Ring bytes the file really holds; a file cut short holds zeros past them.
    let present: UInt64

    init(fd: Int32, path: String, fileOffset: Int, size: UInt64) {
        self.fd = fd
        self.path = path
        self.fileOffset = fileOffset
        self.size = size
        var info = stat()
        let fileSize = fstat(fd, &info) == 0 ? UInt64(max(Int(info.st_size) - fileOffset, 0)) : size
        present = min(fileSize, size)
    }

    /// The next position after `position` whose word is the commit word of an entry there (the
    /// complement of the position), or `limit`. Damaged, zero-filled and overwritten stretches
    /// are crossed in one tight loop over the window, and the part of the ring a short file
    /// lacks is skipped whole.
    func nextCommitWord(after position: UInt64, before limit: UInt64) throws -> UInt64 {
        var position = position + 8
        while position < limit {
            let offset = position % size
            if offset >= present {
                position += size - offset
                continue
            }
            try ensure(offset, count: 8)
            // Aligned up: the window holds zeros past the file's last byte.
            let end = min(start + UInt64(buffer.count), (present + 7) & ~7, offset + (limit - position))
            let base = position - offset
            let found = buffer.withUnsafeBytes { raw -> UInt64? in
                var at = offset
                while at + 8 <= end {
                    if raw.loadUnaligned(fromByteOffset: Int(at - start), as: UInt64.self) == ~(base + at) {
                        return at
                    }
                    at += 8
                }
                return nil
            }
            if let found { return base + found }
            position += end - offset
        }
        return limit
    }

    /// The eight bytes at `position`, or 0 where they wrap around the ring's end.
    func word(at position: UInt64) throws -> UInt64 {
        let offset = position % size
        guard offset + 8 <= size else { return 0 }
        try ensure(offset, count: 8)
        return buffer.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: Int(offset - start), as: UInt64.self) }
    }

    func bytes(at position: UInt64, count: Int) throws -> [UInt8] {
        let offset = position % size
        let first = Int(min(UInt64(count), size - offset))
        try ensure(offset, count: first)
        var out = Array(buffer[Int(offset - start)..<Int(offset - start) + first])
        if first < count {
            try ensure(0, count: count - first)  // now start == 0
            out += buffer[0..<count - first]
        }
        return out
    }

    private func ensure(_ offset: UInt64, count: Int) throws {
        if offset >= start && offset + UInt64(count) <= start + UInt64(buffer.count) { return }
        let length = Int(min(UInt64(Self.capacity), size - offset))
        buffer = [UInt8](repeating: 0, count: length)
        start = offset
        var done = 0
        while done < length {
            let got = buffer.withUnsafeMutableBytes {
                pread(fd, $0.baseAddress! + done, length - done, off_t(fileOffset + Int(offset) + done))
            }
            if got < 0 {
                if errno == EINTR { continue }
                throw CrashCaptureError.system("cannot read the session file", path: path)
            }
            if got == 0 { break }
            done += got
        }
    }
}
