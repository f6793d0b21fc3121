// SIGTERM and SIGINT, for apps that have no handler of their own: the handler only writes
// the signal number to a pipe, so the Swift side can record $AppEnd and flush events on a
// normal thread, then end the process by the same signal. A second signal ends it at once.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "cc_internal.h"

static int cc_termination_pipe[2] = {-1, -1};
static _Atomic int cc_termination_count;
static const int cc_termination_signals[] = {SIGTERM, SIGINT};

static void cc_termination_handler(int signo) {
    int saved_errno = errno;
    if (atomic_fetch_add(&cc_termination_count, 1) > 0) {
        signal(signo, SIG_DFL);
        raise(signo);
    }
    unsigned char byte = (unsigned char)signo;
    (void)!write(cc_termination_pipe[1], &byte, 1);
    errno = saved_errno;
}

int crashcapture_watch_termination(void) {
    if (cc_termination_pipe[0] >= 0) return cc_termination_pipe[0];
    if (pipe2(cc_termination_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
    for (size_t i = 0; i < sizeof(cc_termination_signals) / sizeof(cc_termination_signals[0]); i++) {
        struct sigaction current;
        if (sigaction(cc_termination_signals[i], NULL, &current) != 0) continue;
        if ((current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL) continue;  // the app's own
        struct sigaction ours;
        memset(&ours, 0, sizeof(ours));
        ours.sa_handler = cc_termination_handler;
        ours.sa_flags = SA_RESTART;
        sigemptyset(&ours.sa_mask);
        sigaction(cc_termination_signals[i], &ours, NULL);
    }
    return cc_termination_pipe[0];
}

void crashcapture_finish_termination(int signo) {
    signal(signo, SIG_DFL);
    sigset_t unblock;
    sigemptyset(&unblock);
    sigaddset(&unblock, signo);
    pthread_sigmask(SIG_UNBLOCK, &unblock, NULL);
    raise(signo);
}
