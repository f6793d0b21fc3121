import CrashFileFormat
import Foundation
import TestSupport
import Testing

@testable import CrashCapture

@Suite struct EventStoreTests {
    func events(_ range: Range<Int>, prefix: String = "e") -> [(id: String, payload: String)] {
        range.map { ("\(prefix)\($0)", "{\"event\":\"x\",\"index\":\($0)}") }
    }

    func storePath() -> String { makeTemporaryDirectory("store") + "/events.sqlite" }

    @Test func keepsOrderAndIgnoresDuplicates() throws {
        let store = try EventStore(path: storePath())
        #expect(try store.insert(events(0..<10)).inserted == 10)
        let again = try store.insert(events(5..<15))
        #expect(again.inserted == 5 && again.duplicates == 5)
        #expect(try store.events().map(\.eventID) == (0..<15).map { "e\($0)" })
        #expect(store.count == 15)
    }

    /// Stores made before `seq` lost AUTOINCREMENT keep their table and work as before.
    @Test func aStoreWithTheOlderAutoincrementTableStillWorks() throws {
        let path = storePath()
        let old = """
            PRAGMA application_id = \(EventStore.applicationID);
            CREATE TABLE events(seq INTEGER PRIMARY KEY AUTOINCREMENT, event_id TEXT NOT NULL UNIQUE,
                payload TEXT NOT NULL, bytes INTEGER NOT NULL, in_flight INTEGER NOT NULL DEFAULT 0,
                context INTEGER NOT NULL DEFAULT 0);
            INSERT INTO events(event_id, payload, bytes) VALUES ('old', '{"event":"old"}', 15);
            """
        let made = try run("/usr/bin/sqlite3", [path, old])
        #expect(made.exitCode == 0, "\(made.stderr)")
        let store = try EventStore(path: path)
        #expect(try store.insert(events(0..<3)).inserted == 3)
        #expect(try store.events().map(\.eventID) == ["old", "e0", "e1", "e2"])
        let batch = try #require(try store.claimBatch(limit: 2))
        try store.complete(batch)
        #expect(try store.events().map(\.eventID) == ["e1", "e2"])
    }

    /// A store whose crash history predates the whole reports gets their columns at open, and
    /// keeps its crashes' lines.
    @Test func anOlderCrashHistoryGetsItsReportColumns() throws {
        let path = storePath()
        let old = """
            PRAGMA application_id = \(EventStore.applicationID);
            CREATE TABLE crash_history(event_id TEXT PRIMARY KEY, time_ms INTEGER NOT NULL, signal TEXT NOT NULL,
                title TEXT NOT NULL, fingerprint TEXT NOT NULL, app_version TEXT NOT NULL) WITHOUT ROWID;
            INSERT INTO crash_history VALUES ('before', 1, 'SIGSEGV', 't', 'f', '1');
            """
        let made = try run("/usr/bin/sqlite3", [path, old])
        #expect(made.exitCode == 0, "\(made.stderr)")
        let store = try EventStore(path: path)
        #expect(try store.crashHistory().map(\.eventID) == ["before"])
        #expect(try store.crashReport(eventID: "before") == nil)
        try store.transaction { transaction in
            try transaction.noteCrashInHistory(
                CrashHistoryEntry(
                    eventID: "after", timeMilliseconds: 2, signal: "SIGABRT", title: "t", fingerprint: "f",
                    appVersion: "1"))
            try transaction.keepCrashReport(eventID: "after", payload: "{\"event\":\"$AppCrashed\"}")
        }
        #expect(try store.crashReport(eventID: "after") == "{\"event\":\"$AppCrashed\"}")
        // A second open finds the columns made.
        #expect(try EventStore(path: path).crashHistory().count == 2)
    }

    @Test func capDropsTheOldestAndCountsThem() throws {
        let store = try EventStore(path: storePath(), limits: .init(maximumEvents: 100, maximumBytes: 1 << 20))
        try store.insert(events(0..<60))
        let result = try store.insert(events(60..<150))
        #expect(result.dropped == 50)
        #expect(store.count == 100)
        #expect(store.droppedCount == 50)
        #expect(try store.events().first?.eventID == "e50", "the oldest went, not everything")
        #expect(try store.events(limit: 1000).last?.eventID == "e149")
    }

    @Test func byteCapDropsOnlyWhatIsNeeded() throws {
        let payload = String(repeating: "x", count: 1000)
        let store = try EventStore(path: storePath(), limits: .init(maximumEvents: 1000, maximumBytes: 10_500))
        try store.insert((0..<20).map { ("b\($0)", payload) })
        #expect(store.count == 10)
        #expect(store.byteCount <= 10_500)
        #expect(try store.events().first?.eventID == "b10")
    }

    @Test func eventsInFlightWhenTheProcessDiedAreRecovered() throws {
        let path = storePath()
        do {
            let store = try EventStore(path: path)
            try store.insert(events(0..<120))
            let batch = try #require(try store.claimBatch(limit: 50))
            #expect(batch.events.map(\.eventID) == (0..<50).map { "e\($0)" })
            let next = try #require(try store.claimBatch(limit: 50))
            #expect(next.events.first?.eventID == "e50", "a second batch does not repeat the first")
        }
        let reopened = try EventStore(path: path)
        let batch = try #require(try reopened.claimBatch(limit: 50))
        #expect(batch.events.first?.eventID == "e0", "claimed rows come back in their place")
    }

    @Test func completeReleaseAndReject() throws {
        let store = try EventStore(path: storePath())
        try store.insert(events(0..<150))
        let first = try #require(try store.claimBatch(limit: 50))
        try store.complete(first)
        #expect(store.count == 100)
        let second = try #require(try store.claimBatch(limit: 50))
        try store.release(second)
        let retried = try #require(try store.claimBatch(limit: 50))
        #expect(retried.events.map(\.eventID) == second.events.map(\.eventID))
        try store.reject(retried, status: 400, reason: "bad batch")
        #expect(store.rejectedCount == 50)
        #expect(store.count == 50)
        #expect(try store.claimBatch(limit: 50)?.events.first?.eventID == "e100")
    }

    /// Delivered batches leave the counts in the commit that acknowledges them and the table
    /// in bulk later: a process that dies in between sends none of them again.
    @Test func deliveredRowsLeaveInBulkAndAreNeverSentAgain() throws {
        let path = storePath()
        func rowsInTable() throws -> String {
            try run("/usr/bin/env", ["sqlite3", path, "SELECT COUNT(*) FROM events"]).stdout
                .trimmingCharacters(in: .newlines)
        }
        do {
            let store = try EventStore(path: path)
            try store.insert(events(0..<120))
            var batch = try store.completeAndClaim(nil, limit: 10)
            for _ in 0..<6 {
                let claimed = try #require(batch)
                batch = try store.completeAndClaim(claimed, limit: 10)
            }
            #expect(batch?.events.first?.eventID == "e60")
            #expect(store.count == 60)
            #expect(try store.events(limit: 1000).first?.eventID == "e60")
            #expect(try rowsInTable() == "120", "delivered rows wait for a bulk delete")
            // The process dies here, batch e60...e69 on the wire.
        }
        let reopened = try EventStore(path: path)
        #expect(reopened.count == 60)
        #expect(try rowsInTable() == "60", "opening deletes the delivered rows")
        let first = try #require(try reopened.claimBatch(limit: 10))
        #expect(first.events.map(\.eventID) == (60..<70).map { "e\($0)" })

        // Completed out of order, a batch's rows go at once; the older one then moves the mark.
        let second = try #require(try reopened.claimBatch(limit: 10))
        try reopened.complete(second)
        #expect(
            try reopened.events(limit: 1000).map(\.eventID) == (60..<70).map { "e\($0)" } + (80..<120).map { "e\($0)" })
        var batch: EventStore.Batch? = first
        while let claimed = batch { batch = try reopened.completeAndClaim(claimed, limit: 10) }
        #expect(reopened.count == 0)
        #expect(try rowsInTable() == "0", "a queue run dry leaves no delivered row behind")

        // With the table empty, new rows may take sequence numbers the mark once covered.
        try reopened.insert(events(0..<5, prefix: "n"))
        #expect(try reopened.claimBatch(limit: 10)?.events.map(\.eventID) == (0..<5).map { "n\($0)" })
    }

    /// Past `purgeRows` delivered rows, they are deleted even while the queue is still long.
    @Test func deliveredRowsAreDeletedEveryPurgeRows() throws {
        let path = storePath()
        let store = try EventStore(path: path)
        try store.insert(events(0..<(EventStore.purgeRows + 200)))
        var batch = try store.completeAndClaim(nil, limit: 50)
        for _ in 0..<(EventStore.purgeRows / 50) {
            let claimed = try #require(batch)
            batch = try store.completeAndClaim(claimed, limit: 50)
        }
        let rows = try run("/usr/bin/env", ["sqlite3", path, "SELECT COUNT(*), MIN(event_id) FROM events"]).stdout
        #expect(rows.trimmingCharacters(in: .newlines) == "200|e\(EventStore.purgeRows)")
        #expect(store.count == 200)
    }

    @Test func aReleasedBatchComesBackInPlaceAroundBatchesStillInFlight() throws {
        let store = try EventStore(path: storePath(), limits: .init(maximumEvents: 130, maximumBytes: 1 << 20))
        try store.insert(events(0..<120))
        let first = try #require(try store.claimBatch(limit: 40))
        let second = try #require(try store.claimBatch(limit: 40))
        try store.release(first)
        // Back in place, and it stops where the batch still in flight begins.
        let again = try #require(try store.claimBatch(limit: 50))
        #expect(again.events.map(\.eventID) == (0..<40).map { "e\($0)" })
        let third = try #require(try store.claimBatch(limit: 50))
        #expect(third.events.map(\.eventID) == (80..<120).map { "e\($0)" })
        // A batch no longer in flight (released, then claimed again under another token) removes nothing.
        try store.complete(first)
        #expect(store.count == 120)
        // The cap drops the oldest rows that are not in flight: here none of the first 120 is free.
        try store.complete(again)
        try store.insert(events(120..<200))
        #expect(store.count == 130)
        let left = try store.events(limit: 1000).map(\.eventID)
        #expect(Array(left.prefix(80)) == (40..<120).map { "e\($0)" }, "rows in flight are never dropped")
        #expect(left.last == "e199")
        try store.complete(second)
        try store.complete(third)
        #expect(try store.claimBatch(limit: 100)?.events.first?.eventID == "e150")
    }

    @Test func rememberedIDsAreNeverImportedTwice() throws {
        let store = try EventStore(path: storePath())
        try store.insert(events(0..<3, prefix: "crash"), rememberIDs: true)
        let batch = try #require(try store.claimBatch(limit: 10))
        try store.complete(batch)
        let again = try store.insert(events(0..<3, prefix: "crash"), rememberIDs: true)
        #expect(again.inserted == 0 && again.duplicates == 3, "uploaded and deleted, still not imported again")
    }

    @Test func garbageFileIsMovedAsideNotTruncated() throws {
        let path = storePath()
        let garbage = Data((0..<8192).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        try garbage.write(to: URL(fileURLWithPath: path))
        let store = try EventStore(path: path)
        let moved = try #require(store.movedAside)
        #expect(moved.reason.contains("not a SQLite database"))
        #expect(FileManager.default.contents(atPath: moved.path) == garbage, "the original bytes are kept")
        try store.insert(events(0..<2))
        #expect(store.count == 2)
    }

    @Test func someoneElsesDatabaseIsMovedAside() throws {
        let path = storePath()
        let result = try run(
            "/usr/bin/env", ["sqlite3", path, "CREATE TABLE customers(id INTEGER); INSERT INTO customers VALUES (1);"])
        try #require(result.exitCode == 0, "sqlite3: \(result.stderr)")
        let store = try EventStore(path: path)
        let moved = try #require(store.movedAside)
        #expect(moved.reason.contains("not a CrashCapture event store"))
        let check = try run("/usr/bin/env", ["sqlite3", moved.path, "SELECT COUNT(*) FROM customers"])
        #expect(check.stdout == "1\n")
    }

    @Test func rejectsNonsenseLimits() {
        #expect(throws: CrashCaptureError.self) {
            try EventStore(path: storePath(), limits: .init(maximumEvents: 0, maximumBytes: 10))
        }
    }

    /// The crash history keeps whole reports for `crashcap show` after their events are gone:
    /// the newest `crashReportsKept`, within `crashReportBytesKept`; older crashes keep their line.
    @Test func theCrashHistoryKeepsTheNewestReportsWithinItsBounds() throws {
        let store = try EventStore(path: storePath())
        func keep(_ index: Int, bytes: Int = 100) throws {
            try store.transaction { transaction in
                try transaction.noteCrashInHistory(
                    CrashHistoryEntry(
                        eventID: "c\(index)", timeMilliseconds: Int64(index), signal: "SIGSEGV", title: "t",
                        fingerprint: "f", appVersion: "1"))
                try transaction.keepCrashReport(
                    eventID: "c\(index)", payload: "{\"pad\":\"" + String(repeating: "p", count: bytes) + "\"}")
            }
        }
        let count = EventStore.crashReportsKept + 5
        for index in 0..<count { try keep(index) }
        #expect(try store.crashHistory().count == count, "every crash keeps its line")
        #expect(try store.crashReport(eventID: "c4") == nil && store.crashReport(eventID: "c5") != nil)
        #expect(try store.crashReport(eventID: "c\(count - 1)")?.contains("ppp") == true)
        // Two reports of half the bytes kept and more: only the newest of them stays whole.
        let half = EventStore.crashReportBytesKept / 2 + 1
        try keep(count, bytes: half)
        try keep(count + 1, bytes: half)
        #expect(try store.crashReport(eventID: "c\(count + 1)") != nil)
        #expect(
            try store.crashReport(eventID: "c\(count)") == nil && store.crashReport(eventID: "c\(count - 1)") == nil)
    }
}

@Suite struct JSONWriterTests {
    @Test func writesWhatTheParserReadsAndWhatSwiftBuilds() throws {
        let text =
            "{\"b\":true,\"f\":false,\"i\":-42,\"big\":1795320933540,\"d\":1.5,\"n\":null,\"s\":\"q\\\"\\n\",\"a\":[1,\"x\",[]],\"o\":{}}"
        let parsed = try #require(try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any])
        var tree = parsed
        tree["native"] = ["flag": true, "count": 3, "offset": UInt64(7), "ratio": 0.25] as [String: Any]
        let written = JSONTree.encode(tree)
        let reparsed = try #require(try JSONSerialization.jsonObject(with: Data(written.utf8)) as? [String: Any])
        #expect(reparsed["b"] as? Bool == true && reparsed["f"] as? Bool == false)
        #expect(reparsed["i"] as? Int == -42 && reparsed["big"] as? Int == 1_795_320_933_540)
        #expect(reparsed["d"] as? Double == 1.5 && reparsed["n"] is NSNull && reparsed["s"] as? String == "q\"\n")
        #expect((reparsed["a"] as? [Any])?.count == 3)
        let native = try #require(reparsed["native"] as? [String: Any])
        #expect(native["flag"] as? Bool == true && native["count"] as? Int == 3 && native["offset"] as? Int == 7)
        #expect(native["ratio"] as? Double == 0.25)
        #expect(written.contains("\"b\":true") && written.contains("\"flag\":true"))
    }
}

@Suite struct EventContextTests {
    @Test func staticPropertiesAreStoredOnceAndReadBackWhole() throws {
        let path = makeTemporaryDirectory("context") + "/events.sqlite"
        let store = try EventStore(path: path)
        let context = "\"$app_name\":\"demo\",\"$os\":\"Linux\""
        let payloads = (0..<3).map {
            (id: "c\($0)", payload: "{\"event\":\"e\",\"properties\":{\(EventStore.contextMarker),\"n\":\($0)}}")
        }
        try store.insert(payloads, context: context)
        #expect(store.byteCount < payloads.reduce(0) { $0 + $1.payload.utf8.count + context.utf8.count })
        let read = try store.events()
        #expect(read[0].payload == "{\"event\":\"e\",\"properties\":{\(context),\"n\":0}}")
        let batch = try #require(try store.claimBatch(limit: 10))
        #expect(batch.events.map(\.payload) == read.map(\.payload))
        try store.reject(batch, status: 400, reason: "x")
        let dump = try run(
            "/usr/bin/env", ["sqlite3", path, "SELECT payload FROM rejected_events ORDER BY event_id LIMIT 1"])
        #expect(dump.stdout.trimmingCharacters(in: .newlines) == read[0].payload, "rejected events are kept whole")
    }
}

extension EventContextTests {
    @Test func contextsNoEventUsesAreForgotten() throws {
        let path = makeTemporaryDirectory("context-prune") + "/events.sqlite"
        let store = try EventStore(path: path)
        let row = { (id: String) in (id: id, payload: "{\"properties\":{\(EventStore.contextMarker)}}") }
        try store.insert([row("old")], context: "\"old\":1")
        try store.complete(try #require(try store.claimBatch(limit: 10)))
        try store.insert([row("kept")], context: "\"kept\":1")
        try store.pruneContexts()
        let left = try run("/usr/bin/env", ["sqlite3", path, "SELECT text FROM contexts"])
        #expect(left.stdout.trimmingCharacters(in: .newlines) == "\"kept\":1")
        // A context pruned away is recorded again when it is used again.
        try store.insert([row("again")], context: "\"old\":1")
        #expect(try store.events().map(\.payload) == ["{\"properties\":{\"kept\":1}}", "{\"properties\":{\"old\":1}}"])
    }
}

@Suite struct EventStoreOpeningTests {
    func filledStore(_ count: Int) throws -> String {
        let path = makeTemporaryDirectory("opening") + "/events.sqlite"
        let store = try EventStore(path: path)
        let payload = String(repeating: "p", count: 300)
        try store.insert((0..<count).map { ("e\($0)", "{\"event\":\"x\",\"pad\":\"\(payload)\",\"n\":\($0)}") })
        return path
    }

    @Test func totalsSurviveReopeningAndMatchTheRows() throws {
        let path = try filledStore(500)
        do {
            let store = try EventStore(path: path)
            try store.complete(try #require(try store.claimBatch(limit: 50)))
            try store.reject(try #require(try store.claimBatch(limit: 50)), status: 400, reason: "x")
        }
        let reopened = try EventStore(path: path)
        let rows = try run("/usr/bin/env", ["sqlite3", path, "SELECT COUNT(*) || ' ' || SUM(bytes) FROM events"])
        #expect(rows.stdout.trimmingCharacters(in: .newlines) == "\(reopened.count) \(reopened.byteCount)")
        #expect(reopened.count == 400)
    }

    /// The collector's store copies its WAL into the database on a thread of its own while the
    /// writer goes on: the database grows as events come, the WAL is written again from its
    /// start instead of growing, and every row is there for a second connection to read.
    @Test func backgroundCheckpointsKeepTheWALShortWhileTheWriterGoesOn() throws {
        let path = makeTemporaryDirectory("checkpoints") + "/events.sqlite"
        let store = try EventStore(path: path, checkpointPages: 64, backgroundCheckpoints: true)
        let pad = String(repeating: "p", count: 900)
        func size(_ file: String) throws -> Int {
            (try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int) ?? 0
        }
        // Past the 64 pages that start a checkpoint, short of the writer's own backstop: with
        // no commit after it, only the checkpointing thread can bring the rows into the file.
        try store.insert((0..<400).map { ("early-\($0)", "{\"event\":\"x\",\"pad\":\"\(pad)\"}") })
        let before = try size(path)
        let deadline = Date().addingTimeInterval(10)
        while try size(path) < before + 300_000 && Date() < deadline { usleep(10_000) }
        #expect(try size(path) >= before + 300_000, "copied by the thread while the writer was idle")
        for batch in 0..<400 {
            try store.insert(
                (0..<50).map { ("c\(batch)-\($0)", "{\"event\":\"x\",\"pad\":\"\(pad)\",\"n\":\($0)}") })
        }
        // 20,000 rows of about 1 KB: without checkpoints the WAL would hold all 20 MB of them.
        #expect(try size(path) > 15_000_000, "the rows reached the database file")
        #expect(try size(path + "-wal") < 4_000_000, "the WAL was started again, not grown")
        let reader = try EventStore(path: path)
        #expect(reader.count == 20_400)
        #expect(try reader.events(after: 20_390, limit: 5).map(\.eventID) == (40...44).map { "c399-\($0)" })
    }

    @Test func damageInsideTheFileIsFoundByTheIntegrityCheckAndMovedAside() throws {
        let path = try filledStore(2000)
        // Overwrite pages in the middle: the header is fine, so opening alone cannot tell.
        let handle = try #require(FileHandle(forUpdatingAtPath: path))
        let size = try handle.seekToEnd()
        try handle.seek(toOffset: size / 2)
        try handle.write(contentsOf: Data(repeating: 0xa5, count: 16384))
        try handle.close()
        let store = try EventStore(path: path, verifyNow: false)
        #expect(store.movedAside == nil)
        #expect(try store.checkIntegrity())
        let moved = try #require(store.movedAside)
        #expect(moved.reason.hasPrefix("damaged"))
        #expect(FileManager.default.fileExists(atPath: moved.path), "the damaged file is kept")
        #expect(store.count == 0)
        try store.insert([("fresh", "{}")])
        #expect(try store.events().map(\.eventID) == ["fresh"])
        #expect(store.movedAsideNotice?.contains(moved.path) == true)
        // The default open reads the whole file at once and finds the same thing.
        let copy = makeTemporaryDirectory("opening") + "/events.sqlite"
        try FileManager.default.copyItem(atPath: moved.path, toPath: copy)
        #expect(try EventStore(path: copy).movedAside?.reason.hasPrefix("damaged") == true)
    }
}
