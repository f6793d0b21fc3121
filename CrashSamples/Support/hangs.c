// Hangs, for the samples: threads that wait as a server's threads do (and count every EINTR
// they see, which a hang report must never cause), a handler that blocks in sleep, and two
// threads that take two locks in opposite orders.
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "crash_sample_support.h"

static _Atomic int sample_eintr_seen;
static _Atomic int sample_waiters_ready;

static void *sample_wait_in_epoll(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "epoll-waiter");
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event event;
    atomic_fetch_add(&sample_waiters_ready, 1);
    for (;;)
        if (epoll_wait(epoll, &event, 1, 60000) < 0 && errno == EINTR) atomic_fetch_add(&sample_eintr_seen, 1);
    return NULL;
}

static void *sample_wait_in_nanosleep(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "sleeper");
    atomic_fetch_add(&sample_waiters_ready, 1);
    for (;;) {
        struct timespec long_time = {60, 0};
        if (nanosleep(&long_time, NULL) != 0 && errno == EINTR) atomic_fetch_add(&sample_eintr_seen, 1);
    }
    return NULL;
}

static void *sample_wait_in_poll(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "poller");
    int fds[2];
    if (pipe(fds) != 0) return NULL;
    struct pollfd wanted = {fds[0], POLLIN, 0};
    atomic_fetch_add(&sample_waiters_ready, 1);
    for (;;)
        if (poll(&wanted, 1, 60000) < 0 && errno == EINTR) atomic_fetch_add(&sample_eintr_seen, 1);
    return NULL;
}

static void *sample_wait_in_sigtimedwait(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "sigwaiter");
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    atomic_fetch_add(&sample_waiters_ready, 1);
    for (;;) {
        struct timespec long_time = {60, 0};
        if (sigtimedwait(&set, NULL, &long_time) < 0 && errno == EINTR) atomic_fetch_add(&sample_eintr_seen, 1);
    }
    return NULL;
}

void sample_start_waiters(void) {
    void *(*bodies[])(void *) = {sample_wait_in_epoll, sample_wait_in_nanosleep, sample_wait_in_poll,
                                 sample_wait_in_sigtimedwait};
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        pthread_t thread;
        pthread_create(&thread, NULL, bodies[i], NULL);
        pthread_detach(thread);
    }
    while (atomic_load(&sample_waiters_ready) < 4) usleep(1000);
    usleep(20 * 1000);  // inside their waits
}

int sample_eintr_count(void) { return atomic_load(&sample_eintr_seen); }

__attribute__((noinline)) void sample_handler_blocked_in_sleep(int milliseconds) {
    struct timespec wait = {milliseconds / 1000, (long)(milliseconds % 1000) * 1000000L};
    while (nanosleep(&wait, &wait) != 0 && errno == EINTR) atomic_fetch_add(&sample_eintr_seen, 1);
    __asm__ volatile("" ::: "memory");  // not a tail call: this frame stays on the stack
}

static pthread_mutex_t sample_lock_a = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t sample_lock_b = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int sample_locks_held;

// Two bodies, not one helper: each thread's top frame is named for the order it takes the
// locks in, and the symbolicator would name a shared helper instead, inlined or not.
__attribute__((noinline)) static void sample_deadlock_take_a_then_b(void) {
    pthread_mutex_lock(&sample_lock_a);
    atomic_fetch_add(&sample_locks_held, 1);
    while (atomic_load(&sample_locks_held) < 2) usleep(1000);
    pthread_mutex_lock(&sample_lock_b);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void sample_deadlock_take_b_then_a(void) {
    pthread_mutex_lock(&sample_lock_b);
    atomic_fetch_add(&sample_locks_held, 1);
    while (atomic_load(&sample_locks_held) < 2) usleep(1000);
    pthread_mutex_lock(&sample_lock_a);
    __asm__ volatile("" ::: "memory");
}

static void *sample_locker_b(void *unused) {
    (void)unused;
    pthread_setname_np(pthread_self(), "locker-b");
    sample_deadlock_take_b_then_a();
    return NULL;
}

void sample_deadlock_on_this_thread(void) {
    pthread_t other;
    pthread_create(&other, NULL, sample_locker_b, NULL);
    pthread_detach(other);
    sample_deadlock_take_a_then_b();
}
