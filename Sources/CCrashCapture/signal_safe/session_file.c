// The crash file of a session: created at install, and again in a forked child.
//
// After fork() in a multithreaded process the child may only make async-signal-safe calls
// until it execs, so everything here follows the crash path's rules (crash_path.c): no
// malloc, no stdio or printf-family formatting, no locks. Failures are returned as errno
// values for install.c to put into words. CrashPathSymbolTests checks this file's object
// against the same allowlist as the crash path, plus the few calls justified there.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cc_internal.h"

// Async-signal-safe: it also runs in a forked child (cc_open_session_file).
int cc_random_hex(char *out, size_t bytes) {
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[32];
    if (bytes > sizeof(raw)) return -1;
    size_t got = 0;
    while (got < bytes) {
        ssize_t n = getrandom(raw + got, bytes - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        got += (size_t)n;
    }
    for (size_t i = 0; i < bytes; i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 0xf];
    }
    out[2 * bytes] = '\0';
    return 0;
}

// Async-signal-safe, like everything cc_open_session_file calls.
static bool cc_build_session_record(void) {
    static char payload[sizeof(cc_global.session_record)];
    cc_buf b = {payload, 0, sizeof(payload) - CCF_RECORD_HEADER_SIZE, false};
    cc_buf_append_str(&b, "{\"session_id\":\"");
    cc_buf_append_str(&b, cc_global.session_id);
    cc_buf_append_str(&b, "\",\"pid\":");
    cc_buf_append_i64(&b, getpid());
    cc_buf_append_str(&b, ",\"start_wall_ms\":");
    cc_buf_append_i64(&b, cc_global.start_wall_ms);
    cc_buf_append_str(&b, ",\"start_monotonic_ns\":");
    cc_buf_append_i64(&b, cc_global.start_mono_ns);
    cc_buf_append_str(&b, ",\"distinct_id\":");
    cc_buf_append_json_string(&b, cc_global.distinct_id, 256);
    cc_buf_append_str(&b, ",\"app_name\":");
    cc_buf_append_json_string(&b, cc_global.app_name, 256);
    cc_buf_append_str(&b, ",\"app_version\":");
    cc_buf_append_json_string(&b, cc_global.app_version, 256);
    cc_buf_append_str(&b, ",\"lib_version\":\"" CRASHCAPTURE_VERSION "\"}");
    if (b.overflow) return false;
    cc_global.session_record_len =
        cc_frame_record(cc_global.session_record, sizeof(cc_global.session_record), CCF_RECORD_SESSION, payload, b.len);
    return cc_global.session_record_len > 0;
}

// One page, written as often as needed: a 64 KiB buffer would add its pages to the
// process's resident memory.
static const char cc_zeros[4096];

// Opens a new crash file for a new session id and reserves its space: named at once
// (install) or left unnamed until a crash (`named` false: a forked child). Used at install
// and again in a forked child, which must not write into its parent's file. After fork() in a
// multithreaded process only async-signal-safe calls are allowed, so this formats with cc_buf
// (never snprintf) and returns 0 or an errno value, with *step naming what failed; the
// caller turns that into a message when it is allowed to.
int cc_open_session_file(bool named, const char **step) {
    int err = cc_name_session(step);
    return err != 0 ? err : cc_create_crash_file(named, true, step);
}

// A new session's id, start, file names and session record, with no file made yet: the C
// install does this on the caller's thread and leaves the files for later (deferred_install.c).
int cc_name_session(const char **step) {
    *step = "getrandom";
    if (cc_random_hex(cc_global.session_id, 16) != 0) return errno != 0 ? errno : EIO;
    cc_global.start_wall_ms = cc_wall_ms();
    cc_global.start_mono_ns = cc_monotonic_ns();
    cc_buf name = {cc_global.file_name, 0, sizeof(cc_global.file_name) - 1, false};
    cc_buf_append_str(&name, CCF_FILE_PREFIX);
    cc_buf_append_str(&name, cc_global.session_id);
    cc_buf_append_str(&name, "." CCF_FILE_EXTENSION);
    cc_global.file_name[name.len] = '\0';
    cc_buf path = {cc_global.file_path, 0, sizeof(cc_global.file_path) - 1, false};
    cc_buf_append_str(&path, cc_global.directory);
    cc_buf_append_str(&path, "/");
    cc_buf_append(&path, name.data, name.len);
    cc_global.file_path[path.len] = '\0';
    *step = "building the crash file path";
    if (name.overflow || path.overflow) return ENAMETOOLONG;
    *step = "writing the session record";
    return cc_build_session_record() ? 0 : EOVERFLOW;
}

// The crash file of the session named by cc_name_session, its space reserved if `want_space`.
int cc_create_crash_file(bool named, bool want_space, const char **step) {
    *step = "creating the crash file";
    // Named from install on, locked so that a replaying process knows it belongs to a live
    // session, and removed at exit: a crash then only writes and flushes it, with no name to
    // give and no directory to flush. It is made unnamed (O_TMPFILE), locked, and only then
    // linked in, so that a replay woken by the new name never finds it unlocked; and linked
    // before its space is reserved, so that on ext4 with a journal the transaction that
    // reserves it, which a crash's fdatasync commits, comes after the one that named it.
    // It stays unnamed where leaving a file behind must not happen: in a forked child, which
    // often execs next (exec closes the file without removing it), and in a directory already
    // at its bound. A crash names such a file (but in the directory at its bound, where a
    // crash is only noted).
    cc_global.anonymous_file = !named || cc_global.over_bound;
    // Not even the session record fits under the file-size limit: no file is made (the caller
    // holds SIGXFSZ off; this keeps a file that could hold nothing from being left).
    if (cc_file_size_allowed() < cc_global.session_record_len) return EFBIG;
    int fd = openat(cc_global.dir_fd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
    bool link_after_lock = fd >= 0 && !cc_global.anonymous_file;
    if (fd < 0) {
        // No O_TMPFILE on this filesystem: named at once.
        cc_global.anonymous_file = false;
        fd = openat(cc_global.dir_fd, cc_global.file_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) return errno;
    }
    if (!cc_global.anonymous_file && flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int saved = errno;
        *step = "locking the crash file";
        close(fd);
        if (!link_after_lock) unlinkat(cc_global.dir_fd, cc_global.file_name, 0);
        return saved;
    }
    cc_buf proc = {cc_global.proc_fd_path, 0, sizeof(cc_global.proc_fd_path) - 1, false};
    cc_buf_append_str(&proc, "/proc/self/fd/");
    cc_buf_append_u64(&proc, (uint64_t)fd);
    cc_global.proc_fd_path[proc.len] = '\0';
    if (link_after_lock) {
        *step = "naming the crash file";
        if (linkat(AT_FDCWD, cc_global.proc_fd_path, cc_global.dir_fd, cc_global.file_name, AT_SYMLINK_FOLLOW) != 0) {
            int saved = errno;
            close(fd);
            return saved;
        }
    }
    // Reserve the report's space now so that a full disk at crash time cannot lose it.
    *step = "reserving space for the crash file";
    // Never past the file-size limit: posix_fallocate beyond RLIMIT_FSIZE raises SIGXFSZ, which
    // would kill the program we are here to protect. A smaller reservation still holds a report.
    // For a crash that comes first (`want_space` false), nothing: the report is written at once.
    size_t reserve = want_space ? cc_global.reserved_bytes : 0;
    struct rlimit fsize;
    if (getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY && fsize.rlim_cur < reserve)
        reserve = (size_t)fsize.rlim_cur;
    int err = !want_space ? 0 : reserve < 4096 ? EFBIG : posix_fallocate(fd, 0, (off_t)reserve);
    if (err == 0) {
        *step = "writing the session record";
        err = cc_write_all(fd, cc_global.session_record, cc_global.session_record_len) != 0 ? errno : 0;
    }
    // posix_fallocate leaves unwritten extents, which a crash's flush would have to convert
    // (an inode write besides the data). Zeros written now reach the disk within the kernel's
    // writeback interval (about 30 s), after which a report of up to CC_PREWRITTEN_BYTES costs
    // one data write and one flush. Past the reservation nothing is written.
    if (err == 0 && !cc_global.anonymous_file && reserve > cc_global.session_record_len) {
        size_t zeros = (reserve < CC_PREWRITTEN_BYTES ? reserve : CC_PREWRITTEN_BYTES) - cc_global.session_record_len;
        for (size_t done = 0; err == 0 && done < zeros; done += sizeof(cc_zeros)) {
            size_t n = zeros - done < sizeof(cc_zeros) ? zeros - done : sizeof(cc_zeros);
            err = cc_write_all(fd, cc_zeros, n) != 0 ? errno : 0;
        }
    }
    if (err == 0 && !cc_note_file(fd, &cc_global.file_dev, &cc_global.file_ino)) err = errno;
    if (err == 0) {
        cc_global.reserved_in_file = reserve;
        cc_global.record_offset = cc_global.session_record_len;
        cc_global.fd = fd;
        atomic_store(&cc_global.session_ended, 0);
        return 0;
    }
    close(fd);
    if (!cc_global.anonymous_file) unlinkat(cc_global.dir_fd, cc_global.file_name, 0);
    return err;
}

void cc_after_fork_in_child(void) {
    if (!atomic_load(&cc_global.installed)) return;
    // The inherited descriptor shares the parent's lock and offset: drop it, start a session.
    if (cc_global.fd >= 0) close(cc_global.fd);
    cc_global.fd = -1;
    cc_process_state_keep_files();
    const char *step;
    if (cc_open_session_file(false, &step) != 0) atomic_store(&cc_global.session_ended, 1);
}

// MARK: - Sessions ended by exec

// A process that execs keeps its pid and start time but loses our state (mappings, descriptors,
// atexit): the files of the image before the exec would be left behind, and its session later
// closed as "killed". The new image (a preload library is inherited with the environment)
// removes the C sessions of its own pid and start time: they ended by exec. An SDK predecessor
// keeps its file: its journal still has to be imported by a replay.
//
// The new image does this when it makes its own files, when it exits before making them, and
// at a crash before them: a shell script that runs a while and then execs a short tool would
// otherwise leave the shell's session behind. Signal-safe, for that last case: the directory
// is read with getdents64 into a buffer on the stack.
//
// Such files were written after this process started. A directory not changed since then (its
// mtime) holds none, and costs one fstat; in one that has, the files last modified before that
// (every other session's, as a rule) are passed over without being opened.
// Compared a byte at a time: a name may be shorter than the prefix, and ends in the buffer.
static bool cc_starts_with(const char *name, const char *prefix) {
    for (; *prefix != '\0'; prefix++, name++)
        if (*name != *prefix) return false;
    return true;
}

// The session id in a session file's name, or in the name it is written under before it is
// renamed into place (".session-<id>.ccs.tmp", left by an exec part way); NULL for other names.
static const char *cc_session_id_in_name(const char *name) {
    if (name[0] == '.') name++;
    return cc_starts_with(name, CCF_SESSION_FILE_PREFIX) ? name + sizeof(CCF_SESSION_FILE_PREFIX) - 1 : NULL;
}

static bool cc_is_exec_predecessor(int directory, const char *name, int64_t started_s) {
    const char *id = cc_session_id_in_name(name);
    if (id == NULL) return false;
    // Our own session's file (made by a rest still running at a crash) is never a predecessor.
    if (cc_global.session_id[0] != '\0' && cc_starts_with(id, cc_global.session_id) &&
        id[strlen(cc_global.session_id)] == '.')
        return false;
    struct stat info;
    if (fstatat(directory, name, &info, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(info.st_mode) ||
        info.st_mtim.tv_sec < started_s)
        return false;
    int file = openat(directory, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (file < 0) return false;
    char header[CCF_SESSION_FIXED_SIZE];
    bool whole = read(file, header, sizeof(header)) == (ssize_t)sizeof(header);
    uint64_t pid = 0, ticks = 0;
    uint32_t lifecycle = 0;
    if (whole && memcmp(header, CCF_SESSION_MAGIC, 4) == 0) {
        memcpy(&pid, header + CCF_SESSION_AT_PID, 8);
        memcpy(&ticks, header + CCF_SESSION_AT_START_TICKS, 8);
        memcpy(&lifecycle, header + CCF_SESSION_AT_LIFECYCLE, 4);
    }
    bool same_process =
        pid == (uint64_t)getpid() && ticks == cc_global.start_ticks && lifecycle == CCF_LIFECYCLE_AT_REPLAY;
    // Exec closed the image's descriptors, and with them its lock. A file still locked is held
    // in this image: by a second copy of this library (a program that installs through the C
    // API and runs under the preload library too has two sessions), never a predecessor's.
    bool predecessor = same_process && flock(file, LOCK_EX | LOCK_NB) == 0;
    close(file);
    return predecessor;
}

// Removes a predecessor's session file and its crash file, named by the same session id.
static void cc_retire_predecessor(int directory, const char *session_name) {
    unlinkat(directory, session_name, 0);
    const char *id = cc_session_id_in_name(session_name);
    size_t id_length = 0;
    while (id[id_length] != '\0' && id[id_length] != '.') id_length++;
    char crash_name[NAME_MAX + 1];
    cc_buf name = {crash_name, 0, sizeof(crash_name) - 1, false};
    cc_buf_append_str(&name, CCF_FILE_PREFIX);
    cc_buf_append(&name, id, id_length);
    cc_buf_append_str(&name, "." CCF_FILE_EXTENSION);
    crash_name[name.len] = '\0';
    if (!name.overflow) unlinkat(directory, crash_name, 0);
}

struct cc_retire_context {
    int directory;
    int64_t started_s;
};

static void cc_retire_if_predecessor(const char *name, void *context) {
    const struct cc_retire_context *retire = context;
    if (cc_is_exec_predecessor(retire->directory, name, retire->started_s))
        cc_retire_predecessor(retire->directory, name);
}

void cc_retire_exec_predecessors(void) {
    struct timespec wall, boot;
    if (cc_global.clock_ticks <= 0 || cc_global.start_ticks == 0 ||
        !cc_holds_file(cc_global.dir_fd, cc_global.dir_dev, cc_global.dir_ino) ||
        clock_gettime(CLOCK_REALTIME, &wall) != 0 || clock_gettime(CLOCK_BOOTTIME, &boot) != 0)
        return;
    // The process's start on the wall clock, less 2 s for the clocks' and timestamps' grain.
    int64_t ran_s = (int64_t)boot.tv_sec - (int64_t)(cc_global.start_ticks / (uint64_t)cc_global.clock_ticks);
    int64_t started_s = (int64_t)wall.tv_sec - ran_s - 2;
    struct stat directory_info;
    if (fstat(cc_global.dir_fd, &directory_info) != 0 || directory_info.st_mtim.tv_sec < started_s) return;
    // A descriptor of its own: getdents64 moves the offset of the one it reads.
    struct cc_retire_context context = {openat(cc_global.dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC), started_s};
    if (context.directory < 0) return;
    char entries[2048];
    cc_each_name(context.directory, entries, sizeof(entries), cc_retire_if_predecessor, &context);
    close(context.directory);
}
