// crash-sample-c KIND [--context main|pthread] [--chain CHAIN] [--main-waits WAIT]
//
// --main-waits: the crash comes on a new thread while the main thread waits once (sleep,
// epoll_wait, ...; sample_main_wait) and then returns from main. CRASH_SAMPLE_DENY_PTRACE=1:
// a seccomp filter fails ptrace first, as some containers do.
//
// The C/C++ crash sample. Installs CrashCapture through the C API when CRASHCAPTURE_DIR is
// set; without it the same crash runs uncaptured (the baseline).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crash_sample_support.h"
#include "crashcapture.h"
#include "crashcapture_testing.h"

static int failures;

static void expect(int condition, const char *what) {
    if (!condition) {
        printf("FAIL %s\n", what);
        failures++;
    }
}

static void other_handler(int signo) { (void)signo; }

static void previous_handler(int signo, siginfo_t *info, void *context) {
    (void)signo;
    (void)info;
    (void)context;
}

// Install and uninstall from the outside: idempotent, exact restore, and a handler someone
// installed after us is not clobbered.
static int selfcheck(const char *directory) {
    struct sigaction previous = {.sa_sigaction = previous_handler, .sa_flags = SA_SIGINFO | SA_RESTART};
    sigemptyset(&previous.sa_mask);
    sigaddset(&previous.sa_mask, SIGUSR2);
    sigaction(SIGSEGV, &previous, NULL);
    sigaction(SIGSEGV, NULL, &previous);  // as the kernel keeps it (glibc adds SA_RESTORER)
    crashcapture_config config = {.directory = directory, .app_name = "selfcheck", .app_version = "1"};
    expect(crashcapture_install(&config) == 0, "install");
    struct sigaction now;
    sigaction(SIGSEGV, NULL, &now);
    expect(now.sa_sigaction != previous_handler, "our handler is in place");
    expect((now.sa_flags & (SA_ONSTACK | SA_SIGINFO)) == (SA_ONSTACK | SA_SIGINFO), "SA_ONSTACK|SA_SIGINFO");
    char path[4096];
    snprintf(path, sizeof(path), "%s", crashcapture_crash_file_path());
    expect(crashcapture_install(&config) == 0, "second install succeeds");
    expect(strcmp(path, crashcapture_crash_file_path()) == 0, "second install changes nothing");
    struct sigaction again;
    sigaction(SIGSEGV, NULL, &again);
    expect(again.sa_sigaction == now.sa_sigaction, "second install keeps our handler");
    stack_t stack;
    sigaltstack(NULL, &stack);
    expect(!(stack.ss_flags & SS_DISABLE) && stack.ss_size >= 64 * 1024, "installing thread has an alt stack");
    signal(SIGBUS, other_handler);  // installed after us
    crashcapture_uninstall();
    expect(!crashcapture_is_installed(), "uninstalled");
    struct sigaction restored;
    sigaction(SIGSEGV, NULL, &restored);
    expect(restored.sa_sigaction == previous_handler, "previous SIGSEGV handler restored");
    expect(restored.sa_flags == previous.sa_flags, "previous flags restored");
    expect(sigismember(&restored.sa_mask, SIGUSR2) == 1, "previous mask restored");
    struct sigaction bus;
    sigaction(SIGBUS, NULL, &bus);
    expect(bus.sa_handler == other_handler, "a handler installed after us is kept");
    expect(crashcapture_install(&config) == 0, "install after uninstall");
    // A second install with another directory is refused; the first stays as it was.
    char other[4096];
    snprintf(other, sizeof(other), "%s-other", directory);
    crashcapture_config another = {.directory = other, .app_name = "selfcheck", .app_version = "1"};
    expect(crashcapture_install(&another) != 0, "a second install with another directory fails");
    expect(strstr(crashcapture_last_error(), "already installed") != NULL, "and says it is already installed");
    expect(access(other, F_OK) != 0, "and creates nothing");
    crashcapture_uninstall();
    // A missing parent is an error, not made: a typo must not grow a tree of directories.
    snprintf(other, sizeof(other), "%s-missing-parent/crashes", directory);
    expect(crashcapture_install(&another) != 0, "a directory whose parent is missing is refused");
    expect(strstr(crashcapture_last_error(), "does not exist") != NULL, "and the error says the parent is missing");
    snprintf(other, sizeof(other), "%s-missing-parent", directory);
    expect(access(other, F_OK) != 0, "and the parent is not made");
    // A relative directory is made absolute once, at install: a later chdir changes nothing.
    char parent[4096];
    snprintf(parent, sizeof(parent), "%s", directory);
    char *slash = strrchr(parent, '/');
    if (slash != NULL && slash != parent) {
        *slash = '\0';
        char here[4096];
        expect(getcwd(here, sizeof(here)) != NULL && chdir(parent) == 0, "chdir to the directory's parent");
        crashcapture_config relative = {.directory = slash + 1, .app_name = "selfcheck", .app_version = "1"};
        expect(crashcapture_install(&relative) == 0, "install with a relative directory");
        const char *file = crashcapture_crash_file_path();
        expect(file != NULL && file[0] == '/' && strncmp(file, directory, strlen(directory)) == 0,
               "the crash file's path is absolute, in the directory meant");
        expect(chdir(here) == 0, "chdir back");
        crashcapture_uninstall();
    }
    printf(failures == 0 ? "selfcheck ok\n" : "selfcheck failed\n");
    return failures == 0 ? 0 : 1;
}

// What the C API must refuse where it is made, rather than let the collector refuse a whole
// batch (or every report) later: one line per check, "ok" or "ACCEPTED".
static int refusals(const char *directory) {
    if (directory == NULL) return 64;
    struct {
        const char *what;
        const char *json;
    } bad_json[] = {
        {"a trailing comma", "\"a\":1,"},
        {"a missing value", "\"a\":"},
        {"an unquoted key", "a:1"},
        {"braces", "{\"a\":1}"},
        {"a key twice", "\"a\":1,\"a\":2"},
        {"a key of the properties", "\"plan\":\"x\""},
        {"a bad key", "\"$bad\":1"},
        {"a control character", "\"a\":\"x\x1by\""},
        {"a bad number", "\"a\":01"},
        {"an object value", "\"a\":{\"b\":1}"},
        {"overlong UTF-8", "\"a\":\"\xc0\xaf\""},
    };
    crashcapture_property plan[] = {{"plan", "pro"}};
    for (size_t i = 0; i < sizeof(bad_json) / sizeof(bad_json[0]); i++) {
        crashcapture_config config = {.directory = directory, .app_name = "refusals", .app_version = "1",
                                      .properties = plan, .property_count = 1,
                                      .prevalidated_properties_json = bad_json[i].json};
        int status = crashcapture_install(&config);
        printf("%s install with %s%s%s\n", status != 0 ? "ok" : "ACCEPTED", bad_json[i].what, status != 0 ? ": " : "",
               status != 0 ? crashcapture_last_error() : "");
        if (status == 0) crashcapture_uninstall();
    }
    crashcapture_property twice[] = {{"plan", "pro"}, {"plan", "free"}};
    crashcapture_config doubled = {.directory = directory, .app_name = "refusals", .app_version = "1",
                                   .properties = twice, .property_count = 2};
    int status = crashcapture_install(&doubled);
    printf("%s install with a property key twice\n", status != 0 ? "ok" : "ACCEPTED");
    if (status == 0) crashcapture_uninstall();
    const char *good_json = "\"seats\":3,\"tags\":[\"a\",\"b\\u00e9\"],\"on\":true,\"ratio\":-1.5e3";
    crashcapture_config config = {.directory = directory, .app_name = "refusals", .app_version = "1",
                                  .properties = plan, .property_count = 1, .prevalidated_properties_json = good_json};
    if (crashcapture_install(&config) != 0) {
        printf("FAIL install with good properties: %s\n", crashcapture_last_error());
        return 1;
    }
    struct {
        const char *what;
        crashcapture_property properties[2];
        size_t count;
    } bad_track[] = {
        {"a key twice", {{"screen", "a"}, {"screen", "b"}}, 2},
        {"a static property's key", {{"plan", "free"}}, 1},
        {"a prevalidated property's key", {{"seats", "4"}}, 1},
        {"overlong UTF-8", {{"screen", "\xe0\x80\xaf"}}, 1},
        {"a UTF-16 surrogate", {{"screen", "\xed\xa0\x80"}}, 1},
        {"a code point past U+10FFFF", {{"screen", "\xf4\x90\x80\x80"}}, 1},
    };
    for (size_t i = 0; i < sizeof(bad_track) / sizeof(bad_track[0]); i++) {
        int tracked = crashcapture_track("refused_event", bad_track[i].properties, bad_track[i].count);
        printf("%s track with %s%s%s\n", tracked != 0 ? "ok" : "ACCEPTED", bad_track[i].what,
               tracked != 0 ? ": " : "", tracked != 0 ? crashcapture_last_error() : "");
    }
    crashcapture_property good[] = {{"screen", "caf\xc3\xa9 \xf0\x9f\x8d\xb5"}, {"step", "2"}};
    printf("%s track with good properties\n", crashcapture_track("kept_event", good, 2) == 0 ? "ok" : "FAIL");
    crashcapture_uninstall();
    return 0;
}

static long resident_kb(void) {
    long pages = 0, resident = 0;
    FILE *statm = fopen("/proc/self/statm", "r");
    if (statm == NULL) return -1;
    if (fscanf(statm, "%ld %ld", &pages, &resident) != 2) resident = -1;
    fclose(statm);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static long thread_count(void) {
    char line[256];
    long threads = -1;
    FILE *status = fopen("/proc/self/status", "r");
    if (status == NULL) return -1;
    while (fgets(line, sizeof(line), status) != NULL)
        if (sscanf(line, "Threads: %ld", &threads) == 1) break;
    fclose(status);
    return threads;
}

// One install, measured from inside: time, resident memory and threads added.
static int measure_install(const char *directory) {
    crashcapture_config config = {.directory = directory, .app_name = "measure", .app_version = "1"};
    long rss_before = resident_kb(), threads_before = thread_count();
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    int status = crashcapture_install(&config);
    clock_gettime(CLOCK_MONOTONIC, &end);
    long rss_after = resident_kb(), threads_after = thread_count();
    if (status != 0) {
        fprintf(stderr, "%s\n", crashcapture_last_error());
        return 1;
    }
    char steps[1024];
    if (crashcapture_test_install_steps(steps, sizeof(steps)) == 0) strcpy(steps, "{}");
    printf("{\"install_ns\":%lld,\"rss_before_kb\":%ld,\"rss_after_kb\":%ld,\"threads_before\":%ld,"
           "\"threads_after\":%ld,\"libunwind\":%d,\"steps_ns\":%s}\n",
           (long long)(end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec), rss_before,
           rss_after, threads_before, threads_after, crashcapture_has_libunwind(), steps);
    return 0;
}

// Opens `count` more descriptors and says how many are open in all, as /proc/self/fd lists
// them, so that a test can hold the report's count to it.
static void open_descriptors(int count) {
    for (int i = 0; i < count; i++) open("/dev/null", O_RDONLY | O_CLOEXEC);
    DIR *listing = opendir("/proc/self/fd");
    int open_count = -1;  // the listing's own
    while (listing != NULL && readdir(listing) != NULL) open_count++;
    if (listing != NULL) closedir(listing);
    printf("open descriptors: %d\n", open_count - 2);  // less "." and ".."
    fflush(stdout);
}

// Registered before install, so it runs after ours at exit: a crash once the session has
// ended normally and its crash file was removed.
static void crash_after_the_session_ended(void) { sample_run_c_kind("null-read"); }

int hang_bench(const char *what, const char *directory);  // hang_bench.c

static long env_number(const char *name, long fallback) {
    const char *text = getenv(name);
    return text != NULL && *text != '\0' ? strtol(text, NULL, 10) : fallback;
}

static void beat_for(crashcapture_watch *watch, long milliseconds) {
    for (long waited = 0; waited < milliseconds; waited += 10) {
        crashcapture_watch_beat(watch);
        usleep(10 * 1000);
    }
}

// A hang on the main thread, while other threads wait as a server's do: a handler that blocks
// in sleep (then the loop goes on and the hang ends), or a deadlock (never ends: the test kills
// the process). Prints how many EINTR the waiting threads saw.
static int hang(const char *kind) {
    long threshold = env_number("CRASH_SAMPLE_HANG_THRESHOLD_MS", 200);
    crashcapture_watch *watch = crashcapture_watch_start("main-loop", threshold);
    sample_start_waiters();
    beat_for(watch, 100);
    if (strcmp(kind, "hang-deadlock") == 0) {
        printf("deadlocking\n");
        fflush(stdout);
        crashcapture_watch_beat(watch);
        sample_deadlock_on_this_thread();
    }
    sample_handler_blocked_in_sleep((int)env_number("CRASH_SAMPLE_HANG_MS", 1000));
    beat_for(watch, 3 * threshold);
    crashcapture_watch_stop(watch);
    printf("eintr=%d\n", sample_eintr_count());
    return 0;
}

static void run(const char *kind) {
    // Returns from main: the crash comes in the atexit handler registered before install.
    if (strcmp(kind, "crash-at-exit") == 0) return;
    if (!sample_run_c_kind(kind)) {
        fprintf(stderr, "unknown kind %s; --list shows them\n", kind);
        exit(64);
    }
}

// crc32 FILE...: the crash path's CRC-32 of each file's bytes, in hex, a line each.
static int print_crc32(int count, char **paths) {
    for (int i = 0; i < count; i++) {
        FILE *file = fopen(paths[i], "rb");
        if (file == NULL) return 66;
        fseek(file, 0, SEEK_END);
        long size = ftell(file);
        rewind(file);
        unsigned char *bytes = malloc(size > 0 ? (size_t)size : 1);
        if (bytes == NULL || fread(bytes, 1, (size_t)size, file) != (size_t)size) return 74;
        fclose(file);
        printf("%08x\n", crashcapture_test_crc32(0, bytes, (size_t)size));
        free(bytes);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; sample_c_kind_at(i) != NULL; i++) puts(sample_c_kind_at(i));
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: crash-sample-c KIND [--context main|pthread] [--chain CHAIN] [--main-waits WAIT]\n");
        return 64;
    }
    const char *kind = argv[1];
    if (strcmp(kind, "selfcheck") == 0) return selfcheck(getenv("CRASHCAPTURE_DIR"));
    if (strcmp(kind, "refusals") == 0) return refusals(getenv("CRASHCAPTURE_DIR"));
    if (strcmp(kind, "measure-install") == 0) return measure_install(getenv("CRASHCAPTURE_DIR"));
    if (strcmp(kind, "crc32") == 0) return print_crc32(argc - 2, argv + 2);
    const char *context = "main";
    const char *chain = "none";
    const char *main_waits = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--context") == 0)
            context = argv[i + 1];
        else if (strcmp(argv[i], "--main-waits") == 0)
            main_waits = argv[i + 1];
        else if (strcmp(argv[i], "--chain") == 0)
            chain = argv[i + 1];
        else {
            fprintf(stderr, "unexpected argument %s\n", argv[i]);
            return 64;
        }
    }
    static const int signals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE, SIGTRAP};
    for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++) {
        if (strcmp(chain, "previous-siginfo") == 0) sample_install_previous_siginfo_handler(signals[i]);
        if (strcmp(chain, "previous-plain") == 0) sample_install_previous_plain_handler(signals[i]);
        if (strcmp(chain, "ignore") == 0) signal(signals[i], SIG_IGN);
    }
    if (strcmp(kind, "crash-at-exit") == 0) atexit(crash_after_the_session_ended);
    // CRASH_SAMPLE_NO_INSTALL: the preload library alone captures (it reads CRASHCAPTURE_DIR too).
    const char *directory = getenv("CRASH_SAMPLE_NO_INSTALL") == NULL ? getenv("CRASHCAPTURE_DIR") : NULL;
    if (directory != NULL) {
        crashcapture_property properties[] = {{"sample_kind", kind}, {"sample_context", context}};
        crashcapture_config config = {.directory = directory,
                                      .app_name = "crash-sample-c",
                                      .app_version = "1.0.0",
                                      .properties = properties,
                                      .property_count = 2};
        if (crashcapture_install(&config) != 0) {
            fprintf(stderr, "crash capture not installed: %s\n", crashcapture_last_error());
            return 70;
        }
        const char *fault = getenv("CRASH_SAMPLE_FAULT_IN_HANDLER");
        if (fault != NULL) crashcapture_test_fault_in_handler(strcmp(fault, "threads") == 0 ? 2 : 1);
    }
    // A process that has run a while: install's files are on the disk, as the kernel's
    // writeback puts them there within about 30 s, and the crash comes after N ms of work
    // (CRASH_SAMPLE_SETTLED=N, 100 if not a number), so that it does not meet a disk just
    // flushed by sync(), whose next flush is quicker than usual.
    // CRASH_SAMPLE_INSTALLED: the crash comes after the install's rest, however slow the
    // machine (its files made, the crash file's reserved space among them).
    if (getenv("CRASH_SAMPLE_INSTALLED") != NULL) crashcapture_test_finish_install();
    const char *settled = getenv("CRASH_SAMPLE_SETTLED");
    if (settled != NULL) {
        char *end;
        long work_ms = strtol(settled, &end, 10);
        if (end == settled || *end != '\0' || work_ms < 0) work_ms = 100;
        sync();
        struct timespec start, now;
        clock_gettime(CLOCK_MONOTONIC, &start);
        do clock_gettime(CLOCK_MONOTONIC, &now);
        while ((now.tv_sec - start.tv_sec) * 1000L + (now.tv_nsec - start.tv_nsec) / 1000000L < work_ms);
    }
    const char *extra_descriptors = getenv("CRASH_SAMPLE_OPEN_DESCRIPTORS");
    if (extra_descriptors != NULL) open_descriptors(atoi(extra_descriptors));
    if (strncmp(kind, "hang-bench-", 11) == 0) exit(hang_bench(kind, directory));
    if (strncmp(kind, "hang-", 5) == 0) exit(hang(kind));
    if (strcmp(chain, "after-capture") == 0)
        for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++)
            sample_install_handler_after_capture(signals[i]);
    if (strcmp(kind, "track-then-exit") == 0 || strcmp(kind, "track-then-segv") == 0) {
        // Three events through the C API; a bad name refused; then exit(0) or a crash.
        for (int i = 0; i < 3; i++) {
            char index[8];
            snprintf(index, sizeof(index), "%d", i);
            crashcapture_property properties[] = {{"index", index}, {"screen", "checkout"}};
            if (crashcapture_track("c_event", properties, 2) != 0) {
                fprintf(stderr, "track refused: %s\n", crashcapture_last_error());
                return 70;
            }
        }
        if (crashcapture_track("9 bad name", NULL, 0) == 0) {
            fprintf(stderr, "a bad event name was accepted\n");
            return 70;
        }
        printf("bad name: %s\n", crashcapture_last_error());
        fflush(stdout);
        if (strcmp(kind, "track-then-exit") == 0) return 0;
        kind = "null-read";
    } else if (strcmp(kind, "notes-then-segv") == 0) {
        // Context, breadcrumbs and an attached log (CRASH_SAMPLE_LOG), then a crash.
        const char *log = getenv("CRASH_SAMPLE_LOG");
        if (crashcapture_set_context("order_id", "A-17") != 0 || crashcapture_set_context("gone", "x") != 0 ||
            crashcapture_set_context("gone", NULL) != 0 || crashcapture_add_breadcrumb("opened cart") != 0 ||
            crashcapture_add_breadcrumb("paid") != 0 || (log != NULL && crashcapture_attach_file(log, 1000) != 0)) {
            fprintf(stderr, "notes refused: %s\n", crashcapture_last_error());
            return 70;
        }
        kind = "null-read";
    } else if (strcmp(kind, "heap-corrupt") == 0) {
        sample_corrupt_heap();
        kind = "null-read";
    } else if (strcmp(kind, "malloc-lock") == 0) {
        sample_start_malloc_hammer();
        kind = "null-read";
    }
    if (getenv("CRASH_SAMPLE_DENY_PTRACE") != NULL) sample_deny_ptrace();
    if (main_waits != NULL) {
        sample_start_crash_later(run, kind);
        if (sample_main_wait(main_waits) != 0) {
            fprintf(stderr, "unknown wait %s\n", main_waits);
            return 64;
        }
    } else if (strcmp(context, "pthread") == 0)
        sample_on_pthread(run, kind);
    else
        run(kind);
    printf("survived %s\n", kind);
    return 0;
}
