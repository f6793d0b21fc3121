// THE CRASH PATH: everything that runs after a fatal signal arrives. This file is its top: the
// entry points, the stages of a report, and the chaining; crash_report.h lists the files below.
//
// Rules for this file and every other file in signal_safe/ (signal-safety(7));
// CrashPathSymbolTests checks the undefined symbols of every object built from this
// folder against an allowlist, so a slip fails CI:
//   - no malloc/free/realloc, no stdio, no printf-family formatting (we format by hand);
//   - no locks, no pthread_mutex, no dladdr/dlsym/dl_iterate_phdr, no uuid_generate;
//   - no Swift and no C++ runtime calls (the C++ terminate handler, which runs before abort()
//     and outside any signal handler, is in install/exception_message.c);
//   - every buffer, file descriptor and byte of reserved disk is prepared at install
//     (install.c); here we only read that state and the few atomics below;
//   - the libunwind functions are reached through pointers taken at install, so the
//     unwinder's own first-use setup is the only work we do not control;
//   - any memory read that may fault (other stacks, loader structures, message buffers)
//     runs inside a stage guarded by sigsetjmp: a fault there is caught by this handler
//     (SA_NODEFER) and costs that stage only, never the report.
// The process must end exactly as it would have without us: same signal, core dump,
// every earlier handler called with the original siginfo and ucontext.
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <linux/futex.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "cc_internal.h"
#include "crash_report.h"
#include "testing/crashcapture_testing.h"

// SIGSYS: a seccomp filter's SECCOMP_RET_TRAP (a container's profile, a sandbox), which
// crashpad catches too. SECCOMP_RET_KILL kills without a signal anyone can catch.
const int cc_handled_signals[CC_HANDLED_SIGNAL_COUNT] = {SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS};

// Which thread reports the crash, shared by every copy of CrashCapture in the process: each
// copy defines it, and each uses the one the dynamic loader finds first (install.c).
CRASHCAPTURE_API _Atomic pid_t crashcapture_crash_owner;

// Whether returning from the handler re-executes the faulting instruction. int3 leaves the
// PC after the trap, so SIGTRAP never counts; signals sent by kill/raise/abort never recur.
static bool cc_fault_recurs(int signo, const siginfo_t *info) {
    if (info->si_code <= 0) return false;
    return signo == SIGSEGV || signo == SIGBUS || signo == SIGILL || signo == SIGFPE;
}

static pid_t cc_gettid(void) { return (pid_t)syscall(SYS_gettid); }

// MARK: - Crash-time state

// One thread reports; the others wait for it. A nested fault on the reporting thread is
// recognised by its tid and jumps back to the stage it interrupted.
static _Atomic pid_t cc_reporting_tid;
static sigjmp_buf cc_stage_jump;
static volatile sig_atomic_t cc_stage_armed;
// Each other thread's unwinding has a guard of its own inside the threads stage, taken before
// the stage's: sharing the stage's would leave the rest of the stage unguarded.
static sigjmp_buf cc_thread_unwind_jump;
static volatile sig_atomic_t cc_thread_unwind_armed;
static volatile sig_atomic_t cc_fault_on_purpose;

static char cc_record[CC_RECORD_CAPACITY];
// The stacks record (stack_memory.c): untouched until a crash, so a live process keeps none of
// it resident; a crash among 16 threads faults in about 140 of its pages.
static char cc_stacks_record[CC_STACKS_CAPACITY];
// How long a crash waits for a C install's rest (its thread loads libunwind and makes the files).
#define CC_REST_AT_CRASH_NS (200 * 1000000LL)
#define CC_STATIC_RUNTIME_AT_CRASH_NS (100 * 1000000LL)

// The thread taking a hang's snapshot (hang_report.c) while it uses the threads' machinery and
// the buffers above: a crash on another thread waits for it; a fault of its own while
// unwinding another thread costs that thread's frames, as in a crash.
static _Atomic pid_t cc_hang_tid;
// A hang's: what to read of each thread while it is still held, before it is let go.
static void (*cc_after_thread_unwound)(cc_thread_slot *slot);

// At install: the parts of the buffers that every report writes into get their pages now
// (about 60 KiB resident; a one-thread report fits in the first 16 KiB of cc_record).
void cc_crash_path_prepare(void) {
    cc_crc32_prepare();
    cc_touch_pages(cc_record, 16 * 1024);
    cc_touch_pages(cc_found.frames, sizeof(cc_found.frames));
    cc_touch_pages(cc_found.swift_message, 1);
    cc_process_state_prepare();
    cc_threads_prepare();
}

void crashcapture_test_fault_in_handler(int where) { cc_fault_on_purpose = where; }

static void cc_fault_here_on_purpose(int where) {
    if (cc_fault_on_purpose == where) {
        volatile int *volatile nowhere = 0;
        *nowhere = 1;
    }
}

// MARK: - Stages

static void cc_unwind(ucontext_t *uc) {
    cc_fault_here_on_purpose(1);
    cc_walk(uc, cc_found.frames, CC_MAX_FRAMES, &cc_found.frame_count, &cc_found.used_libunwind);
    cc_recover_bad_call(uc);
    cc_registers r = cc_registers_from(uc);
    cc_walk_async_chain(r.pc, r.fp, r.sp, cc_found.async_frames, CC_MAX_ASYNC_FRAMES, &cc_found.async_frame_count,
                        &cc_found.async_owner);
    if (cc_found.async_frame_count > 0) {
        uintptr_t task = cc_global.swift_task_current != NULL ? cc_global.swift_task_current() : cc_task_on_stack(r.sp);
        cc_task_name(task, cc_found.task_name, sizeof(cc_found.task_name));
    }
}

// Whether a stack runs a Swift task: a frame in libswift_Concurrency (swift_job_run). Only
// those threads have their async chain followed, so that parked threads cost nothing more.
static bool cc_runs_a_task(const uintptr_t *frames, size_t count) {
    const cc_module_map *map = atomic_load_explicit(&cc_global.module_map, memory_order_acquire);
    if (map == NULL || map->concurrency_end == 0) return false;
    for (size_t i = 0; i < count; i++)
        if (frames[i] >= map->concurrency_start && frames[i] < map->concurrency_end) return true;
    return false;
}

// The other threads that have answered and are not unwound yet, each from the context it
// saved, each under a guard of its own: a corrupt stack costs that thread's frames only.
// Called while the rest are still answering, and once more after. Whether it unwound any.
static bool cc_unwind_other_threads(void) {
    volatile bool unwound_any = false;
    for (volatile int i = 0; cc_thread_slot_at(i) != NULL; i++) {
        cc_thread_slot *slot = cc_thread_slot_at(i);
        if (slot->unwound || !cc_thread_captured(slot)) continue;
        slot->unwound = true;
        unwound_any = true;
        volatile int used_libunwind = 0;
        if (sigsetjmp(cc_thread_unwind_jump, 1) == 0) {
            cc_thread_unwind_armed = 1;
            cc_walk(&slot->context, slot->frames, CC_THREAD_FRAMES, &slot->frame_count, &used_libunwind);
            if (cc_runs_a_task(slot->frames, slot->frame_count)) {
                cc_registers r = cc_registers_from(&slot->context);
                cc_walk_async_chain(r.pc, r.fp, r.sp, slot->async_frames, CC_THREAD_ASYNC_FRAMES,
                                    &slot->async_frame_count, &slot->async_owner);
                cc_task_name(cc_task_on_stack(r.sp), slot->task_name, sizeof(slot->task_name));
            }
            if (cc_after_thread_unwound != NULL) cc_after_thread_unwound(slot);
            cc_thread_unwind_armed = 0;
        } else {
            cc_thread_unwind_armed = 0;
            slot->unwind_faulted = true;
        }
        // A hang's thread goes on as soon as its stack is taken: the others' do not hold it.
        if (cc_after_thread_unwound != NULL) cc_freeze_let_go(i);
    }
    return unwound_any;
}

static void cc_copy_text(char *dst, size_t cap, const char *src) {
    size_t i = 0;
    if (src != NULL)
        for (; i + 1 < cap && src[i] != '\0'; i++) dst[i] = src[i];
    dst[i] = '\0';
}

static void cc_gather_texts(void) {
    if (prctl(PR_GET_NAME, cc_found.thread_name) != 0) cc_found.thread_name[0] = '\0';
    cc_found.thread_name[sizeof(cc_found.thread_name) - 1] = '\0';
    const char *message = NULL;
    if (cc_global.swift_fatal_message != NULL)
        message = atomic_load_explicit(cc_global.swift_fatal_message, memory_order_acquire);
    cc_copy_text(cc_found.swift_message, sizeof(cc_found.swift_message), message);
    cc_copy_text(cc_found.exception_what, sizeof(cc_found.exception_what),
                 atomic_load_explicit(&cc_global.exception_what, memory_order_acquire));
    cc_copy_text(cc_found.exception_type, sizeof(cc_found.exception_type),
                 atomic_load_explicit(&cc_global.exception_type_name, memory_order_acquire));
}

static unsigned cc_run_stages(ucontext_t *uc, const cc_module_map *map) {
    // volatile: both live across siglongjmp back into this frame.
    volatile unsigned faulted = 0;
    cc_found.thread_name[0] = cc_found.swift_message[0] = cc_found.exception_type[0] = cc_found.exception_what[0] = '\0';
    cc_found.task_name[0] = '\0';
    for (volatile int stage = 0; stage < CC_STAGE_COUNT; stage++) {
        if (sigsetjmp(cc_stage_jump, 1) == 0) {
            cc_stage_armed = 1;
            switch (stage) {
            case CC_STAGE_UNWIND: {
                int64_t start = cc_monotonic_ns();
                cc_unwind(uc);
                cc_found.unwind_ns = cc_monotonic_ns() - start;
                break;
            }
            case CC_STAGE_LATE_MODULES: cc_scan_late_modules(map); break;
            case CC_STAGE_TEXTS: cc_gather_texts(); break;
            case CC_STAGE_THREADS: {
                int64_t start = cc_monotonic_ns();
                cc_threads_await(cc_unwind_other_threads);
                cc_unwind_other_threads();
                cc_fault_here_on_purpose(2);
                cc_found.other_threads_ns += cc_monotonic_ns() - start;
                break;
            }
            }
            cc_stage_armed = 0;
        } else {
            cc_stage_armed = 0;
            faulted |= 1u << stage;
            if (stage == CC_STAGE_UNWIND && cc_found.frame_count == 0) {
                cc_found.frames[0] = cc_registers_from(uc).pc;
                cc_found.frame_count = 1;
            }
        }
    }
    return faulted;
}

// The $AppCrashed and (unless the session already ended) $AppEnd records, framed, within `cap`.
static size_t cc_build_report(char *out, size_t cap, const cc_crash *c) {
    // The $AppEnd that follows needs a few hundred bytes; 16 KiB are left for it.
    size_t crashed = cc_build_crashed_event(out + CCF_RECORD_HEADER_SIZE, cap - 16384, c);
    if (crashed == 0) crashed = cc_build_minimal_event(out + CCF_RECORD_HEADER_SIZE, cap - 16384, c);
    cc_frame_in_place(out, CCF_RECORD_EVENT, crashed);
    size_t total = CCF_RECORD_HEADER_SIZE + crashed;
    // A session already ended normally ($AppEnd tracked, then a crash in an atexit handler)
    // must not get a second $AppEnd.
    if (!atomic_load(&cc_global.session_ended)) {
        size_t end = cc_build_end_event(out + total + CCF_RECORD_HEADER_SIZE, cap - total - CCF_RECORD_HEADER_SIZE, c);
        cc_frame_in_place(out + total, CCF_RECORD_EVENT, end);
        total += CCF_RECORD_HEADER_SIZE + end;
    }
    return total;
}

static void cc_static_runtime_at_crash(int64_t bound_ns);

static void cc_report(int signo, siginfo_t *info, ucontext_t *uc, int64_t entry_ns) {
    cc_install_rest_at_crash(CC_REST_AT_CRASH_NS);
    cc_static_runtime_at_crash(CC_STATIC_RUNTIME_AT_CRASH_NS);
    cc_found.crash_signal = signo;
    cc_found.crash_code = info != NULL ? info->si_code : 0;
    // The process-state files kept since install are read first, then every reserved
    // descriptor is given back: libunwind's pipe, the listing of the threads (and a named crash
    // file, if one must be reopened) find room even when the process had none left.
    int64_t kept_start = cc_monotonic_ns();
    cc_process_state_read_kept();
    cc_found.kept_files_ns = cc_monotonic_ns() - kept_start;
    cc_check_libunwind_pipe();
    cc_crash c = {
        .signo = signo,
        .info = info,
        .uc = uc,
        .map = atomic_load_explicit(&cc_global.module_map, memory_order_acquire),
        .pid = getpid(),
        .tid = cc_gettid(),
        .time_ms = cc_wall_ms(),
        .entry_ns = entry_ns,
    };
    // The other threads are asked first, so the report shows them as they were when the crash
    // came; they answer while this thread unwinds itself (the stages before CC_STAGE_THREADS).
    int64_t asked = cc_monotonic_ns();
    cc_threads_ask(c.tid, asked + CC_THREAD_ANSWER_NS, false);
    cc_found.other_threads_ns = cc_found.threads_asked_ns = cc_monotonic_ns() - asked;
    c.faulted_stages = cc_run_stages(uc, c.map);

    char *out = cc_record;
    size_t cap = sizeof(cc_record);
    int64_t events_start = cc_monotonic_ns();
    size_t total = cc_build_report(out, cap, &c);
    cc_found.events_ns = cc_monotonic_ns() - events_start;

    // RLIMIT_FSIZE lowered since install: a write past it raises SIGXFSZ, and the process would
    // die of that instead of its own signal. The soft limit is lifted to the hard one for our
    // writes and put back after; nothing is written past what remains allowed.
    struct rlimit fsize;
    bool limited = getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY;
    bool lifted = false;
    uint64_t allowed = UINT64_MAX;
    if (limited) {
        struct rlimit hard = {fsize.rlim_max, fsize.rlim_max};
        lifted = fsize.rlim_max > fsize.rlim_cur && setrlimit(RLIMIT_FSIZE, &hard) == 0;
        allowed = lifted ? (fsize.rlim_max == RLIM_INFINITY ? UINT64_MAX : fsize.rlim_max) : fsize.rlim_cur;
    }
    // The space reserved at install holds most reports whole. A larger one (hundreds of deep
    // stacks) that meets a full disk or the file-size limit is built again to fit what there is
    // room for: the crashing thread whole, as many other threads as fit.
    uint64_t offset = cc_global.record_offset;
    uint64_t room = cc_global.reserved_in_file > offset ? cc_global.reserved_in_file - offset : 0;
    uint64_t room_allowed = allowed > offset ? allowed - offset : 0;
    if (allowed != UINT64_MAX && (room == 0 || room_allowed < room)) room = room_allowed;
    bool can_shrink = total > room && room >= CC_SMALLEST_REPORT_ROOM;
    // Every thread's stack memory, within what the reservation holds past the events (and a
    // timing record); without a reservation, within CC_STACKS_UNRESERVED_BOUND. The threads are
    // still frozen: their stacks hold still while they are copied.
    size_t stacks = 0;
    int64_t stacks_start = cc_monotonic_ns();
    uint64_t stacks_room = cc_global.reserved_in_file > offset + total + 4096
                               ? cc_global.reserved_in_file - offset - total - 4096
                               : (cc_global.reserved_in_file == 0 ? CC_STACKS_UNRESERVED_BOUND : 0);
    if (stacks_room > CC_STACKS_UNRESERVED_BOUND && cc_global.reserved_in_file == 0) stacks_room = CC_STACKS_UNRESERVED_BOUND;
    if (room_allowed < UINT64_MAX && stacks_room + total + 4096 > room_allowed)
        stacks_room = room_allowed > total + 4096 ? room_allowed - total - 4096 : 0;
    if (stacks_room >= 4096 && !cc_global.no_stack_memory) {
        size_t bound = stacks_room < CC_STACKS_CAPACITY ? (size_t)stacks_room : CC_STACKS_CAPACITY;
        stacks = cc_build_stacks(cc_stacks_record, sizeof(cc_stacks_record), &c, bound - bound / 16);
    }
    cc_found.stacks_ns = cc_monotonic_ns() - stacks_start;
    cc_found.stacks_bytes = stacks;
    if (cc_write_report(out, total, cap, entry_ns, allowed, can_shrink ? CC_WRITE_MAY_RETRY : CC_WRITE_ONCE,
                        stacks > 0 ? cc_stacks_record : NULL, stacks) != 0) {
        cc_found.report_trimmed = 1;
        total = cc_build_report(out, (size_t)room, &c);
        cc_write_report(out, total, cap, entry_ns, allowed, CC_WRITE_SMALLER_AGAIN, NULL, 0);
    }
    if (lifted) setrlimit(RLIMIT_FSIZE, &fsize);
    cc_write_crash_line(&c);
    // The other threads stay frozen: cc_chain lets go of them only for a handler of the app's.
}

// MARK: - An install's rest

// A program that carries the Swift runtime has its symbol table read by a thread of ours for a
// millisecond or two after install (install/static_swift_runtime.c). A crash meanwhile waits
// for it, bounded, before it takes the module list and the fatal message: unless the crash is
// in that thread.
static void cc_static_runtime_at_crash(int64_t bound_ns) {
    if (atomic_load(&cc_global.static_runtime_reading) == 0) return;
    if (atomic_load(&cc_global.static_runtime_reader_tid) == cc_gettid()) return;
    int64_t until = cc_monotonic_ns() + bound_ns;
    while (atomic_load(&cc_global.static_runtime_reading) != 0) {
        int64_t left = until - cc_monotonic_ns();
        if (left <= 0) return;
        struct timespec wait = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
        syscall(SYS_futex, &cc_global.static_runtime_reading, FUTEX_WAIT_PRIVATE, 1, &wait, NULL, 0);
    }
}

// A C install leaves its files, libunwind and the module list to a thread of ours, which waits
// a few milliseconds first (deferred_install.c). A crash before then wakes it and waits while
// it does what the report needs (the thread runs outside any handler, so it may load
// libunwind); the crash file is made here. Past the bound (a thread stuck on a lock the
// crashing thread holds), the report does without: a frame-pointer walk, the modules found
// through the loader's list.
void cc_install_rest_at_crash(int64_t bound_ns) {
    uint32_t state = atomic_load(&cc_global.install_rest);
    if (state != CC_REST_PENDING && state != CC_REST_RUNNING) return;
    if (atomic_load(&cc_global.install_rest_tid) == cc_gettid()) return;  // the crash is in the rest itself
    atomic_store(&cc_global.install_rest_wake, CC_REST_WAKE_FOR_CRASH);
    syscall(SYS_futex, &cc_global.install_rest_wake, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    int64_t until = cc_monotonic_ns() + bound_ns;
    for (;;) {
        state = atomic_load(&cc_global.install_rest);
        int64_t left = until - cc_monotonic_ns();
        if (state == CC_REST_DONE || state == CC_REST_FOR_REPORT || state == CC_REST_CANCELLED || left <= 0) break;
        struct timespec wait = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
        syscall(SYS_futex, &cc_global.install_rest, FUTEX_WAIT_PRIVATE, state, &wait, NULL, 0);
    }
    uint32_t pending = CC_REST_PENDING;
    atomic_compare_exchange_strong(&cc_global.install_rest, &pending, CC_REST_CANCELLED);
    state = atomic_load(&cc_global.install_rest);
    bool helped = state == CC_REST_DONE || state == CC_REST_FOR_REPORT;
    // Without the rest, the sessions of the images this one was exec'd from are ended here.
    if (!helped) cc_retire_exec_predecessors();
    // Its thread ends right after. Not waited for: the report passes over it, so that it lists
    // the program's threads only, and a single-threaded program's crash freezes nothing.
    pid_t thread = atomic_load(&cc_global.install_rest_thread);
    if (thread > 0 && helped) atomic_store(&cc_global.install_rest_leaving, thread);
}

// MARK: - A hang's snapshot

int cc_hang_snapshot_begin(pid_t self) {
    pid_t none = 0;
    if (!atomic_compare_exchange_strong(&cc_hang_tid, &none, self)) return EBUSY;
    // Sequentially consistent with the crash path's claim below: either a crash sees this
    // snapshot and waits for it, or this snapshot sees the crash and gives way.
    if (atomic_load(&cc_reporting_tid) != 0 || atomic_load(cc_global.crash_owner) != 0) {
        atomic_store(&cc_hang_tid, 0);
        return EBUSY;
    }
    return 0;
}

// Every other thread frozen by ptrace (never a signal), each unwound and passed to
// `while_held` as soon as it stops, then let go at once: a thread is held for its own stack's
// sake only. The longest any thread was held, in ns.
int64_t cc_hang_snapshot_threads(pid_t self, void (*while_held)(cc_thread_slot *slot), char **record,
                                 size_t *record_cap) {
    int64_t start = cc_monotonic_ns();
    cc_after_thread_unwound = while_held;
    cc_threads_ask(self, start + CC_THREAD_ANSWER_NS, true);
    cc_threads_await(cc_unwind_other_threads);
    cc_unwind_other_threads();
    cc_after_thread_unwound = NULL;
    cc_threads_release();
    int64_t held = cc_freeze_longest_hold_ns();
    cc_threads_name();
    if (sigsetjmp(cc_thread_unwind_jump, 1) == 0) {
        cc_thread_unwind_armed = 1;
        cc_scan_late_modules(atomic_load_explicit(&cc_global.module_map, memory_order_acquire));
    }
    cc_thread_unwind_armed = 0;
    *record = cc_record;
    *record_cap = sizeof(cc_record);
    return held;
}

void cc_hang_snapshot_end(void) { atomic_store(&cc_hang_tid, 0); }

// MARK: - Chaining

static void cc_set_default(int signo) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(signo, &dfl, NULL);
}

// Sends the signal again to this thread with the original siginfo (si_code, si_pid,
// si_value), under the default action, so the process ends by it with a core dump.
static void cc_reraise(int signo, siginfo_t *info) {
    cc_set_default(signo);
    siginfo_t copy = *info;
    if (syscall(SYS_rt_tgsigqueueinfo, getpid(), cc_gettid(), signo, &copy) != 0)
        syscall(SYS_tgkill, getpid(), cc_gettid(), signo);
    sigset_t unblock;
    sigemptyset(&unblock);
    sigaddset(&unblock, signo);
    pthread_sigmask(SIG_UNBLOCK, &unblock, NULL);
}

static bool cc_is_default(const struct sigaction *sa) {
    return !(sa->sa_flags & SA_SIGINFO) && sa->sa_handler == SIG_DFL;
}

static bool cc_is_ignore(const struct sigaction *sa) {
    return !(sa->sa_flags & SA_SIGINFO) && sa->sa_handler == SIG_IGN;
}

static void cc_chain(int signo, siginfo_t *info, void *context) {
    struct sigaction previous = cc_global.previous[signo];
    bool recurs = cc_fault_recurs(signo, info);
    if (cc_is_ignore(&previous)) {
        // Only a hardware fault gets here (sent signals returned early), and the kernel
        // does not let one be ignored: the default action is what would have happened.
        cc_set_default(signo);
        if (!recurs) cc_reraise(signo, info);
        return;
    }
    sigaction(signo, &previous, NULL);
    if (cc_is_default(&previous)) {
        if (!recurs) cc_reraise(signo, info);
        return;
    }
    // An earlier handler (the Swift runtime's backtracer, the app's own) may want the other
    // threads (to list or suspend them itself), and may let the process go on: the report is
    // durable, so the threads go on first.
    cc_threads_release();
    // Call the previous handler as the kernel would have: its sa_mask added to the mask of
    // the interrupted code, the signal itself blocked unless SA_NODEFER, reset if asked.
    if (previous.sa_flags & SA_RESETHAND) cc_set_default(signo);
    sigset_t mask = ((ucontext_t *)context)->uc_sigmask;
    for (int s = 1; s < NSIG; s++)
        if (sigismember(&previous.sa_mask, s) == 1) sigaddset(&mask, s);
    if (previous.sa_flags & SA_NODEFER)
        sigdelset(&mask, signo);
    else
        sigaddset(&mask, signo);
    sigset_t saved;
    pthread_sigmask(SIG_SETMASK, &mask, &saved);
    if (previous.sa_flags & SA_SIGINFO)
        previous.sa_sigaction(signo, info, context);
    else
        previous.sa_handler(signo);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    cc_threads_release_held();
    // A fault that recurs meets whatever disposition the previous handler left; a sent
    // signal does not come back by itself, and the session is over: end it as the default would.
    if (!recurs) cc_reraise(signo, info);
}

// MARK: - Entry points

// The crash belongs to the first thread, in any copy of CrashCapture in the process, to take
// the word that every copy finds at install (crashcapture_crash_owner, looked up by name).
static bool cc_claim(pid_t self) {
    pid_t none = 0;
    return atomic_compare_exchange_strong(cc_global.crash_owner, &none, self) || none == self;
}

// This copy's session is the other copy's: its files go, so that replay finds one session
// that crashed, not a second one that seems killed. A journal of events is kept for replay.
static void cc_give_way_to_other_copy(void) {
    atomic_store(&cc_global.session_ended, 1);
    if (!cc_global.anonymous_file) unlinkat(cc_global.dir_fd, cc_global.file_name, 0);
    if (cc_global.sdk_session) return;
    char name[128];
    cc_buf b = {name, 0, sizeof(name) - 1, false};
    cc_buf_append_str(&b, CCF_SESSION_FILE_PREFIX);
    cc_buf_append_str(&b, cc_global.session_id);
    cc_buf_append_str(&b, "." CCF_SESSION_FILE_EXTENSION);
    name[b.len] = '\0';
    if (!b.overflow) unlinkat(cc_global.dir_fd, name, 0);
}

// For the exit paths (atexit, the preload's and the SDK's ends of a session): while a crash
// is being reported, a thread that reaches them must neither end the session as clean nor
// delete anything. Another thread waits here until the process dies (bounded); the reporting
// thread itself (a handler we chained to called exit) returns at once. 1: a crash was seen.
int crashcapture_crash_in_progress(void) {
    pid_t reporting = atomic_load(&cc_reporting_tid);
    if (reporting == 0) return 0;
    if (reporting != cc_gettid()) {
        struct timespec tick = {0, 10 * 1000000};
        for (int waited = 0; waited < 3000; waited++) nanosleep(&tick, NULL);
    }
    return 1;
}

void cc_signal_handler(int signo, siginfo_t *info, void *context) {
    int saved_errno = errno;
    int64_t entry_ns = cc_monotonic_ns();
    const struct sigaction *previous = &cc_global.previous[signo];
    if (info->si_code <= 0 && cc_is_ignore(previous)) {
        // Without us a sent signal would have been ignored: stay invisible.
        errno = saved_errno;
        return;
    }
    if (!atomic_load(&cc_global.installed)) {
        // Uninstalled, but a handler installed after us still chains here: pass it on.
        cc_chain(signo, info, context);
        errno = saved_errno;
        return;
    }
    pid_t self = cc_gettid();
    pid_t expected = 0;
    if (atomic_load(&cc_hang_tid) == self) {
        if (cc_thread_unwind_armed) siglongjmp(cc_thread_unwind_jump, 1);
        // The watchdog's own crash: the threads its snapshot holds go first, then it is a crash
        // like any other.
        cc_threads_release();
        atomic_store(&cc_hang_tid, 0);
    }
    if (atomic_load(&cc_reporting_tid) == self) {
        if (cc_thread_unwind_armed) siglongjmp(cc_thread_unwind_jump, 1);
        if (cc_stage_armed) siglongjmp(cc_stage_jump, 1);
        // A fault after the report (in a chained handler, say): let it take its course.
        cc_chain(signo, info, context);
    } else if (atomic_load(cc_global.crash_owner) == self &&
               atomic_compare_exchange_strong(&cc_reporting_tid, &expected, self)) {
        // Another copy of CrashCapture in this process (the preload library beside a linked
        // install) reported this crash before chaining to us: one crash, one report.
        cc_give_way_to_other_copy();
        atomic_store(&cc_found.report_written, 1);
        cc_chain(signo, info, context);
    } else if (cc_claim(self) && atomic_compare_exchange_strong(&cc_reporting_tid, &expected, self)) {
        // A hang's snapshot under way shares the threads' machinery: it ends within
        // milliseconds (its threads are let go after 250 ms at most); 2 s bound.
        struct timespec tick = {0, 1000000};
        for (int waited_ms = 0; waited_ms < 2000 && atomic_load(&cc_hang_tid) != 0; waited_ms++) nanosleep(&tick, NULL);
        cc_report(signo, info, (ucontext_t *)context, entry_ns);
        atomic_store(&cc_found.report_written, 1);
        cc_chain(signo, info, context);
    } else {
        // Another thread is reporting. Give it time to finish and to end the process with
        // its own signal; if it does not within the bound, end it with ours.
        cc_threads_note_waiting_crasher(self);
        // Answer the reporter's request for this thread's context while waiting: the report
        // then shows this crash's stack too (libunwind crosses this handler's signal frame).
        if (cc_global.thread_signal > 0) {
            sigset_t ask;
            sigemptyset(&ask);
            sigaddset(&ask, cc_global.thread_signal);
            pthread_sigmask(SIG_UNBLOCK, &ask, NULL);
        }
        struct timespec tick = {0, 1000000};
        for (int waited_ms = 0; waited_ms < 20000 && !atomic_load(&cc_found.report_written); waited_ms++)
            nanosleep(&tick, NULL);
        for (int waited_ms = 0; waited_ms < 10000; waited_ms++) nanosleep(&tick, NULL);
        cc_chain(signo, info, context);
    }
    errno = saved_errno;
}
