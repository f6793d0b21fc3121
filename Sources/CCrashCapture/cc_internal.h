// State shared between install time (install/) and the code that runs after a signal or in
// a forked child (signal_safe/). Everything here is prepared at install; the signal-safe
// code only reads it, apart from the few atomics that coordinate crashing threads.
#ifndef CC_INTERNAL_H
#define CC_INTERNAL_H

#define UNW_LOCAL_ONLY
#include <libunwind.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "crashcapture.h"
#include "crashcapture_format.h"

#define CC_MAX_FRAMES 256
#define CC_MAX_MODULES 512
#define CC_MODULE_JSON_CAPACITY (192 * 1024)
#define CC_STATIC_JSON_CAPACITY (32 * 1024)
// The largest report the crash path writes (every thread's stack and registers included).
#define CC_RECORD_CAPACITY (2 * 1024 * 1024 + 64 * 1024)
// What the crash file reserves at install, so that a full disk cannot lose the report: 960 KiB
// holds most reports whole (a crash among 256 threads writes about 170 KiB), and keeps a live
// process's disk, with the 1 MiB journal, under 2 MiB. A larger report that finds no room past
// it is built again to fit (CC_SMALLEST_REPORT_ROOM at least: the crashing thread whole).
#define CC_DEFAULT_RESERVED_BYTES (960 * 1024)
// The stacks record (every thread's stack memory) at most, and the bound on its stack bytes when
// the crash file has no reserved space to hold it.
#define CC_STACKS_CAPACITY (1024 * 1024)
#define CC_STACKS_UNRESERVED_BOUND (768 * 1024)
#define CC_MAX_ATTACHMENTS 4
#define CC_ATTACHMENT_MAX_BYTES 65536
#define CC_SMALLEST_REPORT_ROOM (32 * 1024)
#define CC_MAX_THREADS 512       // other threads captured at most; the rest are counted
#define CC_THREAD_FRAMES 128     // frames per other thread
#define CC_MAX_ASYNC_FRAMES 64   // [async] callers of the crashing thread
#define CC_THREAD_ASYNC_FRAMES 16  // [async] callers of each other thread running a task
#define CC_THREAD_ANSWER_NS (100 * 1000000LL)  // how long the other threads have to answer
#define CC_ALTSTACK_SIZE (64 * 1024)
// The start of a named crash file written with zeros at install (a report of up to 64 threads).
#define CC_PREWRITTEN_BYTES (64 * 1024)
// Descriptors held from install for the crash path: the process-state files it reads, each
// kept open so that a crash reads it without a path lookup (a cold /proc or cgroup lookup
// costs tens of µs), /dev/null in a slot whose file cannot be opened. All are closed once
// read, which gives the rest of the crash path room in a process that ran out of descriptors.
enum { CC_KEPT_STATUS, CC_KEPT_CMDLINE, CC_KEPT_CGROUP_LIMIT, CC_KEPT_CGROUP_USAGE, CC_RESERVED_FDS };


// A growable-nowhere text buffer: appends stop at `cap` and set `overflow`.
typedef struct cc_buf {
    char *data;
    size_t len;
    size_t cap;
    bool overflow;
} cc_buf;

typedef struct cc_module {
    uintptr_t start;      // lowest PT_LOAD address in memory
    uintptr_t end;        // one past the highest
    uintptr_t load_bias;  // dlpi_addr: memory address minus ELF virtual address
} cc_module;

typedef struct cc_module_map {
    size_t count;
    // libswift_Concurrency's addresses when the process loaded it (swift_job_run's when the
    // program carries the runtime itself): a thread with a frame there runs a Swift task, and
    // only such threads have their async context chain followed.
    uintptr_t concurrency_start, concurrency_end;
    cc_module modules[CC_MAX_MODULES];
    size_t json_len;
    char json[CC_MODULE_JSON_CAPACITY];  // `{"path":..,"base":..,"build_id":..},...` no brackets
} cc_module_map;

typedef int (*cc_unw_getcontext_fn)(unw_context_t *);
typedef int (*cc_unw_init_local2_fn)(unw_cursor_t *, unw_context_t *, int);
typedef int (*cc_unw_step_fn)(unw_cursor_t *);
typedef int (*cc_unw_get_reg_fn)(unw_cursor_t *, unw_regnum_t, unw_word_t *);

#define CC_HANDLED_SIGNAL_COUNT 7
extern const int cc_handled_signals[CC_HANDLED_SIGNAL_COUNT];

typedef struct cc_state {
    _Atomic int installed;
    _Atomic int session_ended;  // normal exit seen; the crash file was removed
    int fd;
    int dir_fd;
    int reserved_fds[CC_RESERVED_FDS];  // by CC_KEPT_*, opened at install, closed by the reporting thread
    bool reserved_is_state[CC_RESERVED_FDS];  // the slot holds its process-state file, not /dev/null
    // Which file each slot held when opened: a program that closes descriptors it did not
    // open may reuse the number (for a pipe, say), and a crash must then neither read it nor
    // close it.
    dev_t reserved_dev[CC_RESERVED_FDS];
    ino_t reserved_ino[CC_RESERVED_FDS];
    // The same for the crash file, the session file and the directory, which a crash writes.
    dev_t file_dev, session_dev, dir_dev;
    ino_t file_ino, session_ino, dir_ino;
    // libunwind's memory-probing pipe, when install saw it made (-1: not known).
    int unwinder_pipe[2];
    dev_t unwinder_pipe_dev;
    ino_t unwinder_pipe_ino;
    uint64_t record_offset;  // where the crash records go (after the session record)
    size_t reserved_bytes;
    uint64_t reserved_in_file;  // bytes of the crash file reserved at install (0: a file made since)
    bool crash_line;  // one line on stderr at a crash
    bool record_arguments;  // the command line's arguments in the report, not only the program
    // The directory held as many crash files or bytes as it may at install: a crash here is
    // only noted in the session file, not given a report of its own.
    bool over_bound;
    size_t maximum_crash_files;
    size_t maximum_crash_bytes;
    long clock_ticks;  // sysconf(_SC_CLK_TCK), read at install
    char container[32];  // "docker", "podman", "kubernetes", "container" or "none", found at install
    char cgroup_limit_file[PATH_MAX];  // the memory cgroup's limit and usage files; "" outside one
    char cgroup_usage_file[PATH_MAX];
    char directory[PATH_MAX];
    // Files whose tails go into a report (crashcapture_attach_file); `attachment_count` is
    // published after the slot is filled, so the crash path reads only whole entries.
    struct {
        char path[PATH_MAX];
        size_t max_bytes;
    } attachments[CC_MAX_ATTACHMENTS];
    _Atomic int attachment_count;
    _Atomic bool logged_in;  // the distinct id is a login id (crashcapture_set_logged_in)
    char app_name[256];
    char app_version[256];
    char file_path[PATH_MAX];
    char file_name[64];
    // The crash file is named since install and removed at a normal end. In a forked child
    // it is an unnamed O_TMPFILE, which a crash links into the directory; in a directory at
    // its bound too, never named (a crash is only noted there).
    bool anonymous_file;
    // The directory is on ext4, where fsync of a file just linked in also makes its name durable.
    bool fsync_covers_new_name;
    char proc_fd_path[64];
    // The session file, named since install: where the report goes when the directory no
    // longer takes the crash file's name. -1 when there is none (or it is not ours).
    _Atomic int session_fd;
    uint64_t session_crash_offset;  // past the header and the ring
    char session_id[33];
    char distinct_id[256];
    // After a login the id changes while a crash may be reading it: the new one is written
    // to the other slot, then published with one atomic store.
    char distinct_id_slots[2][256];
    _Atomic(const char *) current_distinct_id;
    int64_t start_wall_ms;
    int64_t start_mono_ns;
    uint64_t start_ticks;  // /proc/self/stat field 22, read once at install

    // Event JSON pieces serialized once at install.
    char session_record[8192];  // framed session record, rewritten if the file must be re-created
    size_t session_record_len;
    char lib_json[512];  // "lib":{...}
    size_t lib_json_len;
    char static_props[CC_STATIC_JSON_CAPACITY];  // properties members, no braces
    size_t static_props_len;

    struct sigaction previous[NSIG];
    bool replaced[NSIG];
    struct sigaction ours;

    // CRASHCAPTURE_FREEZE=signal at install: the other threads are asked by signal, never
    // frozen with ptrace (to compare the two, or where tracing the process is unwelcome).
    bool freeze_by_signal_only;
    bool no_stack_memory;  // CRASHCAPTURE_STACK_MEMORY=off: no stacks record
    uintptr_t main_stack_end;  // __libc_stack_end: the stacks record stops below it (argv, environment)
    // The process-wide owner of a crash (crashcapture_crash_owner of the first copy found).
    _Atomic pid_t *crash_owner;
    bool sdk_session;  // the session file holds the SDK's journal of events
    int thread_signal;  // the real-time signal that asks a thread for its context; 0: none free
    struct sigaction thread_signal_previous;

    cc_unw_init_local2_fn unw_init_local2;
    cc_unw_step_fn unw_step;
    cc_unw_get_reg_fn unw_get_reg;

    _Atomic(const char *) *swift_fatal_message;  // from swift_getFatalErrorMessageBuffer
    void (*previous_terminate)(void);
    void *(*set_terminate)(void (*)(void));
    void *(*cxa_current_exception_type)(void);
    _Atomic(const char *) exception_type_name;
    _Atomic(const char *) exception_what;  // what() of an uncaught std::exception

    cc_module_map *_Atomic module_map;
    cc_module_map *module_maps[2];

    // The C install's second half (install/deferred_install.c): enum cc_install_rest, a futex
    // word; and the word its thread sleeps on, which a crash, or a call that needs the files,
    // sets to wake it at once.
    _Atomic uint32_t install_rest;
    _Atomic uint32_t install_rest_wake;
    _Atomic pid_t install_rest_tid;  // the thread doing it while it runs
    _Atomic pid_t install_rest_thread;  // the thread made for it, until it has ended
    // At a crash, that thread when its work is done and it is on its way out: not one of the
    // program's threads, so the report neither lists nor freezes it.
    _Atomic pid_t install_rest_leaving;
    char executable_path[PATH_MAX];   // read at a crash that comes before the module list is made
    // The Swift runtime's task metadata (0: no Swift concurrency, or a layout we do not know)
    // and its swift_task_getCurrent, for the names of tasks (cc_find_swift_task_layout).
    _Atomic uintptr_t swift_task_metadata;
    uintptr_t (*swift_task_current)(void);
    // 1 while a thread reads the symbol table of a program that carries the Swift runtime
    // (install/static_swift_runtime.c), a futex word a crash waits on; and that thread.
    _Atomic uint32_t static_runtime_reading;
    _Atomic pid_t static_runtime_reader_tid;
} cc_state;

enum cc_install_rest {
    CC_REST_NONE = 0,       // nothing deferred (the Swift SDK's install does it all at once)
    CC_REST_PENDING = 1,    // its thread waits a few milliseconds before it starts
    CC_REST_RUNNING = 2,
    CC_REST_DONE = 3,
    CC_REST_CANCELLED = 4,  // the process ended (or a crash came) first: never done
    CC_REST_FOR_REPORT = 5,  // a crash came first: what its report needs is done, and no more will be
};

// What install_rest_wake holds: the thread sleeps while it is CC_REST_WAKE_NOT_YET.
enum cc_install_rest_wake {
    CC_REST_WAKE_NOT_YET = 0,
    CC_REST_WAKE_NOW = 1,        // the session ended, or the files are wanted at once
    CC_REST_WAKE_FOR_CRASH = 2,  // a crash waits: only what its report needs, nothing on disk
};

extern cc_state cc_global;

// signal_safe/crash_path.c: the async-signal-safe part. Also used at install for shared formatting.
// (cc_terminate_handler is in install/exception_message.c: it runs before abort, not in a handler.)
void cc_signal_handler(int signo, siginfo_t *info, void *context);
void cc_terminate_handler(void);
void cc_buf_append(cc_buf *b, const char *s, size_t n);
void cc_buf_append_str(cc_buf *b, const char *s);
void cc_buf_append_json_string(cc_buf *b, const char *s, size_t max_bytes);
void cc_buf_append_u64(cc_buf *b, uint64_t v);
void cc_buf_append_i64(cc_buf *b, int64_t v);
void cc_buf_append_thousandths(cc_buf *b, int64_t thousandths);
void cc_buf_append_hex(cc_buf *b, uint64_t v);
uint32_t cc_crc32(uint32_t crc, const void *data, size_t n);
void cc_crc32_prepare(void);
void cc_touch_pages(void *p, size_t n);
// Calls `visit` with each name the open directory lists, read with getdents64 into `buffer`
// (which the names point into): signal-safe. The descriptor's offset moves with it.
void cc_each_name(int directory, char *buffer, size_t size, void (*visit)(const char *name, void *context),
                  void *context);
void cc_crash_path_prepare(void);
void cc_process_state_prepare(void);
void cc_threads_prepare(void);
size_t cc_frame_record(char *out, size_t cap, uint32_t type, const char *payload, size_t len);
int cc_write_all(int fd, const void *data, size_t n);
// Whether fd still holds the file it was opened on (device and inode as recorded then).
bool cc_holds_file(int fd, dev_t dev, ino_t ino);
// Notes the device and inode fd holds, for cc_holds_file at a crash; false if fstat fails.
bool cc_note_file(int fd, dev_t *dev, ino_t *ino);
int64_t cc_monotonic_ns(void);
int64_t cc_wall_ms(void);
bool cc_read_build_id(uintptr_t load_bias, const void *phdrs, size_t phnum, char *hex_out, size_t hex_cap);

// install/modules.c
int cc_modules_capture(void);
void cc_find_swift_task_layout(void);

// install/static_swift_runtime.c: what a program linked with --static-swift-stdlib carries of
// the Swift runtime, from its own symbol table (all 0 for any other program).
typedef struct cc_static_swift_runtime {
    uintptr_t job_run_start, job_run_end;  // swift_job_run: a frame there runs a task
    uintptr_t task_get_current;            // swift_task_getCurrent
    uintptr_t fatal_message;               // the fatal error message buffer itself
    uintptr_t fatal_message_function;      // or swift_getFatalErrorMessageBuffer
} cc_static_swift_runtime;
// Reads the symbol table the first time (blocking); `known` never reads: all 0 until then.
const cc_static_swift_runtime *cc_static_swift_runtime_find(void);
const cc_static_swift_runtime *cc_static_swift_runtime_known(void);
bool cc_static_swift_runtime_read(void);

// signal_safe/session_file.c: async-signal-safe, it also runs in a forked child.
int cc_random_hex(char *out, size_t bytes);
int cc_open_session_file(bool named, const char **step);
int cc_name_session(const char **step);
int cc_create_crash_file(bool named, bool want_space, const char **step);
void cc_after_fork_in_child(void);

// signal_safe/termination_signal.c: the SIGTERM/SIGINT handler and the pipe it writes to.
extern int cc_termination_pipe[2];
void cc_termination_handler(int signo);

// journal/session_journal.c: the session file and the journal in it.
int cc_session_file_create(size_t journal_bytes, int lifecycle, bool sdk, const char **step);
// signal_safe/session_file.c: removes the files of the C sessions this process's images
// before an exec left behind.
void cc_retire_exec_predecessors(void);
void cc_session_file_detach_in_child(void);
void cc_session_file_close(bool remove);
bool cc_session_file_is_sdk(void);
// The session file's notes area (context, breadcrumbs), or NULL when there is none.
char *cc_session_notes(void);
// How long each step of the last install took, for `crash-sample-c measure-install` and the
// crash benchmark, which report the install target's figure step by step.
enum {
    CC_STEP_CONFIGURATION,
    CC_STEP_DIRECTORY,
    CC_STEP_CRASH_PATH,
    CC_STEP_BOUND,
    CC_STEP_CRASH_FILE,
    CC_STEP_SESSION_FILE,
    CC_STEP_MODULES,
    CC_STEP_LIBUNWIND_LOAD,
    CC_STEP_LIBUNWIND_FIRST_STEP,
    CC_STEP_KEPT_FILES,
    CC_STEP_RUNTIMES,
    CC_STEP_SIGNALS,
    CC_STEP_REST_THREAD,  // a C install: starting the thread that does the rest
    CC_STEP_COUNT
};
void cc_step_done(int step);
// libunwind and the Swift and C++ runtimes' hooks (install/runtimes.c).
void cc_load_libunwind(void);
void cc_hook_runtimes(void);
void cc_hook_static_fatal_message(void);
void cc_unhook_runtimes(void);
// install_support.c: the last error's text (cc_fail sets it), the step timings' start, the
// session's mark of life (session_journal.c) without finishing the install's rest.
const char *cc_last_error_text(void);
void cc_steps_begin(void);
void cc_session_mark_alive(void);
// session_notes.c's work behind the public calls (install.c finishes the install's rest first).
int cc_notes_set_context_json(const char *key, const char *value_json);
int cc_notes_set_context(const char *key, const char *value);
int cc_notes_add_breadcrumb(const char *message);
// The file-size limit: the bytes a file may reach, UINT64_MAX for no limit
// (signal_safe/file_limit.c); SIGXFSZ held off on this thread around our writes, one they
// raised taken before the release (install/file_limit_hold.c, not for the crash path).
typedef struct cc_file_limit_hold_t {
    sigset_t previous;
    bool active;
    bool was_pending;
} cc_file_limit_hold_t;
uint64_t cc_file_size_allowed(void);
void cc_file_limit_hold(cc_file_limit_hold_t *hold);
void cc_file_limit_release(cc_file_limit_hold_t *hold);
// The static properties and the `lib` object, from the configuration (0), or -1 with the error set.
int cc_build_static_json(const crashcapture_config *config);
// A property key by the Sensors rules (0), or -1 with the error set; UTF-8 validity.
int cc_check_key(const char *key);
bool cc_valid_utf8(const char *s);
// Whether JSON object members (no braces, flat values) name `key`.
bool cc_members_have_key(const char *members, size_t length, const char *key);
// The session's journal, its ring made in the session file on first use for a session made
// without one (the C API's): NULL when there is no session or no room.
struct crashcapture_journal *cc_session_journal_for_events(void);
// Sets crashcapture_last_error() from a printf format; returns -1.
int cc_fail(const char *format, ...) __attribute__((format(printf, 1, 2)));
uint32_t cc_journal_crc32c(uint32_t crc, const void *data, size_t n);
// Writes the context set so far into a new session file's notes.
void cc_notes_session_created(void);

// signal_safe/thread_capture.c: the other threads' contexts, at crash time.
enum {
    CC_SLOT_ASKED = 1,     // being frozen, its context not taken yet
    CC_SLOT_CAPTURED = 2,  // its context is in the slot and it is held still
    CC_SLOT_MISSED = 3,    // not captured: `why` says why
};
enum cc_freeze_method { CC_FROZEN_BY_NONE, CC_FROZEN_BY_PTRACE, CC_FROZEN_BY_SIGNAL };
typedef struct cc_thread_slot {
    pid_t tid;
    _Atomic int state;
    char name[16];
    char run_state;   // from /proc/self/task/<tid>/stat: R, S, D, T, ...
    // Frozen by our helper: 1 if its registers show it inside a system call, 0 if not, -1 unknown.
    // Its stat, read while the helper works, may already say 't' (our ptrace stop).
    signed char in_system_call;
    // From the same registers: the system call it is in (-1: none or unknown), and its thread
    // pointer (fs_base on x86_64), which is what pthread_self() returns in that thread.
    long syscall_number;
    uintptr_t thread_pointer;
    // A hang report's: the thread holding the lock this one waits for (0: none seen), and the lock.
    pid_t waits_for;
    uintptr_t waits_on_lock;
    const char *why;  // when not captured
    bool unwind_faulted;
    bool unwound;
    volatile size_t frame_count;
    ucontext_t context;
    uintptr_t frames[CC_THREAD_FRAMES];
    // Its task's [async] callers, when it runs one (cc_walk_async_chain), and the task's name.
    char task_name[64];
    volatile size_t async_frame_count;
    volatile uintptr_t async_owner;
    uintptr_t async_frames[CC_THREAD_ASYNC_FRAMES];
} cc_thread_slot;
void cc_thread_capture_handler(int signo, siginfo_t *info, void *context);
void cc_threads_note_waiting_crasher(pid_t tid);
bool cc_thread_crashed_too(pid_t tid);
// `for_hang`: ptrace only, never a signal (the process goes on), and waits that a stop ended
// with EINTR are made to run again when the threads are let go.
int cc_threads_ask(pid_t crashing, int64_t deadline_ns, bool for_hang);
// Waits for the answers until the deadline given to cc_threads_ask, calling `meanwhile` before
// each wait (it returns whether it did anything; if so, the answers are counted again first).
void cc_threads_await(bool (*meanwhile)(void));
int cc_threads_total_count(void);
// Names the listed threads not named yet (a hang's, after they were let go).
void cc_threads_name(void);
cc_thread_slot *cc_thread_slot_at(int index);
bool cc_thread_captured(const cc_thread_slot *slot);
int cc_threads_freeze_method(void);
char cc_thread_state(const cc_thread_slot *slot);
const char *cc_threads_freeze_note(void);
void cc_threads_release(void);
void cc_threads_release_held(void);

// signal_safe/thread_freeze.c: the ptrace helper. `cc_freeze_start` starts it on the listed
// slots (-1 with `why` if it cannot be started); the caller may work meanwhile, then
// `cc_freeze_confirm` says whether ptrace proved allowed: 0, and the slots are answered as by
// the signal method, through `answers`; -1 with `why`, and nothing was touched.
void cc_freeze_prepare(void);
int cc_freeze_start(cc_thread_slot *slots, int count, _Atomic uint32_t *answers, bool for_hang, const char **why);
int cc_freeze_confirm(const char **why);
void cc_freeze_release(void);
// A hang's freeze: the thread in slot `index` may go on now (its stack is taken).
void cc_freeze_let_go(int index);
// The longest any thread of the last freeze was held, from its interrupt to its detach, in ns.
int64_t cc_freeze_longest_hold_ns(void);

// signal_safe/process_state.c
void cc_append_process_state(cc_buf *b, int thread_count);
// Reads the process-state files kept open since install, then closes every reserved descriptor.
void cc_process_state_read_kept(void);
// Install and the forked child: (re)opens the kept process-state files; /proc/self ones name
// the process that opened them.
void cc_process_state_keep_files(void);
void cc_append_memory(cc_buf *b, uintptr_t sp, uintptr_t pc, uintptr_t fault, bool has_fault);

// install/exception_message.c: an uncaught std::exception's what(), in the terminate handler.
void cc_exception_message_prepare(void);
void cc_exception_message_capture(const void *thrown_type);

// signal_safe/hang_report.c: a hang's report, for the watchdog (install/watchdog.c).
#define CC_MAX_HANG_REPORTS 32  // per process: a watch that keeps missing fills no disk
typedef struct crashcapture_hang_request {
    const char *watch_name;
    int64_t threshold_ms;
    int64_t stalled_ms;
    uintptr_t watched_thread;  // pthread_self() of the thread that last beat the watch; 0: unknown
} crashcapture_hang_request;
typedef struct crashcapture_hang_result {
    char file_name[128];
    uint32_t sequence;  // the n of its hang id, `<session>-hang-<n>`
    pid_t hung_tid;     // the watched thread, found among the frozen ones; 0: not found
    bool deadlock;
    int64_t threads_held_ns;
    int64_t total_ns;  // from the call to the report durable
} crashcapture_hang_result;
// 0, or an errno value: ENODEV not installed, EBUSY a crash is being reported, ENOSPC the
// directory is at its bound, EDQUOT this process wrote CC_MAX_HANG_REPORTS already, EFBIG the
// file-size limit, or what writing the file met.
int cc_capture_hang(const crashcapture_hang_request *request, crashcapture_hang_result *result);
int cc_write_hang_end(const char *watch_name, uint32_t sequence, int64_t duration_ms, char *name_out,
                      size_t name_cap);

// install/deferred_install.c: the rest of a C install, done off the caller's thread.
int cc_install_rest_start(void);
void cc_install_rest_finish(void);  // done now on the calling thread if still to do; never from the crash path
void cc_install_rest_cancel(void);  // at the end of a session: never done, or waited for
void cc_install_rest_prepare_fork(void);
void cc_install_rest_after_fork(bool child);
const char *cc_install_rest_problem(void);  // why the files could not be made, or NULL
// install/install.c, for the rest
bool cc_directory_is_over_bound(int dir_fd);
void cc_detect_container(void);
void cc_install_thread_signal(void);
bool cc_fsync_covers_new_name(int dir_fd);
// signal_safe/crash_path.c: at a crash, wakes the rest and waits for it, at most `bound_ns`.
void cc_install_rest_at_crash(int64_t bound_ns);

// install/watchdog.c
void cc_watchdog_stop(void);
void cc_watchdog_after_fork_in_child(void);

// install/threads.c
void cc_threads_enable(bool enabled);
int cc_create_own_thread(pthread_t *thread, const pthread_attr_t *attr, void *(*routine)(void *), void *argument);

#endif
