// The second half of a C install (crashcapture_install, the preload library), done off the
// caller's thread. The caller installs what the crash path cannot do without: the signal
// handlers, the alternate stack, the directory, the session's id and names. A thread of ours
// waits a few milliseconds and then makes the rest: the crash file and its space, the session
// file, the module list, libunwind, the kept process-state files, the runtimes' hooks.
//
// A process that ends within those milliseconds (a tool run from a shell script) never pays for
// them: its exit cancels the work, and nothing was written to delete. A crash before then
// wakes the thread and waits (bounded) while it does what the report needs (the modules,
// libunwind, the files, with no space reserved): the report is as full as after a whole
// install.
// The C API's calls that need the files (track, context, breadcrumbs, the crash file's path, a
// hang watch) do the rest at once, on their own thread, if it is still to do.
//
// The trade: a process killed by SIGKILL within the first milliseconds leaves no session to
// close.
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cc_internal.h"

// Long enough for a short-lived tool to be gone (/bin/true under the preload library lives
// about 1 ms), short enough that a report of any crash later than this has every part.
#define CC_REST_DELAY_NS (20 * 1000000LL)

static pthread_mutex_t cc_rest_lock = PTHREAD_MUTEX_INITIALIZER;
static char cc_rest_problem[PATH_MAX + 512];

static void cc_rest_wake_waiters(void) {
    syscall(SYS_futex, &cc_global.install_rest, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

// The directory as the files need it. The program may have closed our descriptor meanwhile and
// reused its number (closefrom, as daemons do): the directory is opened again by its path,
// never written through a descriptor that is now someone else's. Then whether it is at its
// bound (a crash is then only noted), and how to make a new name durable.
static void cc_rest_directory(void) {
    if (!cc_holds_file(cc_global.dir_fd, cc_global.dir_dev, cc_global.dir_ino)) {
        int dir = open(cc_global.directory, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        cc_global.dir_fd = dir >= 0 && cc_holds_file(dir, cc_global.dir_dev, cc_global.dir_ino) ? dir : -1;
        if (dir >= 0 && cc_global.dir_fd < 0) close(dir);
    }
    cc_global.over_bound = cc_global.dir_fd >= 0 && cc_directory_is_over_bound(cc_global.dir_fd);
    cc_global.fsync_covers_new_name = cc_global.dir_fd >= 0 && cc_fsync_covers_new_name(cc_global.dir_fd);
}

// What a report needs beyond the caller's half and the files: the signal that asks the other
// threads for their stacks, the modules and libunwind. After the files, so that a rest stuck
// on the loader's lock (held by a crashing thread) has made them.
static void cc_rest_for_report(void) {
    cc_install_thread_signal();
    cc_detect_container();
    cc_static_swift_runtime_find();  // this thread is not the caller's: the symbol table now
    cc_modules_capture();
    cc_load_libunwind();
    cc_hook_runtimes();
}

// The session file, then the crash file, its space reserved or not. The session file first:
// an exec that ends this image part way leaves a session file (or its temporary) that the next
// image removes with its crash file (cc_retire_exec_predecessors), never a crash file on its
// own. The crash file is made even if the session file could not be. Their failures no longer
// fail an install that has returned: they are kept for crashcapture_last_error, and the crash
// path makes a crash file at the crash.
static void cc_rest_files(bool want_space) {
    const char *step = NULL;
    const char *session_step = NULL;
    int session_err = cc_session_file_create(0, CCF_LIFECYCLE_AT_REPLAY, false, &session_step);
    if (session_err == 0) cc_notes_session_created();
    int err = cc_create_crash_file(true, want_space, &step);
    if (err == 0 && session_err != 0) {
        err = session_err;
        step = session_step;
    }
    if (err != 0)
        snprintf(cc_rest_problem, sizeof(cc_rest_problem), "%s in %s failed: %s", step, cc_global.directory,
                 strerror(err));
}

// Once, under cc_rest_lock. For a crash in the process's first milliseconds (`for_crash`), only what
// its report needs: the files, the modules and libunwind; not the crash file's reserved space
// (the report is written at once), the pages and tables prepared for a later crash, or the
// kept descriptors, and the crash costs that much less. Those are never made after (the crash
// path uses the pages they would touch); a program whose own handler goes on past the crash
// keeps a crash file without reserved space.
static void cc_rest_run(bool for_crash) {
    pthread_mutex_lock(&cc_rest_lock);
    atomic_store(&cc_global.install_rest_tid, (pid_t)syscall(SYS_gettid));
    uint32_t pending = CC_REST_PENDING;
    if (!atomic_compare_exchange_strong(&cc_global.install_rest, &pending, CC_REST_RUNNING)) {
        pthread_mutex_unlock(&cc_rest_lock);
        return;
    }
    if (!for_crash) cc_crash_path_prepare();
    cc_rest_directory();
    // The files are written within the file-size limit, SIGXFSZ held off: the rest also runs on
    // the app's own threads (cc_install_rest_finish), which the signal would end.
    cc_file_limit_hold_t file_limit;
    cc_file_limit_hold(&file_limit);
    cc_rest_files(!for_crash);
    cc_file_limit_release(&file_limit);
    cc_rest_for_report();
    if (!for_crash) cc_process_state_keep_files();
    atomic_store(&cc_global.install_rest, for_crash ? CC_REST_FOR_REPORT : CC_REST_DONE);
    cc_rest_wake_waiters();
    pthread_mutex_unlock(&cc_rest_lock);
}

void cc_install_rest_finish(void) {
    uint32_t state = atomic_load(&cc_global.install_rest);
    if (state != CC_REST_PENDING && state != CC_REST_RUNNING) return;
    cc_rest_run(false);
}

const char *cc_install_rest_problem(void) { return cc_rest_problem[0] != '\0' ? cc_rest_problem : NULL; }

static void *cc_rest_main(void *unused) {
    (void)unused;
    // Only the crash signals reach this thread: the app's signals go to the app's threads.
    sigset_t mask;
    sigfillset(&mask);
    for (int i = 0; i < CC_HANDLED_SIGNAL_COUNT; i++) sigdelset(&mask, cc_handled_signals[i]);
    pthread_sigmask(SIG_SETMASK, &mask, NULL);
    prctl(PR_SET_NAME, "cc-install", 0, 0, 0);
    atomic_store(&cc_global.install_rest_thread, (pid_t)syscall(SYS_gettid));
    struct timespec delay = {0, CC_REST_DELAY_NS};
    while (atomic_load(&cc_global.install_rest_wake) == CC_REST_WAKE_NOT_YET) {
        if (syscall(SYS_futex, &cc_global.install_rest_wake, FUTEX_WAIT_PRIVATE, CC_REST_WAKE_NOT_YET, &delay, NULL,
                    0) != 0 &&
            errno == ETIMEDOUT)
            break;
    }
    cc_rest_run(atomic_load(&cc_global.install_rest_wake) == CC_REST_WAKE_FOR_CRASH);
    return NULL;
}

int cc_install_rest_start(void) {
    atomic_store(&cc_global.install_rest_wake, CC_REST_WAKE_NOT_YET);
    cc_rest_problem[0] = '\0';
    atomic_store(&cc_global.install_rest, CC_REST_PENDING);
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attributes, 128 * 1024);
    pthread_t thread;
    int err = cc_create_own_thread(&thread, &attributes, cc_rest_main, NULL);
    pthread_attr_destroy(&attributes);
    // No thread to be had: the rest is done here, as before.
    if (err != 0) cc_install_rest_finish();
    return 0;
}

void cc_install_rest_cancel(void) {
    if (atomic_load(&cc_global.install_rest) == CC_REST_NONE) return;
    // Waits for a rest already running; a rest not begun is never begun.
    pthread_mutex_lock(&cc_rest_lock);
    uint32_t pending = CC_REST_PENDING;
    bool never_begun = atomic_compare_exchange_strong(&cc_global.install_rest, &pending, CC_REST_CANCELLED);
    // An image that ends before its rest still ends the sessions of the images it was exec'd
    // from, which the rest would have done.
    if (never_begun) cc_retire_exec_predecessors();
    pthread_mutex_unlock(&cc_rest_lock);
    atomic_store(&cc_global.install_rest_wake, CC_REST_WAKE_NOW);
    syscall(SYS_futex, &cc_global.install_rest_wake, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
    cc_rest_wake_waiters();
}

// fork() waits for a rest that is running, so that the child never inherits its lock held.
void cc_install_rest_prepare_fork(void) { pthread_mutex_lock(&cc_rest_lock); }

// A child has no thread of the parent's, and makes a crash file of its own (session_file.c):
// a rest the parent had not done yet is not done there, and a crash there does without it
// (a frame-pointer walk, the modules found through the loader's list).
void cc_install_rest_after_fork(bool child) {
    pthread_mutex_unlock(&cc_rest_lock);
    uint32_t pending = CC_REST_PENDING;
    // The one fact of the rest a child's crash file needs (how to make its name durable): two
    // system calls, fine in a forked child.
    if (child && atomic_compare_exchange_strong(&cc_global.install_rest, &pending, CC_REST_CANCELLED))
        cc_global.fsync_covers_new_name = cc_global.dir_fd >= 0 && cc_fsync_covers_new_name(cc_global.dir_fd);
}
