// A hang's report: every other thread frozen by ptrace and unwound as at a crash (the
// machinery of thread_freeze.c and crash_path.c), the locks they wait for read while they are
// held, then the $AppHang event written to a file of its own and flushed, which replay imports
// like a crash file. The process goes on: no signal reaches its threads, and a wait that the
// freeze ended with EINTR is made to run again.
//
// This runs on the watchdog's thread (install/watchdog.c), outside any signal handler, but
// while the other threads are frozen any of them may hold the allocator's or the loader's
// lock: so the rules of crash_path.c apply here too, and CrashPathSymbolTests checks them.
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include "cc_internal.h"
#include "crash_report.h"

static _Atomic uint32_t cc_hang_sequence;
static _Atomic uint32_t cc_hang_files_written;

// MARK: - What each frozen thread waits for

#define CC_FUTEX_TID_MASK 0x3fffffffU

static cc_thread_slot *cc_slot_of_tid(pid_t tid) {
    for (int i = 0; cc_thread_slot_at(i) != NULL; i++)
        if (cc_thread_slot_at(i)->tid == tid) return cc_thread_slot_at(i);
    return NULL;
}

// The owner of the lock a thread waits for in futex(2), where the lock says: a priority-
// inheritance futex holds its owner's id (Swift's Mutex on Linux); a glibc mutex keeps it
// beside the futex word (`__owner`, 8 bytes in), trusted only when the word says locked and
// the id is one of ours. Condition variables and semaphores name no owner.
static pid_t cc_lock_owner(uintptr_t address, long operation) {
    long command = operation & ~(long)(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME);
    const volatile uint32_t *word = (const volatile uint32_t *)address;
    if (command == FUTEX_LOCK_PI || command == 13 /* FUTEX_LOCK_PI2 */) return (pid_t)(*word & CC_FUTEX_TID_MASK);
    if (command != FUTEX_WAIT && command != FUTEX_WAIT_BITSET) return 0;
    if ((address & 3) != 0 || (*word != 1 && *word != 2)) return 0;
    pid_t owner = *(const volatile pid_t *)(address + 8);
    return owner > 0 && cc_slot_of_tid(owner) != NULL ? owner : 0;
}

// Called by the snapshot for each thread while it is held (a fault here is caught there).
static void cc_note_lock_wait(cc_thread_slot *slot) {
#if defined(__x86_64__)
    if (slot->syscall_number != SYS_futex) return;
    uintptr_t address = (uintptr_t)slot->context.uc_mcontext.gregs[REG_RDI];
    long operation = (long)slot->context.uc_mcontext.gregs[REG_RSI];
    pid_t owner = cc_lock_owner(address, operation);
    if (owner == 0 || owner == slot->tid) return;
    slot->waits_for = owner;
    slot->waits_on_lock = address;
#else
    (void)slot;
#endif
}

// Whether `slot` is on a cycle of threads each waiting for a lock the next one holds.
static bool cc_in_deadlock(const cc_thread_slot *slot) {
    const cc_thread_slot *at = slot;
    for (int steps = 0; steps < CC_MAX_THREADS && at != NULL && at->waits_for != 0; steps++) {
        at = cc_slot_of_tid(at->waits_for);
        if (at == slot) return true;
    }
    return false;
}

// MARK: - The event

// `-hang-<n>`, or `-hang-<n>-end`: what follows the session id in a hang's event ids and files.
static void cc_append_hang_suffix(cc_buf *b, uint32_t sequence, bool end) {
    cc_buf_append_str(b, "-hang-");
    cc_buf_append_u64(b, sequence);
    if (end) cc_buf_append_str(b, "-end");
}

// The event id suffix as a string, for cc_append_event_head.
static const char *cc_hang_suffix(char *out, size_t cap, uint32_t sequence, bool end) {
    cc_buf b = {out, 0, cap - 1, false};
    cc_append_hang_suffix(&b, sequence, end);
    out[b.len] = '\0';
    return out;
}

static void cc_append_hang_id(cc_buf *b, uint32_t sequence) {
    cc_buf_append_str(b, cc_global.session_id);
    cc_append_hang_suffix(b, sequence, false);
}

// Whether any thread is on a cycle of lock waits.
static bool cc_any_deadlock(void) {
    for (int i = 0; cc_thread_slot_at(i) != NULL; i++)
        if (cc_in_deadlock(cc_thread_slot_at(i))) return true;
    return false;
}

static size_t cc_build_hang_event(char *out, size_t cap, const crashcapture_hang_request *request,
                                  uint32_t sequence, int64_t time_ms, const cc_thread_slot *hung, bool deadlock,
                                  int64_t held_ns, int64_t entry_ns) {
    cc_buf b = {out, 0, cap, false};
    size_t limit = cap > 4096 ? cap - 4096 : 0;
    char suffix[32];
    cc_append_event_head(&b, "$AppHang", cc_hang_suffix(suffix, sizeof(suffix), sequence, false), time_ms);
    cc_buf_append_str(&b, ",\"hang_id\":\"");
    cc_append_hang_id(&b, sequence);
    cc_buf_append_str(&b, "\",\"hang_watch\":");
    cc_buf_append_json_string(&b, request->watch_name != NULL ? request->watch_name : "", 256);
    cc_buf_append_str(&b, ",\"hang_threshold_ms\":");
    cc_buf_append_i64(&b, request->threshold_ms);
    cc_buf_append_str(&b, ",\"hang_stalled_ms\":");
    cc_buf_append_i64(&b, request->stalled_ms);
    cc_buf_append_str(&b, ",\"hang_deadlock\":");
    cc_buf_append_str(&b, deadlock ? "true" : "false");
    if (hung != NULL) {
        cc_buf_append_str(&b, ",\"hang_tid\":");
        cc_buf_append_i64(&b, hung->tid);
        cc_buf_append_str(&b, ",\"hang_thread_name\":");
        cc_buf_append_json_string(&b, hung->name, sizeof(hung->name));
        cc_buf_append_str(&b, ",\"hang_main_thread\":");
        cc_buf_append_str(&b, hung->tid == getpid() ? "true" : "false");
    }
    // Replay writes the readable reason, with the stacks named; this one needs no symbols.
    cc_buf_append_str(&b, ",\"app_hang_reason\":\"watch ");
    cc_buf_append_json_escaped(&b, request->watch_name != NULL ? request->watch_name : "", 256);
    cc_buf_append_str(&b, " missed its ");
    cc_buf_append_i64(&b, request->threshold_ms);
    cc_buf_append_str(&b, " ms threshold\"");
    cc_buf_append_str(&b, ",\"hang_threads_held_ms\":");
    cc_buf_append_thousandths(&b, held_ns / 1000);
    cc_buf_append_str(&b, ",\"hang_capture_ms\":");
    cc_buf_append_thousandths(&b, (cc_monotonic_ns() - entry_ns) / 1000);
    cc_buf_append_str(&b, "},\"hang\":{");
    cc_append_modules(&b, atomic_load_explicit(&cc_global.module_map, memory_order_acquire), limit);
    cc_buf_append_str(&b, ",\"threads\":[");
    int listed = 0, left_out = 0;
    cc_append_other_threads(&b, limit, hung != NULL ? hung->tid : 0, &listed, &left_out);
    cc_buf_append_str(&b, "]");
    cc_append_threads_summary(&b, listed, left_out);
    if (deadlock) {
        cc_buf_append_str(&b, ",\"deadlock\":[");
        bool first = true;
        for (int i = 0; cc_thread_slot_at(i) != NULL; i++) {
            const cc_thread_slot *slot = cc_thread_slot_at(i);
            if (!cc_in_deadlock(slot)) continue;
            if (!first) cc_buf_append_str(&b, ",");
            first = false;
            cc_buf_append_str(&b, "{\"tid\":");
            cc_buf_append_i64(&b, slot->tid);
            cc_buf_append_str(&b, ",\"waits_for\":");
            cc_buf_append_i64(&b, slot->waits_for);
            cc_buf_append_str(&b, ",\"lock\":");
            cc_buf_append_quoted_hex(&b, slot->waits_on_lock);
            cc_buf_append_str(&b, "}");
        }
        cc_buf_append_str(&b, "]");
    }
    cc_buf_append_str(&b, "}}");
    return b.overflow ? 0 : b.len;
}

static size_t cc_build_hang_end_event(char *out, size_t cap, const char *watch_name, uint32_t sequence,
                                      int64_t duration_ms) {
    cc_buf b = {out, 0, cap, false};
    char suffix[40];
    cc_append_event_head(&b, "$AppHangEnd", cc_hang_suffix(suffix, sizeof(suffix), sequence, true), cc_wall_ms());
    cc_buf_append_str(&b, ",\"hang_id\":\"");
    cc_append_hang_id(&b, sequence);
    cc_buf_append_str(&b, "\",\"hang_watch\":");
    cc_buf_append_json_string(&b, watch_name != NULL ? watch_name : "", 256);
    cc_buf_append_str(&b, ",\"hang_duration_ms\":");
    cc_buf_append_i64(&b, duration_ms);
    cc_buf_append_str(&b, ",\"$event_duration\":");
    cc_buf_append_thousandths(&b, duration_ms);
    cc_buf_append_str(&b, "}}");
    return b.overflow ? 0 : b.len;
}

// MARK: - The file

// `crash-<session>-hang-<n>[-end].ccr`: the crash file's format and prefix, so that replay,
// `crashcap list` and the directory's bound treat it as one.
static bool cc_hang_file_name(char *out, size_t cap, uint32_t sequence, bool end) {
    cc_buf b = {out, 0, cap - 1, false};
    cc_buf_append_str(&b, CCF_FILE_PREFIX);
    cc_buf_append_str(&b, cc_global.session_id);
    cc_append_hang_suffix(&b, sequence, end);
    cc_buf_append_str(&b, "." CCF_FILE_EXTENSION);
    out[b.len] = '\0';
    return !b.overflow;
}

// The session record and `event` (framed in place: its payload at out + 16), made durable
// under `name`: written unnamed, linked in, flushed (on ext4 the file's flush makes its new name
// durable too; elsewhere the directory is flushed). 0 or an errno value.
static int cc_write_hang_file(const char *name, char *event, size_t payload) {
    cc_frame_in_place(event, CCF_RECORD_EVENT, payload);
    size_t framed = CCF_RECORD_HEADER_SIZE + payload;
    struct rlimit fsize;
    if (getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY &&
        fsize.rlim_cur < cc_global.session_record_len + framed)
        return EFBIG;  // past the limit the write would raise SIGXFSZ and end the process
    int dir = cc_global.dir_fd;
    bool named_at_once = false;
    int fd = openat(dir, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
    char temporary[128];
    cc_buf t = {temporary, 0, sizeof(temporary) - 1, false};
    cc_buf_append_str(&t, ".");
    cc_buf_append_str(&t, name);
    cc_buf_append_str(&t, ".tmp");
    temporary[t.len] = '\0';
    if (fd < 0) {
        named_at_once = true;
        fd = openat(dir, temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) return errno;
    }
    int err = 0;
    if (cc_write_all(fd, cc_global.session_record, cc_global.session_record_len) != 0 ||
        cc_write_all(fd, event, framed) != 0)
        err = errno != 0 ? errno : EIO;
    if (err == 0 && !named_at_once) {
        char proc[64];
        cc_buf p = {proc, 0, sizeof(proc) - 1, false};
        cc_buf_append_str(&p, "/proc/self/fd/");
        cc_buf_append_u64(&p, (uint64_t)fd);
        proc[p.len] = '\0';
        if (linkat(AT_FDCWD, proc, dir, name, AT_SYMLINK_FOLLOW) != 0) err = errno;
    }
    if (err == 0 && (named_at_once ? fdatasync(fd) : fsync(fd)) != 0) err = errno;
    // Linked under its name, then the temporary name removed (rename is not among the calls the
    // crash path's rules allow; link and unlink are).
    if (err == 0 && named_at_once && linkat(dir, temporary, dir, name, 0) != 0) err = errno;
    if (err == 0 && (named_at_once || !cc_global.fsync_covers_new_name) && fsync(dir) != 0) err = errno;
    close(fd);
    if (named_at_once) unlinkat(dir, temporary, 0);
    return err;
}

// MARK: - Entry points (install/watchdog.c)

int cc_capture_hang(const crashcapture_hang_request *request, crashcapture_hang_result *result) {
    int64_t entry_ns = cc_monotonic_ns();
    memset(result, 0, sizeof(*result));
    if (!atomic_load(&cc_global.installed)) return ENODEV;
    if (cc_global.over_bound) return ENOSPC;  // the directory held all the reports it may
    if (atomic_load(&cc_hang_files_written) >= CC_MAX_HANG_REPORTS) return EDQUOT;
    pid_t self = (pid_t)syscall(SYS_gettid);
    if (cc_hang_snapshot_begin(self) != 0) return EBUSY;
    char *record = NULL;
    size_t cap = 0;
    int64_t held = cc_hang_snapshot_threads(self, cc_note_lock_wait, &record, &cap);
    const cc_thread_slot *hung = NULL;
    for (int i = 0; request->watched_thread != 0 && cc_thread_slot_at(i) != NULL; i++)
        if (cc_thread_slot_at(i)->thread_pointer == request->watched_thread) hung = cc_thread_slot_at(i);
    uint32_t sequence = atomic_fetch_add(&cc_hang_sequence, 1) + 1;
    bool deadlock = cc_any_deadlock();
    size_t payload = cc_build_hang_event(record + CCF_RECORD_HEADER_SIZE, cap - CCF_RECORD_HEADER_SIZE, request,
                                         sequence, cc_wall_ms(), hung, deadlock, held, entry_ns);
    int err = payload == 0 ? EOVERFLOW : 0;
    if (err == 0 && !cc_hang_file_name(result->file_name, sizeof(result->file_name), sequence, false)) err = ENAMETOOLONG;
    if (err == 0) err = cc_write_hang_file(result->file_name, record, payload);
    if (err == 0) {
        atomic_fetch_add(&cc_hang_files_written, 1);
        result->sequence = sequence;
        result->hung_tid = hung != NULL ? hung->tid : 0;
        result->deadlock = deadlock;
        result->threads_held_ns = held;
        result->total_ns = cc_monotonic_ns() - entry_ns;
    } else {
        result->file_name[0] = '\0';
    }
    cc_hang_snapshot_end();
    return err;
}

int cc_write_hang_end(const char *watch_name, uint32_t sequence, int64_t duration_ms, char *name_out,
                      size_t name_cap) {
    if (!atomic_load(&cc_global.installed)) return ENODEV;
    // Small: a buffer of its own, so that it never waits for a snapshot or a crash.
    static char record[CCF_RECORD_HEADER_SIZE + 16384];
    size_t payload = cc_build_hang_end_event(record + CCF_RECORD_HEADER_SIZE, sizeof(record) - CCF_RECORD_HEADER_SIZE,
                                             watch_name, sequence, duration_ms);
    if (payload == 0) return EOVERFLOW;
    if (!cc_hang_file_name(name_out, name_cap, sequence, true)) return ENAMETOOLONG;
    return cc_write_hang_file(name_out, record, payload);
}
