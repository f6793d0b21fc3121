// crash-sample-c KIND [--context main|pthread] [--chain CHAIN]
//
// The C/C++ crash sample. Installs CrashCapture through the C API when CRASHCAPTURE_DIR is
// set; without it the same crash runs uncaptured (the baseline).
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crash_sample_support.h"
#include "crashcapture.h"

static void run(const char *kind) {
    if (!sample_run_c_kind(kind)) {
        fprintf(stderr, "unknown kind %s; --list shows them\n", kind);
        exit(64);
    }
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; sample_c_kind_at(i) != NULL; i++) puts(sample_c_kind_at(i));
        return 0;
    }
    if (argc < 2) {
        fprintf(stderr, "usage: crash-sample-c KIND [--context main|pthread] [--chain CHAIN]\n");
        return 64;
    }
    const char *kind = argv[1];
    const char *context = "main";
    const char *chain = "none";
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--context") == 0)
            context = argv[i + 1];
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
    const char *directory = getenv("CRASHCAPTURE_DIR");
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
        if (getenv("CRASH_SAMPLE_FAULT_IN_HANDLER") != NULL) crashcapture_test_fault_in_handler(1);
    }
    if (strcmp(chain, "after-capture") == 0)
        for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++)
            sample_install_handler_after_capture(signals[i]);
    if (strcmp(kind, "heap-corrupt") == 0) {
        sample_corrupt_heap();
        kind = "null-read";
    } else if (strcmp(kind, "malloc-lock") == 0) {
        sample_start_malloc_hammer();
        kind = "null-read";
    }
    if (strcmp(context, "pthread") == 0)
        sample_on_pthread(run, kind);
    else
        run(kind);
    printf("survived %s\n", kind);
    return 0;
}
