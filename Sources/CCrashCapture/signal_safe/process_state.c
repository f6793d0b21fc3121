// The crashed process's state and the memory around the fault, for the report. The rules of
// crash_path.c apply: signal-safe calls only, nothing allocated. Memory is read with
// process_vm_readv on ourselves, which fails (EFAULT) instead of faulting on an unmapped page;
// /proc files are read with one read(2) each into buffers of our own.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "cc_internal.h"

static char cc_proc_text[8192];
static char cc_fd_entries[4096];
static struct pollfd cc_polled[512];
static char cc_cmdline[4096];
static char cc_cgroup_limit[64];
static char cc_cgroup_usage[64];
static unsigned char cc_memory_bytes[4096];
// What cc_process_state_read_kept read from each kept file; -1 where it read nothing.
static long cc_kept_length[CC_RESERVED_FDS] = {-1, -1, -1, -1};

void cc_process_state_prepare(void) {
    cc_touch_pages(cc_proc_text, sizeof(cc_proc_text));
    cc_touch_pages(cc_polled, sizeof(cc_polled));
    cc_touch_pages(cc_cmdline, sizeof(cc_cmdline));
    cc_touch_pages(cc_cgroup_limit, sizeof(cc_cgroup_limit));
    cc_touch_pages(cc_memory_bytes, sizeof(cc_memory_bytes));
}

// Reads from the descriptor's offset to the end (or cap - 1 bytes) into buf, NUL-terminated.
static size_t cc_read_to_end(int fd, char *buf, size_t cap) {
    size_t total = 0;
    while (total + 1 < cap) {
        ssize_t n = read(fd, buf + total, cap - 1 - total);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        total += (size_t)n;
    }
    buf[total] = '\0';
    return total;
}

static size_t cc_read_whole(const char *path, char *buf, size_t cap) {
    int fd = openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    size_t total = cc_read_to_end(fd, buf, cap);
    close(fd);
    return total;
}

static const char *cc_kept_path(int slot) {
    switch (slot) {
    case CC_KEPT_STATUS: return "/proc/self/status";
    case CC_KEPT_CMDLINE: return "/proc/self/cmdline";
    case CC_KEPT_CGROUP_LIMIT: return cc_global.cgroup_limit_file;
    default: return cc_global.cgroup_usage_file;
    }
}

static char *cc_kept_buffer(int slot, size_t *cap) {
    switch (slot) {
    case CC_KEPT_STATUS: *cap = sizeof(cc_proc_text); return cc_proc_text;
    case CC_KEPT_CMDLINE: *cap = sizeof(cc_cmdline); return cc_cmdline;
    case CC_KEPT_CGROUP_LIMIT: *cap = sizeof(cc_cgroup_limit); return cc_cgroup_limit;
    default: *cap = sizeof(cc_cgroup_usage); return cc_cgroup_usage;
    }
}

static bool cc_reserved_is_ours(int slot);

void cc_process_state_keep_files(void) {
    for (int slot = 0; slot < CC_RESERVED_FDS; slot++) {
        bool per_process = slot == CC_KEPT_STATUS || slot == CC_KEPT_CMDLINE;
        bool ours = cc_reserved_is_ours(slot);
        if (ours && cc_global.reserved_is_state[slot] && !per_process) continue;
        if (ours) close(cc_global.reserved_fds[slot]);
        const char *path = cc_kept_path(slot);
        int fd = path[0] != '\0' ? openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC) : -1;
        cc_global.reserved_is_state[slot] = fd >= 0;
        if (fd < 0) fd = openat(AT_FDCWD, "/dev/null", O_RDONLY | O_CLOEXEC);
        cc_global.reserved_dev[slot] = 0;
        cc_global.reserved_ino[slot] = 0;
        if (fd >= 0 && !cc_note_file(fd, &cc_global.reserved_dev[slot], &cc_global.reserved_ino[slot])) {
            close(fd);
            fd = -1;
        }
        cc_global.reserved_fds[slot] = fd;
    }
}

static bool cc_reserved_is_ours(int slot) {
    return cc_holds_file(cc_global.reserved_fds[slot], cc_global.reserved_dev[slot], cc_global.reserved_ino[slot]);
}

// proc and cgroup files are made anew by each read from offset 0. A descriptor that no longer
// holds its file (closed and reused by the program) is left alone: read, it might block.
void cc_process_state_read_kept(void) {
    for (int slot = 0; slot < CC_RESERVED_FDS; slot++) {
        int fd = cc_global.reserved_fds[slot];
        bool ours = cc_reserved_is_ours(slot);
        cc_kept_length[slot] = -1;
        if (ours && cc_global.reserved_is_state[slot] && lseek(fd, 0, SEEK_SET) == 0) {
            size_t cap;
            char *buf = cc_kept_buffer(slot, &cap);
            cc_kept_length[slot] = (long)cc_read_to_end(fd, buf, cap);
        }
        if (ours) close(fd);
        cc_global.reserved_fds[slot] = -1;
        cc_global.reserved_is_state[slot] = false;
    }
}

// A kept file's text as the crash found it, or the file read now where none was kept.
static size_t cc_state_file(int slot) {
    size_t cap;
    char *buf = cc_kept_buffer(slot, &cap);
    if (cc_kept_length[slot] >= 0) return (size_t)cc_kept_length[slot];
    const char *path = cc_kept_path(slot);
    return path[0] != '\0' ? cc_read_whole(path, buf, cap) : 0;
}

static uint64_t cc_parse_u64(const char *text, const char **end) {
    uint64_t value = 0;
    while (*text == ' ' || *text == '\t') text++;
    while (*text >= '0' && *text <= '9') value = value * 10 + (uint64_t)(*text++ - '0');
    if (end != NULL) *end = text;
    return value;
}

// The number after `key` in a "Key:   value kB" file such as /proc/self/status; 0 if absent.
static uint64_t cc_status_value(const char *text, size_t n, const char *key) {
    size_t key_len = strlen(key);
    for (size_t i = 0; i + key_len < n; i++) {
        if ((i == 0 || text[i - 1] == '\n') && memcmp(text + i, key, key_len) == 0)
            return cc_parse_u64(text + i + key_len, NULL);
    }
    return 0;
}

static void cc_append_member_u64(cc_buf *b, const char *key, uint64_t value) {
    cc_buf_append_str(b, ",\"");
    cc_buf_append_str(b, key);
    cc_buf_append_str(b, "\":");
    cc_buf_append_u64(b, value);
}

static void cc_append_limit(cc_buf *b, const char *key, int resource, bool first) {
    struct rlimit limit;
    cc_buf_append_str(b, first ? "\"" : ",\"");
    cc_buf_append_str(b, key);
    cc_buf_append_str(b, "\":");
    if (getrlimit(resource, &limit) != 0) {
        cc_buf_append_str(b, "null");
    } else if (limit.rlim_cur == RLIM_INFINITY) {
        cc_buf_append_str(b, "\"unlimited\"");
    } else {
        cc_buf_append_u64(b, (uint64_t)limit.rlim_cur);
    }
}

static void cc_count_descriptor(const char *name, void *count) {
    if (name[0] != '.') ++*(int *)count;
}

static int cc_list_open_descriptors(void) {
    int dir = openat(AT_FDCWD, "/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) return -1;
    int count = 0;
    cc_each_name(dir, cc_fd_entries, sizeof(cc_fd_entries), cc_count_descriptor, &count);
    close(dir);
    return count - 1;  // the descriptor that listed them
}

// Open descriptors among the first `table_size` (FDSize in status): poll with no events
// answers POLLNVAL for each closed one. Listing /proc/self/fd instead builds a dentry and an
// inode per descriptor, about 40 µs for a dozen the first time; poll costs a few µs. (poll
// also calls O_PATH descriptors closed; they are rare.) Large tables are listed.
static int cc_count_open_descriptors(uint64_t table_size) {
    enum { chunk = sizeof(cc_polled) / sizeof(cc_polled[0]) };
    if (table_size == 0 || table_size > 16 * chunk) return cc_list_open_descriptors();
    int count = 0;
    for (uint64_t base = 0; base < table_size; base += chunk) {
        nfds_t n = table_size - base < chunk ? (nfds_t)(table_size - base) : chunk;
        for (nfds_t i = 0; i < n; i++) cc_polled[i] = (struct pollfd){.fd = (int)(base + i), .events = 0, .revents = 0};
        int ready;
        do ready = poll(cc_polled, n, 0);
        while (ready < 0 && errno == EINTR);
        if (ready < 0) return cc_list_open_descriptors();
        for (nfds_t i = 0; i < n; i++) count += (cc_polled[i].revents & POLLNVAL) == 0;
    }
    return count;
}

// argv from /proc/self/cmdline (NUL-separated), each a JSON string; the program alone when
// the arguments are not to be recorded. The environment is never read.
static void cc_append_command_line(cc_buf *b) {
    size_t n = cc_state_file(CC_KEPT_CMDLINE);
    cc_buf_append_str(b, ",\"command_line\":[");
    size_t start = 0;
    bool first = true;
    while (start < n) {
        size_t end = start;
        while (end < n && cc_cmdline[end] != '\0') end++;
        if (!first) cc_buf_append_str(b, ",");
        cc_buf_append_json_string(b, cc_cmdline + start, end - start + 1);
        first = false;
        if (!cc_global.record_arguments) break;
        start = end + 1;
    }
    cc_buf_append_str(b, "]");
    if (!cc_global.record_arguments) cc_buf_append_str(b, ",\"arguments_recorded\":false");
}

static void cc_append_memory_cgroup(cc_buf *b) {
    if (cc_global.cgroup_limit_file[0] == '\0') return;
    const char *text = cc_cgroup_limit;
    cc_buf_append_str(b, ",\"memory_cgroup\":{\"path\":");
    cc_buf_append_json_string(b, cc_global.cgroup_limit_file, sizeof(cc_global.cgroup_limit_file));
    size_t n = cc_state_file(CC_KEPT_CGROUP_LIMIT);
    cc_buf_append_str(b, ",\"limit\":");
    if (n == 0) {
        cc_buf_append_str(b, "null");
    } else if (text[0] < '0' || text[0] > '9') {
        cc_buf_append_str(b, "\"unlimited\"");  // v2 writes "max"
    } else {
        uint64_t limit = cc_parse_u64(text, NULL);
        // v1 writes a huge page-rounded number for "no limit"
        if (limit >= (1ULL << 62)) cc_buf_append_str(b, "\"unlimited\"");
        else cc_buf_append_u64(b, limit);
    }
    n = cc_state_file(CC_KEPT_CGROUP_USAGE);
    cc_buf_append_str(b, ",\"usage\":");
    if (n == 0) cc_buf_append_str(b, "null");
    else cc_buf_append_u64(b, cc_parse_u64(cc_cgroup_usage, NULL));
    cc_buf_append_str(b, "}");
}

// Milliseconds the process has run: CLOCK_BOOTTIME (the clock of /proc/uptime, read
// without a file) less the process's start in clock ticks since boot.
static void cc_append_uptime(cc_buf *b) {
    struct timespec now;
    if (clock_gettime(CLOCK_BOOTTIME, &now) != 0 || cc_global.clock_ticks <= 0) return;
    uint64_t now_ms = (uint64_t)now.tv_sec * 1000 + (uint64_t)now.tv_nsec / 1000000;
    uint64_t start_ms = cc_global.start_ticks * 1000 / (uint64_t)cc_global.clock_ticks;
    cc_append_member_u64(b, "uptime_ms", now_ms > start_ms ? now_ms - start_ms : 0);
}

void cc_append_process_state(cc_buf *b, int thread_count) {
    cc_buf_append_str(b, ",\"process\":{\"pid\":");
    cc_buf_append_i64(b, getpid());
    cc_append_command_line(b);
    size_t n = cc_state_file(CC_KEPT_STATUS);
    cc_append_member_u64(b, "rss_bytes", cc_status_value(cc_proc_text, n, "VmRSS:") * 1024);
    cc_append_member_u64(b, "peak_rss_bytes", cc_status_value(cc_proc_text, n, "VmHWM:") * 1024);
    cc_append_member_u64(b, "threads", (uint64_t)(thread_count > 0 ? thread_count : (int)cc_status_value(cc_proc_text, n, "Threads:")));
    cc_append_uptime(b);
    int descriptors = cc_count_open_descriptors(cc_status_value(cc_proc_text, n, "FDSize:"));
    if (descriptors >= 0) cc_append_member_u64(b, "open_descriptors", (uint64_t)descriptors);
    cc_buf_append_str(b, ",\"limits\":{");
    cc_append_limit(b, "stack", RLIMIT_STACK, true);
    cc_append_limit(b, "core", RLIMIT_CORE, false);
    cc_append_limit(b, "nofile", RLIMIT_NOFILE, false);
    cc_append_limit(b, "as", RLIMIT_AS, false);
    cc_buf_append_str(b, "}");
    cc_append_memory_cgroup(b);
    cc_buf_append_str(b, ",\"container\":");
    cc_buf_append_json_string(b, cc_global.container, sizeof(cc_global.container));
    cc_buf_append_str(b, "}");
}

// MARK: - Memory near the fault

static const char cc_base64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void cc_append_base64(cc_buf *b, const unsigned char *data, size_t n) {
    for (size_t i = 0; i < n; i += 3) {
        uint32_t chunk = (uint32_t)data[i] << 16;
        if (i + 1 < n) chunk |= (uint32_t)data[i + 1] << 8;
        if (i + 2 < n) chunk |= data[i + 2];
        char out[4] = {cc_base64_alphabet[(chunk >> 18) & 63], cc_base64_alphabet[(chunk >> 12) & 63],
                       i + 1 < n ? cc_base64_alphabet[(chunk >> 6) & 63] : '=',
                       i + 2 < n ? cc_base64_alphabet[chunk & 63] : '='};
        cc_buf_append(b, out, 4);
    }
}

// Reads [address, address + n) where readable, a page at a time; each readable run becomes
// one entry. Nothing is touched directly: an unmapped page only fails the system call.
static void cc_append_region(cc_buf *b, bool *first, const char *what, uintptr_t address, size_t n) {
    if (n > sizeof(cc_memory_bytes)) n = sizeof(cc_memory_bytes);
    const uintptr_t page = 4096;
    size_t run_start = 0, run_length = 0;
    for (size_t at = 0; at <= n; ) {
        size_t chunk = 0;
        bool readable = false;
        if (at < n) {
            uintptr_t here = address + at;
            chunk = (size_t)(page - (here & (page - 1)));
            if (chunk > n - at) chunk = n - at;
            struct iovec local = {cc_memory_bytes + at, chunk};
            struct iovec remote = {(void *)here, chunk};
            readable = syscall(SYS_process_vm_readv, getpid(), &local, 1UL, &remote, 1UL, 0UL) == (long)chunk;
        }
        if (readable) {
            if (run_length == 0) run_start = at;
            run_length += chunk;
        } else if (run_length > 0) {
            cc_buf_append_str(b, *first ? "{\"what\":\"" : ",{\"what\":\"");
            *first = false;
            cc_buf_append_str(b, what);
            cc_buf_append_str(b, "\",\"address\":\"");
            cc_buf_append_hex(b, address + run_start);
            cc_buf_append_str(b, "\",\"base64\":\"");
            cc_append_base64(b, cc_memory_bytes + run_start, run_length);
            cc_buf_append_str(b, "\"}");
            run_length = 0;
        }
        if (at == n) break;
        at += chunk;
    }
}

void cc_append_memory(cc_buf *b, uintptr_t sp, uintptr_t pc, uintptr_t fault, bool has_fault) {
    bool first = true;
    cc_buf_append_str(b, ",\"memory\":[");
    cc_append_region(b, &first, "stack", sp, 2048);
    cc_append_region(b, &first, "pc", pc >= 128 ? pc - 128 : 0, 256);
    if (has_fault && fault >= 4096) cc_append_region(b, &first, "fault_address", fault - 128, 256);
    cc_buf_append_str(b, "]");
}
