// The beat, inlined into the app's code: the C library's own inline function (crashcapture.h),
// so that the word's layout is written in one place. This file imports the C module publicly,
// so that an app that inlines beat() can see it; nothing of it is re-exported.
public import CCrashCapture

extension HangWatch {
    /// Progress, in a few nanoseconds: the kernel's coarse clock (read in user space) and this
    /// thread's id, in one relaxed store (`crashcapture_watch_beat`).
    @inlinable
    public func beat() {
        crashcapture_watch_beat(handle)
    }
}
