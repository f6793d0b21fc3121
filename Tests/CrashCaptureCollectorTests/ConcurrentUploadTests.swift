import CrashCaptureCollector
import Foundation
import TestSupport
import Testing

@testable import CrashCapture

/// Many apps uploading at once through a faulty network: every event arrives exactly once,
/// and each app's events in the order it tracked them.
@Suite struct ConcurrentUploadTests {
    @Test func twentyUploadersThroughFaultsDeliverEveryEventOnce() throws {
        // Dropped connections, 503s and slow answers, spread over everyone's first requests.
        let collector = try CollectorProcess([
            "--drop-first", "8", "--fail-first", "12", "--fail-status", "503", "--delay-ms", "5",
        ])
        let uploaders = try (0..<20).map { app -> Uploader in
            let store = try EventStore(path: makeTemporaryDirectory("uploader-\(app)") + "/events.sqlite")
            _ = try store.insert(
                (0..<120).map { index in
                    (
                        id: "a\(app)-\(index)",
                        payload:
                            #"{"type":"track","distinct_id":"u","time":1700000000000,"event_id":"a\#(app)-\#(index)","event":"e","properties":{"i":\#(index)}}"#
                    )
                })
            var options = UploadOptions()
            options.retryBaseDelay = .milliseconds(50)
            options.retryMaximumDelay = .milliseconds(200)
            options.requestTimeout = .seconds(5)
            return try Uploader(endpoint: URL(string: collector.url)!, store: store, options: options)
        }
        DispatchQueue.concurrentPerform(iterations: uploaders.count) { index in
            uploaders[index].flushNow(deadline: Date().addingTimeInterval(60))
        }
        let ids = try collector.events().compactMap { $0["event_id"] as? String }
        #expect(ids.count == 20 * 120, "\(ids.count) events")
        #expect(Set(ids).count == ids.count, "none twice")
        for app in 0..<20 {
            let mine = ids.filter { $0.hasPrefix("a\(app)-") }.map { Int($0.split(separator: "-")[1])! }
            #expect(mine == Array(0..<120), "app \(app)'s events in order")
        }
        #expect(uploaders.reduce(0) { $0 + $1.statistics.failedAttempts } >= 20, "the faults were met")
    }

    /// A 503 with Retry-After: 2 holds the next attempt back 2 s, though our own backoff would
    /// have tried again after 50 ms.
    @Test func retryAfterIsHonoured() throws {
        let collector = try CollectorProcess(["--fail-first", "1", "--fail-status", "503", "--retry-after", "2"])
        let store = try EventStore(path: makeTemporaryDirectory("retry-after") + "/events.sqlite")
        _ = try store.insert([
            (
                id: "r1",
                payload:
                    #"{"type":"track","distinct_id":"u","time":1700000000000,"event_id":"r1","event":"e","properties":{}}"#
            )
        ])
        var options = UploadOptions()
        options.retryBaseDelay = .milliseconds(50)
        options.retryMaximumDelay = .seconds(10)
        let uploader = try Uploader(endpoint: URL(string: collector.url)!, store: store, options: options)
        let start = Date()
        uploader.flushNow(deadline: Date().addingTimeInterval(20))
        let elapsed = Date().timeIntervalSince(start)
        #expect(uploader.statistics.failedAttempts == 1)
        #expect(
            uploader.statistics.lastError?.contains("retry after 2 s") == true, "\(uploader.statistics.lastError ?? "")"
        )
        #expect(elapsed >= 2 && elapsed < 10, "waited \(elapsed) s")
        #expect(try collector.events().count == 1)
    }
}
