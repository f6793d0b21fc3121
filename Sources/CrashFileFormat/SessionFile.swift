internal import CCrashFileFormat
internal import Foundation

#if canImport(Glibc)
    internal import Glibc
#endif

/// A session file as a later process reads it: the facts about the session from its header
/// and the journal entries its ring still holds. Read with `read(2)`, never mapped, through a
/// window of a few MiB that slides along the ring, so a truncated or hostile file can neither
/// raise SIGBUS in the reader nor make its memory grow with the ring's size.
package struct SessionFile: Sendable {
    package enum Lifecycle: UInt32, Sendable {
        case none = 0, tracked = 1, atReplay = 2
    }

    package struct Entry: Sendable {
        package var position: UInt64
        package var type: UInt32
        package var payload: [UInt8]
    }

    package var sessionID: String
    package var lifecycle: Lifecycle
    package var startWallMilliseconds: Int64
    package var startMonotonicNanoseconds: Int64
    package var pid: Int32
    package var processStartTicks: UInt64
    package var aliveWallMilliseconds: Int64
    package var aliveMonotonicNanoseconds: Int64
    /// The memory cgroup's OOM-kill count at start; nil when it could not be read.
    package var oomKillsAtStart: UInt64?
    package var reserved: UInt64
    package var consumed: UInt64
    package var dropped: UInt64
    package var bootID: String
    package var pidNamespace: UInt64
    /// The context JSON: session and distinct id, app name and version, static properties, OOM counter file.
    package var context: [String: Any] {
        JSONTree.object(contextText.utf8) ?? [:]
    }
    package var contextText: String
    /// The session id the fixed header holds (bytes 112–144), checked against the context's.
    package var headerSessionID = ""
    /// The lifecycle field as written, for the check of its range.
    var lifecycleRaw: UInt32 = 0
    /// Where the crash path kept a crash file's bytes in this file, when the directory no
    /// longer took the crash file's name; nil when it did not have to.
    package var keptCrash: (offset: UInt64, size: UInt64)?
    /// A crash that kept no report of its own (the directory was over its bound): signal
    /// number, si_code and wall-clock time.
    package var crashNotKept: (signal: Int32, code: Int32, wallMilliseconds: Int64)?
    /// The ring's size in bytes; 0 without a journal.
    package var ringSize: UInt64
    /// When a C session that left events in its journal ended normally; nil: it did not.
    package var cleanEndWallMilliseconds: Int64? = nil
    /// How many entries past the consumed position the writer committed (its counts, which
    /// wrap, subtracted); nil when the file does not keep them (older writers, or no ring in
    /// the file). A reader that finds fewer has met damage: zeroed entries look like space
    /// reserved and never committed, which only these counts tell apart.
    package var entriesPastConsumed: UInt32? = nil
    /// Where the notes area (context, breadcrumbs) lies in the header; nil in older files.
    package var notesArea: (offset: Int, size: Int)? = nil
    /// Whether the header says the writer laid out a notes area after the context, whatever
    /// it says of the header's size: the layout a damaged header is checked against.
    var declaresNotes = false
    /// Borrowed from the caller, who keeps it open while entries are read.
    let fd: Int32
    let path: String
    private(set) var headerSize: Int

    package static let filePrefix = CCF_SESSION_FILE_PREFIX
    package static let fileExtension = CCF_SESSION_FILE_EXTENSION
    package static let eventEntry = UInt32(CCF_JOURNAL_EVENT.rawValue)
    package static let identityEntry = UInt32(CCF_JOURNAL_IDENTITY.rawValue)

    package static func isSessionFileName(_ name: String) -> Bool {
        name.hasPrefix(filePrefix) && name.hasSuffix("." + fileExtension)
    }

    /// The name install gives a session file until it is complete (`.session-ID.ccs.tmp`).
    package static func isInstallTemporaryName(_ name: String) -> Bool {
        name.hasPrefix("." + filePrefix) && name.hasSuffix("." + fileExtension + ".tmp")
    }

    /// The session file's name for a session id.
    package static func fileName(sessionID: String) -> String { filePrefix + sessionID + "." + fileExtension }

    /// The session id in a session file's name.
    package static func sessionID(fromFileName name: String) -> String? {
        guard isSessionFileName(name) else { return nil }
        return String(name.dropFirst(filePrefix.utf8.count).dropLast(fileExtension.utf8.count + 1))
    }

    /// Reads the session file open at `fd`.
    /// `lenient`: for a file already found damaged, whose journal may still be saved: the magic
    /// and version are not required, a header or ring size out of bounds is replaced by what the
    /// file's layout gives, and a context whose size is wrong is read up to its first NUL. Only
    /// a context that is not a JSON object with a session id stops it.
    package static func read(fd: Int32, path: String, lenient: Bool = false) throws -> SessionFile {
        let fixedSize = Int(CCF_SESSION_FIXED_SIZE)
        let fixed = try readExactly(fd: fd, offset: 0, count: fixedSize, path: path)
        guard fixed.count == fixedSize, lenient || Array(fixed[0..<4]) == Array(CCF_SESSION_MAGIC.utf8) else {
            throw CrashCaptureError.corrupt("not a session file (no \(CCF_SESSION_MAGIC) header)", path: path)
        }
        func u32(_ offset: ccf_session_offset) -> UInt32 {
            fixed.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: Int(offset.rawValue), as: UInt32.self) }
        }
        func u64(_ offset: ccf_session_offset) -> UInt64 {
            fixed.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: Int(offset.rawValue), as: UInt64.self) }
        }
        func text(_ offset: ccf_session_offset, _ count: Int) -> String {
            let start = Int(offset.rawValue)
            let bytes = fixed[start..<start + count].prefix { $0 != 0 }
            return String(decoding: bytes, as: UTF8.self)
        }
        guard lenient || u32(CCF_SESSION_AT_VERSION) == CCF_SESSION_VERSION else {
            throw CrashCaptureError.corrupt(
                "session file version \(u32(CCF_SESSION_AT_VERSION)) is not one this version reads", path: path)
        }
        var headerSize = Int(u32(CCF_SESSION_AT_HEADER_SIZE))
        var ringSize = u64(CCF_SESSION_AT_RING_SIZE)
        var contextSize = Int(u32(CCF_SESSION_AT_CONTEXT_SIZE))
        let sane =
            headerSize >= fixedSize + contextSize && headerSize % Int(CCF_SESSION_PAGE) == 0
            && contextSize <= Int(CCF_SESSION_MAXIMUM_CONTEXT) && ringSize <= UInt64(CCF_SESSION_MAXIMUM_RING)
            && ringSize % 8 == 0
        guard sane || lenient else {
            throw CrashCaptureError.corrupt(
                "session file header is damaged (header \(headerSize) bytes, context \(contextSize), ring \(ringSize))",
                path: path)
        }
        var contextBytes =
            contextSize <= Int(CCF_SESSION_MAXIMUM_CONTEXT)
            ? try readExactly(fd: fd, offset: fixedSize, count: contextSize, path: path) : []
        if lenient && JSONTree.object(contextBytes) == nil {
            let region = try readExactly(fd: fd, offset: fixedSize, count: Int(CCF_SESSION_MAXIMUM_CONTEXT), path: path)
            contextBytes = Array(region.prefix { $0 != 0 })
            contextSize = contextBytes.count
        }
        let contextText = String(decoding: contextBytes, as: UTF8.self)
        guard
            let context = JSONTree.object(contextBytes),
            let sessionID = context["session_id"] as? String
        else {
            throw CrashCaptureError.corrupt("session file context is not the JSON object it should be", path: path)
        }
        let notesOffset = Int(u32(CCF_SESSION_AT_NOTES_OFFSET))
        let notesSize = Int(u32(CCF_SESSION_AT_NOTES_SIZE))
        if !sane {
            // What the writer lays out: the header (with its notes) rounded up to a page, then
            // the ring to the end.
            let page = Int(CCF_SESSION_PAGE)
            let notesEnd =
                notesSize == SessionNotes.areaSize ? (fixedSize + contextSize + 7) / 8 * 8 + SessionNotes.areaSize : 0
            headerSize = (max(fixedSize + contextSize, notesEnd) + page - 1) / page * page
            var info = stat()
            let fileSize = fstat(fd, &info) == 0 ? Int(info.st_size) : headerSize
            ringSize = UInt64(max(0, fileSize - headerSize)) & ~7
        }
        let oom = u64(CCF_SESSION_AT_OOM_KILLS)
        var file = SessionFile(
            sessionID: sessionID, lifecycle: Lifecycle(rawValue: u32(CCF_SESSION_AT_LIFECYCLE)) ?? .none,
            startWallMilliseconds: Int64(bitPattern: u64(CCF_SESSION_AT_START_WALL_MS)),
            startMonotonicNanoseconds: Int64(bitPattern: u64(CCF_SESSION_AT_START_MONO_NS)),
            pid: Int32(truncatingIfNeeded: u64(CCF_SESSION_AT_PID)),
            processStartTicks: u64(CCF_SESSION_AT_START_TICKS),
            aliveWallMilliseconds: Int64(bitPattern: u64(CCF_SESSION_AT_ALIVE_WALL_MS)),
            aliveMonotonicNanoseconds: Int64(bitPattern: u64(CCF_SESSION_AT_ALIVE_MONO_NS)),
            oomKillsAtStart: oom == UInt64.max ? nil : oom, reserved: u64(CCF_SESSION_AT_RESERVED),
            consumed: u64(CCF_SESSION_AT_CONSUMED), dropped: u64(CCF_SESSION_AT_DROPPED),
            bootID: text(CCF_SESSION_AT_BOOT_ID, 37), pidNamespace: u64(CCF_SESSION_AT_PID_NAMESPACE),
            contextText: contextText,
            keptCrash: u64(CCF_SESSION_AT_CRASH_OFFSET) == 0
                ? nil : (u64(CCF_SESSION_AT_CRASH_OFFSET), u64(CCF_SESSION_AT_CRASH_SIZE)),
            crashNotKept: u32(CCF_SESSION_AT_NOT_KEPT_SIGNAL) == 0
                ? nil
                : (
                    Int32(bitPattern: u32(CCF_SESSION_AT_NOT_KEPT_SIGNAL)),
                    Int32(bitPattern: u32(CCF_SESSION_AT_NOT_KEPT_CODE)),
                    Int64(bitPattern: u64(CCF_SESSION_AT_NOT_KEPT_WALL_MS))
                ), ringSize: ringSize, fd: fd,
            path: path, headerSize: headerSize)
        if notesOffset >= fixedSize + contextSize, notesSize == SessionNotes.areaSize,
            notesOffset + notesSize <= headerSize
        {
            file.notesArea = (notesOffset, notesSize)
        }
        file.headerSessionID = text(CCF_SESSION_AT_SESSION_ID, 33)
        file.lifecycleRaw = u32(CCF_SESSION_AT_LIFECYCLE)
        file.declaresNotes = notesOffset == (fixedSize + contextSize + 7) / 8 * 8 && notesSize == SessionNotes.areaSize
        let cleanEnd = Int64(bitPattern: u64(CCF_SESSION_AT_CLEAN_END_WALL_MS))
        if cleanEnd > 0 { file.cleanEndWallMilliseconds = cleanEnd }
        if u32(CCF_SESSION_AT_FLAGS) & CCF_SESSION_FLAG_ENTRY_COUNTS != 0, ringSize > 0 {
            file.entriesPastConsumed =
                u32(CCF_SESSION_AT_COMMITTED_ENTRIES) &- u32(CCF_SESSION_AT_CONSUMED_ENTRIES)
        }
        return file
    }

    /// The crash file's bytes kept in this file, read through the open descriptor; no more
    /// than a crash file may hold.
    /// Any value from the file may be hostile: the offset is checked against the file's size in
    /// UInt64 arithmetic that cannot overflow, and only then converted.
    package func keptCrashBytes() throws -> [UInt8]? {
        guard let kept = keptCrash else { return nil }
        guard keptCrashFits(kept), let offset = Int(exactly: kept.offset), let count = Int(exactly: kept.size) else {
            throw CrashCaptureError.corrupt(
                "the crash kept in the session file lies outside it (offset \(kept.offset), \(kept.size) bytes, "
                    + "file \(fileSize) bytes)",
                path: path)
        }
        let bytes = try Self.readExactly(fd: fd, offset: offset, count: count, path: path)
        guard bytes.count == count else {
            throw CrashCaptureError.corrupt("the crash kept in the session file is cut short", path: path)
        }
        return bytes
    }

    /// A kept crash lies past the header, inside the file, and no larger than a crash file.
    func keptCrashFits(_ kept: (offset: UInt64, size: UInt64)) -> Bool {
        let (end, overflow) = kept.offset.addingReportingOverflow(kept.size)
        return kept.offset >= UInt64(headerSize) && kept.size > 0 && kept.size <= UInt64(CCF_MAXIMUM_FILE_SIZE)
            && !overflow && end <= fileSize
    }

    /// The file's size when it was read.
    package var fileSize: UInt64 {
        var info = stat()
        return fstat(fd, &info) == 0 ? UInt64(max(0, Int64(info.st_size))) : 0
    }

    /// The file's last modification, in wall-clock ms: the latest the session can have lived,
    /// whatever its clock fields say.
    package var modifiedWallMilliseconds: Int64 {
        var info = stat()
        guard fstat(fd, &info) == 0 else { return 0 }
        return Int64(info.st_mtim.tv_sec) * 1000 + Int64(info.st_mtim.tv_nsec) / 1_000_000
    }

    /// The wall-clock fields are believable: the session started after 2001, not after the file
    /// was last written (plus a day of clock skew), and was last alive between its start and
    /// then; monotonic time did not run backwards.
    package var clockFieldsHold: Bool {
        let latest = modifiedWallMilliseconds + 86_400_000
        return startWallMilliseconds > 1_000_000_000_000 && startWallMilliseconds <= latest
            && aliveWallMilliseconds >= startWallMilliseconds && aliveWallMilliseconds <= latest
            && startMonotonicNanoseconds >= 0 && aliveMonotonicNanoseconds >= startMonotonicNanoseconds
    }

    /// The header's fields checked against the file and against each other, beyond what
    /// `checkedJournal` checks of the journal: each thing found wrong. Empty when all hold.
    package func inconsistencies() -> [String] {
        var found: [String] = []
        let size = fileSize
        let (ringEnd, overflow) = UInt64(headerSize).addingReportingOverflow(ringSize)
        // The writer allocates the header and the ring together, and appends only a kept crash:
        // a file of any other length is not the one the header describes. A file without a ring
        // (a C session's) holds at least its fixed part and context; the rest of its header is
        // never written.
        let keptEnd = keptCrash.map { $0.offset.addingReportingOverflow($0.size) }.flatMap { $0.overflow ? nil : $0.0 }
        if ringSize > 0, overflow || ringEnd > size {
            found.append("the file is cut short: \(size) bytes, its header and journal take \(ringEnd)")
        } else if ringSize > 0, size > max(ringEnd, keptEnd ?? 0) {
            found.append("the file holds \(size) bytes, its header and journal only \(ringEnd)")
        } else if size < UInt64(Int(CCF_SESSION_FIXED_SIZE) + contextText.utf8.count) {
            found.append("the file is cut short inside its header (\(size) bytes)")
        }
        if headerSessionID != sessionID {
            found.append("the header names session \(headerSessionID), its context \(sessionID)")
        }
        if let name = Self.sessionID(fromFileName: (path as NSString).lastPathComponent), name != sessionID {
            found.append("the file is named for session \(name), its context says \(sessionID)")
        }
        if !clockFieldsHold {
            found.append(
                "the clock fields disagree (start \(startWallMilliseconds) ms, last alive \(aliveWallMilliseconds) ms, "
                    + "monotonic \(startMonotonicNanoseconds) to \(aliveMonotonicNanoseconds) ns)")
        }
        if let notKept = crashNotKept, !(1...64).contains(notKept.signal) {
            found.append("the crash noted without a report has signal \(notKept.signal)")
        }
        if let notKept = crashNotKept, notKept.wallMilliseconds < startWallMilliseconds {
            found.append("the crash noted without a report is dated \(notKept.wallMilliseconds), before the start")
        }
        if let end = cleanEndWallMilliseconds, end < startWallMilliseconds {
            found.append("the clean end is dated \(end), before the start")
        }
        if reserved > Self.maximumPosition || consumed > reserved {
            found.append("the journal's reserved end \(reserved) and consumed position \(consumed) do not hold")
        }
        if lifecycleRaw > Lifecycle.atReplay.rawValue {
            found.append("the lifecycle \(lifecycleRaw) is not one this version knows")
        }
        if let kept = keptCrash, !keptCrashFits(kept) {
            found.append("the crash kept in the session file lies outside it")
        }
        return found
    }

    static func readExactly(fd: Int32, offset: Int, count: Int, path: String) throws -> [UInt8] {
        guard count > 0 else { return [] }
        var bytes = [UInt8](repeating: 0, count: count)
        var done = 0
        while done < count {
            let got = bytes.withUnsafeMutableBytes {
                pread(fd, $0.baseAddress! + done, count - done, off_t(offset + done))
            }
            if got < 0 {
                if errno == EINTR { continue }
                throw CrashCaptureError.system("cannot read the session file", path: path)
            }
            if got == 0 { break }
            done += got
        }
        return Array(bytes.prefix(done))
    }

    /// Visits, in order, the whole entries the ring holds from `start` (or from the oldest it can
    /// still hold) up to `reserved`, reading the file through `fd`, which must still be open. A
    /// torn or overwritten stretch is skipped by looking, 8 bytes at a time, for the next entry
    /// whose commit word and checksum both match its place. Returns the stretches skipped.
    /// `damaged` is told of each place whose commit word stands but whose entry fails its own
    /// checks (a changed byte, a cut): an entry that was written whole and is now lost.
    /// Positions past `maximumPosition` are never read, so no arithmetic on them can overflow.
    package func forEachEntry(
        from start: UInt64? = nil, damaged: ((UInt64) -> Void)? = nil, _ body: (Entry) throws -> Void
    ) throws -> Int {
        try forEachEntry(from: start, oldest: nil, damaged: damaged, body)
    }

    /// `oldest`: the lowest position the ring can still hold, when it is known otherwise than
    /// from the reserved end (a probe whose reserved end is only a bound).
    private func forEachEntry(
        from start: UInt64?, oldest known: UInt64?, damaged: ((UInt64) -> Void)?, _ body: (Entry) throws -> Void
    ) throws -> Int {
        guard ringSize > 0, reserved > 0, reserved <= Self.maximumPosition else { return 0 }
        let ring = RingWindow(fd: fd, path: path, fileOffset: headerSize, size: ringSize)
        let oldest = known ?? (reserved > ringSize ? reserved - ringSize : 0)
        let from = max(start ?? oldest, oldest)
        guard from < reserved else { return 0 }
        var position = (from + 7) & ~7
        var skipped = 0
        var inGap = false
        while position < reserved {
            let committed = try ring.word(at: position) == ~position
            // An entry whose own checksum holds (it covers the position, so no older lap passes)
            // is imported even when its commit word was damaged: one changed byte there must
            // not lose an event whose every other byte says it is whole.
            if let entry = try entry(at: position, in: ring) {
                try body(entry)
                position += Self.entrySize(entry.payload.count)
                inGap = false
            } else {
                if committed { damaged?(position) }
                if !inGap { skipped += 1 }
                inGap = true
                position = try ring.nextCommitWord(after: position, before: reserved)
            }
        }
        return skipped
    }

    /// The journal's header fields (where the ring starts, its reserved end, the consumed
    /// position) checked against the ring itself, whose entries carry their own position and
    /// checksum. nil when they agree. Otherwise a copy whose fields come from the entries found,
    /// which imports every intact entry (those already stored are recognised by their ids), and
    /// what was wrong.
    package func checkedJournal() throws -> (repaired: SessionFile, problem: String)? {
        let page = Int(CCF_SESSION_PAGE)
        // Where the writer puts the ring: after the context, and the notes area when it made one.
        let contextEnd = Int(CCF_SESSION_FIXED_SIZE) + contextText.utf8.count
        let headerEnd = declaresNotes ? (contextEnd + 7) / 8 * 8 + SessionNotes.areaSize : contextEnd
        let canonical = (headerEnd + page - 1) / page * page
        var info = stat()
        let fileSize = fstat(fd, &info) == 0 ? UInt64(max(0, Int64(info.st_size))) : 0
        var best: (headerSize: Int, ringSize: UInt64, positions: [(start: UInt64, end: UInt64)], end: UInt64)?
        // The header's own values first: another layout wins only with more entries.
        for candidate in headerSize == canonical ? [headerSize] : [headerSize, canonical] {
            // The ring fills the file after the header: its size is known twice.
            let fromFile = fileSize > UInt64(candidate) ? (fileSize - UInt64(candidate)) & ~7 : 0
            for size in (ringSize == fromFile ? [ringSize] : [ringSize, fromFile])
            where size > 0 && size <= UInt64(CCF_SESSION_MAXIMUM_RING) {
                var probe = self
                probe.headerSize = candidate
                probe.ringSize = size
                guard let latest = try probe.latestCommitWord() else { continue }
                probe.reserved = latest + Self.entrySize(Int(CCF_MAXIMUM_PAYLOAD))
                // The entry at `latest` takes 8 bytes at least: what the ring still holds
                // begins no lower than this, however small the ring is beside the bound above.
                let lowest = latest + 8 > size ? latest + 8 - size : 0
                var positions: [(start: UInt64, end: UInt64)] = []
                var end: UInt64 = 0
                _ = try probe.forEachEntry(from: nil, oldest: lowest, damaged: nil) { entry in
                    positions.append((entry.position, entry.position + Self.entrySize(entry.payload.count)))
                    end = max(end, entry.position + Self.entrySize(entry.payload.count))
                }
                if positions.count > (best?.positions.count ?? 0) { best = (candidate, size, positions, end) }
            }
        }
        guard let best else { return nil }
        var problems: [String] = []
        var repaired = self
        if best.headerSize != headerSize {
            problems.append("the journal starts at byte \(best.headerSize), not at \(headerSize) as the header says")
            repaired.headerSize = best.headerSize
        }
        if best.ringSize != ringSize {
            problems.append("the journal holds \(best.ringSize) bytes, not \(ringSize) as the header says")
            repaired.ringSize = best.ringSize
        }
        let first = best.positions.map(\.start).min() ?? 0
        // A torn last entry may lie past the last whole one: the reserved end may exceed it by
        // one entry, but never so far that the ring it implies no longer holds an intact entry.
        let slack = min(Self.entrySize(Int(CCF_MAXIMUM_PAYLOAD)), best.ringSize)
        if reserved < best.end || reserved > best.end + slack
            || (reserved > best.ringSize && reserved - best.ringSize > first)
        {
            problems.append("the journal's reserved end says \(reserved), its entries end at \(best.end)")
            repaired.reserved = best.end
        }
        // The writer consumes whole entries: the consumed position never falls inside an intact
        // one. It may stand where an entry was reserved and never committed (a thread killed
        // while writing it), which no intact entry covers.
        let boundary = !best.positions.contains { $0.start < consumed && consumed < $0.end }
        if consumed > repaired.reserved || !boundary {
            problems.append("the consumed position \(consumed) is not a place in the journal (\(first) to \(best.end))")
            repaired.consumed = first
        }
        guard !problems.isEmpty else { return nil }
        if repaired.consumed > repaired.reserved { repaired.consumed = first }
        return (repaired, problems.joined(separator: "; "))
    }

    /// The highest position whose commit word stands at its place in the ring (at `headerSize`,
    /// `ringSize` bytes); nil when none does.
    private func latestCommitWord() throws -> UInt64? {
        let offset = headerSize
        var latest: UInt64?
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var at: UInt64 = 0
        while at < ringSize {
            let count = Int(min(UInt64(buffer.count), ringSize - at))
            let got = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, count, off_t(offset) + off_t(at)) }
            if got <= 0 { break }
            buffer.withUnsafeBytes { raw in
                var index = 0
                while index + 8 <= got {
                    let position = ~raw.loadUnaligned(fromByteOffset: index, as: UInt64.self)
                    if position % ringSize == at + UInt64(index), position < UInt64(1) << 56,
                        position > (latest ?? 0) || latest == nil
                    {
                        latest = position
                    }
                    index += 8
                }
            }
            at += UInt64(got)
        }
        return latest
    }

    /// Every entry at once: for tests and small journals.
    package func entries(from start: UInt64? = nil) throws -> (entries: [Entry], skipped: Int) {
        var found: [Entry] = []
        let skipped = try forEachEntry(from: start) { found.append($0) }
        return (found, skipped)
    }

    /// No position the writer can reach in a file's life (a mebibyte a microsecond for a
    /// century is below 2^62): a larger reserved end or consumed position is damage.
    package static let maximumPosition: UInt64 = 1 << 56

    package static func entrySize(_ length: Int) -> UInt64 { UInt64(Int(CCF_JOURNAL_HEADER_SIZE) + (length + 7) & ~7) }

    private func entry(at position: UInt64, in ring: RingWindow) throws -> Entry? {
        let headerSize = Int(CCF_JOURNAL_HEADER_SIZE)
        let head = try ring.bytes(at: position, count: headerSize)
        guard Array(head[8..<12]) == Array(CCF_JOURNAL_ENTRY_MAGIC.utf8) else { return nil }
        let length = head.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 12, as: UInt32.self) }
        let type = head.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 16, as: UInt32.self) }
        let expected = head.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 20, as: UInt32.self) }
        guard length <= CCF_MAXIMUM_PAYLOAD, position + Self.entrySize(Int(length)) <= reserved else { return nil }
        let payload = try ring.bytes(at: position + UInt64(headerSize), count: Int(length))
        var covered = [UInt8](repeating: 0, count: 16)
        covered.withUnsafeMutableBytes {
            $0.storeBytes(of: position, toByteOffset: 0, as: UInt64.self)
            $0.storeBytes(of: type, toByteOffset: 8, as: UInt32.self)
            $0.storeBytes(of: length, toByteOffset: 12, as: UInt32.self)
        }
        guard CRC32C.update(CRC32C.update(0, covered), payload) == expected else { return nil }
        return Entry(position: position, type: type, payload: payload)
    }
}

/// CRC-32C (Castagnoli), the checksum of journal entries: `track()` computes it with the CPU's
/// crc32 instruction, eight bytes a cycle, where the crash file's zlib CRC-32 costs it about a
/// microsecond per event. Replay reads few entries, so a table does here.
package enum CRC32C: Sendable {
    static let table: [UInt32] = (0..<256).map { index in
        var crc = UInt32(index)
        for _ in 0..<8 { crc = crc & 1 == 1 ? (crc >> 1) ^ 0x82F6_3B78 : crc >> 1 }
        return crc
    }

    package static func update(_ crc: UInt32, _ bytes: [UInt8]) -> UInt32 {
        table.withUnsafeBufferPointer { table in
            var value = ~crc
            for byte in bytes { value = table[Int((value ^ UInt32(byte)) & 0xff)] ^ (value >> 8) }
            return ~value
        }
    }
}
