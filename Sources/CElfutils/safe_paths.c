// The files the symbolicator opens, or lets libdwfl open, are never ones that could hang it: a
// FIFO (open(2) waits for a writer forever) or a file past the size a module may have.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crashcapture_elfutils.h"
#include "safe_paths.h"

// Whether `path`, if something is there, is a regular file of bounded size: libdwfl opens the
// places it searches with a plain open(2), which waits forever on a FIFO.
static int harmless(const char *path) {
    struct stat status;
    if (stat(path, &status) != 0) return 1;
    return S_ISREG(status.st_mode) && status.st_size <= CCS_MAXIMUM_MODULE_BYTES;
}

// Every place libdwfl's standard search may open for this module (its build-id path and its
// debuglink in the module's directory, its .debug/, and each directory of the search path):
// all of them harmless, or the search is not made at all.
int ccs_search_is_harmless(
    const char *search_path, const char *file_name, const char *debuglink_file, const char *build_id) {
    char directory[PATH_MAX] = "";
    if (file_name != NULL) {
        snprintf(directory, sizeof directory, "%s", file_name);
        char *slash = strrchr(directory, '/');
        if (slash != NULL) *slash = '\0';
        else directory[0] = '\0';
    }
    char linked[PATH_MAX];
    const char *base = file_name != NULL ? strrchr(file_name, '/') : NULL;
    snprintf(linked, sizeof linked, "%s", debuglink_file != NULL ? debuglink_file : "");
    if (linked[0] == '\0' && base != NULL) snprintf(linked, sizeof linked, "%s.debug", base + 1);
    char path[PATH_MAX];
    const char *cursor = search_path != NULL ? search_path : ":.debug:/usr/lib/debug";
    while (cursor != NULL) {
        const char *end = strchr(cursor, ':');
        size_t length = end != NULL ? (size_t)(end - cursor) : strlen(cursor);
        char entry[PATH_MAX];
        snprintf(entry, sizeof entry, "%.*s", (int)length, cursor);
        const char *place = entry[0] == '+' || entry[0] == '-' ? entry + 1 : entry;
        if (linked[0] != '\0') {
            if (place[0] == '/') {
                snprintf(path, sizeof path, "%s%s/%s", place, directory, linked);
                if (!harmless(path)) return 0;
                snprintf(path, sizeof path, "%s/%s", place, linked);
                if (!harmless(path)) return 0;
            } else {
                snprintf(path, sizeof path, "%s%s%s/%s", directory, place[0] != '\0' ? "/" : "", place, linked);
                if (!harmless(path)) return 0;
            }
        }
        if (place[0] == '/' && build_id[0] != '\0') {
            snprintf(path, sizeof path, "%s/.build-id/%.2s/%s.debug", place, build_id, build_id + 2);
            if (!harmless(path)) return 0;
            snprintf(path, sizeof path, "%s/.build-id/%.2s/%s", place, build_id, build_id + 2);
            if (!harmless(path)) return 0;
        }
        cursor = end != NULL ? end + 1 : NULL;
    }
    return 1;
}

int ccs_open_regular(const char *path, int64_t maximum_bytes) {
    // O_NONBLOCK: opening a FIFO would otherwise wait for a writer, forever.
    int descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (descriptor < 0) return -1;
    struct stat status;
    int problem = fstat(descriptor, &status) != 0 ? errno
                  : !S_ISREG(status.st_mode)      ? EINVAL
                  : status.st_size > maximum_bytes ? EFBIG
                                                   : 0;
    if (problem != 0) {
        close(descriptor);
        errno = problem;
        return -1;
    }
    return descriptor;
}
