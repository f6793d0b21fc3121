import CrashCapture
import CrashFileFormat
import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

@Suite struct CrashReplayerTests {
    /// A directory holding one real crash file from a Swift force-unwrap.
    func crashedDirectory(_ kind: String = "swift-force-unwrap") throws -> String {
        let directory = makeTemporaryDirectory("replay")
        let result = try run(
            Paths.swiftSample, [kind], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(result.signal == SIGILL || result.signal == SIGSEGV)
        try #require(crashFiles(in: directory).count == 1)
        return directory
    }

    func objects(_ store: EventStore) throws -> [[String: Any]] {
        try store.events().compactMap {
            try JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any]
        }
    }

    /// The directory is opened once: renamed and replaced by a link to another directory
    /// after the replayer opened it, the replay still reads, archives and removes in the
    /// directory it opened, and the other one is untouched.
    @Test func aDirectorySwappedForALinkDoesNotRedirectTheReplay() throws {
        let directory = try crashedDirectory()
        let other = try crashedDirectory()
        let otherFiles = crashFiles(in: other)
        let store = try EventStore(path: makeTemporaryDirectory("swap-store") + "/events.sqlite")
        var replayer = CrashReplayer(directory: directory, store: store)
        replayer.archive = true
        #expect(rename(directory, directory + "-moved") == 0)
        // The temporary directories' cleanup knows the first name only.
        defer { try? FileManager.default.removeItem(atPath: directory + "-moved") }
        #expect(symlink(other, directory) == 0)
        let summary = replayer.replayAll()
        #expect(summary.count(.imported) == 1)
        #expect(crashFiles(in: other) == otherFiles, "the directory behind the link is untouched")
        #expect(!FileManager.default.fileExists(atPath: other + "/archive"))
        #expect(crashFiles(in: directory + "-moved").isEmpty)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory + "-moved/archive").count == 1)
    }

    /// Every thread's frames are named in the replayed event, so the backend shows what each
    /// thread was doing without the crash file.
    @Test func theReplayedEventNamesEveryThreadsFrames() throws {
        let directory = makeTemporaryDirectory("threads")
        let crashed = try run(
            Paths.cSample, ["threads-parked"],
            environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
        #expect(crashed.signal == SIGSEGV)
        let store = try EventStore(path: directory + "/replayed.sqlite")
        #expect(CrashReplayer(directory: directory, store: store).replayAll().count(.imported) == 1)
        let event = try #require(try objects(store).first { $0["event"] as? String == "$AppCrashed" })
        let crash = try #require(event["crash"] as? [String: Any])
        let threads = try #require(crash["threads"] as? [[String: Any]])
        #expect(threads.count == 5 && threads.first?["crashed"] as? Bool == true)
        #expect((crash["threads_total"] as? NSNumber)?.intValue == 5)
        for (name, function) in [
            ("park-futex", "sample_park_in_futex"), ("park-read", "sample_park_in_read"),
            ("park-sleep", "sample_park_in_nanosleep"), ("park-poll", "sample_park_in_poll"),
        ] {
            let thread = try #require(threads.first { $0["name"] as? String == name }, "\(name) listed")
            let frames = thread["frames"] as? [[String: Any]] ?? []
            #expect(frames.contains { ($0["function"] as? String)?.contains(function) == true }, "\(name): \(frames)")
            #expect(frames.allSatisfy { $0["module_name"] is String && $0["pc"] is String })
        }
    }

    /// Two runs of one crash (ASLR apart) share a fingerprint; another crash site does not.
    @Test func fingerprintsGroupOneCrashSiteAcrossRuns() throws {
        let directory = makeTemporaryDirectory("fingerprints")
        for kind in ["null-read", "null-read", "abort", "null-write"] {
            let crashed = try run(
                Paths.cSample, [kind], environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
            #expect(crashed.signal != nil)
        }
        let store = try EventStore(path: directory + "/replayed.sqlite")
        #expect(CrashReplayer(directory: directory, store: store).replayAll().count(.imported) == 4)
        let crashes = try objects(store).filter { $0["event"] as? String == "$AppCrashed" }.compactMap {
            $0["properties"] as? [String: Any]
        }
        let byTitle = Dictionary(grouping: crashes) { $0["crash_title"] as? String ?? "" }
        #expect(
            Set(byTitle.keys) == [
                "SIGSEGV in sample_null_read", "SIGABRT in sample_abort", "SIGSEGV in sample_null_write",
            ])
        let reads = try #require(byTitle["SIGSEGV in sample_null_read"])
        let prints = Set(crashes.compactMap { $0["crash_fingerprint"] as? String })
        #expect(reads.count == 2 && Set(reads.compactMap { $0["crash_fingerprint"] as? String }).count == 1)
        #expect(prints.count == 3 && prints.allSatisfy { $0.count == 16 })
    }

    /// A program crashing at every start: past five crashes of one site within the hour, the
    /// later ones arrive as compact events with their count, without stacks.
    @Test func aCrashLoopIsCompactedPastFiveRepeats() throws {
        let directory = makeTemporaryDirectory("crash-loop")
        for _ in 0..<8 {
            let crashed = try run(
                Paths.cSample, ["null-read"],
                environment: ["CRASHCAPTURE_DIR": directory, "SWIFT_BACKTRACE": "enable=no"])
            #expect(crashed.signal == SIGSEGV)
        }
        let store = try EventStore(path: directory + "/replayed.sqlite")
        #expect(CrashReplayer(directory: directory, store: store).replayAll().count(.imported) == 8)
        let crashes = try objects(store).filter { $0["event"] as? String == "$AppCrashed" }
        let counts = crashes.compactMap { ($0["properties"] as? [String: Any])?["crash_repeat_count"] as? Int }
        #expect(counts == Array(1...8), "\(counts)")
        let compact = crashes.filter { ($0["properties"] as? [String: Any])?["crash_compact"] as? Bool == true }
        #expect(compact.count == 3)
        #expect(compact.allSatisfy { $0["crash"] == nil })
        #expect(crashes.prefix(5).allSatisfy { $0["crash"] != nil }, "the first five keep their stacks")
        // A crash noted twice (a replay killed and run again) counts once.
        #expect(try store.noteCrash(fingerprint: "x", eventID: "a", timeMilliseconds: 10, window: 100).count == 1)
        #expect(try store.noteCrash(fingerprint: "x", eventID: "a", timeMilliseconds: 10, window: 100).count == 1)
    }

    @Test func importsOnceSymbolicatesAndDeletes() throws {
        let directory = try crashedDirectory()
        let file = crashFiles(in: directory)[0]
        let copy = try Data(contentsOf: URL(fileURLWithPath: file))
        let store = try EventStore(path: directory + "/replayed.sqlite")
        let summary = CrashReplayer(directory: directory, store: store).replayAll()
        #expect(summary.count(.imported) == 1 && summary.importedEvents == 2)
        #expect(crashFiles(in: directory).isEmpty, "an imported file is deleted")
        let crashed = try #require(try objects(store).first { $0["event"] as? String == "$AppCrashed" })
        let frames = try #require((crashed["crash"] as? [String: Any])?["frames"] as? [[String: Any]])
        #expect(frames.prefix(6).contains { ($0["function"] as? String)?.contains("crashSwiftForceUnwrap") == true })
        let reason = try #require((crashed["properties"] as? [String: Any])?["app_crashed_reason"] as? String)
        #expect(reason.contains("crashSwiftForceUnwrap"))
        #expect(reason.contains("Unexpectedly found nil"))
        #expect((crashed["properties"] as? [String: Any])?["crash_fdatasync_ms"] != nil)
        // Killed after importing, before deleting: the file is back, the events are not doubled.
        try copy.write(to: URL(fileURLWithPath: file))
        let again = CrashReplayer(directory: directory, store: store).replayAll()
        #expect(again.count(.alreadyImported) == 1)
        #expect(store.count == 2)
        #expect(crashFiles(in: directory).isEmpty)
    }

    @Test func uploadedEventsAreNotImportedAgain() throws {
        let directory = try crashedDirectory()
        let file = crashFiles(in: directory)[0]
        let copy = try Data(contentsOf: URL(fileURLWithPath: file))
        let store = try EventStore(path: directory + "/replayed.sqlite")
        _ = CrashReplayer(directory: directory, store: store).replayAll()
        try store.complete(try #require(try store.claimBatch(limit: 10)))
        try copy.write(to: URL(fileURLWithPath: file))
        _ = CrashReplayer(directory: directory, store: store).replayAll()
        #expect(store.count == 0)
    }

    @Test func tornFileKeepsItsWholeRecordsAndIsMovedAsideWithANote() throws {
        let directory = try crashedDirectory()
        let file = crashFiles(in: directory)[0]
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))
        let contents = CrashFileReader.parse(bytes)
        let end = contents.records[2]  // session, $AppCrashed, $AppEnd, timing
        try Data(bytes[0..<(end.offset + 30)]).write(to: URL(fileURLWithPath: file))
        let store = try EventStore(path: directory + "/replayed.sqlite")
        let summary = CrashReplayer(directory: directory, store: store).replayAll()
        let result = try #require(summary.files.first)
        #expect(result.importedEvents == 1, "the whole $AppCrashed record is recovered")
        #expect(result.problems.contains { $0.offset == end.offset && $0.reason.contains("truncated") })
        let moved = try #require(result.movedTo)
        #expect(moved.contains("/damaged/"))
        let note = try String(contentsOfFile: moved + ".txt", encoding: .utf8)
        #expect(note.contains("offset \(end.offset)"))
    }

    /// Each byte of each record's 16-byte frame (magic, type, length, checksum) given 0, 0xff,
    /// its value +-1, and each length pointed past the file, replayed in-process: the file is
    /// imported whole (both events) or set aside in damaged/ with what it still vouches for;
    /// never a trap, and no event stored with a negative time (issue #42).
    @Test func everyByteOfEachRecordsFrame() throws {
        let source = try crashedDirectory()
        let file = crashFiles(in: source)[0]
        let name = (file as NSString).lastPathComponent
        let original = [UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))
        let records = CrashFileReader.parse(original).records
        try #require(records.count == 5, "session, two events, stacks, timing")
        var cases: [(String, [UInt8])] = []
        for record in records {
            for at in record.offset..<record.offset + CrashFileLayout.headerSize {
                let byte = original[at]
                for value in Set([0, 0xff, byte &+ 1, byte &- 1]) where value != byte {
                    var bytes = original
                    bytes[at] = value
                    cases.append(("byte \(at) = \(value)", bytes))
                }
            }
            var past = original
            withUnsafeBytes(of: UInt32(original.count).littleEndian) {
                past.replaceSubrange(record.offset + 8..<record.offset + 12, with: $0)
            }
            cases.append(("record at \(record.offset): length past the file", past))
        }
        for (label, bytes) in cases {
            let directory = makeTemporaryDirectory("frame")
            defer { try? FileManager.default.removeItem(atPath: directory) }
            try Data(bytes).write(to: URL(fileURLWithPath: directory + "/" + name))
            let store = try EventStore(path: directory + "/events.sqlite")
            let summary = CrashReplayer(directory: directory, store: store).replayAll()
            let result = try #require(summary.files.first, "\(label)")
            let stored = try objects(store)
            for event in stored {
                #expect(((event["time"] as? Int64) ?? 0) >= 0, "\(label): \(event["event"] ?? "")")
            }
            if result.outcome == .imported {
                #expect(stored.count == 2, "\(label): imported \(stored.count) events")
            } else {
                #expect(result.outcome == .damaged, "\(label): \(result.outcome)")
                #expect(result.movedTo?.contains("/damaged/") == true, "\(label): not set aside")
            }
        }
    }

    /// A crash file whose `$AppEnd` says time -1 and `$event_duration` -5 (its checksum made to
    /// hold): no negative time is stored; the file's mtime stands in, said so, and the file is
    /// set aside with a note (issue #42).
    @Test func aNegativeTimeInACrashFileIsNeverStored() throws {
        let directory = try crashedDirectory()
        let file = crashFiles(in: directory)[0]
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))
        let records = CrashFileReader.parse(bytes).records.filter { $0.type == .event }
        let end = try #require(records.last)
        var text = String(decoding: end.payload, as: UTF8.self)
        let time = try #require(text.range(of: #""time":[0-9]+"#, options: .regularExpression))
        text.replaceSubrange(time, with: "\"time\":-1")
        let duration = try #require(text.range(of: #""\$event_duration":[0-9.]+"#, options: .regularExpression))
        text.replaceSubrange(duration, with: "\"$event_duration\":-5")
        var payload = Array(text.utf8)
        var covered: [UInt8] = []
        withUnsafeBytes(of: UInt32(2).littleEndian) { covered += $0 }
        withUnsafeBytes(of: UInt32(payload.count).littleEndian) { covered += $0 }
        covered += payload
        var framed = CrashFileLayout.magic + covered.prefix(8)
        withUnsafeBytes(of: CRC32.update(0, covered).littleEndian) { framed += $0 }
        framed += payload
        payload = []
        let after = end.offset + CrashFileLayout.headerSize + end.payload.count
        try Data(Array(bytes[0..<end.offset]) + framed + Array(bytes[after...])).write(to: URL(fileURLWithPath: file))
        let store = try EventStore(path: directory + "/replayed.sqlite")
        let summary = CrashReplayer(directory: directory, store: store).replayAll()
        let result = try #require(summary.files.first)
        let ended = try #require(try objects(store).first { $0["event"] as? String == "$AppEnd" })
        #expect(try #require(ended["time"] as? Int64) > 0)
        let properties = try #require(ended["properties"] as? [String: Any])
        #expect(try #require(properties["$event_duration"] as? Double) >= 0)
        #expect(properties["time_from"] as? String == "file_mtime")
        #expect(result.outcome == .damaged && result.movedTo?.contains("/damaged/") == true)
    }

    /// A crash record whose `event` key appears twice (the second an ordinary event's name) is
    /// refused as damaged: which of the two the event is cannot be told, so it is not imported
    /// as an ordinary event (issue #42).
    @Test func aCrashRecordNamingItsEventTwiceIsRefusedAsDamaged() throws {
        let directory = try crashedDirectory()
        let file = crashFiles(in: directory)[0]
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: file)))
        let contents = CrashFileReader.parse(bytes)
        let crashed = try #require(contents.records.first { $0.type == .event })
        var payload = crashed.payload
        try #require(payload.last == UInt8(ascii: "}"))
        payload.removeLast()  // the closing brace
        payload += Array(",\"event\":\"page_view\"}".utf8)
        var framed = CrashFileLayout.magic
        var covered: [UInt8] = []
        withUnsafeBytes(of: UInt32(2).littleEndian) { covered += $0 }
        withUnsafeBytes(of: UInt32(payload.count).littleEndian) { covered += $0 }
        covered += payload
        framed += covered.prefix(8)
        withUnsafeBytes(of: CRC32.update(0, covered).littleEndian) { framed += $0 }
        framed += payload
        let end = crashed.offset + CrashFileLayout.headerSize + crashed.payload.count
        let rewritten = Array(bytes[0..<crashed.offset]) + framed + Array(bytes[end...])
        #expect(CrashFileReader.parse(rewritten).problems.isEmpty, "the record is framed whole")
        try Data(rewritten).write(to: URL(fileURLWithPath: file))
        let store = try EventStore(path: directory + "/replayed.sqlite")
        let summary = CrashReplayer(directory: directory, store: store).replayAll()
        let result = try #require(summary.files.first)
        #expect(result.outcome == .damaged)
        #expect(result.problems.contains { $0.reason.contains("appears twice") }, "\(result.problems)")
        #expect(try objects(store).allSatisfy { $0["event"] as? String != "page_view" })
        #expect(result.movedTo?.contains("/damaged/") == true)
    }

    @Test(arguments: ["zeros", "foreign", "empty", "random"])
    func fileThatIsNotACrashReportIsMovedAside(kind: String) throws {
        let directory = makeTemporaryDirectory("foreign")
        let path = directory + "/crash-\(kind).ccr"
        let data: Data
        switch kind {
        case "zeros": data = Data(count: 256 * 1024)
        case "foreign": data = Data("{\"this\":\"is JSON, not a crash file\"}".utf8)
        case "empty": data = Data()
        default: data = Data((0..<5000).map { _ in UInt8.random(in: 0...255) })
        }
        try data.write(to: URL(fileURLWithPath: path))
        let store = try EventStore(path: directory + "/events.sqlite")
        let summary = CrashReplayer(directory: directory, store: store).replayAll()
        #expect(summary.files.first?.outcome == .damaged)
        #expect(summary.files.first?.movedTo?.contains("/damaged/") == true)
        #expect(store.count == 0)
        #expect(crashFiles(in: directory).isEmpty)
    }

    @Test func oversizedFileGivesUpItsRecordsAndIsMovedAside() throws {
        let directory = try crashedDirectory()
        let file = crashFiles(in: directory)[0]
        // Past the 16 MiB the reader takes (sparse: nothing is written to disk).
        #expect(truncate(file, off_t(17 << 20)) == 0)
        let store = try EventStore(path: directory + "/replayed.sqlite")
        let result = try #require(CrashReplayer(directory: directory, store: store).replayAll().files.first)
        #expect(result.importedEvents == 2, "the records before the limit are recovered")
        #expect(result.problems.contains { $0.reason.contains("larger than") })
        #expect(result.movedTo?.contains("/damaged/") == true)
        #expect(store.count == 2)
    }

    @Test func lockedFileOfALiveProcessIsLeftAlone() throws {
        let directory = try crashedDirectory()
        let file = crashFiles(in: directory)[0]
        let holder = open(file, O_RDONLY)
        defer { close(holder) }
        #expect(flock(holder, LOCK_EX) == 0)
        // flock conflicts between open file descriptions, even within one process.
        let store = try EventStore(path: directory + "/replayed.sqlite")
        let summary = CrashReplayer(directory: directory, store: store).replayAll()
        #expect(summary.files.first?.outcome == .skippedLive)
        #expect(crashFiles(in: directory).count == 1)
        #expect(store.count == 0)
    }

    @Test func nextStartReplaysAutomaticallyAndTheCollectorGetsTheWholeSession() throws {
        let collector = try CollectorProcess()
        let directory = makeTemporaryDirectory("restart")
        let environment = [
            "CRASHCAPTURE_DIR": directory, "CRASHCAPTURE_SERVER_URL": collector.url, "SWIFT_BACKTRACE": "enable=no",
            "CRASH_SAMPLE_EVENTS": "3",
        ]
        let crashed = try run(Paths.swiftSample, ["pipeline-crash"], environment: environment)
        #expect(crashed.signal == SIGSEGV)
        let restarted = try run(Paths.swiftSample, ["pipeline-track"], environment: environment)
        #expect(restarted.exitCode == 0, "\(restarted.stderr)")
        let events = try collector.events()
        let sessions = events.compactMap { $0["session_id"] as? String }
        let first = try #require(sessions.first)
        let session = events.filter { $0["session_id"] as? String == first }
        #expect(session.compactMap { $0["event"] as? String }.filter { $0 == "$AppEnd" }.count == 1)
        #expect(session.first?["event"] as? String == "$AppStart")
        let crash = try #require(session.first { $0["event"] as? String == "$AppCrashed" })
        let frames = (crash["crash"] as? [String: Any])?["frames"] as? [[String: Any]] ?? []
        #expect(frames.prefix(4).contains { ($0["function"] as? String)?.contains("crashSwiftNullRead") == true })
        #expect(Set(sessions).count == 2)
        #expect(crashFiles(in: directory).isEmpty)
        let ids = events.compactMap { $0["event_id"] as? String }
        #expect(Set(ids).count == ids.count)
    }
}
