// libCrashCapturePreload.so: crash capture for programs nobody recompiled.
//
//     LD_PRELOAD=/path/libCrashCapturePreload.so CRASHCAPTURE_DIR=/var/crash/app any-binary
//
// Built by the C compiler alone from the same sources as the CCrashCapture target, so the
// Swift runtime never enters a process that did not ask for it. Optional environment:
// CRASHCAPTURE_APP_NAME (default: the executable's name), CRASHCAPTURE_APP_VERSION,
// CRASHCAPTURE_MAX_CRASH_FILES and CRASHCAPTURE_MAX_CRASH_BYTES (the directory's bound).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crashcapture.h"

__attribute__((constructor)) static void crashcapture_preload_install(void) {
    const char *directory = getenv("CRASHCAPTURE_DIR");
    if (directory == NULL || directory[0] == '\0') return;
    crashcapture_config config;
    memset(&config, 0, sizeof(config));
    config.directory = directory;
    config.app_name = getenv("CRASHCAPTURE_APP_NAME");
    config.app_version = getenv("CRASHCAPTURE_APP_VERSION");
    const char *line = getenv("CRASHCAPTURE_CRASH_LINE");
    config.no_crash_line = line != NULL && strcmp(line, "0") == 0;
    const char *arguments = getenv("CRASHCAPTURE_ARGUMENTS");
    config.omit_arguments = arguments != NULL && strcmp(arguments, "0") == 0;
    const char *files = getenv("CRASHCAPTURE_MAX_CRASH_FILES");
    const char *bytes = getenv("CRASHCAPTURE_MAX_CRASH_BYTES");
    if (files != NULL) config.maximum_crash_files = strtoull(files, NULL, 10);
    if (bytes != NULL) config.maximum_crash_bytes = strtoull(bytes, NULL, 10);
    if (crashcapture_install(&config) != 0) {
        // The program runs on, uncaptured; say so once, where its operator will look.
        const char *error = crashcapture_last_error();
        static const char prefix[] = "crashcapture: not installed: ";
        (void)!write(STDERR_FILENO, prefix, sizeof(prefix) - 1);
        (void)!write(STDERR_FILENO, error, strlen(error));
        (void)!write(STDERR_FILENO, "\n", 1);
    }
}
