import CrashFileFormat
import Foundation
import Synchronization
import TestSupport
import Testing

@testable import CrashCapture

@Suite struct EventPipelineTests {
    func pipeline(journalBytes: Int = 1 << 20, fullJournalWait: Duration = .seconds(1)) throws -> EventPipeline {
        let store = try EventStore(path: makeTemporaryDirectory("pipeline-unit") + "/events.sqlite")
        let identity = EventPipeline.Identity(
            sessionID: "session", appVersion: "1", staticProperties: "\"k\":1", distinctID: "anonymous")
        return EventPipeline(
            store: store, identity: identity, uploader: nil, memoryJournalBytes: journalBytes,
            fullJournalWait: fullJournalWait)
    }

    func event(_ index: Int) -> PendingEvent {
        PendingEvent(name: "e", properties: ["index": .int(index)], timeMilliseconds: 0, method: "code")
    }

    func trackFromFourThreads(_ pipeline: EventPipeline, eventsEach: Int) -> DispatchGroup {
        let group = DispatchGroup()
        for thread in 0..<4 {
            group.enter()
            Thread {
                for index in 0..<eventsEach { pipeline.enqueue(event(thread * 10_000 + index)) }
                group.leave()
            }.start()
        }
        return group
    }

    /// A pipeline with a 64 KiB journal (a few hundred events) whose writer is held until the
    /// semaphore is signalled, and 4,000 events coming from four threads.
    func burstIntoAHeldWriter(fullJournalWait: Duration) throws -> (
        EventPipeline, DispatchSemaphore, DispatchGroup, ContinuousClock.Instant
    ) {
        let pipeline = try pipeline(journalBytes: 64 << 10, fullJournalWait: fullJournalWait)
        let held = DispatchSemaphore(value: 0)
        pipeline.onWriter { held.wait() }
        return (pipeline, held, trackFromFourThreads(pipeline, eventsEach: 1000), ContinuousClock.now)
    }

    /// The writer is held for 300 ms: track() waits for room instead of dropping, and every
    /// event reaches the store.
    @Test func aFullJournalMakesTrackWaitForTheWriter() throws {
        let (pipeline, held, group, started) = try burstIntoAHeldWriter(fullJournalWait: .seconds(10))
        #expect(group.wait(timeout: .now() + 0.3) == .timedOut, "the journal held every event: nothing waited")
        held.signal()
        #expect(group.wait(timeout: .now() + 30) == .success)
        #expect(ContinuousClock.now - started >= .milliseconds(300))
        pipeline.flushToStore()
        #expect(pipeline.droppedBeforeStore == 0)
        #expect(pipeline.store.count == 4000)
    }

    /// A bound too long to add to the clock (a Duration of Int64.max seconds) waits, as a long
    /// bound does: it does not wrap around into no wait at all.
    @Test func anEnormousBoundStillWaits() throws {
        let (pipeline, held, group, _) = try burstIntoAHeldWriter(fullJournalWait: .seconds(Int64.max))
        #expect(group.wait(timeout: .now() + 0.2) == .timedOut)
        held.signal()
        #expect(group.wait(timeout: .now() + 30) == .success)
        pipeline.flushToStore()
        #expect(pipeline.droppedBeforeStore == 0)
        #expect(pipeline.store.count == 4000)
    }

    /// Past the bound an event is dropped and counted, and while the writer stays stuck nobody
    /// waits again: 4,000 calls end in far less than 4,000 bounds. Once the writer stores
    /// again, track() has room and drops nothing more.
    @Test func aJournalFullPastTheBoundDropsCountsAndStopsWaiting() throws {
        let (pipeline, held, group, started) = try burstIntoAHeldWriter(fullJournalWait: .milliseconds(200))
        #expect(group.wait(timeout: .now() + 30) == .success, "track() waited for the writer past its bound")
        #expect(ContinuousClock.now - started < .seconds(5))
        let dropped = pipeline.droppedBeforeStore
        #expect(dropped > 0 && dropped < 4000)
        held.signal()
        pipeline.flushToStore()
        #expect(pipeline.store.count + dropped == 4000)
        pipeline.enqueue(event(99))
        pipeline.flushToStore()
        #expect(pipeline.droppedBeforeStore == dropped)
        #expect(pipeline.store.count + dropped == 4001)
    }

    @Test func entriesThatWrapAroundTheRingEndReadBackWhole() throws {
        // A small ring, events of every size up to a third of it: many wrap around its end.
        let pipeline = try pipeline(journalBytes: 64 << 10)
        var expected: [String] = []
        for index in 0..<600 {
            let text = String(repeating: "x", count: (index * 97) % 20_000)
            expected.append(text)
            pipeline.enqueue(
                PendingEvent(name: "e", properties: ["text": .string(text)], timeMilliseconds: 0, method: "code"))
            if index % 2 == 1 { pipeline.flushToStore() }
        }
        pipeline.flushToStore()
        #expect(pipeline.droppedBeforeStore == 0)
        let texts = try pipeline.store.events(limit: 1000).map { stored in
            let event = try #require(
                try JSONSerialization.jsonObject(with: Data(stored.payload.utf8)) as? [String: Any])
            return try #require((event["properties"] as? [String: Any])?["text"] as? String)
        }
        #expect(texts == expected)
    }

    @Test func storedEventsReadBackAsWholeSensorsEvents() throws {
        let pipeline = try pipeline()
        pipeline.enqueue(
            PendingEvent(
                name: "Buy", properties: ["item": "tea", "count": .int(2)], timeMilliseconds: 1234, method: "code"))
        pipeline.setLoginID("user-7", distinctID: "user-7")
        pipeline.enqueue(PendingEvent(name: "$AppEnd", properties: [:], timeMilliseconds: 1300, method: "autoTrack"))
        pipeline.setLoginID(nil, distinctID: "anonymous")
        pipeline.enqueue(PendingEvent(name: "Later", properties: [:], timeMilliseconds: 1400, method: "code"))
        pipeline.flushToStore()
        let stored = try pipeline.store.events()
        #expect(stored.count == 3)
        let events = try stored.map {
            try #require(try JSONSerialization.jsonObject(with: Data($0.payload.utf8)) as? [String: Any])
        }
        let buy = events[0]
        #expect(buy["type"] as? String == "track")
        #expect(buy["event"] as? String == "Buy")
        #expect(buy["time"] as? Int == 1234)
        #expect(buy["event_id"] as? String == stored[0].eventID)
        #expect(buy["session_id"] as? String == "session")
        #expect(buy["distinct_id"] as? String == "anonymous")
        #expect(buy["login_id"] == nil, "tracked before the login, written after it")
        let lib = try #require(buy["lib"] as? [String: Any])
        #expect(lib["$lib"] as? String == "CrashCapture")
        #expect(lib["$lib_method"] as? String == "code")
        #expect(lib["$app_version"] as? String == "1")
        let properties = try #require(buy["properties"] as? [String: Any])
        #expect(properties["k"] as? Int == 1)
        #expect(properties["item"] as? String == "tea")
        #expect(properties["count"] as? Int == 2)
        #expect(properties["$pid"] as? Int == Int(getpid()))
        // After login the same shared text carries the login id; an event without properties of
        // its own is still whole.
        let end = events[1]
        #expect(end["login_id"] as? String == "user-7")
        #expect(end["distinct_id"] as? String == "user-7")
        #expect((end["lib"] as? [String: Any])?["$lib_method"] as? String == "autoTrack")
        // $pid and k shared, and the method among the properties as in `lib`.
        #expect((end["properties"] as? [String: Any])?.count == 3)
        #expect((end["properties"] as? [String: Any])?["$lib_method"] as? String == "autoTrack")
        #expect(events[2]["distinct_id"] as? String == "anonymous")
        #expect(events[2]["login_id"] == nil, "after logout")
        // What is shared is stored once: a row is far smaller than the event it reads back as.
        #expect(pipeline.store.byteCount < stored.reduce(0) { $0 + $1.payload.utf8.count } / 2)
    }

    @Test func theStackWriterWritesWhatTheStringPathWrites() throws {
        let pipeline = try pipeline()
        let events = [
            PendingEvent(name: "plain", properties: [:], timeMilliseconds: 0, method: "code"),
            PendingEvent(
                name: "Buy", properties: ["q\"uote": "a\\b\n\u{1}\u{7f}é😀", "n": .int(-42), "big": .int(Int.max)],
                timeMilliseconds: 1_795_394_899_135, method: "code"),
            PendingEvent(
                name: "mixed",
                properties: [
                    "d": .double(0.1), "e": .double(-1e-300), "t": .bool(true), "f": .bool(false),
                    "list": .strings(["x", "y\"z", ""]), "empty": .strings([]),
                ],
                timeMilliseconds: 7, method: "code"),
            PendingEvent(
                name: "$AppEnd", properties: [:], timeMilliseconds: 9, method: "autoTrack", eventID: "s-end",
                extra: "\"$event_duration\":1.500,\"$app_end_reason\":\"exit\""),
        ]
        for (index, event) in events.enumerated() {
            let number = UInt64(index * 1_234_567 + 1)
            let expected = pipeline.journalText(event, id: event.eventID ?? "session-" + EventPipeline.padded(number))
            let written = withUnsafeTemporaryAllocation(byteCount: 2048, alignment: 8) { buffer in
                var writer = JournalWriter(buffer)
                pipeline.write(event, number: number, into: &writer)
                #expect(!writer.overflow)
                return String(decoding: writer.bytes, as: UTF8.self)
            }
            #expect(written == expected)
        }
        // Too small a buffer says so instead of writing past its end.
        withUnsafeTemporaryAllocation(byteCount: 16, alignment: 8) { buffer in
            var writer = JournalWriter(buffer)
            pipeline.write(events[1], number: 1, into: &writer)
            #expect(writer.overflow && writer.count <= 16)
        }
    }
}
