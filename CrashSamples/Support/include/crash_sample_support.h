// Ways to crash a Linux process, shared by the Swift and the C/C++ crash samples. Every
// crashing function is noinline and named for what it does, so tests can find it among the
// top frames of a report.
#ifndef CRASH_SAMPLE_SUPPORT_H
#define CRASH_SAMPLE_SUPPORT_H

#ifdef __cplusplus
extern "C" {
#endif

/// Runs the named C/C++ crash kind on the calling thread. Returns 0 if the kind is not a
/// C/C++ kind (the caller may know it), and does not return otherwise.
int sample_run_c_kind(const char *kind);
/// Name of the C/C++ kind at index, NULL past the last.
const char *sample_c_kind_at(int index);

/// Runs `body(kind)` on a new pthread and waits for it (so crashes happen off the main thread).
void sample_on_pthread(void (*body)(const char *), const char *kind);

/// Chaining scenarios: a handler installed before capture (SA_SIGINFO or signal()), SIG_IGN,
/// or installed after capture and chaining to it. Each handler appends a line to the file
/// named by CRASH_SAMPLE_MARKER, then lets the signal take its default course.
void sample_install_previous_siginfo_handler(int signo);
void sample_install_previous_plain_handler(int signo);
void sample_install_handler_after_capture(int signo);

/// A crash on a new pthread 100 ms from now, while the caller goes on (to wait).
void sample_start_crash_later(void (*body)(const char *), const char *kind);
/// Waits once on the calling thread in the way named (sleep, nanosleep, pause, poll, epoll_wait,
/// select, read, sigwait, futex, join: the crash thread), then prints how the wait ended and
/// returns 0; -1 for an unknown name.
int sample_main_wait(const char *how);
const char *sample_main_wait_at(int index);
/// pthread_setname_np for the calling thread (Swift cannot reach it through Glibc).
void sample_name_this_thread(const char *name);
/// A seccomp filter that fails ptrace and process_vm_readv with EPERM, for the whole process.
void sample_deny_ptrace(void);
void sample_trap_acct_syscall(void);

/// Hostile states.
void sample_start_malloc_hammer(void);
void sample_corrupt_heap(void);

/// Hangs: four threads waiting as a server's do (epoll_wait, nanosleep, poll, sigtimedwait),
/// each counting the EINTR it sees; a handler blocked in nanosleep; two locks taken in
/// opposite orders by this thread and another (never returns).
void sample_start_waiters(void);
int sample_eintr_count(void);
void sample_handler_blocked_in_sleep(int milliseconds);
void sample_deadlock_on_this_thread(void);

/// Unbounded recursion.
void sample_recurse_forever(void);
/// Blocks until a signal kills the process (for kills sent from outside).
void sample_wait_for_signal(void);

#ifdef __cplusplus
}
#endif

/// fork(), for the Swift sample.
int sample_fork(void);

#endif
