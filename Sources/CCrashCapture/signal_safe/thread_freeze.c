// Freezing the other threads with ptrace, as breakpad and crashpad do on Linux: a helper
// process that shares our memory (clone with CLONE_VM, on a stack set aside at install) seizes
// and interrupts every listed thread, copies each one's registers into its slot, and holds
// them stopped until it is told to let go, or until the process dies.
//
// Why not a signal to each thread: a signal handler ends the waits the kernel never restarts
// (nanosleep's neighbours epoll_wait, sigtimedwait...) with EINTR once the thread goes on, and
// threads that block every signal (Dispatch's workers) cannot answer at all. A ptrace stop
// runs no code in the thread and reaches it whatever its signal mask.
//
// The rules of crash_path.c apply here. The helper is a process of its own that shares our
// thread's TLS, so it makes raw system calls only (glibc's syscall() would write the crashing
// thread's errno), allocates nothing and touches nothing but the slots and the words below.
#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "cc_internal.h"

#ifndef PTRACE_SEIZE
#define PTRACE_SEIZE 0x4206
#define PTRACE_INTERRUPT 0x4207
#define PTRACE_EVENT_STOP 128
#endif
#define CC_SYS_close_range 436  // the same number on x86_64 and aarch64
#define CC_CLOSE_RANGE_UNSHARE (1U << 1)
#ifndef NT_PRSTATUS
#define NT_PRSTATUS 1
#endif

enum {
    CC_HELPER_STARTING = 0,
    CC_HELPER_ALLOWED = 1,   // ptrace works: the first thread is seized, the others follow
    CC_HELPER_REFUSED = 2,   // ptrace refused for the first thread: nothing was touched
    CC_HELPER_DONE = 3,      // every seized thread has stopped (or exited)
};

static char cc_helper_stack[64 * 1024] __attribute__((aligned(64)));
static cc_thread_slot *cc_frozen_slots;
static int cc_frozen_count;
static _Atomic uint32_t *cc_frozen_answers;
static _Atomic uint32_t cc_helper_state;
static _Atomic uint32_t cc_helper_go;
static _Atomic uint32_t cc_helper_release;
static pid_t cc_helper_pid;
static bool cc_freeze_for_hang;  // the process goes on: bounded hold, interrupted waits run again
// A hang's threads are let go one by one, each once its stack is taken: the reporting thread
// marks the slot and counts it (a futex word the helper waits on).
static _Atomic uint8_t cc_let_go[CC_MAX_THREADS];
static _Atomic uint32_t cc_let_go_count;
static bool cc_detached[CC_MAX_THREADS];
static int64_t cc_interrupted_at[CC_MAX_THREADS];  // when the helper asked each thread to stop
static int64_t cc_longest_hold;  // the longest any thread was held, interrupt to detach
static int cc_dumpable_before = -1;  // put back once every thread is seized
// Per slot: seized by the helper, its stop seen, and the signal a stop reported (handed back
// at the detach).
static bool cc_seized[CC_MAX_THREADS];
static bool cc_stop_seen[CC_MAX_THREADS];
static int cc_stop_signal[CC_MAX_THREADS];

// MARK: - Raw system calls, for the helper

static long cc_raw_syscall(long n, long a, long b, long c, long d, long e) {
#if defined(__x86_64__)
    long result;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    __asm__ volatile("syscall"
                     : "=a"(result)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return result;
#elif defined(__aarch64__)
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4) : "memory");
    return x0;
#else
    (void)n, (void)a, (void)b, (void)c, (void)d, (void)e;
    return -ENOSYS;
#endif
}

static void cc_raw_wake(_Atomic uint32_t *word) {
    cc_raw_syscall(SYS_futex, (long)word, FUTEX_WAKE_PRIVATE, 0x7fffffff, 0, 0);
}

// MARK: - Registers into a context that libunwind can start from

static bool cc_read_registers(pid_t tid, cc_thread_slot *slot) {
    ucontext_t *context = &slot->context;
    memset(&context->uc_mcontext, 0, sizeof(context->uc_mcontext));
#if defined(__x86_64__)
    struct user_regs_struct r;
    if (cc_raw_syscall(SYS_ptrace, PTRACE_GETREGS, tid, 0, (long)&r, 0) != 0) return false;
    greg_t *g = context->uc_mcontext.gregs;
    g[REG_R8] = (greg_t)r.r8, g[REG_R9] = (greg_t)r.r9, g[REG_R10] = (greg_t)r.r10, g[REG_R11] = (greg_t)r.r11;
    g[REG_R12] = (greg_t)r.r12, g[REG_R13] = (greg_t)r.r13, g[REG_R14] = (greg_t)r.r14, g[REG_R15] = (greg_t)r.r15;
    g[REG_RDI] = (greg_t)r.rdi, g[REG_RSI] = (greg_t)r.rsi, g[REG_RBP] = (greg_t)r.rbp, g[REG_RBX] = (greg_t)r.rbx;
    g[REG_RDX] = (greg_t)r.rdx, g[REG_RAX] = (greg_t)r.rax, g[REG_RCX] = (greg_t)r.rcx, g[REG_RSP] = (greg_t)r.rsp;
    g[REG_RIP] = (greg_t)r.rip, g[REG_EFL] = (greg_t)r.eflags;
    slot->in_system_call = (long)r.orig_rax != -1;
    slot->syscall_number = (long)r.orig_rax;
    slot->thread_pointer = (uintptr_t)r.fs_base;
    return true;
#elif defined(__aarch64__)
    struct user_pt_regs r;
    struct iovec io = {&r, sizeof(r)};
    if (cc_raw_syscall(SYS_ptrace, PTRACE_GETREGSET, tid, NT_PRSTATUS, (long)&io, 0) != 0) return false;
    for (int i = 0; i < 31; i++) context->uc_mcontext.regs[i] = r.regs[i];
    context->uc_mcontext.sp = r.sp;
    context->uc_mcontext.pc = r.pc;
    context->uc_mcontext.pstate = r.pstate;
    return true;
#else
    (void)tid, (void)slot;
    return false;
#endif
}

// A wait that the stop ended with EINTR, and that the kernel never restarts by itself
// (epoll_wait, sigtimedwait, semtimedop, a socket call with a timeout): set to run again once
// the thread goes on, as the kernel does for the waits it restarts, so that a process that goes
// on (a hang report) sees no EINTR. Only after a stop that reported no signal of its own.
static long cc_slot_result(const cc_thread_slot *slot) {
#if defined(__x86_64__)
    return (long)slot->context.uc_mcontext.gregs[REG_RAX];
#else
    (void)slot;
    return 0;
#endif
}

static void cc_rerun_interrupted_wait(pid_t tid) {
#if defined(__x86_64__)
    struct user_regs_struct r;
    if (cc_raw_syscall(SYS_ptrace, PTRACE_GETREGS, tid, 0, (long)&r, 0) != 0) return;
    if ((long)r.orig_rax < 0 || (long)r.rax != -EINTR) return;
    r.rax = r.orig_rax;
    r.rip -= 2;  // back onto the `syscall` instruction
    cc_raw_syscall(SYS_ptrace, PTRACE_SETREGS, tid, 0, (long)&r, 0);
#else
    (void)tid;
#endif
}

// MARK: - The helper process

static void cc_answer(int index) {
    int asked = CC_SLOT_ASKED;
    if (!atomic_compare_exchange_strong(&cc_frozen_slots[index].state, &asked, CC_SLOT_CAPTURED)) return;
    atomic_fetch_add(cc_frozen_answers, 1);
    cc_raw_wake(cc_frozen_answers);
}

static void cc_miss(int index, const char *why) {
    int asked = CC_SLOT_ASKED;
    cc_frozen_slots[index].why = why;
    if (atomic_compare_exchange_strong(&cc_frozen_slots[index].state, &asked, CC_SLOT_MISSED)) {
        atomic_fetch_add(cc_frozen_answers, 1);
        cc_raw_wake(cc_frozen_answers);
    }
}

static int cc_slot_of(pid_t tid) {
    for (int i = 0; i < cc_frozen_count; i++)
        if (cc_frozen_slots[i].tid == tid) return i;
    return -1;
}

static int64_t cc_raw_now_ns(void) {
    struct timespec now;
    cc_raw_syscall(SYS_clock_gettime, CLOCK_MONOTONIC, (long)&now, 0, 0, 0);
    return (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
}

static void cc_detach(int i) {
    // Only a thread whose registers at the stop showed a system call returning EINTR.
    if (cc_freeze_for_hang && cc_stop_seen[i] && cc_stop_signal[i] == 0 && cc_frozen_slots[i].syscall_number >= 0 &&
        cc_slot_result(&cc_frozen_slots[i]) == -EINTR)
        cc_rerun_interrupted_wait(cc_frozen_slots[i].tid);
    cc_raw_syscall(SYS_ptrace, PTRACE_DETACH, cc_frozen_slots[i].tid, 0, cc_stop_signal[i], 0);
    cc_detached[i] = true;
    int64_t held = cc_raw_now_ns() - cc_interrupted_at[i];
    if (held > cc_longest_hold) cc_longest_hold = held;
}

// A hang's threads whose stacks are taken go on; true once every seized thread has.
static bool cc_detach_let_go(void) {
    bool all = true;
    for (int i = 0; i < cc_frozen_count; i++) {
        if (!cc_seized[i] || cc_detached[i]) continue;
        if (atomic_load(&cc_let_go[i]))
            cc_detach(i);
        else
            all = false;
    }
    return all;
}

static int cc_freeze_helper(void *unused) {
    (void)unused;
    // Every signal blocked: a fault here kills the helper alone, never runs our handler in it.
    uint64_t all = ~(uint64_t)0;
    cc_raw_syscall(SYS_rt_sigprocmask, SIG_SETMASK, (long)&all, 0, sizeof(all), 0);
    // Gone with the crashing thread, which holds no thread frozen past the process's death.
    cc_raw_syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    // SIGCHLD ignored here (the helper has its own dispositions): a frozen thread that dies with
    // the process is then released at once, instead of staying a zombie until its tracer, the
    // helper, dies too.
    struct {
        void *handler;
        unsigned long flags;
        void *restorer;
        uint64_t mask;
    } ignore = {SIG_IGN, 0, NULL, 0};
    cc_raw_syscall(SYS_rt_sigaction, SIGCHLD, (long)&ignore, 0, sizeof(uint64_t), 0);
    // A table of descriptors of its own, empty (Linux 5.9; elsewhere it shares ours): the
    // helper must not hold the app's files, locks and sockets open a moment past its death.
    cc_raw_syscall(CC_SYS_close_range, 0, ~0U, CC_CLOSE_RANGE_UNSHARE, 0, 0);
    while (atomic_load(&cc_helper_go) == 0)
        cc_raw_syscall(SYS_futex, (long)&cc_helper_go, FUTEX_WAIT_PRIVATE, 0, 0, 0);
    int pending = 0, seized = 0;
    for (int i = 0; i < cc_frozen_count; i++) {
        pid_t tid = cc_frozen_slots[i].tid;
        long result = cc_raw_syscall(SYS_ptrace, PTRACE_SEIZE, tid, 0, 0, 0);
        if (result == -EPERM && seized == 0) {
            // Refused (Yama, seccomp, no capability): the caller asks by signal instead.
            atomic_store(&cc_helper_state, CC_HELPER_REFUSED);
            cc_raw_wake(&cc_helper_state);
            return 0;
        }
        if (result != 0) {
            cc_miss(i, result == -ESRCH ? "exited" : result == -EPERM ? "ptrace refused for this thread"
                                                                      : "could not be seized");
            continue;
        }
        if (seized++ == 0) {
            atomic_store(&cc_helper_state, CC_HELPER_ALLOWED);
            cc_raw_wake(&cc_helper_state);
        }
        cc_seized[i] = true;
        cc_interrupted_at[i] = cc_raw_now_ns();
        if (cc_raw_syscall(SYS_ptrace, PTRACE_INTERRUPT, tid, 0, 0, 0) != 0) {
            cc_miss(i, "could not be interrupted");
            continue;
        }
        pending++;
    }
    // The seizing was the only step that needed the process dumpable.
    if (cc_dumpable_before >= 0) cc_raw_syscall(SYS_prctl, PR_SET_DUMPABLE, cc_dumpable_before, 0, 0, 0);
    while (pending > 0) {
        int status = 0;
        long tid = cc_raw_syscall(SYS_wait4, -1, (long)&status, __WALL, 0, 0);
        if (tid == -EINTR) continue;
        if (tid <= 0) break;
        int index = cc_slot_of((pid_t)tid);
        if (index < 0 || cc_stop_seen[index]) continue;
        cc_stop_seen[index] = true;
        pending--;
        if (WIFSTOPPED(status)) {
            // A signal that arrived meanwhile stops the thread too: it is handed back at the detach.
            if ((status >> 16) == 0) cc_stop_signal[index] = WSTOPSIG(status);
            if (atomic_load(&cc_frozen_slots[index].state) != CC_SLOT_ASKED) continue;
            if (cc_read_registers((pid_t)tid, &cc_frozen_slots[index]))
                cc_answer(index);
            else
                cc_miss(index, "its registers could not be read");
        } else {
            cc_seized[index] = false;  // exited or killed: nothing to detach
            cc_miss(index, "exited");
        }
        if (cc_freeze_for_hang) cc_detach_let_go();
    }
    atomic_store(&cc_helper_state, CC_HELPER_DONE);
    cc_raw_wake(&cc_helper_state);
    if (cc_freeze_for_hang) {
        // Each thread goes on once its stack is taken. All go after 250 ms whatever happens: a
        // process that goes on must never be held longer, even by a reporter stuck itself.
        int64_t until = cc_raw_now_ns() + 250 * 1000000LL;
        for (;;) {
            uint32_t seen = atomic_load(&cc_let_go_count);
            if (cc_detach_let_go() || atomic_load(&cc_helper_release) != 0) break;
            int64_t left = until - cc_raw_now_ns();
            if (left <= 0) break;
            struct timespec wait = {(time_t)(left / 1000000000), (long)(left % 1000000000)};
            cc_raw_syscall(SYS_futex, (long)&cc_let_go_count, FUTEX_WAIT_PRIVATE, seen, (long)&wait, 0);
        }
    } else {
        // Held until released (a chained handler needs the threads back) or until the process dies.
        struct timespec bound = {60, 0};
        while (atomic_load(&cc_helper_release) == 0)
            if (cc_raw_syscall(SYS_futex, (long)&cc_helper_release, FUTEX_WAIT_PRIVATE, 0, (long)&bound, 0) ==
                -ETIMEDOUT)
                break;
    }
    for (int i = 0; i < cc_frozen_count; i++)
        if (cc_seized[i] && !cc_detached[i]) cc_detach(i);
    return 0;
}

// MARK: - The crashing thread's side

static void cc_restore_dumpable(void) {
    if (cc_dumpable_before >= 0) prctl(PR_SET_DUMPABLE, cc_dumpable_before, 0, 0, 0);
    cc_dumpable_before = -1;
}

void cc_freeze_prepare(void) { cc_touch_pages(cc_helper_stack + sizeof(cc_helper_stack) - 8192, 8192); }

int cc_freeze_start(cc_thread_slot *slots, int count, _Atomic uint32_t *answers, bool for_hang, const char **why) {
    cc_freeze_for_hang = for_hang;
    cc_frozen_slots = slots;
    cc_frozen_count = count;
    cc_frozen_answers = answers;
    atomic_store(&cc_helper_state, CC_HELPER_STARTING);
    atomic_store(&cc_helper_go, 0);
    atomic_store(&cc_helper_release, 0);
    memset(cc_seized, 0, sizeof(cc_seized));
    memset(cc_stop_seen, 0, sizeof(cc_stop_seen));
    memset(cc_stop_signal, 0, sizeof(cc_stop_signal));
    memset(cc_detached, 0, sizeof(cc_detached));
    for (int i = 0; i < count; i++) atomic_store(&cc_let_go[i], 0);
    atomic_store(&cc_let_go_count, 0);
    cc_longest_hold = 0;
    // A process that is not dumpable can be traced only by a privileged tracer: dumpable while
    // the helper seizes the threads (the check is made at the seizing only), then as it was, so
    // that the core dump is what it would have been.
    int dumpable = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
    cc_dumpable_before = dumpable != 1 && dumpable >= 0 && prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) == 0 ? dumpable : -1;
    // No exit signal: the app's SIGCHLD handler must not run for our helper.
    pid_t helper = clone(cc_freeze_helper, cc_helper_stack + sizeof(cc_helper_stack),
                         CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_UNTRACED, NULL);
    if (helper <= 0) {
        cc_restore_dumpable();
        *why = "clone refused";
        return -1;
    }
    cc_helper_pid = helper;
    // Yama (ptrace_scope 1) lets only a named tracer attach to us; elsewhere this fails harmlessly.
    prctl(PR_SET_PTRACER, helper, 0, 0, 0);
    atomic_store(&cc_helper_go, 1);
    syscall(SYS_futex, &cc_helper_go, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    return 0;
}

int cc_freeze_confirm(const char **why) {
    // Until the helper knows whether ptrace is allowed (one system call for the first thread).
    struct timespec tick = {0, 200 * 1000};
    for (int waited = 0; waited < 5000 && atomic_load(&cc_helper_state) == CC_HELPER_STARTING; waited++)
        syscall(SYS_futex, &cc_helper_state, FUTEX_WAIT_PRIVATE, CC_HELPER_STARTING, &tick, NULL, 0);
    uint32_t state = atomic_load(&cc_helper_state);
    if (state != CC_HELPER_ALLOWED && state != CC_HELPER_DONE) cc_restore_dumpable();
    if (state == CC_HELPER_REFUSED || state == CC_HELPER_STARTING) {
        *why = state == CC_HELPER_REFUSED ? "ptrace refused" : "the freezing helper did not start";
        cc_freeze_release();
        return -1;
    }
    return 0;
}

int64_t cc_freeze_longest_hold_ns(void) { return cc_longest_hold; }

void cc_freeze_let_go(int index) {
    if (!cc_freeze_for_hang || cc_helper_pid <= 0 || index < 0 || index >= cc_frozen_count) return;
    atomic_store(&cc_let_go[index], 1);
    atomic_fetch_add(&cc_let_go_count, 1);
    syscall(SYS_futex, &cc_let_go_count, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

void cc_freeze_release(void) {
    if (cc_helper_pid <= 0) return;
    if (cc_freeze_for_hang) {
        atomic_fetch_add(&cc_let_go_count, 1);
        syscall(SYS_futex, &cc_let_go_count, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    }
    atomic_store(&cc_helper_release, 1);
    syscall(SYS_futex, &cc_helper_release, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    // The helper may still wait for a thread that never stops (an uninterruptible wait): after
    // a short while it is killed, and the kernel detaches its tracees.
    int status;
    struct timespec tick = {0, 100 * 1000};
    for (int waited = 0; waited < 200; waited++) {
        if (syscall(SYS_wait4, cc_helper_pid, &status, __WALL | WNOHANG, NULL) != 0) goto reaped;
        nanosleep(&tick, NULL);
    }
    syscall(SYS_kill, cc_helper_pid, SIGKILL);
    syscall(SYS_wait4, cc_helper_pid, &status, __WALL, NULL);
reaped:
    cc_helper_pid = 0;
    prctl(PR_SET_PTRACER, 0, 0, 0, 0);
}
