// What the files of the crash path share, from the bottom up: encoding.c, stack_walk.c,
// report_events.c, report_file.c, then crash_path.c, which runs the stages. A file calls only
// the files before it (thread_capture.c, thread_freeze.c and process_state.c sit beside
// stack_walk.c, on encoding.c alone).
#ifndef CC_CRASH_REPORT_H
#define CC_CRASH_REPORT_H

#include <signal.h>
#include <stdatomic.h>
#include <ucontext.h>

#include "cc_internal.h"

// MARK: encoding.c

void cc_buf_append_char(cc_buf *b, char c);
void cc_buf_append_quoted_hex(cc_buf *b, uint64_t v);
void cc_buf_append_json_escaped(cc_buf *b, const char *s, size_t max_bytes);
// Writes the 16-byte header in front of a payload that already sits at out + 16.
void cc_frame_in_place(char *out, uint32_t type, size_t len);

// MARK: stack_walk.c

typedef struct cc_registers {
    uintptr_t pc, sp, fp;
} cc_registers;

// Modules the loader gained after the last refresh, found through _r_debug at crash time.
#define CC_MAX_LATE_MODULES 64
typedef struct cc_late_module {
    cc_module range;
    const char *path;
    char build_id[65];
} cc_late_module;

// What the crashing thread found and how long each part took, filled by the stages and read
// when the report is built and written. Only the reporting thread writes it.
typedef struct cc_findings {
    uintptr_t frames[CC_MAX_FRAMES];
    volatile size_t frame_count;
    // The crashing thread's logical [async] callers, when it runs a Swift async task: the
    // resume functions along its async context chain (cc_walk_async_chain).
    uintptr_t async_frames[CC_MAX_ASYNC_FRAMES];
    volatile size_t async_frame_count;
    volatile uintptr_t async_owner;  // a pc in the function whose frame held the first context
    char task_name[128];             // the task's name, when it was given one (Task(name:))
    volatile int used_libunwind;
    cc_late_module late_modules[CC_MAX_LATE_MODULES];
    volatile size_t late_module_count;
    char thread_name[32];
    char swift_message[4096];
    char exception_type[512];
    char exception_what[1024];
    int crash_signal, crash_code;
    _Atomic int report_written;
    // 1: linked in the directory; 2: kept in the session file; 3: noted in its header (the
    // directory at its bound); 4: noted there (no room for a report under the file-size limit).
    _Atomic int report_named;
    int report_trimmed;        // the whole report found no room: built again to fit the space there was
    int64_t other_threads_ns;  // listing, freezing, waiting for and unwinding the other threads
    int64_t threads_asked_ns;  // of which listing them and starting their freeze
    // Where the rest of the handler's own work goes, for the timing record: reading the kept
    // process-state files, unwinding the crashing thread, building the two events.
    int64_t kept_files_ns, unwind_ns, events_ns;
    // Copying every thread's stack memory into the stacks record, and the record's size.
    int64_t stacks_ns;
    int64_t stacks_write_ns;  // the stacks record's write, after the report is durable
    size_t stacks_bytes;
} cc_findings;
extern cc_findings cc_found;

cc_registers cc_registers_from(const ucontext_t *uc);
void cc_append_registers(cc_buf *b, const ucontext_t *uc);
bool cc_in_any_module(uintptr_t pc);
// Index of the module holding pc in the combined list (install-time map, then late ones).
long cc_find_module(const cc_module_map *map, uintptr_t pc, uintptr_t *bias);
void cc_scan_late_modules(const cc_module_map *map);
void cc_check_libunwind_pipe(void);
void cc_walk(ucontext_t *uc, uintptr_t *frames, size_t max, volatile size_t *count, volatile int *used_libunwind);
void cc_recover_bad_call(const ucontext_t *uc);

// Follows a Swift async task's context chain, from the first frame (of the stack that pc, fp
// and sp describe) whose word below its record leads to one: each context's resume function,
// innermost first, into `frames`, and a pc of the function that held it into `owner`.
void cc_walk_async_chain(uintptr_t pc, uintptr_t fp, uintptr_t sp, uintptr_t *frames, size_t max,
                         volatile size_t *count, volatile uintptr_t *owner);

// The running Swift task a stopped thread's stack points to (0: none found), and a task's name
// (Task(name:)) into out; both read our memory without risking a fault.
uintptr_t cc_task_on_stack(uintptr_t sp);
bool cc_task_name(uintptr_t task, char *out, size_t cap);

// MARK: report_events.c

enum cc_stage {
    CC_STAGE_UNWIND = 0,
    CC_STAGE_LATE_MODULES,
    CC_STAGE_TEXTS,
    CC_STAGE_THREADS,
    CC_STAGE_COUNT,
};
extern const char *const cc_stage_names[CC_STAGE_COUNT];

typedef struct cc_crash {
    int signo;
    const siginfo_t *info;
    const ucontext_t *uc;
    const cc_module_map *map;
    pid_t pid, tid;
    int64_t time_ms;
    int64_t entry_ns;
    unsigned faulted_stages;
} cc_crash;

const char *cc_signal_name(int signo);
void cc_append_module_name(cc_buf *b, const cc_crash *c, long index);
size_t cc_build_crashed_event(char *out, size_t cap, const cc_crash *c);
// Used when the full event did not fit: signal facts only, never nothing.
size_t cc_build_minimal_event(char *out, size_t cap, const cc_crash *c);
size_t cc_build_end_event(char *out, size_t cap, const cc_crash *c);
// The pieces a hang report shares with a crash's: an event's head up to its properties' own
// members (`{"type":..,"properties":{<static>,"$pid":..,"$lib_method":..`), the modules, the
// other threads and how they were held.
void cc_append_event_head(cc_buf *b, const char *event, const char *id_suffix, int64_t time_ms);
void cc_append_modules(cc_buf *b, const cc_module_map *map, size_t limit);
void cc_append_other_threads(cc_buf *b, size_t limit, pid_t hung_tid, int *listed, int *left_out);
void cc_append_threads_summary(cc_buf *b, int listed, int left_out);
size_t cc_build_timing(char *out, size_t cap, int64_t handler_ns, int64_t write_ns, int64_t sync_ns,
                       int64_t publish_ns, int sync_ok, bool named_before_sync, bool directory_flushed);

// MARK: stack_memory.c

// The stacks record (CCF_RECORD_STACKS), framed, into out: the crashing thread's registers and
// stack, then every captured thread's, `bound` bytes of stack memory at most in all. Its size,
// or 0 when nothing fits.
size_t cc_build_stacks(char *out, size_t cap, const cc_crash *c, size_t bound);

// MARK: process_state.c, attachments.c

void cc_append_base64(cc_buf *b, const unsigned char *data, size_t n);
// The tails of the files crashcapture_attach_file named, read now, base64: stops short of
// `limit` bytes of report.
void cc_append_attachments(cc_buf *b, size_t limit);

// MARK: report_file.c

// Writes the framed records `out[0, total)` where they belong, makes them durable, and appends
// the timing record; nothing past `allowed` bytes of file. `after` (the stacks record, or NULL)
// is written once the records are durable, before the timing record, and is not flushed itself:
// the report does not wait for it.
// 0 once the report is written (or given up, its named file removed). CC_WRITE_MAY_RETRY: a
// write that found no room (ENOSPC, EDQUOT, or past the file-size limit) returns its errno
// instead and leaves the file for a smaller report, which CC_WRITE_SMALLER_AGAIN writes.
typedef enum { CC_WRITE_ONCE, CC_WRITE_MAY_RETRY, CC_WRITE_SMALLER_AGAIN } cc_write_attempt;
int cc_write_report(char *out, size_t total, size_t cap, int64_t entry_ns, uint64_t allowed, cc_write_attempt attempt,
                    const char *after, size_t after_len);
void cc_write_crash_line(const cc_crash *c);

// MARK: crash_path.c, for hang_report.c

// 0, or EBUSY when a crash is being reported or another snapshot is under way.
int cc_hang_snapshot_begin(pid_t self);
// Freezes, unwinds and lets go of every other thread, each as soon as its stack is taken (see
// crash_path.c); gives the report buffer to build into. The longest any thread was held, in ns.
int64_t cc_hang_snapshot_threads(pid_t self, void (*while_held)(cc_thread_slot *slot), char **record,
                                 size_t *record_cap);
void cc_hang_snapshot_end(void);

#endif
