internal import Foundation

#if canImport(Glibc)
    internal import Glibc
#endif

/// A write past `RLIMIT_FSIZE` raises SIGXFSZ, whose default action kills the process: a
/// library must not end the program it serves because the program (or its shell) set a small
/// file-size limit. Our own file writes (SQLite's among them) run with the signal blocked on
/// their thread; a write past the limit then fails with EFBIG, which the caller reports, and
/// the signal it left pending is taken before the thread's mask is put back.
enum FileSizeSignal {
    static func blocked<T>(_ body: () throws -> T) rethrows -> T {
        let saved = block()
        defer { restore(saved) }
        return try body()
    }

    static func block() -> sigset_t {
        var signal = only()
        var saved = sigset_t()
        pthread_sigmask(SIG_BLOCK, &signal, &saved)
        return saved
    }

    static func restore(_ saved: sigset_t) {
        var saved = saved
        guard sigismember(&saved, SIGXFSZ) == 0 else { return }  // blocked before us: left as it was
        var pending = sigset_t()
        var signal = only()
        if sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ) == 1 {
            var now = timespec()
            _ = sigtimedwait(&signal, nil, &now)
        }
        pthread_sigmask(SIG_SETMASK, &saved, nil)
    }

    private static func only() -> sigset_t {
        var set = sigset_t()
        sigemptyset(&set)
        sigaddset(&set, SIGXFSZ)
        return set
    }
}

/// The store's lock: one thread in the database at a time, with SIGXFSZ blocked while it is.
/// A store opened in the background holds the gate shut until it is open: every `lock()`
/// waits at it first (once open, the wait is one atomic read).
final class StoreLock: @unchecked Sendable {  // `saved` is touched only while `mutex` is held
    private let mutex = NSLock()
    private var saved = sigset_t()
    private let gate = DispatchGroup()

    func lock() {
        gate.wait()
        lockPastTheGate()
    }

    /// For the opener, which works behind the shut gate.
    func lockPastTheGate() {
        mutex.lock()
        saved = FileSizeSignal.block()
    }

    func shutGate() { gate.enter() }
    func openGate() { gate.leave() }

    func unlock() {
        FileSizeSignal.restore(saved)
        mutex.unlock()
    }
}
