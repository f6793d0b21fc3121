// SIGTERM and SIGINT, for apps that have no handler of their own: installs the handler in
// signal_safe/termination_signal.c, which only writes the signal number to a pipe, and ends
// the process by that signal once the Swift side has recorded $AppEnd.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "cc_internal.h"

static const int cc_termination_signals[] = {SIGTERM, SIGINT};

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
