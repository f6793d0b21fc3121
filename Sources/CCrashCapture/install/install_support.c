// What every install file shares, below all of them: the last error's text, the install's
// step timings, and the facts about the directory and the process that install and its
// deferred rest both find (the crash directory's bound, whether a file's flush covers its new
// name, the container, the thread signal). Nothing here calls into another install file, so
// calls run one way: install.c and deferred_install.c call down into this file, never back.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "cc_internal.h"

static char cc_last_error[1024];

const char *cc_last_error_text(void) { return cc_last_error; }

int cc_fail(const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(cc_last_error, sizeof(cc_last_error), format, args);
    va_end(args);
    return -1;
}

static const char *const cc_step_names[CC_STEP_COUNT] = {
    "configuration", "directory", "crash_path", "bound", "crash_file", "session_file",
    "modules", "libunwind_load", "libunwind_first_step", "kept_files", "runtimes", "signals", "rest_thread"};
static int64_t cc_step_ns[CC_STEP_COUNT];
static int64_t cc_step_started_ns;

void cc_steps_begin(void) {
    memset(cc_step_ns, 0, sizeof(cc_step_ns));
    cc_step_started_ns = cc_monotonic_ns();
}

void cc_step_done(int step) {
    int64_t now = cc_monotonic_ns();
    cc_step_ns[step] = now - cc_step_started_ns;
    cc_step_started_ns = now;
}

void crashcapture_test_finish_install(void) { cc_install_rest_finish(); }

uint32_t crashcapture_test_crc32(uint32_t crc, const void *data, size_t n) {
    cc_crc32_prepare();
    return cc_crc32(crc, data, n);
}

size_t crashcapture_test_install_steps(char *out, size_t capacity) {
    cc_buf b = {out, 0, capacity > 0 ? capacity - 1 : 0, false};
    cc_buf_append_str(&b, "{");
    for (int i = 0; i < CC_STEP_COUNT; i++) {
        cc_buf_append_str(&b, i > 0 ? ",\"" : "\"");
        cc_buf_append_str(&b, cc_step_names[i]);
        cc_buf_append_str(&b, "\":");
        cc_buf_append_i64(&b, cc_step_ns[i]);
    }
    cc_buf_append_str(&b, "}");
    if (capacity > 0) out[b.overflow ? 0 : b.len] = '\0';
    return b.overflow ? 0 : b.len;
}

// ext4 makes a name just linked to a file durable with that file's fsync: with a journal the
// link and the inode's change share one transaction, which fsync commits; without one,
// ext4_sync_parent writes the directory of an inode given a new entry. The crash path then
// links first and flushes once, instead of flushing the records and then the directory.
// ext2's own driver shares the magic number but not the behaviour; only the ext4 driver
// answers EXT4_IOC_GETSTATE (Linux 5.4 and later; earlier kernels keep the two flushes, as
// do XFS, btrfs, overlayfs and NFS).
#define CC_EXT4_IOC_GETSTATE _IOW('f', 41, uint32_t)
bool cc_fsync_covers_new_name(int dir_fd) {
    struct statfs fs;
    uint32_t state = 0;
    return fstatfs(dir_fd, &fs) == 0 && fs.f_type == 0xEF53 && ioctl(dir_fd, CC_EXT4_IOC_GETSTATE, &state) == 0;
}

// Whether we run in a container, and which kind, by the marks each runtime leaves.
void cc_detect_container(void) {
    const char *kind = "none";
    char text[4096];
    if (getenv("KUBERNETES_SERVICE_HOST") != NULL) {
        kind = "kubernetes";
    } else if (access("/.dockerenv", F_OK) == 0) {
        kind = "docker";
    } else if (access("/run/.containerenv", F_OK) == 0) {
        kind = "podman";
    } else if (getenv("container") != NULL) {
        kind = "container";  // systemd-nspawn, LXC and others set it for PID 1
    } else {
        int fd = open("/proc/1/cgroup", O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, text, sizeof(text) - 1) : -1;
        if (fd >= 0) close(fd);
        if (n > 0) {
            text[n] = '\0';
            if (strstr(text, "docker") != NULL) kind = "docker";
            else if (strstr(text, "kubepods") != NULL) kind = "kubernetes";
            else if (strstr(text, "containerd") != NULL || strstr(text, "lxc") != NULL) kind = "container";
        }
    }
    snprintf(cc_global.container, sizeof(cc_global.container), "%s", kind);
}

// The signal that asks each thread for its context at a crash: the highest real-time signal
// nobody handles (apps and libraries that take one usually take the lowest free). Without a
// free one, a report still lists every thread, without their stacks.
void cc_install_thread_signal(void) {
    cc_global.thread_signal = 0;
    for (int signo = SIGRTMAX; signo > SIGRTMIN; signo--) {
        struct sigaction current;
        if (sigaction(signo, NULL, &current) != 0 || current.sa_handler != SIG_DFL) continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_sigaction = cc_thread_capture_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        // Parked in this handler, a thread runs nothing else but a crash of its own.
        sigfillset(&sa.sa_mask);
        for (int i = 0; i < CC_HANDLED_SIGNAL_COUNT; i++) sigdelset(&sa.sa_mask, cc_handled_signals[i]);
        if (sigaction(signo, &sa, NULL) != 0) continue;
        cc_global.thread_signal = signo;
        cc_global.thread_signal_previous = current;
        return;
    }
}

// Whether the directory already holds as many crash files, or crash and session bytes, as
// it may: a program that crashes at every start, with nobody replaying, must not fill the disk.
// Counted once at install, where listing a directory costs nothing that matters.
bool cc_directory_is_over_bound(int dir_fd) {
    // A descriptor of its own: a dup would share dir_fd's position, which later listings start from.
    int listing = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (listing < 0) return false;
    DIR *directory = fdopendir(listing);
    if (directory == NULL) {
        close(listing);
        return false;
    }
    size_t files = 0;
    uint64_t bytes = 0;
    size_t prefix = strlen(CCF_FILE_PREFIX);
    size_t session_prefix = strlen(CCF_SESSION_FILE_PREFIX);
    struct dirent *entry;
    while ((entry = readdir(directory)) != NULL) {
        size_t length = strlen(entry->d_name);
        bool crash = length > prefix + 4 && strncmp(entry->d_name, CCF_FILE_PREFIX, prefix) == 0 &&
                     strcmp(entry->d_name + length - 4, "." CCF_FILE_EXTENSION) == 0;
        bool session = length > session_prefix + 4 &&
                       strncmp(entry->d_name, CCF_SESSION_FILE_PREFIX, session_prefix) == 0 &&
                       strcmp(entry->d_name + length - 4, "." CCF_SESSION_FILE_EXTENSION) == 0;
        if (!crash && !session) continue;
        struct stat status;
        if (fstatat(dir_fd, entry->d_name, &status, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(status.st_mode)) continue;
        if (crash) files++;
        bytes += (uint64_t)status.st_blocks * 512;
    }
    closedir(directory);
    return files >= cc_global.maximum_crash_files || bytes >= cc_global.maximum_crash_bytes;
}
