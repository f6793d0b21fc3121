// The signal part of SIGTERM/SIGINT handling, under the same rules as crash_path.c: it only
// writes the signal number to a pipe, so that the Swift side records $AppEnd and flushes
// events on a normal thread (install/termination.c), then ends the process by the same
// signal. A second signal ends it at once.
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>

#include "cc_internal.h"

int cc_termination_pipe[2] = {-1, -1};
static _Atomic int cc_termination_count;

void cc_termination_handler(int signo) {
    int saved_errno = errno;
    if (atomic_fetch_add(&cc_termination_count, 1) > 0) {
        signal(signo, SIG_DFL);
        raise(signo);
    }
    unsigned char byte = (unsigned char)signo;
    (void)!write(cc_termination_pipe[1], &byte, 1);
    errno = saved_errno;
}
