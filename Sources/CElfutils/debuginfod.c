// debuginfod, through libdebuginfod loaded with dlopen on first use: each build-id asked once
// a process, each server at most until it first times out, within limits set where the
// environment sets none, its cache kept bounded by the Swift side (DebuginfodCache).
#include "crashcapture_elfutils.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "libdw_abi.h"

static void copy_message(char *destination, size_t size, const char *message) {
    if (destination != NULL && size > 0) snprintf(destination, size, "%s", message);
}

static struct {
    const char *unavailable;
    debuginfod_client *(*begin)(void);
    void (*end)(debuginfod_client *);
    int (*find_debuginfo)(debuginfod_client *, const unsigned char *, int, char **);
    int (*find_executable)(debuginfod_client *, const unsigned char *, int, char **);
} di;

static pthread_once_t di_once = PTHREAD_ONCE_INIT;

static void load_libdebuginfod(void) {
    void *library = dlopen("libdebuginfod.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        di.unavailable = "libdebuginfod.so.1 is not installed (Debian: apt-get install libdebuginfod1)";
        return;
    }
    *(void **)&di.begin = dlsym(library, "debuginfod_begin");
    *(void **)&di.end = dlsym(library, "debuginfod_end");
    *(void **)&di.find_debuginfo = dlsym(library, "debuginfod_find_debuginfo");
    *(void **)&di.find_executable = dlsym(library, "debuginfod_find_executable");
    if (!di.begin || !di.end || !di.find_debuginfo || !di.find_executable)
        di.unavailable = "libdebuginfod.so.1 lacks the debuginfod_find_* calls";
}

// An empty value counts as unset, as libdebuginfod reads it.
static void set_unless_given(const char *name, const char *value) {
    const char *given = getenv(name);
    if (given == NULL || given[0] == '\0') setenv(name, value, 1);
}

void ccs_bound_debuginfod(void) {
    set_unless_given("DEBUGINFOD_TIMEOUT", "10");
    set_unless_given("DEBUGINFOD_MAXTIME", "60");
    set_unless_given("DEBUGINFOD_MAXSIZE", "536870912");
    // libdebuginfod tries a server that does not answer three times over by default.
    set_unless_given("DEBUGINFOD_RETRY_LIMIT", "0");
}

// Each build-id and kind asked once a process, with its answer kept: the modules of a report,
// and the same module in many reports, would otherwise each pay a server's timeout again.
#define CCS_ASKED_BUILD_IDS 1024
static struct {
    char key[2 * 64 + 3];
    int found;
    char *path;
    char why[128];
} asked[CCS_ASKED_BUILD_IDS];
static size_t asked_count;
static pthread_mutex_t asked_lock = PTHREAD_MUTEX_INITIALIZER;

static int debuginfod_find_uncached(
    const unsigned char *build_id, size_t build_id_size, int executable, char *path, size_t path_size, char *why,
    size_t why_size);

int ccs_debuginfod_find(
    const unsigned char *build_id, size_t build_id_size, int executable, char *path, size_t path_size, char *why,
    size_t why_size) {
    char key[sizeof asked[0].key];
    size_t at = 0;
    key[at++] = executable ? 'x' : 'd';
    for (size_t index = 0; index < build_id_size && index < 64; index++, at += 2)
        snprintf(key + at, 3, "%02x", build_id[index]);
    key[at] = '\0';
    pthread_mutex_lock(&asked_lock);
    for (size_t index = 0; index < asked_count; index++) {
        if (strcmp(asked[index].key, key) != 0) continue;
        int found = asked[index].found;
        if (found) copy_message(path, path_size, asked[index].path);
        else copy_message(why, why_size, asked[index].why);
        pthread_mutex_unlock(&asked_lock);
        return found;
    }
    // Held across the question: two threads asking for the same build-id ask once.
    int found = debuginfod_find_uncached(build_id, build_id_size, executable, path, path_size, why, why_size);
    if (asked_count < CCS_ASKED_BUILD_IDS) {
        snprintf(asked[asked_count].key, sizeof asked[0].key, "%s", key);
        asked[asked_count].found = found;
        asked[asked_count].path = found ? strdup(path) : NULL;
        if (!found) snprintf(asked[asked_count].why, sizeof asked[0].why, "%s", why != NULL ? why : "");
        if (!found || asked[asked_count].path != NULL) asked_count++;
    }
    pthread_mutex_unlock(&asked_lock);
    return found;
}

// A server that timed out once is not asked again in this run: a silent one (it takes the
// connection and never answers) cost a whole timeout per lookup, two lookups a module (the
// executable, then the debug info), for every module of every report. It is dropped from
// DEBUGINFOD_URLS, so libdw's own lookups skip it too; the servers left are asked one at a
// time (each its own DEBUGINFOD_URLS for the call), so that the one that timed out is known.
static int64_t monotonic_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

static int ask_one_server(
    const char *server, const unsigned char *build_id, size_t build_id_size, int executable, char **found,
    bool *timed_out) {
    setenv("DEBUGINFOD_URLS", server, 1);
    debuginfod_client *client = di.begin();
    if (client == NULL) return -ENOMEM;
    const char *timeout_text = getenv("DEBUGINFOD_TIMEOUT");
    long timeout_s = timeout_text != NULL && timeout_text[0] != '\0' ? strtol(timeout_text, NULL, 10) : 90;
    int64_t started = monotonic_ms();
    int descriptor = executable ? di.find_executable(client, build_id, (int)build_id_size, found)
                                : di.find_debuginfo(client, build_id, (int)build_id_size, found);
    di.end(client);
    int64_t elapsed = monotonic_ms() - started;
    *timed_out = descriptor == -ETIME || descriptor == -ETIMEDOUT ||
                 (descriptor < 0 && descriptor != -ENOENT && timeout_s > 0 && elapsed + 500 >= timeout_s * 1000);
    return descriptor;
}

static int debuginfod_find_uncached(
    const unsigned char *build_id, size_t build_id_size, int executable, char *path, size_t path_size, char *why,
    size_t why_size) {
    pthread_once(&di_once, load_libdebuginfod);
    if (di.unavailable != NULL) {
        copy_message(why, why_size, di.unavailable);
        return 0;
    }
    const char *urls = getenv("DEBUGINFOD_URLS");
    if (urls == NULL || urls[0] == '\0') {
        copy_message(why, why_size, "no debuginfod server is left (each timed out earlier in this run)");
        return 0;
    }
    char *list = strdup(urls);
    char *left = malloc(strlen(urls) + 1);
    if (list == NULL || left == NULL) {
        free(list);
        free(left);
        copy_message(why, why_size, "out of memory");
        return 0;
    }
    left[0] = '\0';
    int result = 0;
    int last_error = -ENOENT;
    char *save = NULL;
    for (char *server = strtok_r(list, " \t\n", &save); server != NULL; server = strtok_r(NULL, " \t\n", &save)) {
        bool timed_out = false;
        char *found = NULL;
        int descriptor =
            result ? -ENOENT : ask_one_server(server, build_id, build_id_size, executable, &found, &timed_out);
        if (descriptor >= 0) {
            close(descriptor);
            copy_message(path, path_size, found != NULL ? found : "");
            result = found != NULL;
        } else if (!result) {
            last_error = descriptor;
        }
        free(found);
        if (timed_out) {
            fprintf(stderr, "crashcap: debuginfod server %s did not answer in time; not asked again in this run\n",
                    server);
            continue;
        }
        if (left[0] != '\0') strcat(left, " ");
        strcat(left, server);
    }
    // The servers that answered (or were not asked) stay; an empty list asks nobody.
    setenv("DEBUGINFOD_URLS", left, 1);
    free(list);
    free(left);
    if (!result) copy_message(why, why_size, last_error == -ETIME ? "timed out" : strerror(-last_error));
    return result;
}
