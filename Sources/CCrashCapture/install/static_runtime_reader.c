// The thread that reads the symbol table of a program carrying the Swift runtime itself
// (static_swift_runtime.c) off the install's caller: reading the tables of a 75 MB server takes
// 1.4 ms or more. It then makes the module list again (swift_job_run marks the threads that run
// a task) and finds the fatal error message buffer. A crash while it reads waits for it
// (cc_static_runtime_at_crash in crash_path.c), so that even the earliest report has both.
// The C install's deferred rest reads the table itself, on its own thread.
#include <dlfcn.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cc_internal.h"

static void *cc_static_runtime_reader(void *unused) {
    (void)unused;
    atomic_store(&cc_global.static_runtime_reader_tid, (pid_t)syscall(SYS_gettid));
    prctl(PR_SET_NAME, "crashcap-syms");
    const cc_static_swift_runtime *linked = cc_static_swift_runtime_find();
    // The module list and the fatal message buffer again, now with what the table gave.
    if (linked->job_run_end != 0) {
        cc_modules_capture();
        cc_hook_static_fatal_message();
    }
    atomic_store(&cc_global.static_runtime_reading, 0);
    syscall(SYS_futex, &cc_global.static_runtime_reading, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
    return NULL;
}

void crashcapture_read_static_runtime_in_background(void) {
    // A Swift runtime library in the process: the program carries none of its own.
    if (cc_static_swift_runtime_read() || dlsym(RTLD_DEFAULT, "swift_job_run") != NULL ||
        dlsym(RTLD_DEFAULT, "swift_release") != NULL)
        return;
    uint32_t idle = 0;
    if (!atomic_compare_exchange_strong(&cc_global.static_runtime_reading, &idle, 1)) return;
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attributes, 64 * 1024);
    pthread_t thread;
    if (pthread_create(&thread, &attributes, cc_static_runtime_reader, NULL) != 0)
        atomic_store(&cc_global.static_runtime_reading, 0);
    pthread_attr_destroy(&attributes);
}

