// Install time: everything the crash path needs is prepared here, where allocation,
// locks and formatting are allowed, so that crash_path.c only reads it.
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "cc_internal.h"

// The loader's: the stack pointer the process started with (glibc exports it, GLIBC_2.1).
extern void *__libc_stack_end;
#include "crashcapture_sdk.h"

cc_state cc_global = {
    .fd = -1, .dir_fd = -1, .reserved_fds = {-1, -1, -1, -1}, .session_fd = -1, .unwinder_pipe = {-1, -1}};

static pthread_mutex_t cc_install_lock = PTHREAD_MUTEX_INITIALIZER;
static bool cc_hooks_registered;

static bool cc_valid_distinct_id(const char *id, size_t len);



const char *crashcapture_last_error(void) {
    const char *deferred = cc_install_rest_problem();
    const char *own = cc_last_error_text();
    return own[0] == '\0' && deferred != NULL ? deferred : own;
}

int crashcapture_is_installed(void) { return atomic_load(&cc_global.installed); }

const char *crashcapture_crash_file_path(void) {
    cc_install_rest_finish();
    return atomic_load(&cc_global.installed) ? cc_global.file_path : NULL;
}

const char *crashcapture_session_id(void) {
    return atomic_load(&cc_global.installed) ? cc_global.session_id : NULL;
}

const char *crashcapture_distinct_id(void) {
    if (!atomic_load(&cc_global.installed)) return NULL;
    const char *current = atomic_load(&cc_global.current_distinct_id);
    return current != NULL ? current : cc_global.distinct_id;
}

void crashcapture_set_logged_in(int logged_in) { atomic_store(&cc_global.logged_in, logged_in != 0); }

int crashcapture_set_distinct_id(const char *distinct_id) {
    if (distinct_id == NULL || !cc_valid_distinct_id(distinct_id, strlen(distinct_id))) return -1;
    pthread_mutex_lock(&cc_install_lock);
    const char *current = atomic_load(&cc_global.current_distinct_id);
    char *slot = current == cc_global.distinct_id_slots[0] ? cc_global.distinct_id_slots[1] : cc_global.distinct_id_slots[0];
    snprintf(slot, sizeof(cc_global.distinct_id_slots[0]), "%s", distinct_id);
    atomic_store(&cc_global.current_distinct_id, slot);
    pthread_mutex_unlock(&cc_install_lock);
    return 0;
}

int64_t crashcapture_start_wall_ms(void) { return cc_global.start_wall_ms; }
int64_t crashcapture_start_monotonic_ns(void) { return cc_global.start_mono_ns; }
const char *crashcapture_static_properties_json(void) { return cc_global.static_props; }
int crashcapture_has_libunwind(void) {
    cc_install_rest_finish();
    return cc_global.unw_init_local2 != NULL;
}

// The C API's calls that need what the install's rest makes: done at once, on the caller's
// thread, if it is still to do; the work itself is below (modules.c, session_journal.c).
int crashcapture_refresh_modules(void) {
    cc_install_rest_finish();
    return cc_modules_capture();
}

void crashcapture_session_alive(void) {
    cc_install_rest_finish();
    cc_session_mark_alive();
}

// The notes are in the session file.
int crashcapture_set_context_json(const char *key, const char *value_json) {
    cc_install_rest_finish();
    return cc_notes_set_context_json(key, value_json);
}

int crashcapture_set_context(const char *key, const char *value) {
    cc_install_rest_finish();
    return cc_notes_set_context(key, value);
}

int crashcapture_add_breadcrumb(const char *message) {
    cc_install_rest_finish();
    return cc_notes_add_breadcrumb(message);
}

// MARK: - Directory and identity

// The capture directory itself is made if missing, never its parents: a typo in the path
// must not grow a tree of directories somewhere unexpected.
static int cc_make_directory(const char *path) {
    if (mkdir(path, 0700) == 0 || errno == EEXIST) return 0;
    if (errno == ENOENT)
        return cc_fail("cannot create crash directory %s: its parent directory does not exist (only the crash "
                       "directory itself is made)",
                       path);
    return cc_fail("cannot create directory %s: %s", path, strerror(errno));
}

static int cc_open_directory(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno != ENOENT) return cc_fail("cannot inspect %s: %s", path, strerror(errno));
        if (cc_make_directory(path) != 0) return -1;
        if (lstat(path, &st) != 0) return cc_fail("cannot inspect %s: %s", path, strerror(errno));
    }
    if (S_ISLNK(st.st_mode)) return cc_fail("crash directory %s is a symbolic link; refusing it", path);
    if (!S_ISDIR(st.st_mode)) return cc_fail("crash directory %s is not a directory", path);
    if (st.st_uid != geteuid())
        return cc_fail("crash directory %s is owned by uid %u, not by this process's uid %u; refusing it", path,
                       (unsigned)st.st_uid, (unsigned)geteuid());
    if (st.st_mode & S_IWOTH) return cc_fail("crash directory %s is writable by everyone; refusing it", path);
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return cc_fail("cannot open directory %s: %s", path, strerror(errno));
    // Every event and the user's ids live here: a directory of ours that others could read
    // (0755, 0770) is made private, as a new one is made.
    if ((st.st_mode & 077) != 0 && fchmod(fd, 0700) != 0) {
        int saved = errno;
        close(fd);
        return cc_fail("crash directory %s is open to other users (mode %o) and cannot be made 0700: %s", path,
                       (unsigned)(st.st_mode & 07777), strerror(saved));
    }
    return fd;
}


static bool cc_valid_distinct_id(const char *id, size_t len) {
    if (len == 0 || len > 255) return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)id[i] < 0x20 || id[i] == '"' || id[i] == '\\' || id[i] == 0x7f) return false;
    return true;
}

// A random UUID persisted next to the crash files, so every session of this app on this
// machine reports as the same user until the app sets its own id.
static int cc_load_distinct_id(int dir_fd, const char *given) {
    if (given != NULL) {
        if (!cc_valid_distinct_id(given, strlen(given)))
            return cc_fail("distinct_id must be 1 to 255 printable bytes without quotes or backslashes");
        snprintf(cc_global.distinct_id, sizeof(cc_global.distinct_id), "%s", given);
        return 0;
    }
    int fd = openat(dir_fd, "distinct_id", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        char buffer[256];
        ssize_t n = read(fd, buffer, sizeof(buffer) - 1);
        close(fd);
        while (n > 0 && (buffer[n - 1] == '\n' || buffer[n - 1] == '\r')) n--;
        if (n > 0 && cc_valid_distinct_id(buffer, (size_t)n)) {
            buffer[n] = '\0';
            memcpy(cc_global.distinct_id, buffer, (size_t)n + 1);
            return 0;
        }
        // A damaged id file is replaced below; the old id is unrecoverable anyway.
    }
    char hex[33];
    if (cc_random_hex(hex, 16) != 0) return cc_fail("getrandom failed: %s", strerror(errno));
    hex[12] = '4';                             // UUID version 4
    hex[16] = "89ab"[(hex[16] - '0') & 3];     // RFC 4122 variant
    snprintf(cc_global.distinct_id, sizeof(cc_global.distinct_id), "%.8s-%.4s-%.4s-%.4s-%.12s", hex, hex + 8,
             hex + 12, hex + 16, hex + 20);
    // No room for it under the file-size limit (`ulimit -f 0`): this session goes on with the
    // id made here, and no file, not even an empty temporary, is left.
    if (cc_file_size_allowed() < strlen(cc_global.distinct_id)) return 0;
    char temp[64];
    snprintf(temp, sizeof(temp), ".distinct_id.%d", (int)getpid());
    fd = openat(dir_fd, temp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return cc_fail("cannot write distinct_id: %s", strerror(errno));
    bool ok = cc_write_all(fd, cc_global.distinct_id, strlen(cc_global.distinct_id)) == 0 && fsync(fd) == 0;
    close(fd);
    if (!ok || renameat(dir_fd, temp, dir_fd, "distinct_id") != 0) {
        unlinkat(dir_fd, temp, 0);
        return cc_fail("cannot write distinct_id: %s", strerror(errno));
    }
    return 0;
}

// MARK: - Signals

static bool cc_is_ours(const struct sigaction *sa) {
    return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == cc_signal_handler;
}




static int cc_install_signal_handlers(void) {
    memset(&cc_global.ours, 0, sizeof(cc_global.ours));
    cc_global.ours.sa_sigaction = cc_signal_handler;
    // SA_NODEFER: a fault inside our own handler must reach us (to be survived), and the
    // handlers we chain to must not inherit the fatal signals blocked.
    cc_global.ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigfillset(&cc_global.ours.sa_mask);
    for (int i = 0; i < CC_HANDLED_SIGNAL_COUNT; i++) sigdelset(&cc_global.ours.sa_mask, cc_handled_signals[i]);
    for (int i = 0; i < CC_HANDLED_SIGNAL_COUNT; i++) {
        int signo = cc_handled_signals[i];
        // One call each: ours in, the previous one out (a process pays every system call).
        struct sigaction previous;
        if (sigaction(signo, &cc_global.ours, &previous) != 0) return cc_fail("sigaction(%d): %s", signo, strerror(errno));
        if (cc_is_ours(&previous)) continue;
        cc_global.previous[signo] = previous;
        cc_global.replaced[signo] = true;
    }
    // A C install takes its real-time signal with the rest (deferred_install.c): only the
    // fallback that asks threads by signal, where ptrace is refused, needs it.
    if (cc_global.sdk_session) cc_install_thread_signal();
    return 0;
}


static void cc_restore_thread_signal(void) {
    int signo = cc_global.thread_signal;
    if (signo == 0) return;
    struct sigaction current;
    if (sigaction(signo, NULL, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
        current.sa_sigaction == cc_thread_capture_handler)
        sigaction(signo, &cc_global.thread_signal_previous, NULL);
    cc_global.thread_signal = 0;
}

static void cc_restore_signal_handlers(void) {
    cc_restore_thread_signal();
    for (int i = 0; i < CC_HANDLED_SIGNAL_COUNT; i++) {
        int signo = cc_handled_signals[i];
        if (!cc_global.replaced[signo]) continue;
        struct sigaction current;
        // Someone installed a handler after ours: leave theirs; our handler passes through.
        if (sigaction(signo, NULL, &current) == 0 && cc_is_ours(&current))
            sigaction(signo, &cc_global.previous[signo], NULL);
        cc_global.replaced[signo] = false;
    }
}

// MARK: - Session end and fork

void crashcapture_end_session(void) {
    if (!atomic_load(&cc_global.installed) || atomic_load(&cc_global.session_ended)) return;
    // A thread that reached exit() while another reports a crash: the crash file is the report.
    if (crashcapture_crash_in_progress()) return;
    // A session that ends before its files were made never makes them.
    cc_install_rest_cancel();
    // From here on a crash (in a later atexit handler, say) is still reported, without a
    // second $AppEnd: the normal one was already tracked.
    atomic_store(&cc_global.session_ended, 1);
    // The SDK removes its session file itself, once its $AppEnd is in the store.
    if (!cc_session_file_is_sdk()) crashcapture_session_retire();
    if (cc_global.anonymous_file) return;
    unlinkat(cc_global.dir_fd, cc_global.file_name, 0);
    int fd = cc_global.fd;
    cc_global.fd = -1;
    if (fd >= 0) close(fd);
}

static void cc_at_exit(void) { crashcapture_end_session(); }

// MARK: - Public

static void cc_before_fork(void) { cc_install_rest_prepare_fork(); }

static void cc_after_fork_in_parent(void) { cc_install_rest_after_fork(false); }

static void cc_after_fork(void) {
    cc_install_rest_after_fork(true);
    cc_session_file_detach_in_child();
    cc_after_fork_in_child();
    cc_watchdog_after_fork_in_child();
}

static int cc_install(const crashcapture_config *config, size_t journal_bytes, int lifecycle, bool sdk);


int crashcapture_install(const crashcapture_config *config) {
    return cc_install(config, 0, CCF_LIFECYCLE_AT_REPLAY, false);
}

int crashcapture_install_sdk(const crashcapture_config *config, size_t journal_bytes, int tracks_lifecycle) {
    return cc_install(config, journal_bytes, tracks_lifecycle ? CCF_LIFECYCLE_TRACKED : CCF_LIFECYCLE_NONE, true);
}

static int cc_install(const crashcapture_config *config, size_t journal_bytes, int lifecycle, bool sdk) {
    pthread_mutex_lock(&cc_install_lock);
    // Every file install writes (the distinct id, the SDK's session and crash files) is
    // written within the file-size limit, and none of them may end the app with SIGXFSZ.
    cc_file_limit_hold_t file_limit;
    cc_file_limit_hold(&file_limit);
    cc_steps_begin();
    int result = 0;
    if (config == NULL || config->directory == NULL || config->directory[0] == '\0') {
        result = cc_fail("a crash directory is required");
        goto done;
    }
    // A relative directory is resolved once, against the working directory at install: a
    // later chdir, and the crash path, never see it again.
    char absolute[PATH_MAX];
    const char *directory = config->directory;
    if (directory[0] != '/') {
        char here[PATH_MAX];
        if (getcwd(here, sizeof(here)) == NULL ||
            snprintf(absolute, sizeof(absolute), "%s/%s", strcmp(here, "/") == 0 ? "" : here, directory) >=
                (int)sizeof(absolute)) {
            result = cc_fail("cannot make the crash directory %s absolute: %s", directory,
                             errno != 0 ? strerror(errno) : "path too long");
            goto done;
        }
        directory = absolute;
    }
    if (atomic_load(&cc_global.installed)) {
        // Installing again with the same directory changes nothing; another one is a mistake
        // that would otherwise go unnoticed.
        if (strcmp(directory, cc_global.directory) != 0)
            result = cc_fail("already installed with crash directory %s; uninstall first to use %s",
                             cc_global.directory, directory);
        goto done;
    }
    if (config->property_count > 0 && config->properties == NULL) {
        result = cc_fail("property_count is %zu but properties is NULL", config->property_count);
        goto done;
    }
    // Bytes that are not UTF-8 cannot travel in the reports' JSON (nor in the CLI's String):
    // such a directory would be named wrongly everywhere it is shown or replayed.
    if (!cc_valid_utf8(directory)) {
        char shown[512];
        size_t n = 0;
        for (const unsigned char *p = (const unsigned char *)directory; *p != '\0' && n + 5 < sizeof(shown); p++)
            n += (size_t)snprintf(shown + n, sizeof(shown) - n, *p >= 0x80 || *p < 0x20 ? "\\x%02x" : "%c", *p);
        shown[n] = '\0';
        result = cc_fail("crash directory %s is not valid UTF-8: it would be named wrongly in every report and by "
                         "crashcap; give a UTF-8 path",
                         shown);
        goto done;
    }
    if (strlen(directory) >= sizeof(cc_global.directory) - 80) {
        result = cc_fail("crash directory path is too long");
        goto done;
    }
    const char *app_name = config->app_name;
    char exe[PATH_MAX];
    if (app_name == NULL || app_name[0] == '\0') {
        ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
        exe[n > 0 ? n : 0] = '\0';
        const char *slash = strrchr(exe, '/');
        app_name = slash != NULL ? slash + 1 : exe;
    }
    if (strlen(app_name) > 200 || !cc_valid_utf8(app_name)) {
        result = cc_fail("app_name must be valid UTF-8 of at most 200 bytes");
        goto done;
    }
    const char *app_version = config->app_version != NULL ? config->app_version : "";
    if (strlen(app_version) > 200 || !cc_valid_utf8(app_version)) {
        result = cc_fail("app_version must be valid UTF-8 of at most 200 bytes");
        goto done;
    }
    snprintf(cc_global.app_name, sizeof(cc_global.app_name), "%s", app_name);
    snprintf(cc_global.app_version, sizeof(cc_global.app_version), "%s", app_version);
    if (cc_build_static_json(config) != 0) {
        result = -1;
        goto done;
    }
    cc_step_done(CC_STEP_CONFIGURATION);
    int dir_fd = cc_open_directory(directory);
    if (dir_fd < 0) {
        result = -1;
        goto done;
    }
    if (cc_load_distinct_id(dir_fd, config->distinct_id) != 0) {
        close(dir_fd);
        result = -1;
        goto done;
    }
    snprintf(cc_global.directory, sizeof(cc_global.directory), "%s", directory);
    cc_global.dir_fd = dir_fd;
    cc_note_file(dir_fd, &cc_global.dir_dev, &cc_global.dir_ino);
    // For the SDK here; a C install finds it with its rest, before it names any file.
    if (sdk) cc_global.fsync_covers_new_name = cc_fsync_covers_new_name(dir_fd);
    cc_global.reserved_bytes = config->reserved_bytes != 0 ? config->reserved_bytes : CC_DEFAULT_RESERVED_BYTES;
    cc_global.crash_line = !config->no_crash_line;
    cc_global.record_arguments = !config->omit_arguments;
    cc_global.clock_ticks = sysconf(_SC_CLK_TCK);
    // Found by name, so that a linked install and the preload library agree on one owner.
    extern _Atomic pid_t crashcapture_crash_owner;
    cc_global.crash_owner = (_Atomic pid_t *)dlsym(RTLD_DEFAULT, "crashcapture_crash_owner");
    if (cc_global.crash_owner == NULL) cc_global.crash_owner = &crashcapture_crash_owner;
    cc_global.sdk_session = sdk;
    const char *freeze = getenv("CRASHCAPTURE_FREEZE");
    cc_global.freeze_by_signal_only = freeze != NULL && strcmp(freeze, "signal") == 0;
    // CRASHCAPTURE_STACK_MEMORY=off: no stacks record (smaller crash files, no minidump); the
    // benchmark measures the handler both ways in one run with it.
    const char *stack_memory = getenv("CRASHCAPTURE_STACK_MEMORY");
    cc_global.no_stack_memory = stack_memory != NULL && strcmp(stack_memory, "off") == 0;
    // Where the main thread's frames end: above it the kernel put argc, argv, the environment
    // and their strings, which the stacks record must never carry (the environment is never
    // recorded, the arguments only when allowed).
    cc_global.main_stack_end = (uintptr_t)__libc_stack_end;
    cc_step_done(CC_STEP_DIRECTORY);
    // The buffers' pages and the CRC tables spare a crash page faults and time; a crash before
    // they are ready does without (a C install prepares them with its rest).
    if (sdk) cc_crash_path_prepare();
    cc_step_done(CC_STEP_CRASH_PATH);
    cc_global.maximum_crash_files = config->maximum_crash_files != 0 ? config->maximum_crash_files : 64;
    cc_global.maximum_crash_bytes = config->maximum_crash_bytes != 0 ? config->maximum_crash_bytes : (size_t)256 << 20;
    if (!sdk) {
        // A C install: the session is named here, and its files and the rest are made off
        // this thread (deferred_install.c) once the handlers are in place.
        const char *step;
        int err = cc_name_session(&step);
        if (err != 0) {
            result = cc_fail("%s in %s failed: %s", step, cc_global.directory, strerror(err));
            close(dir_fd);
            cc_global.dir_fd = -1;
            goto done;
        }
        goto handlers;
    }
    cc_detect_container();
    cc_global.over_bound = cc_directory_is_over_bound(dir_fd);
    cc_step_done(CC_STEP_BOUND);
    const char *step;
    int err = cc_open_session_file(true, &step);
    if (err != 0) {
        result = cc_fail("%s in %s failed: %s", step, cc_global.directory, strerror(err));
        close(dir_fd);
        cc_global.dir_fd = -1;
        goto done;
    }
    cc_step_done(CC_STEP_CRASH_FILE);
    err = cc_session_file_create(journal_bytes, lifecycle, sdk, &step);
    if (err != 0) {
        result = cc_fail("%s in %s failed: %s", step, cc_global.directory, strerror(err));
        if (cc_global.fd >= 0) close(cc_global.fd);
        cc_global.fd = -1;
        if (!cc_global.anonymous_file) unlinkat(dir_fd, cc_global.file_name, 0);
        close(dir_fd);
        cc_global.dir_fd = -1;
        goto done;
    }
    // A session made again (uninstall, then install) starts with the context the app had set.
    cc_notes_session_created();
    cc_step_done(CC_STEP_SESSION_FILE);
    cc_modules_capture();
    cc_step_done(CC_STEP_MODULES);
    cc_load_libunwind();
    cc_step_done(CC_STEP_LIBUNWIND_FIRST_STEP);
    cc_process_state_keep_files();
    cc_step_done(CC_STEP_KEPT_FILES);
handlers:
    // On this thread in either install: an uncaught C++ exception in the program's first
    // milliseconds must still find our terminate handler, which records its type.
    cc_hook_runtimes();
    crashcapture_install_thread_stack();
    cc_threads_enable(true);
    cc_step_done(CC_STEP_RUNTIMES);
    atomic_store(&cc_global.installed, 1);
    if (cc_install_signal_handlers() != 0) {
        atomic_store(&cc_global.installed, 0);
        cc_restore_signal_handlers();
        cc_session_file_close(true);
        result = -1;
        goto done;
    }
    if (!cc_hooks_registered) {
        cc_hooks_registered = true;
        atexit(cc_at_exit);
        pthread_atfork(cc_before_fork, cc_after_fork_in_parent, cc_after_fork);
    }
    cc_step_done(CC_STEP_SIGNALS);
    if (!sdk) cc_install_rest_start();
    cc_step_done(CC_STEP_REST_THREAD);
done:
    cc_file_limit_release(&file_limit);
    pthread_mutex_unlock(&cc_install_lock);
    return result;
}

void crashcapture_uninstall(void) {
    pthread_mutex_lock(&cc_install_lock);
    if (atomic_load(&cc_global.installed)) {
        cc_install_rest_cancel();
        cc_watchdog_stop();
        cc_restore_signal_handlers();
        cc_unhook_runtimes();
        cc_threads_enable(false);
        crashcapture_end_session();
        cc_session_file_close(true);
        atomic_store(&cc_global.installed, 0);
        if (cc_global.fd >= 0) close(cc_global.fd);
        cc_global.fd = -1;
        if (cc_global.dir_fd >= 0) close(cc_global.dir_fd);
        cc_global.dir_fd = -1;
    }
    pthread_mutex_unlock(&cc_install_lock);
}
