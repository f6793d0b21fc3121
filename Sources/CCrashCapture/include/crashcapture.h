// CrashCapture C API.
//
// Install once, early, from any thread:
//
//     crashcapture_config config = { .directory = "/var/lib/myapp/crashes",
//                                    .app_name = "myapp", .app_version = "1.4.2" };
//     if (crashcapture_install(&config) != 0)
//         fprintf(stderr, "crash capture off: %s\n", crashcapture_last_error());
//
// After that, a SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE, SIGTRAP or SIGSYS (or an uncaught C++
// exception, which ends in SIGABRT) leaves a checksummed crash file, flushed to disk, in the
// directory, and the process still dies of the same signal, with every handler that was
// installed before us still called.
#ifndef CRASHCAPTURE_H
#define CRASHCAPTURE_H

#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CRASHCAPTURE_VERSION "0.1.0"

// The shared libraries are built with hidden visibility: only this API (and the
// pthread_create interposer) is exported, so two copies in one process never mix state.
#define CRASHCAPTURE_API __attribute__((visibility("default")))

/// A static property attached to every event of this process. Keys follow the Sensors
/// Analytics rules (letters, digits, `_` and `$`, not starting with a digit, at most 100
/// bytes, no `$` prefix and no reserved name), each named once; values are UTF-8 text (strict:
/// no overlong forms, surrogates or code points past U+10FFFF) of at most 8191 bytes.
typedef struct crashcapture_property {
    const char *key;
    const char *value;
} crashcapture_property;

typedef struct crashcapture_config {
    /// Where crash files and the distinct id live. Created 0700 if missing (its parent must
    /// exist), and made 0700 if others could read it; a symlink, a directory writable by
    /// everyone, one owned by another user, or a path that is not valid UTF-8 is refused. A
    /// relative path is made absolute against the working directory at install.
    const char *directory;
    const char *app_name;
    const char *app_version;
    /// NULL: a random id persisted in `<directory>/distinct_id`.
    const char *distinct_id;
    const crashcapture_property *properties;
    size_t property_count;
    /// For language bindings that validate typed values themselves: the members of a JSON
    /// object (`"k":1,"s":"v"`, no braces), appended after `properties`. NULL for none. Read
    /// strictly at install, which fails on anything else: not JSON (a trailing comma, a bad
    /// escape, a control character, text that is not strict UTF-8), a key by other rules than
    /// `properties`' or named twice (here or there), a value that is not text (at most 8191
    /// bytes), a number, true, false or a list of at most 500 texts.
    const char *prevalidated_properties_json;
    /// Bytes reserved on disk for the crash report at install. 0: the default (960 KiB, which
    /// holds most reports whole; a larger one that finds no room past it is made to fit).
    size_t reserved_bytes;
    /// Nonzero: no line on stderr at a crash. By default one line (signal, code, fault address,
    /// thread, top frame, the report's path) is written there, so that container logs show the
    /// crash even when the capture directory is lost.
    int no_crash_line;
    /// Nonzero: the report's command line holds the program only, not its arguments (which may
    /// carry secrets). The environment is never recorded.
    int omit_arguments;
    /// The crash directory's bound: when it already holds this many crash files (0: 64), or
    /// crash and session files of this many bytes (0: 256 MiB), a crash keeps no report of its
    /// own. The oldest unreplayed reports are kept; the session file notes the crash's signal,
    /// and replay imports it as a compact $AppCrashed (`crash_not_kept`).
    size_t maximum_crash_files;
    size_t maximum_crash_bytes;
} crashcapture_config;

/// Installs the handlers. Returns 0, or -1 with crashcapture_last_error() set; a second
/// call while installed returns 0 and changes nothing with the same directory, and fails with
/// another one.
CRASHCAPTURE_API int crashcapture_install(const crashcapture_config *config);

/// Restores the signal dispositions we replaced (unless someone replaced ours since), the
/// previous C++ terminate handler, and removes this session's crash file.
CRASHCAPTURE_API void crashcapture_uninstall(void);

CRASHCAPTURE_API int crashcapture_is_installed(void);

/// Tracks an event: `event` (a name by the property-key rules) with `count` text properties,
/// in the Sensors Analytics data model, as the Swift SDK's track() does. The event is in the
/// session file's journal when this returns, so it survives any death of the process; a C
/// program has no event store, so its events wait there for `crashcap replay` or `crashcap
/// watch` (the session file stays after a normal exit when it holds events). Never blocks: once
/// the journal (256 KiB, about 1,000 events) is full, events are dropped and counted. 0, or -1
/// with crashcapture_last_error() set; refused, with nothing tracked, is what the collector would
/// refuse: a key given twice, or named as a static property, a value that is not strict UTF-8.
CRASHCAPTURE_API int crashcapture_track(const char *event, const crashcapture_property *properties, size_t count);

/// Context for the report of a crash: `key` (the rules of a property key) set to the text
/// `value`, or removed with NULL. Kept in the session file as it changes, so a crash costs
/// nothing more; a replayed $AppCrashed carries them as `crash_context`. 0, or -1 with
/// crashcapture_last_error() set (not installed, a bad key, more than 4 KiB of context).
CRASHCAPTURE_API int crashcapture_set_context(const char *key, const char *value);

/// A breadcrumb for the report of a crash: a line of text (at most 232 bytes are kept) with
/// the time. The last 64 are kept in the session file; a replayed $AppCrashed lists them
/// among `crash_breadcrumbs`, in time order with the last events. 0, or -1 if not installed.
CRASHCAPTURE_API int crashcapture_add_breadcrumb(const char *message);

/// At a crash, the last `max_bytes` (at most 65536) of the file at `path` (a log file, say)
/// are copied into the report (`attachments`). Up to 4 files; the file is opened only at the
/// crash, so it may be rotated or appear later. 0, or -1 with crashcapture_last_error() set.
CRASHCAPTURE_API int crashcapture_attach_file(const char *path, size_t max_bytes);

/// Text of the last failure of crashcapture_install, for this process.
CRASHCAPTURE_API const char *crashcapture_last_error(void);

/// Gives the calling thread an alternate signal stack with a guard page, so a stack overflow
/// on it is captured. Threads created after install get one automatically; call this on
/// threads that existed before. Returns 0 or -1 (errno set).
CRASHCAPTURE_API int crashcapture_install_thread_stack(void);

/// Re-reads the list of loaded modules (path, address range, GNU build-id) used to place
/// frames. Modules loaded later are also found at crash time, so calling this is optional.
CRASHCAPTURE_API int crashcapture_refresh_modules(void);

/// Path of this session's crash file, or NULL when not installed.
CRASHCAPTURE_API const char *crashcapture_crash_file_path(void);

/// The session id, 32 hex digits, or NULL when not installed. Event ids are derived from it.
CRASHCAPTURE_API const char *crashcapture_session_id(void);

/// The distinct id in use, or NULL when not installed.
CRASHCAPTURE_API const char *crashcapture_distinct_id(void);

/// The $AppStart moment: wall clock in ms since the epoch and CLOCK_MONOTONIC in ns.
CRASHCAPTURE_API int64_t crashcapture_start_wall_ms(void);
CRASHCAPTURE_API int64_t crashcapture_start_monotonic_ns(void);

/// The static event properties as JSON object members (no braces), as written into reports.
CRASHCAPTURE_API const char *crashcapture_static_properties_json(void);

/// 1 when stacks come from libunwind, 0 when libunwind could not be loaded and stacks are
/// walked through frame pointers only.
CRASHCAPTURE_API int crashcapture_has_libunwind(void);

/// Marks the session as ended normally: the crash file and the session file are removed. Called automatically at
/// exit(); a later crash of this process (from an atexit handler) is still captured.
CRASHCAPTURE_API void crashcapture_end_session(void);

/// Whether a crash is being reported (or was). A thread other than the crashing one waits here until the process
/// dies of the crash (at most 30 s) before it returns 1: an exit path calls this first and, on 1, deletes nothing
/// and ends no session. 0: no crash.
CRASHCAPTURE_API int crashcapture_crash_in_progress(void);

/// Records that the session is still alive. A session killed without a crash (SIGKILL, the
/// OOM killer) is closed at the next replay with an $AppEnd whose duration runs up to the last
/// such call (install counts as one). Two stores into a shared mapping: cheap enough for any
/// main loop. The Swift SDK calls it every 2 s by itself.
CRASHCAPTURE_API void crashcapture_session_alive(void);

/// Replaces the C-level distinct id (after a login), so crash reports carry it too.
/// Returns 0, or -1 when the id is not 1 to 255 printable bytes without quotes or backslashes.
CRASHCAPTURE_API int crashcapture_set_distinct_id(const char *distinct_id);

/// For SIGTERM and SIGINT still at their default action: install a handler that writes the
/// signal number to a pipe and returns the pipe's read end (or -1). The caller records the
/// session's end, then calls crashcapture_finish_termination(signo) to die by that signal.
CRASHCAPTURE_API int crashcapture_watch_termination(void);
CRASHCAPTURE_API void crashcapture_finish_termination(int signo);

/// MARK: Hangs
///
/// A watch: code that must make progress (an event loop, a worker, a main loop) beats it at
/// least once per threshold. A watchdog thread of ours sleeps until the earliest moment a watch
/// could miss its threshold; when one does, it writes a hang report: every other thread's stack,
/// taken by freezing the threads with ptrace for about a millisecond (no signal reaches them; a
/// wait the freeze ends with EINTR runs again), as a file of its own beside the crash file
/// (`crash-<session>-hang-<n>.ccr`, flushed), which replay imports as an `$AppHang` event. When
/// the watch beats again, `$AppHangEnd` follows with the duration.
typedef struct crashcapture_watch {
    /// Written by crashcapture_watch_beat only: the beating thread's pthread_self() over 16 in
    /// the high 47 bits; in the low 17, CLOCK_MONOTONIC_COARSE as seconds times 1024 plus
    /// 2^20-ns units within the second.
    uint64_t beat;
} crashcapture_watch;

/// A watch named `name` (at most 63 bytes kept) with a threshold of `threshold_ms` (10 ms to
/// 60 s; held to those bounds). Never NULL: before install, after uninstall, or with 256
/// watches already, a watch that nothing checks. A watch whose last beat came from a thread
/// that has since ended (without crashcapture_watch_stop) is not reported as hung: it is no
/// longer checked, which the listener hears once (a CRASHCAPTURE_HANG notice, error ESRCH),
/// until a living thread beats it again.
CRASHCAPTURE_API crashcapture_watch *crashcapture_watch_start(const char *name, int64_t threshold_ms);

/// 1 when the watchdog checks the watch, 0 for one that nothing checks.
CRASHCAPTURE_API int crashcapture_watch_is_checked(const crashcapture_watch *watch);

/// The watch is no longer checked; its memory is reused by a later watch, so stop it once.
CRASHCAPTURE_API void crashcapture_watch_stop(crashcapture_watch *watch);

/// Progress, in a few nanoseconds: the kernel's coarse clock (read in user space, through the
/// vDSO) and this thread's id, in one relaxed store. The time lets the watchdog sleep until a
/// watch could be late instead of waking to look; the thread names the hung one in a report.
static inline void crashcapture_watch_beat(crashcapture_watch *watch) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    // Seconds times 1024 and 2^20-ns units within the second (0 to 953): no multiplication.
    uint64_t units = ((uint64_t)now.tv_sec << 10) | ((uint64_t)now.tv_nsec >> 20);
#if defined(__x86_64__)
    // glibc's pthread_self() is the thread pointer on x86_64: read without a call.
    uintptr_t thread = (uintptr_t)__builtin_thread_pointer();
#else
    uintptr_t thread = (uintptr_t)pthread_self();
#endif
    __atomic_store_n(&watch->beat, (((uint64_t)thread >> 4) << 17) | (units & 0x1ffff), __ATOMIC_RELAXED);
}

enum { CRASHCAPTURE_HANG = 1, CRASHCAPTURE_HANG_END = 2 };

/// What the watchdog did, for a listener (the Swift SDK imports the files at once).
typedef struct crashcapture_hang_notice {
    int kind;                // CRASHCAPTURE_HANG or CRASHCAPTURE_HANG_END
    const char *watch_name;
    const char *file_name;   // in the capture directory; "" when none was written
    int error;               // 0, or the errno value that kept the file from being written
    int64_t stalled_ms;      // no beat for this long when the hang was declared
    int64_t duration_ms;     // CRASHCAPTURE_HANG_END: from the last beat before the hang to the first after
    int hung_tid;            // the watched thread among the frozen ones; 0: not found
    int deadlock;            // threads were found waiting in a cycle for each other's locks
    int64_t threads_held_ns; // how long the other threads were frozen
    int64_t total_ns;        // from the hang's detection to its report durable
} crashcapture_hang_notice;

/// Called on the watchdog's thread after each hang report and hang end; NULL: none. It must
/// return quickly: every watch waits for it.
CRASHCAPTURE_API void crashcapture_watchdog_set_listener(void (*listener)(const crashcapture_hang_notice *notice));

#ifdef __cplusplus
}
#endif

#endif
