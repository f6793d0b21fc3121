public import CCrashCapture
internal import CrashFileFormat
internal import Dispatch
internal import Foundation
internal import Logging
internal import Synchronization

#if canImport(Glibc)
    internal import Glibc
#endif

/// A watch on code that must keep making progress: an event loop, a worker's loop, a main
/// queue. The watched code calls ``beat()`` more often than the threshold; when no beat comes
/// for a whole threshold, CrashCapture's watchdog thread writes an `$AppHang` report with every
/// thread's stack (the thread that beat last marked `hung`), taken by freezing the threads for
/// about a millisecond without a signal, and `$AppHangEnd` with the hang's duration once the
/// watch beats again. The report is a file beside the crash file, flushed, so that a hang that
/// ends in a SIGKILL is still reported at the next start; a live process imports it at once.
///
/// Dropping the last reference stops the watch.
public final class HangWatch: @unchecked Sendable {
    // @unchecked: `handle` points into the C library's table of watches, which lives as long as
    // the process, and a beat is one atomic store there; `onStop` is set once, at init, and run
    // once, behind `stopped`.
    /// The name given; it names the watch in the report (`hang_watch`).
    public let name: String
    /// How long the watched code may go without a beat before it counts as hung.
    public let threshold: Duration
    /// False for a watch that nothing checks: made before install, after a failed one, or past
    /// 256 watches.
    public let isActive: Bool
    @usableFromInline let handle: UnsafeMutablePointer<crashcapture_watch>
    private let onStop: (() -> Void)?
    /// Once stopped, the C library may give the watch's slot to another watch: a second stop
    /// (an explicit one, then the release) must not stop that one.
    private let stopped = Atomic<Bool>(false)

    init(name: String, threshold: Duration, onStop: (() -> Void)? = nil) {
        self.name = name
        self.threshold = threshold
        if CrashCapture.isInstalled { HangReports.listen() }
        handle = crashcapture_watch_start(name, HangReports.milliseconds(threshold))
        isActive = crashcapture_watch_is_checked(handle) != 0
        self.onStop = onStop
    }

    /// No longer checked. Also done when the watch is released.
    public func stop() {
        guard !stopped.exchange(true, ordering: .relaxed) else { return }
        onStop?()
        crashcapture_watch_stop(handle)
    }

    deinit { stop() }
}

extension CrashCapture {
    /// A watch that the code it names must beat within every `threshold` (at least 10 ms).
    /// Never throws: before ``install(_:)``, after a failed one, or past 256 watches, the watch
    /// does nothing (``HangWatch/isActive`` is false).
    public static func watch(name: String, threshold: Duration) -> HangWatch {
        HangWatch(name: name, threshold: threshold)
    }

    /// The main queue, beaten by a timer on it four times per `threshold`: for apps that run
    /// the main queue (`RunLoop.main.run()`, `dispatchMain()`); in any other app it would be
    /// reported hung, since nothing runs it. Under `dispatchMain()` on Linux the main thread
    /// ends and the queue runs on whichever Dispatch worker is free: the report then marks the
    /// worker that ran the last beat, which may not be the one that blocks (every thread's stack
    /// is in the report all the same).
    public static func watchMainQueue(threshold: Duration = .seconds(2)) -> HangWatch {
        let timer = DispatchSource.makeTimerSource(queue: .main)
        let watch = HangWatch(name: "main-queue", threshold: threshold) { timer.cancel() }
        let quarter = max(1, Int(HangReports.milliseconds(threshold) / 4))
        timer.schedule(deadline: .now(), repeating: .milliseconds(quarter))
        timer.setEventHandler { [weak watch] in watch?.beat() }
        timer.resume()
        return watch
    }
}

/// What the watchdog reports, taken into the event store: a hang's file imported (names on
/// every frame) as soon as it is written, and its end's.
enum HangReports {
    private static let queue = DispatchQueue(label: "CrashCapture.hangs")

    static func milliseconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return max(0, seconds * 1000 + attoseconds / 1_000_000_000_000_000)
    }

    static func listen() {
        crashcapture_watchdog_set_listener { notice in
            guard let notice else { return }
            HangReports.noticed(notice.pointee)
        }
    }

    static func noticed(_ notice: crashcapture_hang_notice) {
        let watch = String(cString: notice.watch_name)
        let file = String(cString: notice.file_name)
        let logger = CrashCapture.logger
        if notice.error == ESRCH {
            logger.warning(
                "watch no longer checked: the thread that beat it has ended without stop()",
                metadata: ["watch": "\(watch)"])
        } else if notice.error != 0 {
            logger.error(
                "hang report not written",
                metadata: ["watch": "\(watch)", "problem": "\(String(cString: strerror(notice.error)))"])
        } else if notice.kind == Int32(CRASHCAPTURE_HANG) {
            logger.warning(
                "hang: a watch missed its threshold",
                metadata: [
                    "watch": "\(watch)", "stalled_ms": "\(notice.stalled_ms)", "thread": "\(notice.hung_tid)",
                    "deadlock": "\(notice.deadlock != 0)", "report": "\(file)",
                ])
        } else {
            logger.notice("hang ended", metadata: ["watch": "\(watch)", "duration_ms": "\(notice.duration_ms)"])
        }
        let target = CrashCapture.state.withLock { (CrashCapture.state.hangReplayer, CrashCapture.state.pipeline) }
        guard !file.isEmpty, let replayer = target.0 else { return }
        let uploader = target.1?.uploader
        queue.async {
            let result = replayer.replay(replayer.directory + "/" + file)
            if result.outcome == .damaged {
                logger.error("hang report could not be imported", metadata: ["file": "\(file)"])
            }
            uploader?.requestFlush()
        }
    }
}
