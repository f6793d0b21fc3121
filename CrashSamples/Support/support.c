#include <assert.h>
#include <poll.h>
#include <stdatomic.h>
#include <dirent.h>
#include <sys/stat.h>
#include <dlfcn.h>
#include <link.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "crash_sample_support.h"

void sample_throw_runtime_error(void);
void sample_throw_non_std(void);
void sample_throw_from_noexcept(void);

#define NOINLINE __attribute__((noinline))

static volatile int sample_sink;

NOINLINE void sample_null_read(void) {
    volatile int *volatile p = NULL;
    sample_sink = *p;
}

NOINLINE void sample_null_write(void) {
    volatile int *volatile p = NULL;
    *p = 1;
}

NOINLINE void sample_wild_pointer(void) {
    volatile int *volatile p = (int *)(uintptr_t)0x5ead0000beefULL;  // canonical, unmapped
    *p = 1;
}

// Outside the 47-bit user address space: a general protection fault, which the kernel
// reports as SIGSEGV with si_code SI_KERNEL and no fault address.
NOINLINE void sample_noncanonical_pointer(void) {
    volatile int *volatile p = (int *)(uintptr_t)0xdeadbeef0000beefULL;
    *p = 1;
}

// Two read-only pages, the store at the start of the second: the memory read around the
// fault then has readable bytes on both sides, whatever the mappings around them.
NOINLINE void sample_write_readonly(void) {
    char *pages = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    volatile char *volatile p = pages + 4096;
    *p = 1;
}

// The store after each call keeps release builds from making it a tail call, which would
// (truly) remove the calling frame from the stack.
NOINLINE void sample_jump_nonexec(void) {
    char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void (*volatile fn)(void) = (void (*)(void))page;
    fn();
    sample_sink = 1;
}

NOINLINE void sample_null_function(void) {
    void (*volatile fn)(void) = NULL;
    fn();
    sample_sink = 1;
}

NOINLINE void sample_bus_truncated_mmap(void) {
    char path[] = "/tmp/crash-sample-bus-XXXXXX";
    int fd = mkstemp(path);
    unlink(path);
    if (fd < 0 || ftruncate(fd, 4096) != 0) abort();
    volatile char *map = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
    if (ftruncate(fd, 0) != 0) abort();
    sample_sink = map[4096 + 16];
}

NOINLINE void sample_int_divide_by_zero(void) {
    volatile int zero = 0;
    sample_sink = 42 / zero;
}

NOINLINE void sample_builtin_trap(void) { __builtin_trap(); }

NOINLINE void sample_abort(void) {
    abort();
}

// glibc finds the second free inside free() and aborts there, its arena lock held: the crash
// path must not need malloc (nor anything that takes that lock) to write the report.
NOINLINE void sample_double_free(void) {
    char *volatile block = malloc(0x500);  // past the largest tcache bin: freed under the lock
    char *volatile guard = malloc(16);     // keeps the block off the top chunk
    free(block);
    free(block);
    free(guard);
}

NOINLINE void sample_assert_fail(void) {
    volatile int answer = 41;
    assert(answer == 42);
    abort();  // NDEBUG builds still crash
}

NOINLINE void sample_raise_segv(void) {
    raise(SIGSEGV);
    sample_sink = 1;
}

NOINLINE void sample_sigqueue_segv(void) {
    union sigval value = {.sival_int = 4242};
    sigqueue(getpid(), SIGSEGV, value);
    sample_sink = 1;
}

static void *sample_sleeping_thread(void *unused) {
    (void)unused;
    for (;;) pause();
    return NULL;
}

NOINLINE void sample_pthread_kill_thread(void) {
    pthread_t thread;
    pthread_create(&thread, NULL, sample_sleeping_thread, NULL);
    usleep(20000);
    pthread_kill(thread, SIGSEGV);
    for (;;) pause();
}

NOINLINE void sample_crash_in_dlopened_library(void) {
    void *zlib = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (zlib == NULL) abort();
    unsigned long (*crc)(unsigned long, const unsigned char *, unsigned) = (unsigned long (*)(
        unsigned long, const unsigned char *, unsigned))dlsym(zlib, "crc32");
    if (crc == NULL) abort();
    crc(0, (const unsigned char *)(uintptr_t)16, 64);
}

// The loader's lock is held while dl_iterate_phdr runs its callback: the unwinder (which
// itself calls dl_iterate_phdr) must not deadlock on it.
static int sample_crash_in_phdr_callback(struct dl_phdr_info *info, size_t size, void *data) {
    (void)info;
    (void)size;
    (void)data;
    sample_null_read();
    return 0;
}

NOINLINE void sample_crash_holding_loader_lock(void) { dl_iterate_phdr(sample_crash_in_phdr_callback, NULL); }

static pthread_barrier_t sample_crash_barrier;

static void *sample_crash_together(void *unused) {
    (void)unused;
    pthread_barrier_wait(&sample_crash_barrier);
    sample_null_read();
    return NULL;
}

static void sample_crash_on_threads(int threads) {
    pthread_t ids[256];
    pthread_barrier_init(&sample_crash_barrier, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) pthread_create(&ids[i], NULL, sample_crash_together, NULL);
    for (int i = 0; i < threads; i++) pthread_join(ids[i], NULL);
}

NOINLINE void sample_concurrent_crashes(void) { sample_crash_on_threads(8); }

NOINLINE void sample_concurrent_crashes_256(void) { sample_crash_on_threads(256); }

// What the hostile kinds below do to a process comes once it has run a while: a C install makes
// its files 20 ms after it returns (deferred_install.c), and these kinds test what those files
// protect against.
static void sample_run_a_while(void) {
    struct timespec while_ = {0, 60 * 1000000};
    nanosleep(&while_, NULL);
}

// The disk filled after install (a file beside the capture directory, until ENOSPC), then a
// crash: the report goes into the space reserved at install.
NOINLINE void sample_fill_disk_then_segv(void) {
    sample_run_a_while();
    const char *directory = getenv("CRASHCAPTURE_DIR");
    if (directory == NULL) abort();
    char path[4096];
    snprintf(path, sizeof(path), "%s/../filler", directory);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) abort();
    static char block[65536];
    while (write(fd, block, sizeof(block)) > 0) {}
    while (write(fd, block, 1) > 0) {}
    close(fd);
    sample_null_read();
}

// A system call the process's seccomp filter forbids (SECCOMP_RET_TRAP): SIGSYS.
NOINLINE void sample_forbidden_syscall(void) {
    sample_trap_acct_syscall();
    // Code after the call keeps it from being a tail call: this frame stays on the stack.
    if (syscall(SYS_acct, NULL) == 0) abort();
}

// The file-size limit lowered after install, then a crash: the process must still die of
// SIGSEGV, never SIGXFSZ. With only the soft limit lowered the report is still written.
static void sample_lower_file_size_limit(bool hard_too) {
    struct rlimit limit;
    getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = 1024;
    if (hard_too) limit.rlim_max = 1024;
    setrlimit(RLIMIT_FSIZE, &limit);
}

NOINLINE void sample_file_size_soft_then_segv(void) {
    sample_lower_file_size_limit(false);
    sample_null_read();
}

NOINLINE void sample_file_size_hard_then_segv(void) {
    sample_lower_file_size_limit(true);
    sample_null_read();
}

// Every descriptor taken, then a crash: the report must still have its full stack.
NOINLINE void sample_no_descriptors_then_segv(void) {
    sample_run_a_while();
    while (open("/dev/null", O_RDONLY) >= 0) {}
    sample_null_read();
}

// The capture directory made read-only after install: the report can no longer be given a
// name there. (Run as a user without CAP_DAC_OVERRIDE, or the mode does not bind.)
NOINLINE void sample_directory_read_only_then_segv(void) {
    sample_run_a_while();
    const char *directory = getenv("CRASHCAPTURE_DIR");
    if (directory == NULL || chmod(directory, 0500) != 0) abort();
    sample_null_read();
}

// The process's crash file deleted from under it (a cleanup job, say), and the directory
// made read-only: no file of its own can hold the report.
NOINLINE void sample_crash_file_deleted_read_only_then_segv(void) {
    sample_run_a_while();
    const char *directory = getenv("CRASHCAPTURE_DIR");
    DIR *entries = directory != NULL ? opendir(directory) : NULL;
    if (entries == NULL) abort();
    for (struct dirent *entry; (entry = readdir(entries)) != NULL;) {
        size_t length = strlen(entry->d_name);
        if (strncmp(entry->d_name, "crash-", 6) == 0 && length > 4 && strcmp(entry->d_name + length - 4, ".ccr") == 0)
            unlinkat(dirfd(entries), entry->d_name, 0);
    }
    closedir(entries);
    if (chmod(directory, 0500) != 0) abort();
    sample_null_read();
}

// Every descriptor past stderr closed after install (closefrom(3), as daemons do) and the
// numbers reused by pipes, one in two full (a write blocks) and the others empty (a read
// blocks): the crash path must touch none of them, whatever it kept open at install.
NOINLINE void sample_descriptors_reused_then_segv(void) {
    sample_run_a_while();
    for (int fd = 3; fd < 256; fd++) close(fd);
    for (int i = 0; i < 16; i++) {
        int ends[2];
        if (pipe(ends) != 0) abort();
        if (i % 2 == 0) {
            fcntl(ends[1], F_SETFL, O_NONBLOCK);
            char block[4096] = {0};
            while (write(ends[1], block, sizeof(block)) > 0) {}
            fcntl(ends[1], F_SETFL, 0);
        }
    }
    sample_null_read();
}

// The capture directory removed after install, everything in it first.
NOINLINE void sample_directory_removed_then_segv(void) {
    sample_run_a_while();
    const char *directory = getenv("CRASHCAPTURE_DIR");
    DIR *entries = directory != NULL ? opendir(directory) : NULL;
    if (entries == NULL) abort();
    for (struct dirent *entry; (entry = readdir(entries)) != NULL;) {
        if (strcmp(entry->d_name, ".") != 0 && strcmp(entry->d_name, "..") != 0)
            unlinkat(dirfd(entries), entry->d_name, 0);
    }
    closedir(entries);
    if (rmdir(directory) != 0) abort();
    sample_null_read();
}

// MARK: - Threads for the report's every-thread capture

static _Atomic int sample_parked;

// Each parked thread says it is about to block; the crash comes once all have (and a moment
// later, so that each is inside its system call).
static void sample_about_to_park(void) { atomic_fetch_add(&sample_parked, 1); }

static void sample_wait_for_parked(int count) {
    while (atomic_load(&sample_parked) < count) usleep(1000);
    usleep(30000);
}

// The same, with the crashing thread running through the last 30 ms instead of asleep, as a
// thread that crashes is: after a sleep its crash would start on a cold CPU.
static void sample_wait_for_parked_running(int count) {
    while (atomic_load(&sample_parked) < count) usleep(1000);
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do clock_gettime(CLOCK_MONOTONIC, &now);
    while ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) < 30000000L);
}

static pthread_mutex_t sample_park_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sample_park_cond = PTHREAD_COND_INITIALIZER;
static int sample_park_pipe[2];

NOINLINE static void *sample_park_in_futex(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "park-futex");
    pthread_mutex_lock(&sample_park_mutex);
    sample_about_to_park();
    for (;;) pthread_cond_wait(&sample_park_cond, &sample_park_mutex);
    return NULL;
}

NOINLINE static void *sample_park_in_read(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "park-read");
    char byte;
    sample_about_to_park();
    for (;;) (void)!read(sample_park_pipe[0], &byte, 1);
    return NULL;
}

NOINLINE static void *sample_park_in_nanosleep(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "park-sleep");
    sample_about_to_park();
    for (;;) {
        struct timespec hour = {3600, 0};
        nanosleep(&hour, NULL);
    }
    return NULL;
}

NOINLINE static void *sample_park_in_poll(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "park-poll");
    struct pollfd wait = {.fd = sample_park_pipe[0], .events = POLLIN};
    sample_about_to_park();
    for (;;) poll(&wait, 1, -1);
    return NULL;
}

// A thread that blocks every signal: it cannot be asked for its context.
NOINLINE static void *sample_block_everything(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "blocker");
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    sample_about_to_park();
    for (;;) {
        struct timespec hour = {3600, 0};
        nanosleep(&hour, NULL);
    }
    return NULL;
}

static void sample_start(void *(*body)(void *)) {
    pthread_t id;
    pthread_create(&id, NULL, body, NULL);
    pthread_detach(id);
}

NOINLINE void sample_threads_parked(void) {
    if (pipe(sample_park_pipe) != 0) abort();
    sample_start(sample_park_in_futex);
    sample_start(sample_park_in_read);
    sample_start(sample_park_in_nanosleep);
    sample_start(sample_park_in_poll);
    sample_wait_for_parked(4);
    sample_null_read();
}

NOINLINE void sample_thread_blocks_signals(void) {
    sample_start(sample_block_everything);
    sample_start(sample_park_in_nanosleep);
    sample_wait_for_parked(2);
    sample_null_read();
}

// CRASH_SAMPLE_DEPTH: how many calls deep each thread parks or crashes, through four
// functions in turn, so that a report at the format's maxima (513 threads of 128 frames) has
// frames at many addresses, as a real program's have.
static int sample_depth(void) {
    const char *wanted = getenv("CRASH_SAMPLE_DEPTH");
    return wanted != NULL ? atoi(wanted) : 0;
}

typedef void (*sample_deep_body)(void);
NOINLINE static void sample_deep_a(int left, sample_deep_body body);
NOINLINE static void sample_deep_b(int left, sample_deep_body body);
NOINLINE static void sample_deep_c(int left, sample_deep_body body);
NOINLINE static void sample_deep_d(int left, sample_deep_body body);
// The volatile read after each call keeps the call from becoming a jump.
static volatile int sample_deep_sink;
#define SAMPLE_DEEP(name, next)                                          \
    NOINLINE static void name(int left, sample_deep_body body) {         \
        if (left <= 0)                                                    \
            body();                                                       \
        else                                                              \
            next(left - 1, body);                                         \
        sample_deep_sink = sample_deep_sink + left;                       \
    }
SAMPLE_DEEP(sample_deep_a, sample_deep_b)
SAMPLE_DEEP(sample_deep_b, sample_deep_c)
SAMPLE_DEEP(sample_deep_c, sample_deep_d)
SAMPLE_DEEP(sample_deep_d, sample_deep_a)

static void sample_nanosleep_forever(void) { (void)sample_park_in_nanosleep(NULL); }

NOINLINE static void *sample_park_deep(void *unused) {
    (void)unused;
    sample_deep_a(sample_depth(), sample_nanosleep_forever);
    return NULL;
}

static void sample_wait_then_null_read(void);
static int sample_parked_wanted;

// CRASH_SAMPLE_THREADS threads in all (default 16), the others parked: for the benchmark.
NOINLINE void sample_parked_threads(void) {
    const char *wanted = getenv("CRASH_SAMPLE_THREADS");
    sample_parked_wanted = wanted != NULL ? atoi(wanted) : 16;
    for (int i = 1; i < sample_parked_wanted; i++) sample_start(sample_park_deep);
    sample_deep_a(sample_depth(), sample_wait_then_null_read);
}

static void sample_wait_then_null_read(void) {
    sample_wait_for_parked_running(sample_parked_wanted - 1);
    sample_null_read();
}

NOINLINE void sample_threads_256(void) {
    for (int i = 0; i < 256; i++) sample_start(sample_park_in_nanosleep);
    sample_wait_for_parked(256);
    sample_null_read();
}

// 256 threads, then a file-size limit (hard, 64 KiB) too low for the whole report, then a
// crash: the report is built again to fit, the crashing thread first.
NOINLINE void sample_threads_256_file_size_then_segv(void) {
    for (int i = 0; i < 256; i++) sample_start(sample_park_in_nanosleep);
    sample_wait_for_parked(256);
    struct rlimit limit = {64 * 1024, 64 * 1024};
    setrlimit(RLIMIT_FSIZE, &limit);
    sample_null_read();
}

static void *sample_short_lived(void *unused) {
    (void)unused;
    return NULL;
}

// Threads start and end all the time while the crash is reported.
NOINLINE static void *sample_churn(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "churn");
    sample_about_to_park();
    for (;;) sample_start(sample_short_lived);
    return NULL;
}

NOINLINE void sample_threads_churning(void) {
    sample_start(sample_churn);
    sample_start(sample_churn);
    sample_wait_for_parked(2);
    sample_null_read();
}

// Another thread inside malloc and free all the time: the crash path must not need the
// allocator's lock, and that thread's stack is still captured.
NOINLINE static void *sample_malloc_forever(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "mallocer");
    sample_about_to_park();
    for (volatile unsigned i = 0;; i++) {
        void *volatile block = malloc(64 + i % 4096);
        free(block);
    }
    return NULL;
}

NOINLINE void sample_crash_while_other_mallocs(void) {
    sample_start(sample_malloc_forever);
    sample_wait_for_parked(1);
    sample_null_read();
}

NOINLINE void sample_concurrent_crashes_2(void) { sample_crash_on_threads(2); }

// fork() for the Swift sample, which Swift's Glibc module does not offer.
int sample_fork(void) { return fork(); }

NOINLINE void sample_crash_in_forked_child(void) {
    pid_t child = fork();
    if (child == 0) sample_null_read();
    int status = 0;
    waitpid(child, &status, 0);
    // The parent lives on: only the child's crash may be reported.
    printf("child-pid %d child-signal %d\n", (int)child, WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    fflush(stdout);
    exit(0);
}

// 60 frames of recursion under main and the dispatcher: a 64-frame stack at the fault.
// The volatile result keeps release builds from turning the recursion into a loop.
NOINLINE int sample_deep_stack(int depth) {
    if (depth == 0) {
        sample_null_read();
        return 0;
    }
    volatile int below = sample_deep_stack(depth - 1);
    return below + 1;
}

static void sample_deep_stack_64(void) { sample_deep_stack(60); }

NOINLINE void sample_recurse_forever(void) {
    volatile char pad[256];
    pad[0] = 1;
    sample_recurse_forever();
    sample_sink = pad[0];
}

void sample_wait_for_signal(void) {
    sample_run_a_while();
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    for (;;) pause();
}

static void *sample_malloc_loop(void *unused) {
    (void)unused;
    for (;;) {
        void *volatile p = malloc(64 + (size_t)(rand() & 1023));
        free(p);
    }
    return NULL;
}

void sample_start_malloc_hammer(void) {
    for (int i = 0; i < 2; i++) {
        pthread_t thread;
        pthread_create(&thread, NULL, sample_malloc_loop, NULL);
    }
    usleep(20000);
}

NOINLINE void sample_corrupt_heap(void) {
    // Overwrite chunk headers around a freed block: any malloc after this may abort or hang.
    char *a = malloc(64);
    char *b = malloc(64);
    free(b);
    memset(a - 16, 0x41, 64 + 64 + 32);
}

// MARK: - Previous handlers

static void sample_mark(const char *who, int signo, const siginfo_t *info) {
    const char *path = getenv("CRASH_SAMPLE_MARKER");
    if (path == NULL) return;
    char line[256];
    int n = snprintf(line, sizeof(line), "%s signo=%d code=%d addr=%p\n", who, signo, info ? info->si_code : 0,
                     info ? info->si_addr : NULL);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
        (void)!write(fd, line, (size_t)n);
        close(fd);
    }
}

static void sample_previous_siginfo(int signo, siginfo_t *info, void *context) {
    (void)context;
    sample_mark("previous-siginfo", signo, info);
    signal(signo, SIG_DFL);
}

static void sample_previous_plain(int signo) {
    sample_mark("previous-plain", signo, NULL);
    signal(signo, SIG_DFL);
}

void sample_install_previous_siginfo_handler(int signo) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = sample_previous_siginfo;
    sa.sa_flags = SA_SIGINFO;
    sigaction(signo, &sa, NULL);
}

void sample_install_previous_plain_handler(int signo) { signal(signo, sample_previous_plain); }

static struct sigaction sample_before_us[65];

static void sample_after_capture(int signo, siginfo_t *info, void *context) {
    sample_mark("after-capture", signo, info);
    struct sigaction *next = &sample_before_us[signo];
    sigaction(signo, next, NULL);
    if (next->sa_flags & SA_SIGINFO)
        next->sa_sigaction(signo, info, context);
    else if (next->sa_handler != SIG_DFL && next->sa_handler != SIG_IGN)
        next->sa_handler(signo);
}

void sample_install_handler_after_capture(int signo) {
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = sample_after_capture;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigaction(signo, &sa, &sample_before_us[signo]);
}

// MARK: - Dispatch by name

typedef struct sample_kind {
    const char *name;
    void (*run)(void);
} sample_kind;

static const sample_kind sample_kinds[] = {
    {"null-read", sample_null_read},
    {"null-write", sample_null_write},
    {"wild-pointer", sample_wild_pointer},
    {"noncanonical-pointer", sample_noncanonical_pointer},
    {"write-readonly", sample_write_readonly},
    {"jump-nonexec", sample_jump_nonexec},
    {"null-function", sample_null_function},
    {"bus-truncated-mmap", sample_bus_truncated_mmap},
    {"int-divide-by-zero", sample_int_divide_by_zero},
    {"builtin-trap", sample_builtin_trap},
    {"abort", sample_abort},
    {"double-free", sample_double_free},
    {"assert", sample_assert_fail},
    {"cxx-runtime-error", sample_throw_runtime_error},
    {"cxx-non-std", sample_throw_non_std},
    {"cxx-noexcept", sample_throw_from_noexcept},
    {"raise-segv", sample_raise_segv},
    {"sigqueue-segv", sample_sigqueue_segv},
    {"pthread-kill", sample_pthread_kill_thread},
    {"dlopen-library", sample_crash_in_dlopened_library},
    {"concurrent-8", sample_concurrent_crashes},
    {"fork-child", sample_crash_in_forked_child},
    {"stack-overflow", sample_recurse_forever},
    {"kill-from-outside", sample_wait_for_signal},
    {"deep-stack-64", sample_deep_stack_64},
    {"loader-lock", sample_crash_holding_loader_lock},
    // Not in the harness's list: the hostile-conditions tests run them.
    {"file-size-soft-then-segv", sample_file_size_soft_then_segv},
    {"file-size-hard-then-segv", sample_file_size_hard_then_segv},
    {"no-descriptors-then-segv", sample_no_descriptors_then_segv},
    {"directory-read-only-then-segv", sample_directory_read_only_then_segv},
    {"directory-removed-then-segv", sample_directory_removed_then_segv},
    {"descriptors-reused-then-segv", sample_descriptors_reused_then_segv},
    {"crash-file-deleted-read-only-then-segv", sample_crash_file_deleted_read_only_then_segv},
    {"concurrent-256", sample_concurrent_crashes_256},
    {"concurrent-2", sample_concurrent_crashes_2},
    {"threads-parked", sample_threads_parked},
    {"thread-blocks-signals", sample_thread_blocks_signals},
    {"threads-256", sample_threads_256},
    {"threads-256-file-size-then-segv", sample_threads_256_file_size_then_segv},
    {"parked-threads", sample_parked_threads},
    {"threads-churning", sample_threads_churning},
    {"malloc-other-thread", sample_crash_while_other_mallocs},
    {"fill-disk-then-segv", sample_fill_disk_then_segv},
    {"forbidden-syscall", sample_forbidden_syscall},
};

static const char *const sample_c_kinds[] = {
    "null-read", "null-write", "wild-pointer", "noncanonical-pointer", "write-readonly", "jump-nonexec", "null-function",
    "bus-truncated-mmap", "int-divide-by-zero", "builtin-trap", "abort", "assert", "cxx-runtime-error",
    "cxx-non-std", "cxx-noexcept", "raise-segv", "sigqueue-segv", "pthread-kill", "dlopen-library",
    "concurrent-8", "fork-child", "stack-overflow", "kill-from-outside", "deep-stack-64", "loader-lock",
    "threads-parked", "thread-blocks-signals", "threads-256", "threads-churning", "malloc-other-thread", "concurrent-2",
    "double-free", "forbidden-syscall", NULL,
};

const char *sample_c_kind_at(int index) {
    if (index < 0 || (size_t)index >= sizeof(sample_c_kinds) / sizeof(sample_c_kinds[0])) return NULL;
    return sample_c_kinds[index];
}

int sample_run_c_kind(const char *kind) {
    for (size_t i = 0; i < sizeof(sample_kinds) / sizeof(sample_kinds[0]); i++) {
        if (strcmp(kind, sample_kinds[i].name) == 0) {
            sample_kinds[i].run();
            // Some kinds (a fault that was ignored, say) may return: the caller decides.
            return 1;
        }
    }
    return 0;
}

typedef struct sample_thread_args {
    void (*body)(const char *);
    const char *kind;
} sample_thread_args;

static void *sample_thread_main(void *context) {
    sample_thread_args *args = context;
    args->body(args->kind);
    return NULL;
}

void sample_on_pthread(void (*body)(const char *), const char *kind) {
    static sample_thread_args args;
    args.body = body;
    args.kind = kind;
    pthread_t thread;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    pthread_create(&thread, &attr, sample_thread_main, &args);
    pthread_join(thread, NULL);
}
