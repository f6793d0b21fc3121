// The session file: named at install so that it outlives any death of the process, with the
// facts a later replay needs to pair the session (who, since when, which boot, which memory
// cgroup) and, for the Swift SDK, the journal behind track().
//
// The journal is a ring in a MAP_SHARED mapping of that file. A shared file mapping's pages
// belong to the page cache, not to the process, so an entry copied into it survives SIGKILL,
// the OOM killer and a crash alike; only power loss or a kernel panic before writeback lose
// it. Writers reserve space with a compare-and-swap on the header's `reserved` word, copy the
// entry, and publish it by storing its commit word last; the SDK's writer thread reads entries in
// position order and, once they are in SQLite, advances `consumed` so their space is reused.
// The layout is in crashcapture_format.h, shared with the Swift reader used at replay.
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/falloc.h>
#include <linux/futex.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "cc_internal.h"
#include "crashcapture_sdk.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

typedef struct cc_session_file {
    int fd;
    char *header;        // the mapped header page(s)
    size_t header_size;
    char *ring;          // in the file's mapping, or anonymous memory when the file has no ring
    char *notes;         // the notes area, in the header's mapping
    _Atomic(char *) ring_published;  // the C API's ring, once made (cc_session_journal_for_events)
    uint64_t ring_size;
    bool ring_in_file;
    bool sdk;            // created by crashcapture_install_sdk: the SDK retires it after its $AppEnd
    _Atomic bool detached;  // a forked child: nothing here is ours
    char name[80];
    char path[PATH_MAX];
} cc_session_file;

static cc_session_file cc_session = {.fd = -1};

// CRC-32C: the CPU computes it eight bytes at a time (SSE 4.2's crc32), where a table-driven
// CRC-32 costs about a microsecond for a typical event. The table is the fallback elsewhere.
static uint32_t cc_crc32c_table[256];

static uint32_t cc_crc32c_software(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    crc = ~crc;
    while (n--) crc = cc_crc32c_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__)
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t cc_crc32c_hardware(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return ~c32;
}
#endif

static uint32_t (*cc_crc32c)(uint32_t, const void *, size_t) = cc_crc32c_software;

static void cc_crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = i;
        for (int bit = 0; bit < 8; bit++) crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
        cc_crc32c_table[i] = crc;
    }
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) cc_crc32c = cc_crc32c_hardware;
#endif
}

static pthread_once_t cc_crc32c_once = PTHREAD_ONCE_INIT;


struct crashcapture_journal {
    _Atomic uint64_t *reserved;
    _Atomic uint64_t *consumed;
    _Atomic uint64_t *dropped;
    char *ring;
    uint64_t size;
    bool persistent;
    uint64_t prefaulted;  // ring bytes faulted in for writing so far (the writer's alone)
    _Atomic bool closed;
    _Atomic uint32_t waiters;  // track() callers waiting for room
    _Atomic bool stalled;      // a wait ran out and nothing was consumed since: nobody waits
    _Atomic uint64_t words[3];  // the counters of a journal without a session file
};

static crashcapture_journal cc_session_journal;

static void cc_journal_init(crashcapture_journal *j, char *ring, uint64_t size, bool persistent,
                            _Atomic uint64_t *words) {
    pthread_once(&cc_crc32c_once, cc_crc32c_init);
    j->ring = ring;
    j->size = ring != NULL ? size : 0;
    j->persistent = persistent;
    j->prefaulted = 0;
    j->reserved = &words[0];
    j->consumed = &words[1];
    j->dropped = &words[2];
    atomic_store(&j->closed, false);
    atomic_store(&j->stalled, false);
}

// Waiters sleep on the low half of `consumed`, which changes whenever the writer consumes (an
// advance of exactly 4 GiB at once is impossible: the ring is smaller). Private futexes: only
// this process's threads wait and wake, and the word's address identifies it within the process.
static _Atomic uint32_t *cc_consumed_low_word(crashcapture_journal *j) {
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    return (_Atomic uint32_t *)j->consumed + 1;
#else
    return (_Atomic uint32_t *)j->consumed;
#endif
}

static void cc_journal_wake_waiters(crashcapture_journal *j) {
    if (atomic_load(&j->waiters) > 0)
        syscall(SYS_futex, cc_consumed_low_word(j), FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

// Sleeps until the writer consumes past `consumed`, or for `timeout_ns`.
static void cc_journal_wait_for_consume(crashcapture_journal *j, uint64_t consumed, int64_t timeout_ns) {
    atomic_fetch_add(&j->waiters, 1);
    // Sequentially consistent on both sides: either this load sees the writer's new position,
    // or the writer's load of `waiters` sees this waiter and wakes it.
    if (atomic_load(j->consumed) == consumed && !atomic_load(&j->closed)) {
        struct timespec timeout = {timeout_ns / 1000000000, timeout_ns % 1000000000};
        syscall(SYS_futex, cc_consumed_low_word(j), FUTEX_WAIT_PRIVATE, (uint32_t)consumed, &timeout, NULL, 0);
    }
    atomic_fetch_sub(&j->waiters, 1);
}


static inline _Atomic uint64_t *cc_word(size_t offset) { return (_Atomic uint64_t *)(cc_session.header + offset); }

static void cc_put_u32(char *at, uint32_t value) { memcpy(at, &value, 4); }
static void cc_put_u64(char *at, uint64_t value) { memcpy(at, &value, 8); }

static size_t cc_read_small_file(const char *path, char *out, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, out, cap - 1);
    close(fd);
    if (n < 0) n = 0;
    out[n] = '\0';
    return (size_t)n;
}

// The file whose `oom_kill` line counts the OOM kills in this process's memory cgroup:
// memory.oom_control under cgroup v1 (preferred: its memory controller is the one that
// limits, when both are mounted), memory.events under v2. Read with one read(2) and parsed in
// place: install pays for every microsecond here. "" when this process is in neither.
static void cc_memory_cgroup_counter(char *out, size_t cap) {
    out[0] = '\0';
    char text[4096];
    size_t n = cc_read_small_file("/proc/self/cgroup", text, sizeof(text));
    const char *v2_path = NULL;
    size_t v2_len = 0;
    for (char *line = text; line < text + n;) {
        char *end = memchr(line, '\n', (size_t)(text + n - line));
        if (end == NULL) end = text + n;
        *end = '\0';
        char *controllers = strchr(line, ':');
        char *path = controllers != NULL ? strchr(controllers + 1, ':') : NULL;
        if (path != NULL) {
            *path++ = '\0';
            controllers++;
            if (strcmp(line, "0") == 0 && controllers[0] == '\0') {
                v2_path = path;
                v2_len = strlen(path);
            }
            for (char *name = controllers; *name != '\0';) {
                size_t length = strcspn(name, ",");
                if (length == 6 && memcmp(name, "memory", 6) == 0) {
                    snprintf(out, cap, "/sys/fs/cgroup/memory%s/memory.oom_control", strcmp(path, "/") == 0 ? "" : path);
                    return;
                }
                name += length + (name[length] == ',');
            }
        }
        line = end + 1;
    }
    if (v2_path != NULL && v2_len < cap - 40)
        snprintf(out, cap, "/sys/fs/cgroup%s/memory.events", strcmp(v2_path, "/") == 0 ? "" : v2_path);
}

// The memory cgroup's limit and usage files, beside its OOM counter (v1: memory.oom_control,
// v2: memory.events), for the report's process state.
static void cc_memory_cgroup_files(const char *counter_file) {
    cc_global.cgroup_limit_file[0] = cc_global.cgroup_usage_file[0] = '\0';
    const char *slash = strrchr(counter_file, '/');
    if (slash == NULL) return;
    int dir_length = (int)(slash - counter_file);
    bool v1 = strstr(slash, "oom_control") != NULL;
    snprintf(cc_global.cgroup_limit_file, sizeof(cc_global.cgroup_limit_file), "%.*s/%s", dir_length, counter_file,
             v1 ? "memory.limit_in_bytes" : "memory.max");
    snprintf(cc_global.cgroup_usage_file, sizeof(cc_global.cgroup_usage_file), "%.*s/%s", dir_length, counter_file,
             v1 ? "memory.usage_in_bytes" : "memory.current");
}

static uint64_t cc_oom_kills(const char *counter_file) {
    char text[4096];
    if (counter_file[0] == '\0' || cc_read_small_file(counter_file, text, sizeof(text)) == 0) return UINT64_MAX;
    const char *at = strstr(text, "oom_kill ");
    while (at != NULL && at != text && at[-1] != '\n') at = strstr(at + 1, "oom_kill ");
    return at != NULL ? strtoull(at + 9, NULL, 10) : UINT64_MAX;
}

static void cc_append_json_member(cc_buf *b, const char *key, const char *value) {
    cc_buf_append_str(b, ",\"");
    cc_buf_append_str(b, key);
    cc_buf_append_str(b, "\":");
    cc_buf_append_json_string(b, value, 8192);
}

// A journal as large as asked, unless the file-size limit forbids it: posix_fallocate past
// RLIMIT_FSIZE raises SIGXFSZ, which would kill the program we are meant to protect.
static uint64_t cc_ring_size_within_limits(uint64_t header_size, uint64_t wanted) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return wanted;
    if (limit.rlim_cur <= header_size) return 0;
    uint64_t room = (uint64_t)limit.rlim_cur - header_size;
    return (wanted <= room ? wanted : room) & ~(uint64_t)(CCF_SESSION_PAGE - 1);
}

// A process that execs keeps its pid and start time but loses our state (mappings, descriptors,
// atexit): the session file of the image before the exec would be left behind and later closed
// as "killed". The new image, installing again (a preload library is inherited with the
// environment), removes C sessions of its own pid and start time: they ended by exec. An SDK
// predecessor keeps its file: its journal still has to be imported by a replay.
//
// Such a file was written after this process started, so the files last modified before
// that (every other session's, as a rule) are passed over without being opened: a directory
// of sessions waiting for a replay would otherwise cost a few µs each at every install.
static void cc_retire_exec_predecessors(void) {
    struct timespec wall, boot;
    if (cc_global.clock_ticks <= 0 || clock_gettime(CLOCK_REALTIME, &wall) != 0 ||
        clock_gettime(CLOCK_BOOTTIME, &boot) != 0)
        return;
    // The process's start on the wall clock, less 2 s for clocks and timestamps' grain.
    int64_t ran_s = (int64_t)boot.tv_sec - (int64_t)(cc_global.start_ticks / (uint64_t)cc_global.clock_ticks);
    int64_t started_s = (int64_t)wall.tv_sec - ran_s - 2;
    int fd = dup(cc_global.dir_fd);
    DIR *directory = fd >= 0 ? fdopendir(fd) : NULL;
    if (directory == NULL) {
        if (fd >= 0) close(fd);
        return;
    }
    size_t prefix = strlen(CCF_SESSION_FILE_PREFIX);
    for (struct dirent *entry; (entry = readdir(directory)) != NULL;) {
        if (strncmp(entry->d_name, CCF_SESSION_FILE_PREFIX, prefix) != 0) continue;
        struct stat info;
        if (fstatat(cc_global.dir_fd, entry->d_name, &info, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(info.st_mode) ||
            info.st_mtim.tv_sec < started_s)
            continue;
        int file = openat(cc_global.dir_fd, entry->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (file < 0) continue;
        char header[CCF_SESSION_FIXED_SIZE];
        bool ours = pread(file, header, sizeof(header), 0) == (ssize_t)sizeof(header) &&
                    memcmp(header, CCF_SESSION_MAGIC, 4) == 0;
        close(file);
        if (!ours) continue;
        uint64_t pid, ticks;
        uint32_t lifecycle;
        memcpy(&pid, header + CCF_SESSION_AT_PID, 8);
        memcpy(&ticks, header + CCF_SESSION_AT_START_TICKS, 8);
        memcpy(&lifecycle, header + CCF_SESSION_AT_LIFECYCLE, 4);
        if (pid == (uint64_t)getpid() && ticks == cc_global.start_ticks && ticks != 0 &&
            lifecycle == CCF_LIFECYCLE_AT_REPLAY) {
            unlinkat(cc_global.dir_fd, entry->d_name, 0);
            // Its crash file too, named since its install: a process that went on to exec did
            // not crash, and exec closed the file without removing it.
            const char *id = entry->d_name + prefix;
            size_t id_length = strcspn(id, ".");
            char crash_name[NAME_MAX + 1];
            if (snprintf(crash_name, sizeof(crash_name), "%s%.*s.%s", CCF_FILE_PREFIX, (int)id_length, id,
                         CCF_FILE_EXTENSION) < (int)sizeof(crash_name))
                unlinkat(cc_global.dir_fd, crash_name, 0);
        }
    }
    closedir(directory);
}

int cc_session_file_create(size_t journal_bytes, int lifecycle, bool sdk, const char **step) {
    cc_retire_exec_predecessors();
    *step = "building the session file's context";
    char counter_file[PATH_MAX];
    cc_memory_cgroup_counter(counter_file, sizeof(counter_file));
    uint64_t oom_kills = cc_oom_kills(counter_file);
    cc_memory_cgroup_files(counter_file);
    if (oom_kills == UINT64_MAX) counter_file[0] = '\0';  // not readable: nothing to compare with later
    // Install holds its lock around this, so one static buffer serves (only its used pages
    // are ever touched).
    static char context[CCF_SESSION_MAXIMUM_CONTEXT];
    cc_buf b = {context, 0, sizeof(context), false};
    cc_buf_append_str(&b, "{\"session_id\":\"");
    cc_buf_append_str(&b, cc_global.session_id);
    cc_buf_append_str(&b, "\"");
    cc_append_json_member(&b, "distinct_id", cc_global.distinct_id);
    cc_append_json_member(&b, "app_name", cc_global.app_name);
    cc_append_json_member(&b, "app_version", cc_global.app_version);
    cc_append_json_member(&b, "lib_version", CRASHCAPTURE_VERSION);
    cc_append_json_member(&b, "oom_counter_file", counter_file);
    cc_buf_append_str(&b, ",\"static_properties\":{");
    cc_buf_append(&b, cc_global.static_props, cc_global.static_props_len);
    cc_buf_append_str(&b, "}}");
    if (b.overflow) return EOVERFLOW;
    // The notes area (context, breadcrumbs) follows the context JSON, inside the header; not
    // where the file-size limit leaves no room for it (writing past it raises SIGXFSZ).
    size_t notes_offset = (CCF_SESSION_FIXED_SIZE + b.len + 7) & ~(size_t)7;
    size_t header_size = (notes_offset + CCF_NOTES_SIZE + CCF_SESSION_PAGE - 1) & ~(size_t)(CCF_SESSION_PAGE - 1);
    struct rlimit file_limit;
    if (getrlimit(RLIMIT_FSIZE, &file_limit) == 0 && file_limit.rlim_cur != RLIM_INFINITY &&
        file_limit.rlim_cur < header_size) {
        notes_offset = 0;
        header_size = (CCF_SESSION_FIXED_SIZE + b.len + CCF_SESSION_PAGE - 1) & ~(size_t)(CCF_SESSION_PAGE - 1);
    }
    uint64_t wanted = ((uint64_t)journal_bytes + 7) & ~(uint64_t)7;
    if (wanted > CCF_SESSION_MAXIMUM_RING) wanted = CCF_SESSION_MAXIMUM_RING;
    uint64_t ring_in_file = cc_ring_size_within_limits(header_size, wanted);

    char header[CCF_SESSION_FIXED_SIZE];
    memset(header, 0, sizeof(header));
    memcpy(header + CCF_SESSION_AT_MAGIC, CCF_SESSION_MAGIC, 4);
    cc_put_u32(header + CCF_SESSION_AT_VERSION, CCF_SESSION_VERSION);
    cc_put_u32(header + CCF_SESSION_AT_HEADER_SIZE, (uint32_t)header_size);
    cc_put_u32(header + CCF_SESSION_AT_LIFECYCLE, (uint32_t)lifecycle);
    cc_put_u64(header + CCF_SESSION_AT_START_WALL_MS, (uint64_t)cc_global.start_wall_ms);
    cc_put_u64(header + CCF_SESSION_AT_START_MONO_NS, (uint64_t)cc_global.start_mono_ns);
    cc_put_u64(header + CCF_SESSION_AT_PID, (uint64_t)getpid());
    cc_put_u64(header + CCF_SESSION_AT_START_TICKS, cc_global.start_ticks);
    cc_put_u64(header + CCF_SESSION_AT_ALIVE_WALL_MS, (uint64_t)cc_global.start_wall_ms);
    cc_put_u64(header + CCF_SESSION_AT_ALIVE_MONO_NS, (uint64_t)cc_global.start_mono_ns);
    cc_put_u64(header + CCF_SESSION_AT_OOM_KILLS, oom_kills);
    cc_put_u32(header + CCF_SESSION_AT_CONTEXT_SIZE, (uint32_t)b.len);
    if (notes_offset > 0) {
        cc_put_u32(header + CCF_SESSION_AT_NOTES_OFFSET, (uint32_t)notes_offset);
        cc_put_u32(header + CCF_SESSION_AT_NOTES_SIZE, CCF_NOTES_SIZE);
    }
    memcpy(header + CCF_SESSION_AT_SESSION_ID, cc_global.session_id, 32);
    char boot_id[64];
    size_t boot_len = cc_read_small_file("/proc/sys/kernel/random/boot_id", boot_id, sizeof(boot_id));
    if (boot_len >= 36) memcpy(header + CCF_SESSION_AT_BOOT_ID, boot_id, 36);
    struct stat pid_ns;
    if (stat("/proc/self/ns/pid", &pid_ns) == 0) cc_put_u64(header + CCF_SESSION_AT_PID_NAMESPACE, pid_ns.st_ino);

    snprintf(cc_session.name, sizeof(cc_session.name), "%s%s.%s", CCF_SESSION_FILE_PREFIX, cc_global.session_id,
             CCF_SESSION_FILE_EXTENSION);
    cc_buf path = {cc_session.path, 0, sizeof(cc_session.path) - 1, false};
    cc_buf_append_str(&path, cc_global.directory);
    cc_buf_append_str(&path, "/");
    cc_buf_append_str(&path, cc_session.name);
    cc_session.path[path.len] = '\0';
    // Made under a name no replay looks at, written and locked, then renamed into place: a
    // replay (or `crashcap watch`, woken by its creation) never finds it empty or unlocked,
    // and so never takes it for a dead session's, nor holds its lock while install wants it.
    char temporary[96];
    snprintf(temporary, sizeof(temporary), ".%s.tmp", cc_session.name);
    *step = "creating the session file";
    int fd = openat(cc_global.dir_fd, temporary, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return errno;
    int err = 0;
    // The ring's space is allocated now: a page of a shared mapping that the filesystem cannot
    // back when it is first written (disk full) would raise SIGBUS in track().
    *step = "reserving space for the journal";
    if (ring_in_file > 0 && posix_fallocate(fd, 0, (off_t)(header_size + ring_in_file)) != 0) ring_in_file = 0;
    // The notes are written through the mapping: their pages must exist in the file, or a
    // store to them would raise SIGBUS. Without a ring, the header alone is allocated; where
    // even that finds no room, the session goes on without notes.
    if (notes_offset > 0 && ring_in_file == 0 && posix_fallocate(fd, 0, (off_t)header_size) != 0) {
        notes_offset = 0;
        cc_put_u32(header + CCF_SESSION_AT_NOTES_OFFSET, 0);
        cc_put_u32(header + CCF_SESSION_AT_NOTES_SIZE, 0);
    }
    cc_put_u64(header + CCF_SESSION_AT_RING_SIZE, ring_in_file);
    // One write of the fixed header and the context; without a ring the file may end there
    // (a reader takes what is missing of the header page as zeros, and the mapping's last page
    // reads as zeros past the end of the file).
    *step = "writing the session file";
    struct iovec parts[2] = {{header, sizeof(header)}, {context, b.len}};
    if (pwritev(fd, parts, 2, 0) != (ssize_t)(sizeof(header) + b.len)) err = errno != 0 ? errno : EIO;
    // Replays take the lock exclusively: while this process holds it, its session is left alone.
    if (err == 0 && flock(fd, LOCK_SH | LOCK_NB) != 0) err = errno;
    char *mapped = MAP_FAILED;
    if (err == 0) {
        *step = "mapping the session file";
        mapped = mmap(NULL, header_size + ring_in_file, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (mapped == MAP_FAILED) err = errno;
    }
    if (err == 0) {
        *step = "naming the session file";
        if (renameat(cc_global.dir_fd, temporary, cc_global.dir_fd, cc_session.name) != 0) err = errno;
    }
    if (err != 0) {
        if (mapped != MAP_FAILED) munmap(mapped, header_size + ring_in_file);
        close(fd);
        unlinkat(cc_global.dir_fd, temporary, 0);
        return err;
    }
    // A forked child must never write into its parent's journal: it does not even inherit it.
    madvise(mapped, header_size + ring_in_file, MADV_DONTFORK);
    cc_session.fd = fd;
    cc_session.notes = notes_offset > 0 ? mapped + notes_offset : NULL;
    cc_session.header = mapped;
    cc_session.header_size = header_size;
    cc_session.sdk = sdk;
    cc_session.ring_in_file = ring_in_file > 0;
    cc_session.ring_size = ring_in_file;
    cc_session.ring = ring_in_file > 0 ? mapped + header_size : NULL;
    if (ring_in_file == 0 && wanted > 0) {
        // No room on disk (or under the file-size limit) for the ring: events still flow through
        // memory, as crash-safe as an in-memory queue, and the SDK says so.
        char *memory = mmap(NULL, wanted, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (memory != MAP_FAILED) {
            madvise(memory, wanted, MADV_DONTFORK);
            cc_session.ring = memory;
            cc_session.ring_size = wanted;
        }
    }
    cc_journal_init(&cc_session_journal, cc_session.ring, cc_session.ring_size, cc_session.ring_in_file,
                     (_Atomic uint64_t *)(mapped + CCF_SESSION_AT_RESERVED));
    atomic_store(&cc_session.ring_published, cc_session.ring);
    atomic_store(&cc_session.detached, false);
    cc_global.session_crash_offset = header_size + ring_in_file;
    cc_note_file(fd, &cc_global.session_dev, &cc_global.session_ino);
    atomic_store(&cc_global.session_fd, fd);
    cc_notes_session_created();
    return 0;
}

void cc_session_file_detach_in_child(void) {
    // The mappings are not inherited (MADV_DONTFORK); the descriptor is, and closing this
    // copy leaves the parent's lock in place.
    atomic_store(&cc_session.detached, true);
    atomic_store(&cc_session.ring_published, NULL);
    atomic_store(&cc_global.session_fd, -1);
    // Only this thread exists now: the journal can be emptied in place. Its counters move off
    // the unmapped header, so the child's track() calls are refused and counted, never a fault.
    crashcapture_journal *j = &cc_session_journal;
    atomic_store(&j->closed, true);
    j->ring = NULL;
    j->size = 0;
    for (int i = 0; i < 3; i++) atomic_store(&j->words[i], 0);
    j->reserved = &j->words[0];
    j->consumed = &j->words[1];
    j->dropped = &j->words[2];
    if (cc_session.fd >= 0) close(cc_session.fd);
    cc_session.fd = -1;
}

void cc_session_file_close(bool remove) {
    if (cc_session.header == NULL || atomic_load(&cc_session.detached)) return;
    atomic_store(&cc_global.session_fd, -1);
    // A C session's events wait in the file for a replay (crashcapture_session_retire).
    bool holds_events = !cc_session.sdk && cc_session.ring_in_file && atomic_load(cc_session_journal.reserved) > 0;
    if (remove && !holds_events) unlinkat(cc_global.dir_fd, cc_session.name, 0);
    // A track() on another thread may still be inside an append: the mapping stays (address
    // space only), its pages are given back, and appends from now on are refused.
    atomic_store(&cc_session_journal.closed, true);
    cc_journal_wake_waiters(&cc_session_journal);
    if (cc_session.ring != NULL && !holds_events) {
        if (cc_session.ring_in_file)
            fallocate(cc_session.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)cc_session.header_size,
                      (off_t)cc_session.ring_size);
        else
            madvise(cc_session.ring, cc_session.ring_size, MADV_DONTNEED);
    }
    if (cc_session.fd >= 0) close(cc_session.fd);
    cc_session.fd = -1;
    cc_session.header = NULL;
    atomic_store(&cc_session.ring_published, NULL);
}

bool cc_session_file_is_sdk(void) { return cc_session.sdk; }

char *cc_session_notes(void) {
    return cc_session.header != NULL && !atomic_load(&cc_session.detached) ? cc_session.notes : NULL;
}

uint32_t cc_journal_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&cc_crc32c_once, cc_crc32c_init);
    return cc_crc32c(crc, data, n);
}

const char *crashcapture_session_file_path(void) { return cc_session.header != NULL ? cc_session.path : NULL; }

void crashcapture_session_retire(void) {
    if (cc_session.header == NULL || atomic_load(&cc_session.detached)) return;
    if (crashcapture_crash_in_progress()) return;
    // A C session's tracked events have no store to go to: the file stays for a replay, which
    // imports them and ends the session as it ended, normally.
    if (!cc_session.sdk && cc_session.ring_in_file && atomic_load(cc_session_journal.reserved) > 0) {
        atomic_store((_Atomic int64_t *)(cc_session.header + CCF_SESSION_AT_CLEAN_END_WALL_MS), cc_wall_ms());
        return;
    }
    unlinkat(cc_global.dir_fd, cc_session.name, 0);
}

// The C API's ring, made on its first event: most C processes track nothing and never pay
// for it. The header's ring size is stored last, after the ring's space and mapping exist.
#define CC_C_JOURNAL_BYTES (256 * 1024)
static pthread_mutex_t cc_ring_lock = PTHREAD_MUTEX_INITIALIZER;

crashcapture_journal *cc_session_journal_for_events(void) {
    if (cc_session.header == NULL || atomic_load(&cc_session.detached)) return NULL;
    if (atomic_load_explicit(&cc_session.ring_published, memory_order_acquire) != NULL) return &cc_session_journal;
    pthread_mutex_lock(&cc_ring_lock);
    if (cc_session.ring == NULL && cc_session.fd >= 0) {
        uint64_t size = cc_ring_size_within_limits(cc_session.header_size, CC_C_JOURNAL_BYTES);
        char *ring = MAP_FAILED;
        if (size > 0 && posix_fallocate(cc_session.fd, (off_t)cc_session.header_size, (off_t)size) == 0)
            ring = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, cc_session.fd, (off_t)cc_session.header_size);
        if (ring != MAP_FAILED) {
            madvise(ring, size, MADV_DONTFORK);
            cc_journal_init(&cc_session_journal, ring, size, true,
                             (_Atomic uint64_t *)(cc_session.header + CCF_SESSION_AT_RESERVED));
            cc_session.ring_size = size;
            cc_session.ring_in_file = true;
            cc_global.session_crash_offset = cc_session.header_size + size;
            atomic_store((_Atomic uint64_t *)(cc_session.header + CCF_SESSION_AT_RING_SIZE), size);
            atomic_store_explicit(&cc_session.ring_published, ring, memory_order_release);
            cc_session.ring = ring;
        }
    }
    pthread_mutex_unlock(&cc_ring_lock);
    return cc_session.ring != NULL ? &cc_session_journal : NULL;
}

void crashcapture_session_alive(void) {
    if (cc_session.header == NULL || atomic_load(&cc_session.detached)) return;
    atomic_store_explicit(cc_word(CCF_SESSION_AT_ALIVE_WALL_MS), (uint64_t)cc_wall_ms(), memory_order_relaxed);
    atomic_store_explicit(cc_word(CCF_SESSION_AT_ALIVE_MONO_NS), (uint64_t)cc_monotonic_ns(), memory_order_relaxed);
}

// MARK: - The journal

crashcapture_journal *crashcapture_session_journal(void) {
    return cc_session.header != NULL && !atomic_load(&cc_session.detached) ? &cc_session_journal : NULL;
}

crashcapture_journal *crashcapture_journal_create_in_memory(size_t bytes) {
    uint64_t size = ((uint64_t)bytes + 7) & ~(uint64_t)7;
    crashcapture_journal *j = calloc(1, sizeof(*j));
    char *ring = size > 0 ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (j == NULL || ring == MAP_FAILED) {
        free(j);
        return NULL;
    }
    cc_journal_init(j, ring, size, false, j->words);
    return j;
}

void crashcapture_journal_destroy_in_memory(crashcapture_journal *j) {
    if (j == NULL || j == &cc_session_journal) return;
    munmap(j->ring, j->size);
    free(j);
}

static inline uint64_t cc_entry_size(size_t length) { return CCF_JOURNAL_HEADER_SIZE + ((length + 7) & ~(size_t)7); }

// Copies into the ring at a logical position, wrapping at its end.
static void cc_ring_put(crashcapture_journal *j, uint64_t position, const void *data, size_t n) {
    uint64_t at = position % j->size;
    size_t first = (size_t)(j->size - at) < n ? (size_t)(j->size - at) : n;
    memcpy(j->ring + at, data, first);
    if (first < n) memcpy(j->ring, (const char *)data + first, n - first);
}

static void cc_ring_get(const crashcapture_journal *j, uint64_t position, void *out, size_t n) {
    uint64_t at = position % j->size;
    size_t first = (size_t)(j->size - at) < n ? (size_t)(j->size - at) : n;
    memcpy(out, j->ring + at, first);
    if (first < n) memcpy((char *)out + first, j->ring, n - first);
}

static uint32_t cc_entry_crc(uint64_t position, uint32_t type, uint32_t length, const void *payload) {
    char head[16];
    memcpy(head, &position, 8);
    memcpy(head + 8, &type, 4);
    memcpy(head + 12, &length, 4);
    return cc_crc32c(cc_crc32c(0, head, sizeof(head)), payload, length);
}

static int cc_journal_drop(crashcapture_journal *j, int code) {
    atomic_fetch_add_explicit(j->dropped, 1, memory_order_relaxed);
    return code;
}

int crashcapture_journal_append(crashcapture_journal *j, uint32_t type, const void *payload, size_t length,
                                int64_t wait_ns) {
    if (j == NULL) return -1;
    uint64_t size = cc_entry_size(length);
    if (j->ring == NULL || atomic_load_explicit(&j->closed, memory_order_relaxed) || length > CCF_MAXIMUM_PAYLOAD ||
        size > j->size)
        return cc_journal_drop(j, -1);
    int64_t deadline = 0;
    uint64_t position = atomic_load_explicit(j->reserved, memory_order_relaxed);
    for (;;) {
        uint64_t consumed = atomic_load_explicit(j->consumed, memory_order_acquire);
        // `position` may be stale (other threads reserved, and the writer consumed, since it
        // was read): then it lies behind `consumed`, the difference would wrap around and look
        // like a full ring, and the compare-and-swap below fails anyway and brings it up to date.
        if (position + size > consumed && position + size - consumed > j->size) {
            uint64_t now = (uint64_t)cc_monotonic_ns();
            if (deadline == 0) deadline = (int64_t)now + wait_ns;
            if (atomic_load_explicit(&j->closed, memory_order_relaxed)) return cc_journal_drop(j, -1);
            if (wait_ns <= 0 || atomic_load_explicit(&j->stalled, memory_order_relaxed) || (int64_t)now >= deadline) {
                if (wait_ns > 0) atomic_store_explicit(&j->stalled, true, memory_order_relaxed);
                return cc_journal_drop(j, -2);
            }
            // Re-read: the stale `position` case must not make anyone sleep.
            uint64_t current = atomic_load_explicit(j->reserved, memory_order_relaxed);
            if (current == position) cc_journal_wait_for_consume(j, consumed, deadline - (int64_t)now);
            position = atomic_load_explicit(j->reserved, memory_order_relaxed);
            continue;
        }
        if (atomic_compare_exchange_weak_explicit(j->reserved, &position, position + size, memory_order_relaxed,
                                                  memory_order_relaxed))
            break;
    }
    char head[16];
    uint32_t length32 = (uint32_t)length;
    uint32_t crc = cc_entry_crc(position, type, length32, payload);
    memcpy(head, CCF_JOURNAL_ENTRY_MAGIC, 4);
    memcpy(head + 4, &length32, 4);
    memcpy(head + 8, &type, 4);
    memcpy(head + 12, &crc, 4);
    cc_ring_put(j, position + 8, head, sizeof(head));
    cc_ring_put(j, position + CCF_JOURNAL_HEADER_SIZE, payload, length);
    // Publish: the commit word is 8-aligned and never wraps, so it is one atomic store.
    _Atomic uint64_t *commit = (_Atomic uint64_t *)(j->ring + position % j->size);
    atomic_store_explicit(commit, ~position, memory_order_release);
    return 0;
}

int crashcapture_journal_read(crashcapture_journal *j, uint64_t position, crashcapture_journal_entry *entry,
                              char *scratch, size_t scratch_size) {
    if (j == NULL || j->ring == NULL || position % 8 != 0) return 0;
    if (position >= atomic_load_explicit(j->reserved, memory_order_acquire)) return 0;
    _Atomic uint64_t *commit = (_Atomic uint64_t *)(j->ring + position % j->size);
    if (atomic_load_explicit(commit, memory_order_acquire) != ~position) return 0;
    char head[16];
    cc_ring_get(j, position + 8, head, sizeof(head));
    uint32_t length, type;
    memcpy(&length, head + 4, 4);
    memcpy(&type, head + 8, 4);
    uint64_t start = (position + CCF_JOURNAL_HEADER_SIZE) % j->size;
    if (start + length <= j->size) {
        entry->payload = j->ring + start;
    } else {
        if (length > scratch_size) return 0;
        cc_ring_get(j, position + CCF_JOURNAL_HEADER_SIZE, scratch, length);
        entry->payload = scratch;
    }
    entry->position = position;
    entry->next = position + cc_entry_size(length);
    entry->type = type;
    entry->length = length;
    return 1;
}

uint64_t crashcapture_journal_consumed(crashcapture_journal *j) { return j != NULL ? atomic_load(j->consumed) : 0; }

void crashcapture_journal_consume(crashcapture_journal *j, uint64_t position) {
    if (j == NULL) return;
    atomic_store(j->consumed, position);
    atomic_store_explicit(&j->stalled, false, memory_order_relaxed);
    cc_journal_wake_waiters(j);
}

uint64_t crashcapture_journal_reserved(crashcapture_journal *j) { return j != NULL ? atomic_load(j->reserved) : 0; }

uint64_t crashcapture_journal_dropped(crashcapture_journal *j) { return j != NULL ? atomic_load(j->dropped) : 0; }

uint64_t crashcapture_journal_size(crashcapture_journal *j) { return j != NULL ? j->size : 0; }

int crashcapture_journal_is_persistent(crashcapture_journal *j) { return j != NULL && j->persistent; }

void crashcapture_journal_prefault(crashcapture_journal *j, size_t ahead) {
    if (j == NULL || j->ring == NULL || !j->persistent || j->prefaulted >= j->size) return;
    // Only the first lap needs it: after that every page has been faulted in once. Pages the
    // kernel wrote back fault once more for write, a minor fault without I/O.
    uint64_t reserved = atomic_load_explicit(j->reserved, memory_order_relaxed);
    uint64_t target = reserved + ahead < j->size ? (reserved + ahead + 4095) & ~(uint64_t)4095 : j->size;
    if (target <= j->prefaulted) return;
    // Older kernels lack MADV_POPULATE_WRITE; the pages then fault on first use instead.
    madvise(j->ring + j->prefaulted, target - j->prefaulted, MADV_POPULATE_WRITE);
    j->prefaulted = target;
}
