// The figures of hang detection (crashcap-bench hang), measured in a process of their own that
// installs the C API and listens to the watchdog:
//   hang-bench-beat      ns per crashcapture_watch_beat, beside a relaxed store of a constant
//   hang-bench-cpu       the watchdog's CPU with 64 watches, beside a thread that only wakes as often
//   hang-bench-report    per hang among 64 threads: threshold to report on disk, the other threads'
//                        stall, beside the disk's flush alone and a spinning thread's gaps without a hang
// Each prints `key value` lines.
#ifndef _GNU_SOURCE  // SwiftPM defines it for the target (cSettings); a build by hand may not
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crashcapture.h"

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void sleep_ns(int64_t ns) {
    struct timespec t = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    nanosleep(&t, NULL);
}

// Called as an app's loop calls them: not inlined into the timing loop, where pthread_self()
// (a const function) and the clock would be hoisted out of it.
__attribute__((noinline)) static void beat_once(crashcapture_watch *watch) { crashcapture_watch_beat(watch); }

__attribute__((noinline)) static void store_once(_Atomic uintptr_t *word, uintptr_t value) {
    atomic_store_explicit(word, value, memory_order_relaxed);
}

static int bench_beat(void) {
    enum { COUNT = 100000000 };
    crashcapture_watch *watch = crashcapture_watch_start("bench", 1000);
    if (!crashcapture_watch_is_checked(watch)) return 70;
    static _Atomic uintptr_t plain;
    for (int round = 0; round < 3; round++) {
        int64_t start = now_ns();
        for (int i = 0; i < COUNT; i++) beat_once(watch);
        int64_t beats = now_ns() - start;
        start = now_ns();
        for (int i = 0; i < COUNT; i++) store_once(&plain, (uintptr_t)i);
        int64_t stores = now_ns() - start;
        printf("beat_ns %.3f\nrelaxed_store_ns %.3f\n", (double)beats / COUNT, (double)stores / COUNT);
    }
    crashcapture_watch_stop(watch);
    return 0;
}

// CPU time a thread of this process has used, from its schedstat (ns on a CPU).
static int64_t thread_cpu_ns(pid_t tid) {
    char path[64], text[128];
    snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", tid);
    FILE *file = fopen(path, "r");
    if (file == NULL) return -1;
    long long ns = -1;
    if (fgets(text, sizeof(text), file) != NULL) ns = atoll(text);
    fclose(file);
    return ns;
}

static pid_t thread_named(const char *name) {
    DIR *tasks = opendir("/proc/self/task");
    struct dirent *entry;
    pid_t found = 0;
    while (tasks != NULL && (entry = readdir(tasks)) != NULL && found == 0) {
        char path[300], comm[64] = "";
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", entry->d_name);
        FILE *file = fopen(path, "r");
        if (file == NULL) continue;
        if (fgets(comm, sizeof(comm), file) != NULL && strncmp(comm, name, strlen(name)) == 0) found = atoi(entry->d_name);
        fclose(file);
    }
    if (tasks != NULL) closedir(tasks);
    return found;
}

static crashcapture_watch *cpu_watches[64];
static _Atomic int cpu_running = 1;
static _Atomic pid_t waker_tid;

static void *beat_some(void *first) {
    int from = (int)(intptr_t)first;
    while (atomic_load(&cpu_running)) {
        for (int i = from; i < 64; i += 4) crashcapture_watch_beat(cpu_watches[i]);
        usleep(1000);
    }
    return NULL;
}

// The reference: a thread that only wakes as often as the watchdog does, and does nothing.
static void *wake_every_5ms(void *unused) {
    (void)unused;
    atomic_store(&waker_tid, (pid_t)gettid());
    int64_t due = now_ns();
    while (atomic_load(&cpu_running)) {
        due += 5000000;
        struct timespec until = {(time_t)(due / 1000000000), (long)(due % 1000000000)};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL);
    }
    return NULL;
}

static int bench_cpu(int seconds) {
    for (int i = 0; i < 64; i++) {
        char name[32];
        snprintf(name, sizeof(name), "watch-%d", i);
        cpu_watches[i] = crashcapture_watch_start(name, 1000);
    }
    pthread_t beaters[4], waker;
    for (int i = 0; i < 4; i++) pthread_create(&beaters[i], NULL, beat_some, (void *)(intptr_t)i);
    pthread_create(&waker, NULL, wake_every_5ms, NULL);
    usleep(100000);
    pid_t watchdog = thread_named("cc-watchdog");
    while (atomic_load(&waker_tid) == 0) usleep(1000);
    int64_t start = now_ns(), watchdog_start = thread_cpu_ns(watchdog), waker_start = thread_cpu_ns(waker_tid);
    sleep((unsigned)seconds);
    int64_t wall = now_ns() - start;
    int64_t watchdog_cpu = thread_cpu_ns(watchdog) - watchdog_start, waker_cpu = thread_cpu_ns(waker_tid) - waker_start;
    atomic_store(&cpu_running, 0);
    for (int i = 0; i < 4; i++) pthread_join(beaters[i], NULL);
    pthread_join(waker, NULL);
    printf("watchdog_cpu_percent %.4f\nwaker_cpu_percent %.4f\nwall_s %.1f\n", 100.0 * watchdog_cpu / wall,
           100.0 * waker_cpu / wall, wall / 1e9);
    return watchdog == 0 ? 70 : 0;
}

// MARK: - A hang among 64 threads

static _Atomic int64_t last_beat_ns;
static _Atomic int64_t noticed_ns;
static _Atomic int64_t noticed_total_ns, noticed_held_ns;
static _Atomic int noticed_error = -1;
static _Atomic int64_t spinner_gap_ns;  // the longest gap between two clock reads since reset
static _Atomic int spinner_reset;

static void listener(const crashcapture_hang_notice *notice) {
    if (notice->kind != CRASHCAPTURE_HANG) return;
    atomic_store(&noticed_total_ns, notice->total_ns);
    atomic_store(&noticed_held_ns, notice->threads_held_ns);
    atomic_store(&noticed_error, notice->error);
    atomic_store(&noticed_ns, now_ns());
}

static void *park(void *unused) {
    (void)unused;
    for (;;) sleep(3600);
    return NULL;
}

// A thread that runs all the time, as a busy server's do: the longest gap between two of its
// clock reads is what a freeze costs it (and what the scheduler costs it anyway).
static void *spin(void *unused) {
    (void)unused;
    int64_t last = now_ns(), longest = 0;
    for (;;) {
        int64_t now = now_ns();
        if (atomic_exchange(&spinner_reset, 0)) longest = 0;
        if (now - last > longest) {
            longest = now - last;
            atomic_store(&spinner_gap_ns, longest);
        }
        last = now;
    }
    return NULL;
}

static double flush_alone_ms(const char *directory) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/flush-probe", directory);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    char block[8192];
    memset(block, 'x', sizeof(block));
    if (fd < 0 || write(fd, block, sizeof(block)) != (ssize_t)sizeof(block)) return -1;
    fdatasync(fd);
    int64_t start = now_ns();
    if (pwrite(fd, block, sizeof(block), 0) != (ssize_t)sizeof(block)) return -1;
    fdatasync(fd);
    double ms = (now_ns() - start) / 1e6;
    close(fd);
    unlink(path);
    return ms;
}

static int bench_report(const char *directory, int hangs) {
    crashcapture_watchdog_set_listener(listener);
    for (int i = 0; i < 61; i++) {
        pthread_t thread;
        pthread_create(&thread, NULL, park, NULL);
    }
    pthread_t spinner;
    pthread_create(&spinner, NULL, spin, NULL);
    const int64_t threshold = 100 * 1000000LL;
    crashcapture_watch *watch = crashcapture_watch_start("bench-loop", threshold / 1000000);
    // 61 parked, the spinner, the watchdog, this one: 64 threads.
    for (int round = 0; round < hangs; round++) {
        atomic_store(&noticed_ns, 0);
        for (int i = 0; i < 200; i++) {
            crashcapture_watch_beat(watch);
            atomic_store(&last_beat_ns, now_ns());
            usleep(1000);
        }
        // Without a hang: the spinner's longest gap over as long a window as a report takes.
        atomic_store(&spinner_reset, 1);
        usleep(20000);
        int64_t quiet_gap = atomic_load(&spinner_gap_ns);
        atomic_store(&spinner_reset, 1);
        while (atomic_load(&noticed_ns) == 0) usleep(500);
        int64_t gap = atomic_load(&spinner_gap_ns);
        int64_t threshold_to_disk = atomic_load(&noticed_ns) - (atomic_load(&last_beat_ns) + threshold);
        printf("threshold_to_disk_ms %.3f\ndetect_to_disk_ms %.3f\nthreads_held_ms %.3f\nspinner_gap_ms %.3f\n"
               "spinner_gap_without_hang_ms %.3f\nflush_alone_ms %.3f\nerror %d\n",
               threshold_to_disk / 1e6, atomic_load(&noticed_total_ns) / 1e6, atomic_load(&noticed_held_ns) / 1e6,
               gap / 1e6, quiet_gap / 1e6, flush_alone_ms(directory), atomic_load(&noticed_error));
        fflush(stdout);
        usleep(50000);
    }
    crashcapture_watch_stop(watch);
    return 0;
}

int hang_bench(const char *what, const char *directory) {
    const char *count = getenv("CRASH_SAMPLE_HANG_BENCH_COUNT");
    if (strcmp(what, "hang-bench-beat") == 0) return bench_beat();
    if (strcmp(what, "hang-bench-cpu") == 0) return bench_cpu(count != NULL ? atoi(count) : 10);
    if (strcmp(what, "hang-bench-report") == 0) return bench_report(directory, count != NULL ? atoi(count) : 20);
    fprintf(stderr, "unknown %s\n", what);
    return 64;
}
