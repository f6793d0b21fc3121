public import CrashCapture
public import NIOCore

/// A hang watch on every event loop of a group, each beaten by a task the loop itself runs
/// four times per threshold: a loop blocked by a synchronous call in a handler (a `sleep`, a
/// blocking read, a lock) misses its beats, and its hang is reported with every thread's stack,
/// the loop's thread marked `hung`.
public final class EventLoopWatches: Sendable {
    /// One per loop, in the group's order, named `<name>-<index>`.
    public let watches: [HangWatch]
    private let beats: [RepeatedTask]

    init(watches: [HangWatch], beats: [RepeatedTask]) {
        self.watches = watches
        self.beats = beats
    }

    /// The loops are no longer watched.
    public func stop() {
        for beat in beats { beat.cancel() }
        for watch in watches { watch.stop() }
    }
}

extension EventLoopGroup {
    /// Watches every loop of this group (see ``EventLoopWatches``). Before
    /// `CrashCapture.install`, the watches do nothing.
    public func watchEventLoops(threshold: Duration = .seconds(1), name: String = "event-loop") -> EventLoopWatches {
        let (seconds, attoseconds) = threshold.components
        let nanoseconds = seconds * 1_000_000_000 + attoseconds / 1_000_000_000
        let every = TimeAmount.nanoseconds(max(1_000_000, nanoseconds / 4))
        var watches: [HangWatch] = []
        var beats: [RepeatedTask] = []
        for (index, loop) in makeIterator().enumerated() {
            let watch = CrashCapture.watch(name: "\(name)-\(index)", threshold: threshold)
            beats.append(loop.scheduleRepeatedTask(initialDelay: .zero, delay: every) { _ in watch.beat() })
            watches.append(watch)
        }
        return EventLoopWatches(watches: watches, beats: beats)
    }
}
