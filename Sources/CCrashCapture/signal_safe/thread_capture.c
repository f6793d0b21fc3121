// Every other thread of the crashing process, for the report: listed from /proc/self/task
// and frozen, its context in a slot prepared here, so that the crashing thread can unwind it
// while its stack holds still. Frozen with ptrace by a helper (thread_freeze.c) where the
// system allows it; else each thread is asked by a real-time signal reserved at install to
// save its context and wait in its handler until the process dies. The rules of crash_path.c
// apply: signal-safe calls only, nothing allocated, every wait bounded. A thread that is not
// captured (exited, stuck in the kernel, blocking every signal under the fallback) is still
// listed, with its name and why.
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "cc_internal.h"

static cc_thread_slot cc_slots[CC_MAX_THREADS];
static char cc_task_entries[8192];  // /proc/self/task, listed
static int cc_slot_count;
static int cc_threads_total;      // every thread /proc/self/task listed, the crashing one included
static _Atomic int cc_capture_open;  // the capture handler answers only while this is set
static _Atomic uint32_t cc_release_word;  // futex word: 1 once the captured threads may go on
static _Atomic uint32_t cc_answer_word;  // futex word: counts the answers; the last one wakes the asker
static _Atomic uint32_t cc_asked_count;  // the threads a signal reached (UINT32_MAX while still asking)
static int64_t cc_answer_deadline_ns;
static int cc_task_dir = -1;  // /proc/self/task while the threads are described
static int cc_freeze_method;  // enum cc_freeze_method
static const char *cc_freeze_note;  // why the fallback was taken

#define CC_WAITING_CRASHERS 64

// Threads that crashed while another was reporting wait in the crash handler with every
// other signal blocked: they are named as such instead of "did not answer".
static _Atomic pid_t cc_waiting_crashers[CC_WAITING_CRASHERS];
static bool cc_is_waiting_crasher(pid_t tid);
static int cc_threads_ask_by_signal(void);
static bool cc_blocks_signal(pid_t tid, int signo);

static pid_t cc_thread_gettid(void) { return (pid_t)syscall(SYS_gettid); }

void cc_threads_note_waiting_crasher(pid_t tid) {
    for (int i = 0; i < CC_WAITING_CRASHERS; i++) {
        pid_t none = 0;
        if (atomic_compare_exchange_strong(&cc_waiting_crashers[i], &none, tid)) return;
    }
}

bool cc_thread_crashed_too(pid_t tid) { return cc_is_waiting_crasher(tid); }

static bool cc_is_waiting_crasher(pid_t tid) {
    for (int i = 0; i < CC_WAITING_CRASHERS; i++)
        if (atomic_load(&cc_waiting_crashers[i]) == tid) return true;
    return false;
}

void cc_thread_capture_handler(int signo, siginfo_t *info, void *context) {
    (void)signo;
    int saved_errno = errno;
    // Only our own request during a capture; anyone else's signal is left without effect.
    if (info->si_code != SI_TKILL || info->si_pid != getpid() || !atomic_load(&cc_capture_open)) {
        errno = saved_errno;
        return;
    }
    pid_t self = cc_thread_gettid();
    for (int i = 0; i < cc_slot_count; i++) {
        cc_thread_slot *slot = &cc_slots[i];
        if (slot->tid != self) continue;
        memcpy(&slot->context, context, sizeof(ucontext_t));
        int asked = CC_SLOT_ASKED;
        // Too late (the reporter gave up on us): go on at once.
        if (!atomic_compare_exchange_strong(&slot->state, &asked, CC_SLOT_CAPTURED)) break;
        // Only the last answer wakes the asker: on two cores, a wake-up for each answer took
        // the asker's core from the threads still to answer.
        if (atomic_fetch_add(&cc_answer_word, 1) + 1 >= atomic_load(&cc_asked_count))
            syscall(SYS_futex, &cc_answer_word, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
        // Hold still until released: our stack is being unwound. Bounded (30 s) in case the
        // reporting thread never gets there.
        struct timespec tick = {0, 10 * 1000000};
        for (int waited = 0; waited < 3000 && atomic_load(&cc_release_word) == 0; waited++)
            syscall(SYS_futex, &cc_release_word, FUTEX_WAIT_PRIVATE, 0, &tick, NULL, 0);
        break;
    }
    errno = saved_errno;
}

// Reads a small file of /proc into buf (NUL-terminated); the length read, or 0. `dir`: the
// descriptor `path` is relative to (a relative lookup in /proc/self/task costs a third less
// than the whole path, which counts with hundreds of threads).
static size_t cc_read_proc(int dir, const char *path, char *buf, size_t cap) {
    int fd = openat(dir, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    return (size_t)n;
}

static void cc_task_path(char *out, size_t cap, pid_t tid, const char *leaf) {
    cc_buf b = {out, 0, cap - 1, false};
    cc_buf_append_u64(&b, (uint64_t)tid);
    cc_buf_append_str(&b, "/");
    cc_buf_append_str(&b, leaf);
    out[b.len] = '\0';
}

// Name and run state from one read of stat: "tid (name) S ...". The name may itself hold
// parentheses, so the last ')' ends it.
static void cc_describe_thread(int task_dir, cc_thread_slot *slot) {
    char path[64], text[512];
    slot->run_state = '?';
    cc_task_path(path, sizeof(path), slot->tid, "stat");
    size_t n = cc_read_proc(task_dir, path, text, sizeof(text));
    size_t open = 0, close = 0;
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '(' && open == 0) open = i + 1;
        if (text[i] == ')') close = i;
    }
    if (open == 0 || close < open) return;  // gone: the name read before, if any, stays
    size_t length = close - open < sizeof(slot->name) - 1 ? close - open : sizeof(slot->name) - 1;
    memcpy(slot->name, text + open, length);
    slot->name[length] = '\0';
    if (close + 2 < n) slot->run_state = text[close + 2];
}

static void cc_name_thread(int task_dir, cc_thread_slot *slot) {
    char path[64];
    slot->run_state = '?';
    cc_task_path(path, sizeof(path), slot->tid, "comm");
    size_t n = cc_read_proc(task_dir, path, slot->name, sizeof(slot->name));
    if (n > 0 && slot->name[n - 1] == '\n') slot->name[n - 1] = '\0';
}

// Whether the thread blocks our signal (SigBlk in its status, a hex mask).
static bool cc_blocks_signal(pid_t tid, int signo) {
    char path[64], text[2048];
    cc_task_path(path, sizeof(path), tid, "status");
    size_t n = cc_read_proc(cc_task_dir, path, text, sizeof(text));
    const char *key = "SigBlk:";
    for (size_t i = 0; i + 7 < n; i++) {
        if (memcmp(text + i, key, 7) != 0) continue;
        size_t at = i + 7;
        while (at < n && (text[at] == '\t' || text[at] == ' ')) at++;
        uint64_t mask = 0;
        for (; at < n; at++) {
            char c = text[at];
            int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (digit < 0) break;
            mask = (mask << 4) | (uint64_t)digit;
        }
        return (mask >> (signo - 1)) & 1;
    }
    return false;
}

static const char *cc_why_missed(const cc_thread_slot *slot, int signo) {
    if (cc_is_waiting_crasher(slot->tid)) return "crashed too; waiting in the crash handler";
    switch (slot->run_state) {
    case 'T': return "stopped";
    case 't': return "stopped by a debugger";
    case 'D': return "in an uninterruptible wait in the kernel";
    case 'Z': case 'X': return "exiting";
    default: break;
    }
    if (cc_freeze_method == CC_FROZEN_BY_PTRACE) return "did not stop in time";
    if (cc_blocks_signal(slot->tid, signo)) return "blocks every signal";
    return "did not answer in time";
}

// One entry of /proc/self/task: a slot for each thread but the crashing one, while there are
// slots; every thread of the program counted.
static void cc_list_thread(const char *name, void *crashing) {
    if (name[0] < '0' || name[0] > '9') return;
    pid_t tid = 0;
    for (const char *p = name; *p >= '0' && *p <= '9'; p++) tid = tid * 10 + (*p - '0');
    if (tid == atomic_load(&cc_global.install_rest_leaving)) return;
    cc_threads_total++;
    if (tid == *(pid_t *)crashing || cc_slot_count >= CC_MAX_THREADS) return;
    cc_thread_slot *slot = &cc_slots[cc_slot_count++];
    slot->tid = tid;
    slot->frame_count = 0;
    slot->unwind_faulted = false;
    slot->unwound = false;
    slot->why = NULL;
    slot->name[0] = '\0';
    slot->syscall_number = -1;
    slot->thread_pointer = 0;
    slot->waits_for = 0;
    slot->waits_on_lock = 0;
    slot->task_name[0] = '\0';
    atomic_store(&slot->state, CC_SLOT_ASKED);
}

// Lists the threads (up to CC_MAX_THREADS besides the crashing one; the rest are counted)
// and freezes them; `cc_threads_await` then waits for their contexts until `deadline_ns`
// (CLOCK_MONOTONIC). The crashing thread does its own work in between, while the others are
// stopped on the other cores. Returns the number of slots filled.
int cc_threads_ask(pid_t crashing, int64_t deadline_ns, bool for_hang) {
    cc_answer_deadline_ns = deadline_ns;
    cc_slot_count = 0;
    cc_threads_total = 0;
    cc_freeze_method = CC_FROZEN_BY_NONE;
    cc_freeze_note = NULL;
    int dir = openat(AT_FDCWD, "/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return 0;
    cc_each_name(dir, cc_task_entries, sizeof(cc_task_entries), cc_list_thread, &crashing);
    cc_task_dir = dir;  // kept for the threads that are not captured
    atomic_store(&cc_release_word, 0);
    atomic_store(&cc_answer_word, 0);
    if (cc_slot_count == 0) return 0;
    atomic_store(&cc_asked_count, (uint32_t)cc_slot_count);
    for (int i = 0; i < cc_slot_count; i++) cc_slots[i].in_system_call = -1;
    if ((for_hang || !cc_global.freeze_by_signal_only) &&
        cc_freeze_start(cc_slots, cc_slot_count, &cc_answer_word, for_hang, &cc_freeze_note) == 0) {
        // Named while the helper freezes them, on the other core: reading 256 threads' stat
        // first took 2.5 ms, all of it before the first was stopped. Only the name (comm, which
        // the kernel formats faster than stat); the state comes from the registers, or, for a
        // thread not captured, from its stat read when the wait is over. (Sharing the naming
        // with the helper measured slower: 5.3-5.7 against 4.6-5.0 ms at 256 threads.)
        // The helper's first seizing, which says whether ptrace is allowed, overlaps the naming.
        // A hang's threads are named once they go on again (cc_threads_name): the fewer
        // cycles spent while they are held, the shorter their stall.
        if (!for_hang)
            for (int i = 0; i < cc_slot_count; i++) cc_name_thread(dir, &cc_slots[i]);
        if (cc_freeze_confirm(&cc_freeze_note) == 0) {
            cc_freeze_method = CC_FROZEN_BY_PTRACE;
            return cc_slot_count;
        }
    }
    if (for_hang) {
        // A process that goes on is never sent a signal: its waits would end with EINTR. The
        // hang is reported with the threads listed and their names only.
        for (int i = 0; i < cc_slot_count; i++) {
            cc_describe_thread(dir, &cc_slots[i]);
            atomic_store(&cc_slots[i].state, CC_SLOT_MISSED);
            cc_slots[i].why = "not frozen: ptrace unavailable, and a hang sends no signal";
        }
        return cc_slot_count;
    }
    if (cc_global.freeze_by_signal_only) cc_freeze_note = "ptrace not tried (CRASHCAPTURE_FREEZE=signal)";
    // Every thread is described (its state as the crash found it) before any is asked: one
    // snapshot.
    for (int i = 0; i < cc_slot_count; i++) cc_describe_thread(dir, &cc_slots[i]);
    return cc_threads_ask_by_signal();
}

// The state for the report: for a thread our helper stopped, running or in a system call (a
// sleep, a wait) as its registers show; else what its stat said.
char cc_thread_state(const cc_thread_slot *slot) {
    if (cc_freeze_method == CC_FROZEN_BY_PTRACE && slot->in_system_call >= 0 && cc_thread_captured(slot))
        return slot->in_system_call ? 'S' : 'R';
    return slot->run_state;
}

// The fallback: each thread asked by signal. A thread whose mask blocks the signal cannot
// answer; it is passed over at once rather than waited for.
static int cc_threads_ask_by_signal(void) {
    int signo = cc_global.thread_signal;
    if (signo <= 0) {
        for (int i = 0; i < cc_slot_count; i++) {
            atomic_store(&cc_slots[i].state, CC_SLOT_MISSED);
            cc_slots[i].why = "no signal was free to ask threads with";
        }
        return cc_slot_count;
    }
    cc_freeze_method = CC_FROZEN_BY_SIGNAL;
    atomic_store(&cc_asked_count, UINT32_MAX);
    atomic_store(&cc_capture_open, 1);
    pid_t pid = getpid();
    uint32_t reached = 0;
    for (int i = 0; i < cc_slot_count; i++) {
        cc_thread_slot *slot = &cc_slots[i];
        if (cc_blocks_signal(slot->tid, signo)) {
            atomic_store(&slot->state, CC_SLOT_MISSED);
            slot->why = "blocks every signal";
        } else if (syscall(SYS_tgkill, pid, slot->tid, signo) != 0) {
            atomic_store(&slot->state, CC_SLOT_MISSED);
            slot->why = "exited";
        } else {
            reached++;
        }
    }
    atomic_store(&cc_asked_count, reached);
    return cc_slot_count;
}

void cc_threads_await(bool (*meanwhile)(void)) {
    if (cc_task_dir < 0) return;
    if (cc_slot_count == 0) {
        close(cc_task_dir);
        cc_task_dir = -1;
        return;
    }
    int signo = cc_global.thread_signal;
    int64_t deadline_ns = cc_answer_deadline_ns;
    // The last answer wakes us (a futex, not a sleep: nanosleep's timer slack alone is 50 µs).
    // The count is read before the slots so that an answer between the two is not slept through.
    for (;;) {
        uint32_t answers = atomic_load(&cc_answer_word);
        int pending = 0;
        for (int i = 0; i < cc_slot_count; i++) pending += atomic_load(&cc_slots[i].state) == CC_SLOT_ASKED;
        int64_t left = deadline_ns - cc_monotonic_ns();
        if (pending == 0 || left <= 0) break;
        if (meanwhile != NULL && meanwhile()) continue;
        struct timespec wait = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
        syscall(SYS_futex, &cc_answer_word, FUTEX_WAIT_PRIVATE, answers, &wait, NULL, 0);
    }
    for (int i = 0; i < cc_slot_count; i++) {
        int asked = CC_SLOT_ASKED;
        bool missed_now = atomic_compare_exchange_strong(&cc_slots[i].state, &asked, CC_SLOT_MISSED);
        // Under ptrace only the name was read: a thread not captured gets its state too.
        if (cc_freeze_method == CC_FROZEN_BY_PTRACE && (missed_now || !cc_thread_captured(&cc_slots[i])))
            cc_describe_thread(cc_task_dir, &cc_slots[i]);
        if (missed_now) cc_slots[i].why = cc_why_missed(&cc_slots[i], signo);
    }
    close(cc_task_dir);
    cc_task_dir = -1;
}

// The start of the listing buffer and the first slots, which every report writes.
void cc_threads_prepare(void) {
    cc_freeze_prepare();
    cc_touch_pages(cc_task_entries, 1);
    cc_touch_pages(cc_slots, 2 * sizeof(cc_slots[0]));
}

int cc_threads_total_count(void) { return cc_threads_total; }

void cc_threads_name(void) {
    int dir = openat(AT_FDCWD, "/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return;
    for (int i = 0; i < cc_slot_count; i++)
        if (cc_slots[i].name[0] == '\0') cc_name_thread(dir, &cc_slots[i]);
    close(dir);
}

cc_thread_slot *cc_thread_slot_at(int index) { return index < cc_slot_count ? &cc_slots[index] : NULL; }

bool cc_thread_captured(const cc_thread_slot *slot) { return atomic_load(&slot->state) == CC_SLOT_CAPTURED; }

int cc_threads_freeze_method(void) { return cc_freeze_method; }

const char *cc_threads_freeze_note(void) { return cc_freeze_note; }

// The threads go on: a ptrace freeze lets go of them (for a handler we chain to, which may
// need them); threads asked by signal stay in their handler until the process dies (bounded).
void cc_threads_release(void) {
    if (cc_freeze_method == CC_FROZEN_BY_PTRACE) cc_freeze_release();
}

// Lets threads held in the capture handler go on: only for a process that goes on (a handler
// we chained to returned, and the fault will not recur).
void cc_threads_release_held(void) {
    atomic_store(&cc_capture_open, 0);
    atomic_store(&cc_release_word, 1);
    syscall(SYS_futex, &cc_release_word, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}
