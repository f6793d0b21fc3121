// The watchdog: one thread that checks every watch (crashcapture_watch_start) and, when one
// misses its threshold, has signal_safe/hang_report.c write a hang report; when the watch
// beats again, the hang's end. It is started by the first watch.
//
// A beat is one relaxed store of the beating thread's pthread_self() into the watch's own cache
// line; the watchdog takes it back (an exchange with 0) at each check, every 5 ms or an eighth
// of the smallest threshold. A watch is hung when no beat was seen for its threshold: noticed
// within one check of it.
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "cc_internal.h"

#define CC_MAX_WATCHES 256
#define CC_WATCH_MIN_THRESHOLD_MS 10
#define CC_WATCHDOG_INTERVAL_NS (5 * 1000000LL)

enum { CC_WATCH_FREE = 0, CC_WATCH_ACTIVE, CC_WATCH_HUNG };

typedef struct cc_watch_slot {
    // Alone in its cache line: beating threads write it, nothing else there is touched.
    _Alignas(64) crashcapture_watch watch;
    // The watchdog's, under cc_watch_lock.
    _Alignas(64) int state;
    char name[64];
    int64_t threshold_ns;
    int64_t last_seen_ns;   // when a beat was last seen (or the watch started)
    uintptr_t last_beater;  // pthread_self() of the thread that beat last
    uint32_t hang_sequence; // the open hang's n, for its end
} cc_watch_slot;

static cc_watch_slot cc_watches[CC_MAX_WATCHES];
static int cc_watch_high;  // slots in use are below this
static crashcapture_watch cc_inert_watch;  // handed out when nothing can check a watch
static pthread_mutex_t cc_watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cc_watch_stopped = PTHREAD_COND_INITIALIZER;
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

static void cc_report_hang(cc_found_hang *found, int64_t detected_ns) {
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

static void *cc_watchdog_main(void *unused) {
    (void)unused;
    // Signals for the app go to the app's threads; the crash signals stay open, so that a fault
    // here is still ours to catch (a blocked fault kills the process with no handler).
    sigset_t mask;
    sigfillset(&mask);
    for (int i = 0; i < CC_HANDLED_SIGNAL_COUNT; i++) sigdelset(&mask, cc_handled_signals[i]);
    pthread_sigmask(SIG_SETMASK, &mask, NULL);
    prctl(PR_SET_NAME, "cc-watchdog", 0, 0, 0);
    int64_t due = cc_now_ns();
    for (;;) {
        cc_found_hang hangs[8], ends[8];
        int hang_count = 0, end_count = 0;
        pthread_mutex_lock(&cc_watch_lock);
        if (cc_watchdog_stopping) break;
        int64_t now = cc_now_ns();
        int64_t late = now - due;
        int64_t interval = CC_WATCHDOG_INTERVAL_NS;
        for (int i = 0; i < cc_watch_high; i++) {
            cc_watch_slot *slot = &cc_watches[i];
            if (slot->state == CC_WATCH_FREE) continue;
            if (slot->threshold_ns / 8 < interval) interval = slot->threshold_ns / 8;
            uintptr_t beater = __atomic_exchange_n(&slot->watch.beaten_by, 0, __ATOMIC_RELAXED);
            if (beater != 0) {
                if (slot->state == CC_WATCH_HUNG && end_count < 8) {
                    cc_found_hang *end = &ends[end_count++];
                    memcpy(end->name, slot->name, sizeof(end->name));
                    end->sequence = slot->hang_sequence;
                    end->duration_ns = now - slot->last_seen_ns;
                }
                slot->state = CC_WATCH_ACTIVE;
                slot->last_seen_ns = now;
                slot->last_beater = beater;
            } else if (late > slot->threshold_ns / 4) {
                // The watchdog itself ran late (the process was stopped, the machine suspended,
                // or a report took long): the watched code gets a threshold of its own again.
                if (slot->state == CC_WATCH_ACTIVE) slot->last_seen_ns = now;
            } else if (slot->state == CC_WATCH_ACTIVE && now - slot->last_seen_ns >= slot->threshold_ns &&
                       hang_count < 8) {
                slot->state = CC_WATCH_HUNG;
                slot->hang_sequence = 0;
                cc_found_hang *hang = &hangs[hang_count++];
                memcpy(hang->name, slot->name, sizeof(hang->name));
                hang->threshold_ns = slot->threshold_ns;
                hang->stalled_ns = now - slot->last_seen_ns;
                hang->beater = slot->last_beater;
                hang->slot = i;
            }
        }
        pthread_mutex_unlock(&cc_watch_lock);
        for (int i = 0; i < end_count; i++) cc_report_hang_end(&ends[i]);
        for (int i = 0; i < hang_count; i++) cc_report_hang(&hangs[i], now);
        due = now + interval;
        struct timespec until = {(time_t)(due / 1000000000), (long)(due % 1000000000)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {
        }
    }
    cc_watchdog_running = false;
    pthread_cond_broadcast(&cc_watch_stopped);
    pthread_mutex_unlock(&cc_watch_lock);
    return NULL;
}

crashcapture_watch *crashcapture_watch_start(const char *name, int64_t threshold_ms) {
    if (!atomic_load(&cc_global.installed)) return &cc_inert_watch;
    if (threshold_ms < CC_WATCH_MIN_THRESHOLD_MS) threshold_ms = CC_WATCH_MIN_THRESHOLD_MS;
    pthread_mutex_lock(&cc_watch_lock);
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
    slot->last_seen_ns = cc_now_ns();
    slot->last_beater = 0;
    slot->hang_sequence = 0;
    __atomic_store_n(&slot->watch.beaten_by, 0, __ATOMIC_RELAXED);
    slot->state = CC_WATCH_ACTIVE;
    if (!cc_watchdog_running) {
        cc_watchdog_stopping = false;
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
    for (int i = 0; i < cc_watch_high; i++) cc_watches[i].state = CC_WATCH_FREE;
    cc_watch_high = 0;
    cc_watchdog_running = false;
    cc_watchdog_stopping = false;
}
