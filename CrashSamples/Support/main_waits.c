// The waits a real program's main thread sits in while another thread crashes. Each is one
// call, as a program that waits once and then returns from main: if a crash reporter ends the
// wait (EINTR), the program runs on into exit() while the crash is still being reported.
#include <errno.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "crash_sample_support.h"

static const char *const sample_waits[] = {
    "sleep", "nanosleep", "pause", "poll", "epoll_wait", "select", "read", "sigwait", "futex", "join", NULL,
};

const char *sample_main_wait_at(int index) { return sample_waits[index]; }

typedef struct sample_delayed {
    void (*body)(const char *);
    const char *kind;
} sample_delayed;

static pthread_t sample_crasher;

static void *sample_run_later(void *context) {
    sample_delayed *delayed = context;
    pthread_setname_np(pthread_self(), "crasher");
    // Long enough for the main thread to be inside its wait.
    struct timespec settle = {0, 100 * 1000000};
    nanosleep(&settle, NULL);
    delayed->body(delayed->kind);
    return NULL;
}

void sample_start_crash_later(void (*body)(const char *), const char *kind) {
    static sample_delayed delayed;
    delayed.body = body;
    delayed.kind = kind;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    pthread_create(&sample_crasher, &attr, sample_run_later, &delayed);
}

int sample_main_wait(const char *how) {
    int result = 0;
    int fds[2] = {-1, -1};
    if (strcmp(how, "sleep") == 0) {
        result = (int)sleep(10);
    } else if (strcmp(how, "nanosleep") == 0) {
        struct timespec ten = {10, 0};
        result = nanosleep(&ten, NULL);
    } else if (strcmp(how, "pause") == 0) {
        result = pause();
    } else if (strcmp(how, "poll") == 0) {
        result = poll(NULL, 0, 10000);
    } else if (strcmp(how, "epoll_wait") == 0) {
        int epoll = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event event;
        result = epoll_wait(epoll, &event, 1, 10000);
    } else if (strcmp(how, "select") == 0) {
        struct timeval ten = {10, 0};
        result = select(0, NULL, NULL, NULL, &ten);
    } else if (strcmp(how, "read") == 0) {
        char byte;
        if (pipe(fds) != 0) return -1;
        result = (int)read(fds[0], &byte, 1);
    } else if (strcmp(how, "sigwait") == 0) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGUSR1);
        pthread_sigmask(SIG_BLOCK, &set, NULL);
        int received = 0;
        result = sigwait(&set, &received);
    } else if (strcmp(how, "futex") == 0) {
        static int word;
        result = (int)syscall(SYS_futex, &word, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
    } else if (strcmp(how, "join") == 0) {
        result = pthread_join(sample_crasher, NULL);
    } else {
        return -1;
    }
    printf("main returned from %s: %d (%s)\n", how, result, result < 0 ? strerror(errno) : "no error");
    fflush(stdout);
    return 0;
}

// Fails ptrace and process_vm_readv with EPERM, as a container's seccomp profile or Yama's
// ptrace_scope 3 would: the crash path must then take its fallback.
void sample_deny_ptrace(void) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_ptrace, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
    };
    struct sock_fprog program = {.len = sizeof(filter) / sizeof(filter[0]), .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &program) != 0)
        perror("seccomp");
}

// A seccomp filter that traps acct(2), a call nothing else here makes: the kernel sends SIGSYS
// (SYS_SECCOMP) with the call's number, as a container's profile does to a forbidden call.
void sample_trap_acct_syscall(void) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_acct, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
    };
    struct sock_fprog program = {.len = sizeof(filter) / sizeof(filter[0]), .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &program) != 0)
        perror("seccomp");
}

void sample_name_this_thread(const char *name) { pthread_setname_np(pthread_self(), name); }
