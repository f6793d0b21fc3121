internal import CrashFileFormat
internal import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Closes the sessions of earlier processes that did not end cleanly, from the session files
/// they left: imports what their journals hold past the store's mark (exactly once, in tracking
/// order), replays their crash file with the last events as breadcrumbs, and gives every
/// session without an `$AppEnd` exactly one, with the reason it most likely ended. A session
/// whose process still runs is left alone. Interrupted at any point and run again, it neither
/// loses nor repeats an event: the mark and the remembered lifecycle ids see to that.
package struct SessionRecovery: Sendable {
    package struct Result: Sendable {
        package enum Outcome: String, Sendable {
            case closed, alive = "alive (left alone)", busy = "busy (another process holds it)", damaged
        }
        package var path: String
        package var sessionID: String
        package var outcome: Outcome
        package var importedEvents = 0
        /// Torn or overwritten stretches of the journal that were skipped.
        package var skippedStretches = 0
        /// Journal positions whose entry was committed whole and now fails its own checks: each
        /// an event lost to damage, named in the note and the output.
        package var damagedEntries: [UInt64] = []
        /// Entries the writer committed past the consumed position that were not found (the
        /// header's counts, beside the entries read): zeroed or overwritten.
        package var missingEntries = 0
        /// `$app_end_reason` of the $AppEnd this added; nil when the session already had one.
        package var endReason: String?
        package var crashFile: CrashReplayer.FileResult?
        /// The process crashed with the directory over its bound: a compact $AppCrashed was
        /// imported in place of a report.
        package var crashNotKept = false
        package var problem: String?
    }

    package struct Summary: Sendable {
        package var sessions: [Result] = []
        /// Crash files replayed apart from any session file (older versions, or files whose session
        /// file is gone).
        package var crashFiles = CrashReplayer.Summary()
        /// Sessions and crash files not begun before the deadline.
        package var leftForLater = 0
        package var importedEvents: Int {
            sessions.reduce(0) { $0 + $1.importedEvents + ($1.crashFile?.importedEvents ?? 0) }
                + crashFiles.importedEvents
        }
    }

    /// Breadcrumbs on a replayed $AppCrashed: this many of the session's last events.
    package static let breadcrumbCount = 50
    /// Each breadcrumb's JSON text is cut to this many bytes (properties are dropped to fit).
    package static let breadcrumbBytes = 512

    package let replayer: CrashReplayer
    /// For tests: runs between listing the session files and listing the crash files, where an
    /// install may finish making its session file.
    package var afterListingSessions: (@Sendable () -> Void)?
    package var directory: String { replayer.directory }
    package var store: EventStore { replayer.store }

    package init(replayer: CrashReplayer) {
        self.replayer = replayer
    }

    /// Every session file but `ownSession`'s, then every crash file no session file speaks for.
    /// `budget`: seconds after which no session or crash file is begun; those left are counted
    /// in `leftForLater` and wait for the next recovery.
    package func recoverAll(
        excluding ownSession: String? = nil, budget: Double? = nil, progress: ((Int, Int) -> Void)? = nil
    ) -> Summary {
        let deadline = budget.map { ProcessInfo.processInfo.systemUptime + $0 }
        var summary = Summary()
        let names = replayer.folder?.names() ?? []
        removeAbandonedSessionTemporaries(names)
        let sessionNames = names.filter {
            SessionFile.isSessionFileName($0) && SessionFile.sessionID(fromFileName: $0) != ownSession
        }
        var handled = Set<String>()
        if let ownSession { handled.insert(ownSession) }
        for (index, name) in sessionNames.enumerated() {
            if let deadline, ProcessInfo.processInfo.systemUptime >= deadline {
                summary.leftForLater += sessionNames.count - index
                // Their crash files wait with them.
                for left in sessionNames[index...] {
                    if let id = SessionFile.sessionID(fromFileName: left) { handled.insert(id) }
                }
                break
            }
            let result = recover(directory + "/" + name)
            // A crash file is replayed with its session (for the breadcrumbs) or, if that session
            // is alive or busy, not yet; only a session file found damaged lets it go alone.
            if result.outcome != .damaged { handled.insert(result.sessionID) }
            summary.sessions.append(result)
            progress?(index + 1, sessionNames.count)
        }
        afterListingSessions?()
        let listed = Set(sessionNames.compactMap(SessionFile.sessionID(fromFileName:)))
        let alone = replayer.pendingFiles().filter { path in
            let name = (path as NSString).lastPathComponent
            let session = String(name.dropFirst(CrashFileLayout.filePrefix.utf8.count).prefix(32))
            // A session's hang reports (`crash-<session>-hang-<n>…`) are not replayed with it:
            // written whole and unlocked, each goes alone, whatever the state of its session.
            if name.utf8.count > CrashFileLayout.filePrefix.utf8.count + 32 + CrashFileLayout.fileExtension.utf8.count
                + 1
            {
                return true
            }
            if handled.contains(session) { return false }
            // Install names the crash file before it makes the session file: one listed here
            // without its session file may have gained it since, and even crashed since. It then
            // waits for the next recovery, which takes the two together (the session's
            // breadcrumbs and end with the crash); replayed alone now, its session would be
            // closed later without it.
            if listed.contains(session) { return true }
            if replayer.folder?.contains(SessionFile.fileName(sessionID: session)) == true { return false }
            // No session file yet: an install between naming its crash file and its session file,
            // or a process that had none. Only the second goes alone: the first still holds its
            // crash file's lock, and crashing right after this listing, it would otherwise have
            // its report taken without its session (seen with `crashcap watch` under load).
            return !Self.isLocked(name, in: replayer.folder)
        }
        summary.crashFiles.files = replayer.replay(alone, deadlineUptime: deadline)
        summary.leftForLater += alone.count - summary.crashFiles.files.count
        return summary
    }

    package func recover(_ path: String) -> Result {
        let name = (path as NSString).lastPathComponent
        var result = Result(
            path: path, sessionID: SessionFile.sessionID(fromFileName: name) ?? name, outcome: .closed)
        let fd: Int32
        do {
            guard let folder = replayer.folder else {
                throw CrashCaptureError.io(replayer.openProblem ?? "cannot open", path: directory)
            }
            fd = try folder.openForReading(name)
        } catch {
            result.outcome = .damaged
            result.problem = "\(error)"
            return result
        }
        defer { close(fd) }
        // The live process holds a shared lock for its whole life; another replay, an exclusive one.
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            result.outcome = .busy
            return result
        }
        var session: SessionFile
        // A header that cannot be read as it is: its journal is saved from what the file holds
        // where it can be, and the file set aside with a note either way.
        var damage: String?
        do {
            session = try SessionFile.read(fd: fd, path: path)
        } catch {
            guard let salvaged = try? SessionFile.read(fd: fd, path: path, lenient: true) else {
                result.outcome = .damaged
                result.problem = "\(error)"
                moveAside(name, reason: "\(error)")
                return result
            }
            session = salvaged
            damage = "\(error)"
        }
        result.sessionID = session.sessionID
        if Self.isAlive(session) {
            result.outcome = .alive
            return result
        }
        // No field is trusted: one that disagrees with the file or with another sets the file
        // aside once every intact entry is imported.
        let inconsistencies = session.inconsistencies()
        if !inconsistencies.isEmpty {
            damage = ([damage].compactMap { $0 } + inconsistencies).joined(separator: "; ")
        }
        // A journal whose header disagrees with its own entries: every intact entry is imported
        // from what the entries say, and the file is set aside with a note, never deleted.
        do {
            if let checked = try session.checkedJournal() {
                session = checked.repaired
                damage = [damage, "journal header damaged: " + checked.problem].compactMap { $0 }.joined(
                    separator: "; ")
            }
        } catch {
            damage = [damage, "journal unreadable: \(error)"].compactMap { $0 }.joined(separator: "; ")
        }
        do {
            try closeSession(session, into: &result)
        } catch {
            // The store could not take it: the file stays for the next replay, which resumes at the mark.
            result.outcome = .damaged
            result.problem = "event store: \(error)"
            return result
        }
        if let crash = result.crashFile, crash.outcome == .skippedLive {
            return result
        }
        if !result.damagedEntries.isEmpty {
            let positions = result.damagedEntries.prefix(16).map(String.init).joined(separator: ", ")
            let more = result.damagedEntries.count > 16 ? ", …" : ""
            let lost =
                "\(result.damagedEntries.count) journal entr\(result.damagedEntries.count == 1 ? "y" : "ies") "
                + "damaged, not imported (at positions \(positions)\(more))"
            damage = [damage, lost].compactMap { $0 }.joined(separator: "; ")
        }
        if result.missingEntries > 0 {
            let lost =
                "\(result.missingEntries) journal entr\(result.missingEntries == 1 ? "y" : "ies") committed but "
                + "not found (zeroed or overwritten)"
            damage = [damage, lost].compactMap { $0 }.joined(separator: "; ")
        }
        if let damage {
            result.outcome = .damaged
            result.problem = damage
            moveAside(name, reason: damage)
            try? store.forgetJournal(session: session.sessionID)
            return result
        }
        replayer.folder?.remove(name)
        try? store.forgetJournal(session: session.sessionID)
        return result
    }

    private func closeSession(_ session: SessionFile, into result: inout Result) throws {
        let sessionID = session.sessionID
        let context = session.context
        let appVersion = context["app_version"] as? String ?? ""
        let staticProperties = Self.staticMembers(session.contextText)
        let mark = try store.journalMark(session: sessionID)
        // Where the import resumes, and the ids in effect there.
        let start = max(mark?.position ?? 0, session.consumed)
        var identity = DistinctIdentity(
            distinctID: context["distinct_id"] as? String ?? "", loginID: nil)
        let resumed = mark.flatMap { mark in
            mark.position >= session.consumed
                ? DistinctIdentity(distinctID: mark.distinctID, loginID: mark.loginID) : nil
        }
        if let resumed { identity = resumed }
        let shared = { (ids: DistinctIdentity) in
            JournalEntries.sharedText(
                ids, sessionID: sessionID, appVersion: appVersion, staticProperties: staticProperties,
                pid: session.pid)
        }
        // One pass over the ring, never held whole: entries before `start` only say which ids
        // were in effect, the rest are imported in chunks, and the last events are kept as
        // breadcrumbs for a crash file.
        var startTracked = session.lifecycle != .atReplay
        let trackStart = {
            guard !startTracked else { return }
            startTracked = true
            let startEvent = self.lifecycleEvent(
                "$AppStart", id: sessionID + "-start",
                time: session.clockFieldsHold
                    ? session.startWallMilliseconds
                    : max(0, min(session.startWallMilliseconds, session.modifiedWallMilliseconds)),
                extra: "\"$resume_from_background\":false")
            try self.store.insert([startEvent], context: shared(identity))
        }
        var rows: [(id: String, payload: String)] = []
        var imported = start
        var lastEvents: [SessionFile.Entry] = []
        var damagedEntries: [UInt64] = []
        defer { result.damagedEntries = damagedEntries }
        var pastConsumed: UInt32 = 0
        defer {
            if let expected = session.entriesPastConsumed, pastConsumed < expected {
                result.missingEntries = Int(expected - pastConsumed)
            }
        }
        result.skippedStretches = try session.forEachEntry(damaged: { damagedEntries.append($0) }) { entry in
            if entry.position >= session.consumed { pastConsumed &+= 1 }
            if entry.type == SessionFile.eventEntry {
                lastEvents.append(entry)
                if lastEvents.count > 2 * Self.breadcrumbCount { lastEvents.removeFirst(Self.breadcrumbCount) }
            }
            if entry.position < start {
                if resumed == nil, entry.type == SessionFile.identityEntry {
                    identity = entry.payload.withUnsafeBytes { JournalEntries.identity($0) } ?? identity
                }
                return
            }
            try trackStart()
            imported = entry.position + SessionFile.entrySize(entry.payload.count)
            if entry.type == SessionFile.identityEntry,
                let changed = entry.payload.withUnsafeBytes({ JournalEntries.identity($0) })
            {
                result.importedEvents += try flush(&rows, identity, upTo: entry.position, sessionID, shared)
                identity = changed
            } else if entry.type == SessionFile.eventEntry,
                let row = entry.payload.withUnsafeBytes({ JournalEntries.eventRow($0) })
            {
                rows.append(row)
                if rows.count >= EventPipeline.chunkSize {
                    result.importedEvents += try flush(&rows, identity, upTo: imported, sessionID, shared)
                }
            }
        }
        try trackStart()
        if imported > start { result.importedEvents += try flush(&rows, identity, upTo: imported, sessionID, shared) }
        let crashName = CrashFileLayout.filePrefix + sessionID + "." + CrashFileLayout.fileExtension
        let crashPath = directory + "/" + crashName
        var kept: [UInt8]?
        do {
            kept = try session.keptCrashBytes()
        } catch {
            result.problem = "\(error)"
        }
        if let folder = replayer.folder, !folder.contains(crashName), let kept {
            // The directory did not take the crash file's name at the crash; its bytes were
            // kept here instead. Named now, it is replayed like any other (and read with the
            // same checks); the session file stays until that is done.
            guard PrivateFiles.write(kept, to: crashName, in: folder) else {
                throw CrashCaptureError.system("cannot write the crash file kept in the session file", path: crashPath)
            }
        }
        if replayer.folder?.contains(crashName) == true {
            // A notes area that cannot be read costs the crash its context, nothing else.
            let notes = (try? session.notes()) ?? SessionNotes()
            let breadcrumbs = Self.breadcrumbs(lastEvents, notes: notes)
            result.crashFile = replayer.replay(crashPath, breadcrumbs: breadcrumbs, contextJSON: notes.contextJSON)
        }
        // Clock fields that do not hold give no time of their own: the file's last write bounds
        // the session's end, and the event says where its time came from.
        let clocksHold = session.clockFieldsHold
        let modified = max(0, session.modifiedWallMilliseconds)
        if result.crashFile == nil, let notKept = session.crashNotKept,
            try !store.hasRemembered(sessionID + "-crash")
        {
            let signal = SignalNames.name(of: notKept.signal)
            let code = SignalNames.codeName(signal: notKept.signal, code: notKept.code)
            let noted = notKept.wallMilliseconds
            let crashTime =
                clocksHold && noted >= session.startWallMilliseconds && noted <= modified + 86_400_000
                ? noted : modified
            let crashed = lifecycleEvent(
                "$AppCrashed", id: sessionID + "-crash", time: crashTime,
                extra:
                    "\"app_crashed_reason\":\"\(signal) (\(code)): no report kept (the crash directory was over its "
                    + "bound, or the report could not be written)\","
                    + "\"crash_signal\":\(notKept.signal),\"crash_signal_name\":\"\(signal)\",\"crash_code_name\":\"\(code)\","
                    + "\"crash_compact\":true,\"crash_not_kept\":true")
            result.importedEvents += try store.insert([crashed], rememberIDs: true, context: shared(identity)).inserted
            result.crashNotKept = true
        }
        guard session.lifecycle != .none, try !store.hasRemembered(sessionID + "-end") else { return }
        if let crash = result.crashFile, crash.outcome == .skippedLive { return }
        let reason =
            session.crashNotKept != nil
            ? "crash" : session.cleanEndWallMilliseconds != nil ? "exit" : Self.endReason(session)
        var endTime = session.cleanEndWallMilliseconds ?? session.aliveWallMilliseconds
        // Hostile fields: a difference that would overflow counts as none.
        func span(_ later: Int64, _ earlier: Int64) -> Int64 {
            let (difference, overflow) = later.subtractingReportingOverflow(earlier)
            return overflow ? 0 : max(0, difference)
        }
        var duration =
            session.cleanEndWallMilliseconds.map { Double(span($0, session.startWallMilliseconds)) / 1e3 }
            ?? Double(span(session.aliveMonotonicNanoseconds, session.startMonotonicNanoseconds)) / 1e9
        var estimated = ""
        if !clocksHold || endTime < session.startWallMilliseconds || endTime > modified + 86_400_000 {
            // Known: the file was last written at `modified`; the session began no later. Its
            // length is unknown unless the start time is believable.
            endTime = modified
            let start = session.startWallMilliseconds
            duration = start > 1_000_000_000_000 && start <= modified ? Double(modified - start) / 1e3 : 0
            estimated = ",\"end_time_from\":\"file_mtime\""
        }
        let end = lifecycleEvent(
            "$AppEnd", id: sessionID + "-end", time: max(0, endTime),
            extra: "\"$event_duration\":\(String(format: "%.3f", max(0, duration))),\"$app_end_reason\":\"\(reason)\""
                + estimated)
        try store.insert([end], context: shared(identity))
        result.endReason = reason
    }

    private func flush(
        _ rows: inout [(id: String, payload: String)], _ identity: DistinctIdentity, upTo position: UInt64,
        _ sessionID: String, _ shared: (DistinctIdentity) -> String
    ) throws -> Int {
        let mark = EventStore.JournalMark(
            sessionID: sessionID, position: position, distinctID: identity.distinctID, loginID: identity.loginID)
        let inserted = try store.insert(rows, context: shared(identity), mark: mark).inserted
        rows.removeAll(keepingCapacity: true)
        return inserted
    }

    private func lifecycleEvent(_ name: String, id: String, time: Int64, extra: String) -> (
        id: String, payload: String
    ) {
        var json = "{\"type\":\"track\",\"event\":\"\(name)\",\"time\":\(time),\"event_id\":\"\(id)\","
        json += "\"lib\":{\"$lib_method\":\"autoTrack\"," + EventStore.contextMarker + ",\"$lib_method\":\"autoTrack\","
        json += extra + "}}"
        return (id, json)
    }

    /// The static properties' members, as the context holds them: `"static_properties":{...}` is last.
    static func staticMembers(_ contextText: String) -> String {
        guard let range = contextText.range(of: ",\"static_properties\":{"), contextText.hasSuffix("}}") else {
            return ""
        }
        return String(contextText[range.upperBound..<contextText.index(contextText.endIndex, offsetBy: -2)])
    }

    /// The session's last events and the app's breadcrumbs, in time order, the last
    /// `breadcrumbCount`: an event as below, a breadcrumb as `{"breadcrumb":TEXT,"time":MS}`.
    static func breadcrumbs(_ entries: [SessionFile.Entry], notes: SessionNotes) -> [String] {
        let events = breadcrumbs(entries).map { text in
            ((JSONTree.object(text.utf8)?["time"] as? NSNumber)?.int64Value ?? 0, text)
        }
        let crumbs = notes.breadcrumbs.map { crumb in
            (crumb.wallMilliseconds, JSONTree.encode(["breadcrumb": crumb.text, "time": crumb.wallMilliseconds]))
        }
        // By time; at the same millisecond, in the order each list had.
        let merged = (events + crumbs).enumerated().sorted { ($0.element.0, $0.offset) < ($1.element.0, $1.offset) }
        return merged.suffix(breadcrumbCount).map(\.element.1)
    }

    /// The last events of the session, oldest first, each a short JSON text: name, time and its
    /// own properties (text values cut to 64 bytes; whole properties dropped to stay within
    /// `breadcrumbBytes`).
    static func breadcrumbs(_ entries: [SessionFile.Entry]) -> [String] {
        let events = entries.filter { $0.type == SessionFile.eventEntry }.suffix(breadcrumbCount)
        return events.compactMap { entry in
            guard let row = entry.payload.withUnsafeBytes({ JournalEntries.eventRow($0) }) else { return nil }
            // The shared part is not needed here: a stand-in keeps the JSON whole.
            let text = row.payload.replacingOccurrences(
                of: EventStore.contextMarker, with: "\"$cc\":0},\"properties\":{\"$cc\":0")
            guard let event = JSONTree.object(text.utf8) else {
                return nil
            }
            var properties = (event["properties"] as? [String: Any]) ?? [:]
            properties["$cc"] = nil
            for (key, value) in properties {
                if let text = value as? String, text.utf8.count > 64 {
                    properties[key] = String(decoding: text.utf8.prefix(61), as: UTF8.self) + "..."
                }
            }
            var crumb: [String: Any] = [
                "event": event["event"] ?? "", "time": event["time"] ?? 0, "properties": properties,
            ]
            var serialized = JSONTree.encode(crumb)
            var keys = properties.keys.sorted()
            while serialized.utf8.count > breadcrumbBytes, let key = keys.popLast() {
                properties[key] = nil
                crumb["properties"] = properties
                crumb["truncated"] = true
                serialized = JSONTree.encode(crumb)
            }
            return serialized
        }
    }

    /// `reboot` when the machine restarted since, `oom_kill` when the OOM killer struck in the
    /// session's memory cgroup since it started, otherwise `killed`.
    static func endReason(_ session: SessionFile) -> String {
        if !session.bootID.isEmpty, let boot = currentBootID, boot != session.bootID { return "reboot" }
        if let before = session.oomKillsAtStart, let file = session.context["oom_counter_file"] as? String,
            let now = oomKills(file), now > before
        {
            return "oom_kill"
        }
        return "killed"
    }

    /// Read once: a process never outlives its boot.
    static let currentBootID: String? = {
        (try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines)
    }()

    /// The OOM-kill count from the counter file the session named. The name comes from a file
    /// anyone who can write the directory could have made: only a cgroup file is read, and only
    /// the way every capture file is (no link, no FIFO or device, a bounded size).
    static func oomKills(_ file: String) -> UInt64? {
        guard file.hasPrefix("/sys/fs/cgroup/"), !file.split(separator: "/").contains(".."),
            let bytes = PrivateFiles.readSmall(file, limit: 64 << 10)
        else { return nil }
        let text = String(decoding: bytes, as: UTF8.self)
        for line in text.split(separator: "\n") where line.hasPrefix("oom_kill ") {
            return UInt64(line.dropFirst("oom_kill ".count))
        }
        return nil
    }

    /// Whether a live process holds the file's lock (a named crash file's, from install on).
    static func isLocked(_ name: String, in folder: CaptureDirectory?) -> Bool {
        guard let folder, let fd = try? folder.openForReading(name) else { return false }
        defer { close(fd) }
        return flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK
    }

    /// Same boot, same pid namespace, and a process with that pid started at the same tick.
    static func isAlive(_ session: SessionFile) -> Bool {
        guard let boot = currentBootID, boot == session.bootID else { return false }
        var namespace = stat()
        guard stat("/proc/self/ns/pid", &namespace) == 0, UInt64(namespace.st_ino) == session.pidNamespace else {
            return false
        }
        guard let stat = try? String(contentsOfFile: "/proc/\(session.pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return false }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // Field 3 (state) is the first after the command; starttime is field 22. A zombie has
        // ended: only its parent has not collected it yet.
        guard fields.count > 19, let ticks = UInt64(fields[19]), fields[0] != "Z", fields[0] != "X" else {
            return false
        }
        return ticks == session.processStartTicks
    }

    /// An install makes its session file under a temporary name, which it renames within the
    /// same millisecond or so: one older than this is an install that was killed in between.
    package static let abandonedTemporaryAge: Double = 60

    /// Removes the session files that an install killed before naming them left behind, with
    /// their journal's space still reserved: nothing else ever would. Such a file holds no event
    /// yet (install names it before `track()` can write into it). One still locked belongs to a
    /// live install, whatever its age, and is left alone.
    private func removeAbandonedSessionTemporaries(_ names: [String]) {
        guard let folder = replayer.folder else { return }
        let now = Date().timeIntervalSince1970
        for name in names where SessionFile.isInstallTemporaryName(name) {
            var info = stat()
            guard fstatat(folder.fd, name, &info, AT_SYMLINK_NOFOLLOW) == 0, info.st_mode & S_IFMT == S_IFREG,
                now - Double(info.st_mtim.tv_sec) > Self.abandonedTemporaryAge
            else { continue }
            let fd = openat(folder.fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            guard fd >= 0 else { continue }
            defer { close(fd) }
            if flock(fd, LOCK_EX | LOCK_NB) == 0 { folder.remove(name) }
        }
    }

    private func moveAside(_ name: String, reason: String) {
        guard let folder = replayer.folder else { return }
        _ = PrivateFiles.moveAside(name, in: folder, note: reason + "\n")
    }
}
