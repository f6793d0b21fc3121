#include <errno.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "server_sample_support.h"

int server_sample_wait_readable(int fd) {
    static int poller = -1;
    if (poller < 0) {
        poller = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event interest = {.events = EPOLLIN, .data.fd = fd};
        if (poller < 0 || epoll_ctl(poller, EPOLL_CTL_ADD, fd, &interest) != 0) return -1;
    }
    for (;;) {
        struct epoll_event ready;
        int n = epoll_wait(poller, &ready, 1, -1);
        if (n > 0) return 0;
        if (n < 0 && errno != EINTR) return -1;
    }
}
