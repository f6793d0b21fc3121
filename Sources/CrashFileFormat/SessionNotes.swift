internal import CCrashFileFormat

/// What the app noted during its session (crashcapture_format.h, the notes area): the context
/// it set and its last breadcrumbs, written in place while it ran. A slot whose checksum fails
/// (torn by a death mid-write) is passed over.
package struct SessionNotes: Sendable {
    /// The context's JSON text (one object), or nil when none was set.
    package var contextJSON: String?
    /// The breadcrumbs still held, oldest first.
    package var breadcrumbs: [(wallMilliseconds: Int64, text: String)] = []

    package init() {}

    package var context: [String: Any]? { contextJSON.flatMap { JSONTree.object(Array($0.utf8)) } }

    /// CCF_NOTES_SIZE, which Swift does not import (a macro of macros).
    static let areaSize =
        Int(CCF_NOTES_CONTEXT_SLOTS) * Int(CCF_NOTES_CONTEXT_SLOT_SIZE) + Int(CCF_NOTES_BREADCRUMB_SLOTS)
        * Int(CCF_NOTES_BREADCRUMB_SLOT_SIZE)
}

extension SessionFile {
    /// The notes area, read through the open descriptor; empty for a file without one.
    package func notes() throws -> SessionNotes {
        var notes = SessionNotes()
        guard let area = notesArea else { return notes }
        let bytes = try Self.readExactly(fd: fd, offset: area.offset, count: area.size, path: path)
        guard bytes.count == area.size else { return notes }
        func u32(_ at: Int) -> UInt32 {
            bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at, as: UInt32.self) }
        }
        func u64(_ at: Int) -> UInt64 {
            bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: at, as: UInt64.self) }
        }
        let header = Int(CCF_NOTES_SLOT_HEADER_SIZE)
        var newest: UInt64 = 0
        for slot in 0..<Int(CCF_NOTES_CONTEXT_SLOTS) {
            let at = slot * Int(CCF_NOTES_CONTEXT_SLOT_SIZE)
            let sequence = u64(at)
            let length = Int(u32(at + 8))
            guard sequence > newest, length <= Int(CCF_NOTES_CONTEXT_SLOT_SIZE) - header else { continue }
            let text = Array(bytes[at + header..<at + header + length])
            guard CRC32C.update(CRC32C.update(0, Array(bytes[at..<at + 8])), text) == u32(at + 12),
                JSONTree.object(text) != nil
            else { continue }
            newest = sequence
            notes.contextJSON = String(decoding: text, as: UTF8.self)
        }
        let crumbsAt = Int(CCF_NOTES_CONTEXT_SLOTS) * Int(CCF_NOTES_CONTEXT_SLOT_SIZE)
        let textAt = Int(CCF_NOTES_BREADCRUMB_TEXT_AT)
        var crumbs: [(sequence: UInt64, wallMilliseconds: Int64, text: String)] = []
        for slot in 0..<Int(CCF_NOTES_BREADCRUMB_SLOTS) {
            let at = crumbsAt + slot * Int(CCF_NOTES_BREADCRUMB_SLOT_SIZE)
            let sequence = u64(at)
            let length = Int(u32(at + 8))
            guard sequence != 0, length <= Int(CCF_NOTES_BREADCRUMB_SLOT_SIZE) - textAt else { continue }
            let text = Array(bytes[at + textAt..<at + textAt + length])
            let crc = CRC32C.update(
                CRC32C.update(CRC32C.update(0, Array(bytes[at..<at + 8])), Array(bytes[at + 16..<at + 24])), text)
            guard crc == u32(at + 12) else { continue }
            crumbs.append((sequence, Int64(bitPattern: u64(at + 16)), String(decoding: text, as: UTF8.self)))
        }
        notes.breadcrumbs = crumbs.sorted { $0.sequence < $1.sequence }.map { ($0.wallMilliseconds, $0.text) }
        return notes
    }
}
