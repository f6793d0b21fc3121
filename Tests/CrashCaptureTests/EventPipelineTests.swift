import Foundation
import Synchronization
import Testing

@testable import CrashCapture

@Suite struct EventPipelineTests {
    func pipeline(maximumPending: Int) throws -> EventPipeline {
        let store = try EventStore(path: makeTemporaryDirectory("pipeline-unit") + "/events.sqlite")
        let identity = EventPipeline.Identity(sessionID: "session", appVersion: "1", staticProperties: "\"k\":1")
        return EventPipeline(store: store, identity: identity, uploader: nil, maximumPending: maximumPending)
    }

    func event(_ index: Int) -> PendingEvent {
        PendingEvent(name: "e", properties: ["index": .int(index)], timeMilliseconds: 0, method: "code")
    }

    @Test func theLimitCountsEveryQueueTogether() throws {
        let pipeline = try pipeline(maximumPending: 10)
        // Hold the writer so that nothing drains while the queues fill.
        let held = DispatchSemaphore(value: 0)
        pipeline.onWriter { held.wait() }
        let group = DispatchGroup()
        for thread in 0..<4 {
            group.enter()
            Thread {
                for index in 0..<25 { pipeline.enqueue(event(thread * 100 + index)) }
                group.leave()
            }.start()
        }
        group.wait()
        #expect(pipeline.droppedBeforeStore == 90)
        held.signal()
        pipeline.flushToStore()
        #expect(pipeline.store.count == 10)
    }

    @Test func threadsSpreadOverTheQueues() {
        // Threads alive at once, so their control blocks are distinct; the old hash sent every
        // worker thread to the same queue.
        let indexes = Mutex<Set<Int>>([])
        let started = DispatchGroup()
        let release = DispatchSemaphore(value: 0)
        for _ in 0..<8 {
            started.enter()
            Thread {
                indexes.withLock { _ = $0.insert(EventPipeline.shardIndex()) }
                started.leave()
                release.wait()
            }.start()
        }
        started.wait()
        for _ in 0..<8 { release.signal() }
        #expect(indexes.withLock { $0.count } >= 3)
    }
}
