// debuginfod, through libdebuginfod loaded with dlopen on first use: each build-id asked once
// a process, within limits set where the environment sets none, its cache kept bounded by the
// Swift side (DebuginfodCache).
#include "crashcapture_elfutils.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static int debuginfod_find_uncached(
    const unsigned char *build_id, size_t build_id_size, int executable, char *path, size_t path_size, char *why,
    size_t why_size) {
    pthread_once(&di_once, load_libdebuginfod);
    if (di.unavailable != NULL) {
        copy_message(why, why_size, di.unavailable);
        return 0;
    }
    debuginfod_client *client = di.begin();
    if (client == NULL) {
        copy_message(why, why_size, "debuginfod_begin failed");
        return 0;
    }
    char *found = NULL;
    int descriptor = executable ? di.find_executable(client, build_id, (int)build_id_size, &found)
                                : di.find_debuginfo(client, build_id, (int)build_id_size, &found);
    di.end(client);
    if (descriptor < 0) {
        copy_message(why, why_size, strerror(-descriptor));
        return 0;
    }
    close(descriptor);
    copy_message(path, path_size, found != NULL ? found : "");
    free(found);
    return found != NULL;
}
