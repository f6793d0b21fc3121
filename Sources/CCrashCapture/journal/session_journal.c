// The session file: named at install so that it outlives any death of the process, with the
// facts a later replay needs to pair the session (who, since when, which boot, which memory
// cgroup), its notes area (journal/session_notes.c) and, for the Swift SDK or the C API's
// first event, the journal behind track() (journal/journal_ring.c), mapped MAP_SHARED: a
// shared file mapping's pages belong to the page cache, not to the process, so an entry copied
// into it survives SIGKILL, the OOM killer and a crash alike; only power loss or a kernel panic
// before writeback lose it. The layout is in crashcapture_format.h, shared with the Swift
// reader used at replay.
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/falloc.h>
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
#include "journal_ring.h"

typedef struct cc_session_file {
    int fd;
    char *header;        // the mapped header page(s)
    size_t header_size;
    char *ring;          // in the file's mapping, or anonymous memory when the file has no ring
    char *notes;         // the notes area, in the header's mapping
    _Atomic(char *) ring_published;  // the C API's ring, once made (cc_session_journal_for_events)
    _Atomic bool notes_allocated;    // the notes area's pages exist in the file
    uint64_t ring_size;
    bool ring_in_file;
    bool sdk;            // created by crashcapture_install_sdk: the SDK retires it after its $AppEnd
    _Atomic bool detached;  // a forked child: nothing here is ours
    char name[80];
    char path[PATH_MAX];
} cc_session_file;

static cc_session_file cc_session = {.fd = -1};

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
    cc_put_u32(header + CCF_SESSION_AT_FLAGS, CCF_SESSION_FLAG_ENTRY_COUNTS);
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
    // Not an O_TMPFILE: inotify reports the close of a file opened unnamed under no name, and
    // `crashcap watch` learns from that close that the session's process ended.
    // Not even the header and context fit under the file-size limit: no file, no temporary.
    if (cc_file_size_allowed() < sizeof(header) + b.len) return EFBIG;
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
    // The notes are written through the mapping: their pages must exist in the file, or a
    // store to them would raise SIGBUS. With a ring they do; without one they are allocated
    // when the app first notes something (cc_session_notes), as most C processes never do.
    atomic_store(&cc_session.notes_allocated, ring_in_file > 0);
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
    // Counted in the header only for a ring the file holds: a reader has nothing to count else.
    if (cc_session.ring_in_file)
        cc_journal_keep_counts(&cc_session_journal, (_Atomic uint32_t *)(mapped + CCF_SESSION_AT_COMMITTED_ENTRIES),
                               (_Atomic uint32_t *)(mapped + CCF_SESSION_AT_CONSUMED_ENTRIES));
    atomic_store(&cc_session.ring_published, cc_session.ring);
    atomic_store(&cc_session.detached, false);
    cc_global.session_crash_offset = header_size + ring_in_file;
    cc_note_file(fd, &cc_global.session_dev, &cc_global.session_ino);
    atomic_store(&cc_global.session_fd, fd);
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
    j->committed_entries = &j->counts[0];
    j->consumed_entries = &j->counts[1];
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

static pthread_mutex_t cc_notes_allocation_lock = PTHREAD_MUTEX_INITIALIZER;

char *cc_session_notes(void) {
    if (cc_session.header == NULL || atomic_load(&cc_session.detached) || cc_session.notes == NULL) return NULL;
    if (atomic_load_explicit(&cc_session.notes_allocated, memory_order_acquire)) return cc_session.notes;
    pthread_mutex_lock(&cc_notes_allocation_lock);
    // On the app's thread: within the file-size limit (lowered since install, perhaps), SIGXFSZ
    // held off.
    cc_file_limit_hold_t file_limit;
    cc_file_limit_hold(&file_limit);
    if (!atomic_load(&cc_session.notes_allocated) && cc_session.fd >= 0 &&
        cc_file_size_allowed() >= cc_session.header_size &&
        posix_fallocate(cc_session.fd, 0, (off_t)cc_session.header_size) == 0)
        atomic_store_explicit(&cc_session.notes_allocated, true, memory_order_release);
    cc_file_limit_release(&file_limit);
    pthread_mutex_unlock(&cc_notes_allocation_lock);
    // No room on the disk for them: the session goes on without notes.
    return atomic_load(&cc_session.notes_allocated) ? cc_session.notes : NULL;
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
        cc_file_limit_hold_t file_limit;
        cc_file_limit_hold(&file_limit);
        bool allocated = size > 0 && posix_fallocate(cc_session.fd, (off_t)cc_session.header_size, (off_t)size) == 0;
        cc_file_limit_release(&file_limit);
        if (allocated)
            ring = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, cc_session.fd, (off_t)cc_session.header_size);
        if (ring != MAP_FAILED) {
            madvise(ring, size, MADV_DONTFORK);
            cc_journal_init(&cc_session_journal, ring, size, true,
                             (_Atomic uint64_t *)(cc_session.header + CCF_SESSION_AT_RESERVED));
            cc_journal_keep_counts(&cc_session_journal,
                                   (_Atomic uint32_t *)(cc_session.header + CCF_SESSION_AT_COMMITTED_ENTRIES),
                                   (_Atomic uint32_t *)(cc_session.header + CCF_SESSION_AT_CONSUMED_ENTRIES));
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

void cc_session_mark_alive(void) {
    if (cc_session.header == NULL || atomic_load(&cc_session.detached)) return;
    atomic_store_explicit(cc_word(CCF_SESSION_AT_ALIVE_WALL_MS), (uint64_t)cc_wall_ms(), memory_order_relaxed);
    atomic_store_explicit(cc_word(CCF_SESSION_AT_ALIVE_MONO_NS), (uint64_t)cc_monotonic_ns(), memory_order_relaxed);
}

// MARK: - The journal

crashcapture_journal *crashcapture_session_journal(void) {
    return cc_session.header != NULL && !atomic_load(&cc_session.detached) ? &cc_session_journal : NULL;
}
