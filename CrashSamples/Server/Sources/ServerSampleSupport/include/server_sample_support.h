#ifndef SERVER_SAMPLE_SUPPORT_H
#define SERVER_SAMPLE_SUPPORT_H

// Waits in epoll_wait until fd is readable, as an event loop waits on its sockets (Glibc's
// Swift module does not bring epoll). 0 when readable, -1 on an error other than EINTR.
int server_sample_wait_readable(int fd);

#endif
