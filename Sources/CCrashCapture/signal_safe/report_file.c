// Where the report goes and how it is made durable: the crash file kept since install, or one
// made again under its name, or the session file; named, flushed, its timing appended; and the
// one line on stderr.
// The rules of crash_path.c apply here: this runs after a fatal signal (signal-safety(7)),
// allocates nothing, takes no lock, and calls nothing above it in the crash path.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cc_internal.h"
#include "crash_report.h"

// The capture directory opened again by its path, made again first if `make` (removed since
// install): for a descriptor the program reused, or a directory that is gone. -1 if neither.
static int cc_reopen_directory(bool make) {
    if (make && mkdir(cc_global.directory, 0700) != 0 && errno != EEXIST) return -1;
    return openat(AT_FDCWD, cc_global.directory, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

// A new crash file under the file's name in `dir`, holding the session record; -1 if not.
static int cc_new_crash_file(int dir) {
    int fd = openat(dir, cc_global.file_name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -1;
    if (cc_write_all(fd, cc_global.session_record, cc_global.session_record_len) != 0) {
        close(fd);
        return -1;
    }
    cc_global.record_offset = cc_global.session_record_len;
    cc_global.reserved_in_file = 0;
    return fd;
}

// The crash file kept since install; or, where it is gone, a new one under its name: removed
// at a normal end (a crash in a later atexit handler still needs one), or its descriptor
// closed and reused by the program (a pipe, say, which is never written).
static int cc_crash_fd(void) {
    if (cc_holds_file(cc_global.fd, cc_global.file_dev, cc_global.file_ino)) return cc_global.fd;
    cc_global.fd = -1;
    if (cc_holds_file(cc_global.dir_fd, cc_global.dir_dev, cc_global.dir_ino))
        return cc_new_crash_file(cc_global.dir_fd);
    int dir = cc_reopen_directory(false);
    int fd = dir >= 0 ? cc_new_crash_file(dir) : -1;
    if (dir >= 0) close(dir);
    return fd;
}

// pwrite is not in signal-safety(7); lseek and write are. Nothing else uses this
// descriptor's offset.
static int cc_write_at(int fd, const void *data, size_t n, uint64_t at) {
    if (lseek(fd, (off_t)at, SEEK_SET) < 0) return -1;
    return cc_write_all(fd, data, n);
}

// The directory was removed after install: it is made again where it was, and the report
// linked into it.
static bool cc_link_into_recreated_directory(void) {
    int dir = cc_reopen_directory(true);
    if (dir < 0) return false;
    bool linked = linkat(AT_FDCWD, cc_global.proc_fd_path, dir, cc_global.file_name, AT_SYMLINK_FOLLOW) == 0;
    if (linked) fsync(dir);
    close(dir);
    return linked;
}

// The named crash file lost its name after install (its directory removed, or the file
// deleted): the session record and the report go into a new file under the same name, in the
// directory made again where it was, and both are flushed. Returns that file, or -1.
static int cc_write_under_new_name(const char *records, size_t len) {
    int dir = cc_reopen_directory(true);
    if (dir < 0) return -1;
    int fd = cc_new_crash_file(dir);
    bool written = fd >= 0 && cc_write_all(fd, records, len) == 0 && fdatasync(fd) == 0 && fsync(dir) == 0;
    close(dir);
    if (written) return fd;
    if (fd >= 0) close(fd);
    return -1;
}

// The directory no longer takes a new name (made read-only after install) and the crash file
// has none: the report's bytes go into the session file, which has had its name since install,
// and only once they are durable does its header say where they are.
static bool cc_keep_in_session_file(const char *records, size_t len, uint64_t allowed) {
    int fd = atomic_load(&cc_global.session_fd);
    if (!cc_holds_file(fd, cc_global.session_dev, cc_global.session_ino)) return false;
    uint64_t at = cc_global.session_crash_offset;
    size_t head = cc_global.session_record_len;
    if (fd < 0 || at + head + len > allowed) return false;
    if (cc_write_at(fd, cc_global.session_record, head, at) != 0 ||
        cc_write_at(fd, records, len, at + head) != 0 || fdatasync(fd) != 0)
        return false;
    uint64_t where[2] = {at, head + len};
    return cc_write_at(fd, where, sizeof(where), CCF_SESSION_AT_CRASH_OFFSET) == 0 && fdatasync(fd) == 0;
}

// Over the directory's bound: no report of its own, only the crash's signal in the session
// file's header, durable before the process goes on dying.
static bool cc_note_crash_not_kept(void) {
    int fd = atomic_load(&cc_global.session_fd);
    if (!cc_holds_file(fd, cc_global.session_dev, cc_global.session_ino)) return false;
    struct {
        int32_t signal;
        int32_t code;
        int64_t wall_ms;
    } note = {cc_found.crash_signal, cc_found.crash_code, cc_wall_ms()};
    return cc_write_at(fd, &note, sizeof(note), CCF_SESSION_AT_NOT_KEPT_SIGNAL) == 0 && fdatasync(fd) == 0;
}

// Names an unnamed crash file (a forked child's): linked into the directory, or into the
// directory made again where it was if it was removed; the directory is flushed unless the
// file's own flush, which follows, covers the name (flush_directory false). In a directory
// that was at its bound at install, the crash is only noted in the session file.
static void cc_publish(bool flush_directory) {
    if (cc_global.over_bound) {
        if (cc_note_crash_not_kept()) atomic_store(&cc_found.report_named, 3);
        return;
    }
    if (linkat(AT_FDCWD, cc_global.proc_fd_path, cc_global.dir_fd, cc_global.file_name, AT_SYMLINK_FOLLOW) == 0) {
        if (flush_directory) fsync(cc_global.dir_fd);
        atomic_store(&cc_found.report_named, 1);
    } else if (errno == ENOENT && cc_link_into_recreated_directory()) {
        atomic_store(&cc_found.report_named, 1);
    }
}

static void cc_write_timing(int fd, char *out, size_t total, size_t cap, uint64_t allowed, int64_t handler_ns,
                            int64_t write_ns, int64_t sync_ns, int64_t publish_ns, int sync_ok,
                            bool named_before_sync, bool directory_flushed);
static const char *cc_after;
static size_t cc_after_len;

// One line on stderr, so that a crash shows in the logs even when the capture directory is
// lost. Written only if stderr takes it at once: a full pipe nobody drains must not hang us.
void cc_write_crash_line(const cc_crash *c) {
    if (!cc_global.crash_line) return;
    char line[1024];
    cc_buf b = {line, 0, sizeof(line), false};
    cc_buf_append_str(&b, "crashcapture: ");
    cc_buf_append_str(&b, cc_signal_name(c->signo));
    cc_buf_append_str(&b, " (");
    cc_buf_append_str(&b, ccf_code_name(c->signo, c->info->si_code));
    cc_buf_append_str(&b, ")");
    if (c->info->si_code > 0) {  // sent signals carry the sender, not an address
        cc_buf_append_str(&b, " at ");
        cc_buf_append_hex(&b, (uintptr_t)c->info->si_addr);
    }
    cc_buf_append_str(&b, " in thread ");
    cc_buf_append_i64(&b, c->tid);
    cc_buf_append_str(&b, " \"");
    size_t name_length = 0;
    while (name_length < sizeof(cc_found.thread_name) && cc_found.thread_name[name_length] != '\0') name_length++;
    cc_buf_append(&b, cc_found.thread_name, name_length);
    cc_buf_append_str(&b, "\" at ");
    if (cc_found.frame_count > 0) {
        uintptr_t bias = 0;
        long index = cc_find_module(c->map, cc_found.frames[0], &bias);
        if (index >= 0) {
            cc_append_module_name(&b, c, index);
            cc_buf_append_str(&b, "+");
            cc_buf_append_hex(&b, cc_found.frames[0] - bias);
        } else {
            cc_buf_append_hex(&b, cc_found.frames[0]);
        }
    } else {
        cc_buf_append_str(&b, "?");
    }
    int named = atomic_load(&cc_found.report_named);
    cc_buf_append_str(&b, named == 1   ? "; report "
                          : named == 2 ? "; report kept in the session file for "
                          : named == 3 ? "; no report kept: the crash directory is full (noted in its session file) "
                          : named == 4 ? "; no report kept: the file-size limit (ulimit -f) leaves no room for one "
                                         "(noted in its session file) "
                                       : "; no report written");
    if (named == 1 || named == 2) cc_buf_append_str(&b, cc_global.file_path);
    if (named == 3 || named == 4) cc_buf_append_str(&b, cc_global.directory);
    // Names (the thread's, a module's, the directory's) may hold ESC or a newline: raw, they
    // would drive the terminal that shows the log or forge a line of it. Every control
    // character (and DEL) becomes \xNN; the text the line is made of has none of its own.
    static char escaped[sizeof(line) * 4 + 1];
    size_t length = 0;
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < b.len && length + 5 < sizeof(escaped); i++) {
        unsigned char byte = (unsigned char)line[i];
        if (byte < 0x20 || byte == 0x7f) {
            escaped[length++] = '\\';
            escaped[length++] = 'x';
            escaped[length++] = hex[byte >> 4];
            escaped[length++] = hex[byte & 15];
        } else {
            escaped[length++] = (char)byte;
        }
    }
    escaped[length++] = '\n';
    // stderr may be a file (a log), which the file-size limit also bounds: past it the write
    // would raise SIGXFSZ, and the process would die of that instead of its own signal. The
    // line is cut to what the limit leaves (getrlimit, fstat and lseek are async-signal-safe).
    struct stat status;
    uint64_t allowed = cc_file_size_allowed();
    if (allowed != UINT64_MAX && fstat(STDERR_FILENO, &status) == 0 && S_ISREG(status.st_mode)) {
        off_t at = lseek(STDERR_FILENO, 0, SEEK_CUR);
        uint64_t end = (uint64_t)status.st_size > (uint64_t)(at > 0 ? at : 0) ? (uint64_t)status.st_size : (uint64_t)at;
        uint64_t room = allowed > end ? allowed - end : 0;
        if (room < length) length = (size_t)room;
    }
    struct pollfd out = {.fd = STDERR_FILENO, .events = POLLOUT};
    if (length > 0 && poll(&out, 1, 0) == 1 && (out.revents & POLLOUT)) (void)!write(STDERR_FILENO, escaped, length);
}

// A named crash file that will hold no report (no room under the file-size limit, or the
// write failed) is removed: the session file tells of the session, and no name is left on a
// file that holds nothing, or half a report. The crash itself is noted in the session file's
// header (a write inside its first page, which neither a full disk nor the file-size limit
// refuses), so that replay imports a crash without a report, not a session that was killed.
static void cc_remove_named_crash_file(void) {
    if (!cc_global.anonymous_file) unlinkat(cc_global.dir_fd, cc_global.file_name, 0);
    (void)cc_note_crash_not_kept();
}

int cc_write_report(char *out, size_t total, size_t cap, int64_t entry_ns, uint64_t allowed, cc_write_attempt attempt,
                    const char *after, size_t after_len) {
    bool may_retry = attempt == CC_WRITE_MAY_RETRY;
    cc_after = after;
    cc_after_len = after_len;
    if (cc_global.record_offset + total > allowed) {
        if (may_retry) return EFBIG;
        cc_remove_named_crash_file();
        // The file-size limit leaves no room for any report: the crash is noted in the session
        // file's header (written in place, nothing grows), as in a directory at its bound.
        if (cc_note_crash_not_kept()) atomic_store(&cc_found.report_named, 4);
        return 0;
    }
    int fd = cc_crash_fd();
    if (fd < 0) {
        (void)cc_note_crash_not_kept();
        return 0;
    }
    int64_t write_start = cc_monotonic_ns();
    if (lseek(fd, (off_t)cc_global.record_offset, SEEK_SET) < 0 || cc_write_all(fd, out, total) != 0) {
        int failed = errno;
        if (may_retry && (failed == ENOSPC || failed == EDQUOT || failed == EFBIG)) return failed;
        cc_remove_named_crash_file();
        return 0;
    }
    // A report written again, smaller, over the part of a larger one that fitted: what is left
    // of that past its end would read as a damaged record.
    if (attempt == CC_WRITE_SMALLER_AGAIN) ftruncate(fd, (off_t)(cc_global.record_offset + total));
    int64_t written = cc_monotonic_ns();
    int sync_ok;
    int64_t sync_ns, publish_ns;
    bool named_before_sync, directory_flushed;
    if (!cc_global.anonymous_file || fd != cc_global.fd) {
        // Named since install (or named again for a crash after the session's end). Removed
        // since, with its directory or alone, it is written again under its name.
        struct stat status;
        if (fstat(fd, &status) == 0 && status.st_nlink == 0) {
            int again = cc_write_under_new_name(out, total);
            int64_t done = cc_monotonic_ns();
            if (again >= 0) {
                atomic_store(&cc_found.report_named, 1);
                cc_write_timing(again, out, total, cap, allowed, done - entry_ns, written - write_start, 0,
                                done - written, 1, false, true);
                close(again);
            } else if (cc_keep_in_session_file(out, total, allowed)) {
                // No new file in the directory either (read-only): the session file keeps it.
                atomic_store(&cc_found.report_named, 2);
                atomic_store(&cc_found.report_written, 1);
            } else {
                (void)cc_note_crash_not_kept();  // kept nowhere: at least the crash is known
            }
            return 0;
        }
        // On ext4 the file's flush also makes its name durable: without a journal,
        // ext4_sync_parent writes the directory of a file named since its last flush; with one,
        // fdatasync commits the transaction that reserved the file's space, which install began
        // after the one that named it. Elsewhere the directory is flushed too.
        sync_ok = fdatasync(fd) == 0;
        int64_t synced = cc_monotonic_ns();
        if (!cc_global.fsync_covers_new_name) fsync(cc_global.dir_fd);
        atomic_store(&cc_found.report_named, 1);
        sync_ns = synced - written;
        publish_ns = cc_monotonic_ns() - synced;
        named_before_sync = true;
        directory_flushed = !cc_global.fsync_covers_new_name;
    } else {
        // Unnamed: a forked child's file, to be named; where one fsync makes both the records
        // and the new name durable, it is linked first and flushed once (power lost between
        // the two leaves a named file whose records fail their checksum, which replay sets
        // aside as damaged). Or a directory without room at install: the crash is only noted.
        named_before_sync = cc_global.fsync_covers_new_name && !cc_global.over_bound;
        sync_ok = named_before_sync ? 1 : fdatasync(fd) == 0;
        int64_t synced = cc_monotonic_ns();
        cc_publish(!named_before_sync);
        int64_t published = cc_monotonic_ns();
        if (named_before_sync) sync_ok = fsync(fd) == 0;
        sync_ns = named_before_sync ? cc_monotonic_ns() - published : synced - written;
        publish_ns = published - synced;
        directory_flushed = !named_before_sync && atomic_load(&cc_found.report_named) == 1;
    }
    int64_t done = cc_monotonic_ns();
    cc_write_timing(fd, out, total, cap, allowed, done - entry_ns, written - write_start, sync_ns, publish_ns,
                    sync_ok, named_before_sync, directory_flushed);
    return 0;
}

// Timings are known only at the end; they ride in a record of their own that the kernel
// flushes on its own schedule (the page cache outlives the process).
static void cc_write_timing(int fd, char *out, size_t total, size_t cap, uint64_t allowed, int64_t handler_ns,
                            int64_t write_ns, int64_t sync_ns, int64_t publish_ns, int sync_ok,
                            bool named_before_sync, bool directory_flushed) {
    atomic_store(&cc_found.report_written, 1);
    // The stacks record: after the durable events, so that the report waits for none of it. A
    // write that stops short (a disk full past the reserved space) is cut off again: a torn
    // record would make a replay set the whole file aside as damaged.
    if (cc_after != NULL && cc_global.record_offset + total + cc_after_len <= allowed) {
        int64_t stacks_start = cc_monotonic_ns();
        off_t before = lseek(fd, 0, SEEK_CUR);
        if (cc_write_all(fd, cc_after, cc_after_len) == 0) {
            total += cc_after_len;
        } else if (before >= 0) {
            (void)!ftruncate(fd, before);
            lseek(fd, before, SEEK_SET);
        }
        cc_found.stacks_write_ns = cc_monotonic_ns() - stacks_start;
    }
    size_t timing = cc_build_timing(out + CCF_RECORD_HEADER_SIZE, cap - CCF_RECORD_HEADER_SIZE, handler_ns,
                                    write_ns, sync_ns, publish_ns, sync_ok, named_before_sync, directory_flushed);
    if (timing > 0 && cc_global.record_offset + total + CCF_RECORD_HEADER_SIZE + timing <= allowed) {
        cc_frame_in_place(out, CCF_RECORD_TIMING, timing);
        cc_write_all(fd, out, CCF_RECORD_HEADER_SIZE + timing);
    }
}
