import CrashFileFormat
import Foundation
import TestSupport
import Testing

@testable import CrashCapture

#if canImport(Glibc)
    import Glibc
#endif

/// No byte of a session file or a crash file is trusted (issue #42): each byte of the fixed
/// headers given several values, the file cut at every page, the ring's bytes flipped, all
/// replayed in-process. Every case either imports every event whose own checksum holds, or
/// sets the file aside in damaged/ with a note (and never loses an intact event either way);
/// no case traps, and no stored time is negative.
@Suite struct SessionFileDamageTests {
    /// A killed session's file with five tracked events, its consumed position zeroed so that
    /// a fresh store must import them all; and where each event's entry lies in the ring.
    struct Fixture: Sendable {
        var name: String
        var bytes: [UInt8]
        var headerSize: Int
        /// Ring position and `index` of each sample event.
        var events: [(position: UInt64, index: Int)]
        var entryEnds: [UInt64]
        var reserved: UInt64
    }

    static let fixture: Result<Fixture, TestFailure> = {
        let source = makeTemporaryDirectory("damage-source")
        defer { try? FileManager.default.removeItem(atPath: source) }
        guard
            let waiting = try? Child(
                Paths.swiftSample, ["pipeline-wait"],
                environment: [
                    "CRASHCAPTURE_DIR": source, "CRASH_SAMPLE_EVENTS": "5",
                    "CRASH_SAMPLE_JOURNAL_BYTES": "\(64 << 10)",
                ]),
            waiting.waitForOutput("ready")
        else { return .failure(TestFailure("the sample never became ready")) }
        kill(waiting.pid, SIGKILL)
        _ = waiting.wait(timeout: 20)
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: source)) ?? []).filter {
            SessionFile.isSessionFileName($0)
        }
        guard let name = names.first,
            var bytes = FileManager.default.contents(atPath: source + "/" + name).map(Array.init)
        else { return .failure(TestFailure("no session file")) }
        // Everything was stored before the kill; pretend none was, so the whole journal is read:
        // the consumed position, and the count of entries consumed.
        bytes.replaceSubrange(88..<96, with: [UInt8](repeating: 0, count: 8))
        bytes.replaceSubrange(252..<256, with: [UInt8](repeating: 0, count: 4))
        let path = source + "/" + name
        guard (try? Data(bytes).write(to: URL(fileURLWithPath: path))) != nil else {
            return .failure(TestFailure("cannot write the fixture"))
        }
        let fd = open(path, O_RDONLY)
        defer { close(fd) }
        guard let session = try? SessionFile.read(fd: fd, path: path), let found = try? session.entries() else {
            return .failure(TestFailure("the fixture's session file does not read"))
        }
        var events: [(UInt64, Int)] = []
        for entry in found.entries where entry.type == SessionFile.eventEntry {
            let text = String(decoding: entry.payload, as: UTF8.self)
            guard text.contains("sample_event"), let range = text.range(of: "\"index\":") else { continue }
            let digits = text[range.upperBound...].prefix { $0.isNumber }
            events.append((entry.position, Int(digits) ?? -1))
        }
        guard events.map(\.1) == Array(0..<5) else {
            return .failure(TestFailure("the fixture holds \(events.map(\.1)), not five events"))
        }
        let headerSize = bytes.withUnsafeBytes { Int($0.loadUnaligned(fromByteOffset: 8, as: UInt32.self)) }
        return .success(
            Fixture(
                name: name, bytes: bytes, headerSize: headerSize, events: events,
                entryEnds: found.entries.map { $0.position + SessionFile.entrySize($0.payload.count) },
                reserved: session.reserved))
    }()

    struct Outcome {
        var outcome: SessionRecovery.Result.Outcome
        var result: SessionRecovery.Result
        var indexes: [Int]
        var setAside: Bool
        var noted: Bool
        var negativeTimes: [String]
    }

    /// The file replayed in-process into a fresh store.
    func replay(_ bytes: [UInt8], name: String) throws -> Outcome {
        let directory = makeTemporaryDirectory("damage")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try Data(bytes).write(to: URL(fileURLWithPath: directory + "/" + name))
        let store = try EventStore(path: directory + "/events.sqlite")
        let recovery = SessionRecovery(replayer: CrashReplayer(directory: directory, store: store))
        let result = recovery.recover(directory + "/" + name)
        let stored = try storedEvents(in: directory)
        let indexes = stored.filter { $0["event"] as? String == "sample_event" }.compactMap {
            ($0["properties"] as? [String: Any])?["index"] as? Int
        }
        var negative: [String] = []
        for event in stored {
            let name = event["event"] as? String ?? "?"
            if let time = event["time"] as? Int64, time < 0 { negative.append("\(name) time \(time)") }
            if let duration = (event["properties"] as? [String: Any])?["$event_duration"] as? Double, duration < 0 {
                negative.append("\(name) $event_duration \(duration)")
            }
        }
        let aside = (try? FileManager.default.contentsOfDirectory(atPath: directory + "/damaged")) ?? []
        return Outcome(
            outcome: result.outcome, result: result, indexes: indexes.sorted(), setAside: aside.contains(name),
            noted: aside.contains(name + ".txt"), negativeTimes: negative)
    }

    /// What every case must hold: no event twice, no negative time, a damaged file set aside with
    /// a note, and every event in `expected` imported.
    func check(_ got: Outcome, expected: [Int], _ label: String) {
        #expect(got.negativeTimes.isEmpty, "\(label): \(got.negativeTimes)")
        #expect(Set(got.indexes).count == got.indexes.count, "\(label): an event twice: \(got.indexes)")
        #expect(
            Set(expected).isSubset(of: got.indexes),
            "\(label): imported \(got.indexes) of \(expected), \(got.outcome.rawValue): \(got.result.problem ?? "")")
        if got.outcome == .damaged {
            #expect(got.setAside && got.noted, "\(label): damaged but not set aside with a note")
        } else {
            #expect(got.outcome == .closed, "\(label): \(got.outcome.rawValue)")
        }
    }

    /// The fixed header's 256 bytes, each given 0, 0xff, its value ±1; and each offset or size
    /// field made to point one page past the file, or to 2^63 (which trapped in `Int(...)`).
    @Test func everyByteOfTheFixedHeader() throws {
        let fixture = try Self.fixture.get()
        let original = fixture.bytes
        for offset in 0..<Int(256) {
            let byte = original[offset]
            for value in Set([0, 0xff, byte &+ 1, byte &- 1]) where value != byte {
                var bytes = original
                bytes[offset] = value
                let got = try replay(bytes, name: fixture.name)
                // A consumed position moved to another entry's start says those before it are
                // stored: they are not asked of this store.
                var expected = Array(0..<5)
                if (88..<96).contains(offset) {
                    let consumed = bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 88, as: UInt64.self) }
                    if consumed <= fixture.reserved, fixture.entryEnds.contains(consumed) {
                        expected = fixture.events.filter { $0.position >= consumed }.map(\.index)
                    }
                }
                check(got, expected: expected, "byte \(offset) = \(value)")
            }
        }
        let fileSize = UInt64(original.count)
        let fields: [(String, Int, Int)] = [
            ("header size", 8, 4), ("ring size", 16, 8), ("reserved end", 80, 8), ("consumed", 88, 8),
            ("context size", 104, 4), ("kept crash offset", 200, 8), ("kept crash size", 208, 8),
            ("notes offset", 232, 4), ("notes size", 236, 4),
        ]
        for (field, offset, width) in fields {
            for value in [fileSize + 4096, fileSize, UInt64(1) << 63, UInt64.max, UInt64(1) << 31] {
                var bytes = original
                withUnsafeBytes(of: value.littleEndian) { raw in
                    bytes.replaceSubrange(offset..<offset + width, with: raw.prefix(width))
                }
                let got = try replay(bytes, name: fixture.name)
                check(got, expected: Array(0..<5), "\(field) = \(value)")
                if field == "kept crash offset" {
                    #expect(got.outcome == .damaged, "\(field) = \(value): a crash kept outside the file is damage")
                }
            }
        }
    }

    /// Cut at every page: the file is set aside (it is shorter than its header says), and every
    /// event whose entry lies before the cut is imported.
    @Test func truncatedAtEveryPage() throws {
        let fixture = try Self.fixture.get()
        for cut in stride(from: 0, to: fixture.bytes.count, by: 4096) {
            let got = try replay(Array(fixture.bytes.prefix(cut)), name: fixture.name)
            let whole = fixture.events.filter { event in
                let end = fixture.entryEnds.first { $0 > event.position } ?? fixture.reserved
                return fixture.headerSize + Int(end) <= cut
            }
            check(got, expected: whole.map(\.index), "cut at \(cut)")
            #expect(got.outcome == .damaged, "cut at \(cut) of \(fixture.bytes.count): not set aside")
        }
    }

    /// Each byte of the journal's entries flipped: an entry that fails its own checksum is
    /// counted, named and the file set aside; every other event is imported.
    @Test func everyFlippedByteOfTheRing() throws {
        let fixture = try Self.fixture.get()
        let start = fixture.headerSize
        let end = fixture.headerSize + Int(fixture.reserved)
        for offset in start..<end {
            var bytes = fixture.bytes
            bytes[offset] ^= 0x5a
            let got = try replay(bytes, name: fixture.name)
            let position = UInt64(offset - start)
            let hit = fixture.events.first { event in
                let end = fixture.entryEnds.first { $0 > event.position } ?? fixture.reserved
                return event.position <= position && position < end
            }
            let expected = fixture.events.filter { $0.index != hit?.index }.map(\.index)
            check(got, expected: expected, "ring byte \(position) flipped")
            if got.indexes != Array(0..<5) {
                #expect(got.outcome == .damaged, "ring byte \(position): an event lost in silence")
                #expect(
                    !got.result.damagedEntries.isEmpty && got.result.problem?.contains("damaged") == true,
                    "ring byte \(position): the lost entry is not named")
            }
        }
    }

    /// Zeroed entries in the middle of the ring: named, never silent.
    @Test func zeroedEntriesAreNamed() throws {
        let fixture = try Self.fixture.get()
        var bytes = fixture.bytes
        let second = fixture.events[1]
        let at = fixture.headerSize + Int(second.position)
        bytes.replaceSubrange(at + 8..<at + 24, with: [UInt8](repeating: 0, count: 16))
        let got = try replay(bytes, name: fixture.name)
        check(got, expected: [0, 2, 3, 4], "entry 1 zeroed")
        #expect(got.outcome == .damaged)
        #expect(got.result.damagedEntries == [second.position])
    }

    /// A whole entry zeroed, its commit word too: it looks like space reserved and never
    /// committed (a thread killed mid-track), which hides nothing. The header's count of
    /// committed entries tells the two apart: the file is set aside, the loss named.
    @Test func aWholeZeroedEntryIsNamed() throws {
        let fixture = try Self.fixture.get()
        for victim in [1, 4] {
            var bytes = fixture.bytes
            let start = fixture.headerSize + Int(fixture.events[victim].position)
            let entryEnd = fixture.entryEnds.first { $0 > fixture.events[victim].position } ?? fixture.reserved
            let end = fixture.headerSize + Int(entryEnd)
            bytes.replaceSubrange(start..<end, with: [UInt8](repeating: 0, count: end - start))
            let got = try replay(bytes, name: fixture.name)
            check(got, expected: (0..<5).filter { $0 != victim }, "entry \(victim) zeroed whole")
            #expect(got.outcome == .damaged, "entry \(victim): \(got.result.problem ?? "")")
            #expect(got.result.missingEntries == 1)
            #expect(got.result.problem?.contains("1 journal entry committed but not found") == true)
        }
        // The same file untouched: nothing is missing.
        let whole = try replay(fixture.bytes, name: fixture.name)
        #expect(whole.outcome == .closed && whole.result.missingEntries == 0, "\(whole.result.problem ?? "")")
    }

    /// `crashcap replay` itself, spawned for a few cases: exit 65 and the file in damaged/.
    @Test(arguments: [("kept crash offset 2^63", 207, UInt8(0x80)), ("clock", 31, UInt8(0xff))])
    func theCommandSetsADamagedFileAside(_ label: String, _ offset: Int, _ value: UInt8) throws {
        let fixture = try Self.fixture.get()
        let directory = makeTemporaryDirectory("damage-cli")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var bytes = fixture.bytes
        bytes[offset] = value
        try Data(bytes).write(to: URL(fileURLWithPath: directory + "/" + fixture.name))
        let replay = try run(Paths.crashcap, ["replay", directory], timeout: 60)
        #expect(replay.exitCode == 65, "\(label): \(replay.stdout) \(replay.stderr)")
        #expect(replay.stdout.contains("damaged"), "\(label): \(replay.stdout)")
        let indexes = try storedEvents(in: directory).filter { $0["event"] as? String == "sample_event" }.compactMap {
            ($0["properties"] as? [String: Any])?["index"] as? Int
        }
        #expect(indexes.sorted() == Array(0..<5), "\(label)")
        for event in try storedEvents(in: directory) {
            if let time = event["time"] as? Int64 { #expect(time >= 0, "\(label): \(event["event"] ?? "")") }
        }
    }

    /// An app whose directory holds a damaged session file starts (the SDK replays at install)
    /// instead of dying at every start.
    @Test func anAppStartsOverADamagedSessionFile() throws {
        let fixture = try Self.fixture.get()
        let directory = makeTemporaryDirectory("damage-app")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var bytes = fixture.bytes
        bytes[207] = 0x80  // the kept crash at 2^63
        try Data(bytes).write(to: URL(fileURLWithPath: directory + "/" + fixture.name))
        let started = try run(
            Paths.swiftSample, ["pipeline-track"],
            environment: ["CRASHCAPTURE_DIR": directory, "CRASH_SAMPLE_EVENTS": "0", "SWIFT_BACKTRACE": "enable=no"])
        #expect(started.exitCode == 0, "\(started.stderr)")
        let aside = (try? FileManager.default.contentsOfDirectory(atPath: directory + "/damaged")) ?? []
        #expect(aside.contains(fixture.name))
    }
}
