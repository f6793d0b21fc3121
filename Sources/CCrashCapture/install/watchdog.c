// The watchdog: one thread that checks every watch (crashcapture_watch_start) and, when one
// misses its threshold, has signal_safe/hang_report.c write a hang report; when the watch
// beats again, the hang's end. It is started by the first watch.
//
// A beat is one relaxed store, into the watch's own cache line, of the beating thread's id and
// the kernel's coarse clock (crashcapture.h). Since each beat says when it came, the watchdog
// needs no polling: it sleeps until the earliest moment a watch could be past its threshold
// (the last beat's time plus the threshold), looks, and sleeps again. With every watch beaten
// in time, it wakes about once per threshold, whatever the number of watches.
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "cc_internal.h"

#define CC_MAX_WATCHES 256
#define CC_WATCH_MIN_THRESHOLD_MS 10
// The beat's 17 bits of time (1024 counts a second) run 128 s before they wrap: a watch is
// looked at at least once per threshold, so a threshold stays well inside that.
#define CC_WATCH_MAX_THRESHOLD_MS 60000
#define CC_BEAT_TIME_BITS 17
#define CC_BEAT_UNIT_SHIFT 20
// A hung watch is looked at this often (or four times per threshold) for its end.
#define CC_HUNG_LOOK_NS (100 * 1000000LL)

// ENDED: the thread that last beat it has ended without stop(); not checked until a living
// thread beats it (its slot is not given to another watch before stop(), which may still come).
enum { CC_WATCH_FREE = 0, CC_WATCH_ACTIVE, CC_WATCH_HUNG, CC_WATCH_ENDED };

typedef struct cc_watch_slot {
    // Alone in its cache line: beating threads write it, nothing else there is touched.
    _Alignas(64) crashcapture_watch watch;
    // The watchdog's, under cc_watch_lock.
    _Alignas(64) int state;
    char name[64];
    int64_t threshold_ns;
    int64_t started_ns;      // CLOCK_MONOTONIC: the watch's start, or when it was given a new one
    int64_t hung_since_ns;   // the last beat before the open hang
    uint64_t hung_word;      // and its word: any other word is a beat since (times wrap, words do not repeat)
    uint32_t hang_sequence;  // the open hang's n, for its end
} cc_watch_slot;

static cc_watch_slot cc_watches[CC_MAX_WATCHES];
static int cc_watch_high;  // slots in use are below this
static crashcapture_watch cc_inert_watch;  // handed out when nothing can check a watch
static pthread_mutex_t cc_watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cc_watch_stopped = PTHREAD_COND_INITIALIZER;
static pthread_cond_t cc_watch_changed;  // on CLOCK_MONOTONIC; made by the first watch
static bool cc_watch_changed_made;
static bool cc_watchdog_running;
static bool cc_watchdog_stopping;
static pthread_t cc_watchdog_thread;
static void (*_Atomic cc_hang_listener)(const crashcapture_hang_notice *);

static int64_t cc_now_ns(void) { return cc_monotonic_ns(); }

static void cc_notify(const crashcapture_hang_notice *notice) {
    void (*listener)(const crashcapture_hang_notice *) = atomic_load(&cc_hang_listener);
    if (listener != NULL) listener(notice);
}

// A hang found by a check, copied out of the table so that the report is written without the
// table's lock (a frozen thread may be waiting for it).
typedef struct cc_found_hang {
    char name[64];
    int64_t threshold_ns, stalled_ns, duration_ns;
    uintptr_t beater;
    uint32_t sequence;
    int slot;
} cc_found_hang;

// Whether a beater has ended. A beat names its thread by the thread's descriptor (what
// pthread_self() points at); glibc keeps the thread's kernel id in it, which the kernel zeroes
// when the thread ends (CLONE_CHILD_CLEARTID). Where in the descriptor: the offset at which
// both the thread that started the first watch and the watchdog find their own ids (-1 when
// none does: then no beater is taken for ended, as before). The hang snapshot's list is not
// enough: a thread it could not freeze with ptrace has no descriptor there.
static long cc_descriptor_tid_offset = -1;
static uintptr_t cc_starter_descriptor;
static pid_t cc_starter_tid;

static bool cc_read_own_word(uintptr_t address, int32_t *out) {
    struct iovec local = {out, sizeof(*out)}, remote = {(void *)address, sizeof(*out)};
    return syscall(SYS_process_vm_readv, getpid(), &local, 1UL, &remote, 1UL, 0UL) == (long)sizeof(*out);
}

static void cc_learn_descriptor_tid_offset(void) {
    uintptr_t own = (uintptr_t)pthread_self();
    pid_t tid = (pid_t)syscall(SYS_gettid);
    for (long offset = 0; offset + 4 <= 4096; offset += 4) {
        int32_t mine = 0, starters = 0;
        if (!cc_read_own_word(own + (uintptr_t)offset, &mine) || mine != tid) continue;
        if (!cc_read_own_word(cc_starter_descriptor + (uintptr_t)offset, &starters) || starters != cc_starter_tid)
            continue;
        cc_descriptor_tid_offset = offset;
        return;
    }
}

static bool cc_beater_ended(uintptr_t beater) {
    if (beater == 0 || cc_descriptor_tid_offset < 0) return false;
    int32_t tid = 0;
    if (!cc_read_own_word(beater + (uintptr_t)cc_descriptor_tid_offset, &tid)) return true;  // its memory is gone
    if (tid <= 0) return true;
    return syscall(SYS_tgkill, getpid(), tid, 0) != 0 && errno == ESRCH;
}

static void cc_report_hang(cc_found_hang *found, int64_t detected_ns) {
    if (cc_beater_ended(found->beater)) {
        // No thread of the process is hung: said once (the notice, error ESRCH), not checked again.
        pthread_mutex_lock(&cc_watch_lock);
        if (cc_watches[found->slot].state == CC_WATCH_HUNG) cc_watches[found->slot].state = CC_WATCH_ENDED;
        pthread_mutex_unlock(&cc_watch_lock);
        crashcapture_hang_notice ended = {
            .kind = CRASHCAPTURE_HANG,
            .watch_name = found->name,
            .file_name = "",
            .error = ESRCH,
            .stalled_ms = found->stalled_ns / 1000000,
            .total_ns = cc_now_ns() - detected_ns,
        };
        cc_notify(&ended);
        return;
    }
    crashcapture_hang_request request = {
        .watch_name = found->name,
        .threshold_ms = found->threshold_ns / 1000000,
        .stalled_ms = found->stalled_ns / 1000000,
        .watched_thread = found->beater,
    };
    crashcapture_hang_result result;
    int error = cc_capture_hang(&request, &result);
    pthread_mutex_lock(&cc_watch_lock);
    if (cc_watches[found->slot].state == CC_WATCH_HUNG) cc_watches[found->slot].hang_sequence = error == 0 ? result.sequence : 0;
    pthread_mutex_unlock(&cc_watch_lock);
    crashcapture_hang_notice notice = {
        .kind = CRASHCAPTURE_HANG,
        .watch_name = found->name,
        .file_name = error == 0 ? result.file_name : "",
        .error = error,
        .stalled_ms = request.stalled_ms,
        .hung_tid = result.hung_tid,
        .deadlock = result.deadlock,
        .threads_held_ns = result.threads_held_ns,
        .total_ns = cc_now_ns() - detected_ns,
    };
    cc_notify(&notice);
}

static void cc_report_hang_end(const cc_found_hang *found) {
    char name[128] = "";
    int error = found->sequence == 0 ? 0
                                     : cc_write_hang_end(found->name, found->sequence, found->duration_ns / 1000000,
                                                         name, sizeof(name));
    crashcapture_hang_notice notice = {
        .kind = CRASHCAPTURE_HANG_END,
        .watch_name = found->name,
        .file_name = error == 0 ? name : "",
        .error = error,
        .duration_ms = found->duration_ns / 1000000,
    };
    cc_notify(&notice);
}

// A time as a beat counts it: seconds times 1024, plus 2^20-ns units within the second.
static uint64_t cc_beat_units(int64_t ns) {
    return ((uint64_t)(ns / 1000000000) << 10) | ((uint64_t)(ns % 1000000000) >> CC_BEAT_UNIT_SHIFT);
}

// When the beat in `word` came, on CLOCK_MONOTONIC (the start of its unit): its low bits are
// the low bits of its count, and the full count is the latest one not after `now_ns` with those
// bits (a beat is never in the future, and never a lap, 128 s, old when it is looked at).
static int64_t cc_beat_time(uint64_t word, int64_t now_ns) {
    uint64_t mask = (1ULL << CC_BEAT_TIME_BITS) - 1;
    uint64_t now_count = cc_beat_units(now_ns);
    uint64_t count = now_count - ((now_count - (word & mask)) & mask);
    return (int64_t)(count >> 10) * 1000000000 + (int64_t)((count & 1023) << CC_BEAT_UNIT_SHIFT);
}

static int64_t cc_beat_uncertainty_ns;

static uintptr_t cc_beat_thread(uint64_t word) { return (uintptr_t)((word >> CC_BEAT_TIME_BITS) << 4); }

static void *cc_watchdog_main(void *unused) {
    (void)unused;
    struct timespec tick = {0, 4000000};
    clock_getres(CLOCK_MONOTONIC_COARSE, &tick);
    cc_beat_uncertainty_ns = (int64_t)tick.tv_sec * 1000000000 + tick.tv_nsec + (1LL << CC_BEAT_UNIT_SHIFT);
    // Signals for the app go to the app's threads; the crash signals stay open, so that a fault
    // here is still ours to catch (a blocked fault kills the process with no handler).
    sigset_t mask;
    sigfillset(&mask);
    for (int i = 0; i < CC_HANDLED_SIGNAL_COUNT; i++) sigdelset(&mask, cc_handled_signals[i]);
    pthread_sigmask(SIG_SETMASK, &mask, NULL);
    prctl(PR_SET_NAME, "cc-watchdog", 0, 0, 0);
    pthread_mutex_lock(&cc_watch_lock);
    cc_learn_descriptor_tid_offset();
    int64_t due = cc_now_ns();
    while (!cc_watchdog_stopping) {
        cc_found_hang hangs[8], ends[8];
        int hang_count = 0, end_count = 0;
        int64_t now = cc_now_ns();
        // Woken late (the process was stopped, the machine suspended, a report took long): a
        // watch whose beats stopped meanwhile gets a threshold of its own again from now.
        int64_t late = now - due;
        int64_t next = now + 1000000000LL;
        for (int i = 0; i < cc_watch_high; i++) {
            cc_watch_slot *slot = &cc_watches[i];
            if (slot->state == CC_WATCH_FREE) continue;
            uint64_t word = __atomic_load_n(&slot->watch.beat, __ATOMIC_RELAXED);
            if (slot->state == CC_WATCH_ENDED) {
                if (word == slot->hung_word) continue;
                slot->state = CC_WATCH_ACTIVE;  // beaten again, by a thread that lives
                slot->started_ns = now;
            }
            int64_t beat = word != 0 ? cc_beat_time(word, now) : slot->started_ns;
            if (beat < slot->started_ns) beat = slot->started_ns;
            if (slot->state == CC_WATCH_HUNG) {
                if (word != slot->hung_word && end_count < 8) {
                    cc_found_hang *end = &ends[end_count++];
                    memcpy(end->name, slot->name, sizeof(end->name));
                    end->sequence = slot->hang_sequence;
                    end->duration_ns = beat - slot->hung_since_ns;
                    slot->state = CC_WATCH_ACTIVE;
                } else {
                    int64_t look = slot->threshold_ns / 4 < CC_HUNG_LOOK_NS ? slot->threshold_ns / 4 : CC_HUNG_LOOK_NS;
                    if (now + look < next) next = now + look;
                    continue;
                }
            }
            // A beat's time is the coarse clock's, up to a tick behind the beat, and cut to a unit:
            // the deadline is that much later, so that no watch is ever called hung early.
            int64_t deadline = beat + slot->threshold_ns + cc_beat_uncertainty_ns;
            if (now >= deadline && late > slot->threshold_ns / 4) {
                slot->started_ns = now;
                deadline = now + slot->threshold_ns;
            }
            if (now >= deadline && hang_count < 8) {
                slot->state = CC_WATCH_HUNG;
                slot->hang_sequence = 0;
                slot->hung_since_ns = beat;
                slot->hung_word = word;
                cc_found_hang *hang = &hangs[hang_count++];
                memcpy(hang->name, slot->name, sizeof(hang->name));
                hang->threshold_ns = slot->threshold_ns;
                hang->stalled_ns = now - beat;
                hang->beater = word != 0 ? cc_beat_thread(word) : 0;
                hang->slot = i;
                int64_t look = slot->threshold_ns / 4 < CC_HUNG_LOOK_NS ? slot->threshold_ns / 4 : CC_HUNG_LOOK_NS;
                if (now + look < next) next = now + look;
            } else if (deadline < next) {
                next = deadline;
            }
        }
        if (end_count > 0 || hang_count > 0) {
            // Written without the table's lock: a frozen thread may be waiting for it.
            pthread_mutex_unlock(&cc_watch_lock);
            for (int i = 0; i < end_count; i++) cc_report_hang_end(&ends[i]);
            for (int i = 0; i < hang_count; i++) cc_report_hang(&hangs[i], now);
            pthread_mutex_lock(&cc_watch_lock);
            continue;  // look again at once: the report took time, and watches may have moved
        }
        due = next;
        struct timespec until = {(time_t)(next / 1000000000), (long)(next % 1000000000)};
        // Woken early by a new watch (crashcapture_watch_start), which may be due sooner.
        pthread_cond_timedwait(&cc_watch_changed, &cc_watch_lock, &until);
    }
    cc_watchdog_running = false;
    pthread_cond_broadcast(&cc_watch_stopped);
    pthread_mutex_unlock(&cc_watch_lock);
    return NULL;
}

crashcapture_watch *crashcapture_watch_start(const char *name, int64_t threshold_ms) {
    cc_install_rest_finish();  // a hang report needs the module list and libunwind
    if (!atomic_load(&cc_global.installed)) return &cc_inert_watch;
    if (threshold_ms < CC_WATCH_MIN_THRESHOLD_MS) threshold_ms = CC_WATCH_MIN_THRESHOLD_MS;
    if (threshold_ms > CC_WATCH_MAX_THRESHOLD_MS) threshold_ms = CC_WATCH_MAX_THRESHOLD_MS;
    pthread_mutex_lock(&cc_watch_lock);
    if (!cc_watch_changed_made) {
        pthread_condattr_t monotonic;
        pthread_condattr_init(&monotonic);
        pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
        pthread_cond_init(&cc_watch_changed, &monotonic);
        pthread_condattr_destroy(&monotonic);
        cc_watch_changed_made = true;
    }
    cc_watch_slot *slot = NULL;
    for (int i = 0; i < CC_MAX_WATCHES && slot == NULL; i++) {
        if (cc_watches[i].state != CC_WATCH_FREE) continue;
        slot = &cc_watches[i];
        if (i >= cc_watch_high) cc_watch_high = i + 1;
    }
    if (slot == NULL) {
        pthread_mutex_unlock(&cc_watch_lock);
        return &cc_inert_watch;
    }
    size_t length = name != NULL ? strnlen(name, sizeof(slot->name) - 1) : 0;
    memcpy(slot->name, name != NULL ? name : "", length);
    slot->name[length] = '\0';
    slot->threshold_ns = threshold_ms * 1000000LL;
    slot->started_ns = cc_now_ns();
    slot->hang_sequence = 0;
    __atomic_store_n(&slot->watch.beat, 0, __ATOMIC_RELAXED);
    slot->state = CC_WATCH_ACTIVE;
    pthread_cond_signal(&cc_watch_changed);
    if (!cc_watchdog_running) {
        cc_watchdog_stopping = false;
        cc_starter_descriptor = (uintptr_t)pthread_self();
        cc_starter_tid = (pid_t)syscall(SYS_gettid);
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setstacksize(&attributes, 256 * 1024);
        cc_watchdog_running = pthread_create(&cc_watchdog_thread, &attributes, cc_watchdog_main, NULL) == 0;
        pthread_attr_destroy(&attributes);
    }
    pthread_mutex_unlock(&cc_watch_lock);
    return &slot->watch;
}

int crashcapture_watch_is_checked(const crashcapture_watch *watch) {
    return watch != NULL && watch != &cc_inert_watch;
}

void crashcapture_watch_stop(crashcapture_watch *watch) {
    if (watch == NULL || watch == &cc_inert_watch) return;
    pthread_mutex_lock(&cc_watch_lock);
    for (int i = 0; i < cc_watch_high; i++)
        if (&cc_watches[i].watch == watch) cc_watches[i].state = CC_WATCH_FREE;
    pthread_mutex_unlock(&cc_watch_lock);
}

void crashcapture_watchdog_set_listener(void (*listener)(const crashcapture_hang_notice *notice)) {
    atomic_store(&cc_hang_listener, listener);
}

// At uninstall: every watch stops, and the thread ends (waited for, unless it is the caller).
void cc_watchdog_stop(void) {
    pthread_mutex_lock(&cc_watch_lock);
    for (int i = 0; i < cc_watch_high; i++) cc_watches[i].state = CC_WATCH_FREE;
    cc_watch_high = 0;
    bool running = cc_watchdog_running;
    pthread_t thread = cc_watchdog_thread;
    cc_watchdog_stopping = true;
    if (running && cc_watch_changed_made) pthread_cond_signal(&cc_watch_changed);
    if (running && !pthread_equal(thread, pthread_self())) {
        while (cc_watchdog_running) pthread_cond_wait(&cc_watch_stopped, &cc_watch_lock);
        pthread_mutex_unlock(&cc_watch_lock);
        pthread_join(thread, NULL);
        return;
    }
    pthread_mutex_unlock(&cc_watch_lock);
}

// A forked child has no watchdog thread, and none of the threads that beat its watches but
// the one that forked: the watches are dropped, and a watch started there starts the thread
// again. The lock may have been held by the parent's watchdog at the fork.
void cc_watchdog_after_fork_in_child(void) {
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    cc_watch_lock = fresh;
    cc_watch_changed_made = false;
    for (int i = 0; i < cc_watch_high; i++) cc_watches[i].state = CC_WATCH_FREE;
    cc_watch_high = 0;
    cc_watchdog_running = false;
    cc_watchdog_stopping = false;
}
