// SIGXFSZ held off on the calling thread around our writes outside the crash path (see
// signal_safe/file_limit.c for the whole rule): blocked with pthread_sigmask, and one our
// write raised taken with sigtimedwait before the mask is put back; one pending before the
// hold, and the app's disposition, are left alone.
#include <signal.h>
#include <time.h>

#include "cc_internal.h"

void cc_file_limit_hold(cc_file_limit_hold_t *hold) {
    sigset_t xfsz;
    sigemptyset(&xfsz);
    sigaddset(&xfsz, SIGXFSZ);
    hold->active = pthread_sigmask(SIG_BLOCK, &xfsz, &hold->previous) == 0;
    sigset_t pending;
    hold->was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ);
}

void cc_file_limit_release(cc_file_limit_hold_t *hold) {
    if (!hold->active) return;
    hold->active = false;
    sigset_t pending;
    if (!hold->was_pending && sigpending(&pending) == 0 && sigismember(&pending, SIGXFSZ)) {
        sigset_t xfsz;
        sigemptyset(&xfsz);
        sigaddset(&xfsz, SIGXFSZ);
        struct timespec now = {0, 0};
        siginfo_t info;
        sigtimedwait(&xfsz, &info, &now);
    }
    pthread_sigmask(SIG_SETMASK, &hold->previous, NULL);
}
