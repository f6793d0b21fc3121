// The report's events, built into a buffer: $AppCrashed with the crash's facts, its stack,
// the modules, the process's state and every thread; the minimal event when that does not fit;
// the compensating $AppEnd; the timing record.
// The rules of crash_path.c apply here: this runs after a fatal signal (signal-safety(7)),
// allocates nothing, takes no lock, and calls nothing above it in the crash path.
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#include "cc_internal.h"
#include "crash_report.h"

// MARK: - Names

const char *cc_signal_name(int signo) {
    const char *name = ccf_signal_name(signo);
    return name != NULL ? name : "SIGNAL";
}

// MARK: - The events

const char *const cc_stage_names[CC_STAGE_COUNT] = {"unwind", "late_modules", "texts", "threads"};

static const char *cc_basename(const char *path) {
    const char *base = path;
    for (const char *p = path; *p != '\0'; p++)
        if (*p == '/') base = p + 1;
    return base;
}

static const char *cc_module_path(const cc_crash *c, long index, const char *fallback) {
    size_t base = c->map != NULL ? c->map->count : 0;
    if (index >= 0 && (size_t)index >= base) return cc_found.late_modules[(size_t)index - base].path;
    return fallback;
}

void cc_append_event_head(cc_buf *b, const char *event, const char *id_suffix, int64_t time_ms) {
    cc_buf_append_str(b, "{\"type\":\"track\",\"event\":\"");
    cc_buf_append_str(b, event);
    cc_buf_append_str(b, "\",\"time\":");
    cc_buf_append_i64(b, time_ms);
    cc_buf_append_str(b, ",\"distinct_id\":");
    const char *distinct_id = atomic_load_explicit(&cc_global.current_distinct_id, memory_order_acquire);
    cc_buf_append_json_string(b, distinct_id != NULL ? distinct_id : cc_global.distinct_id, sizeof(cc_global.distinct_id));
    if (atomic_load_explicit(&cc_global.logged_in, memory_order_relaxed)) {
        cc_buf_append_str(b, ",\"login_id\":");
        cc_buf_append_json_string(b, distinct_id != NULL ? distinct_id : cc_global.distinct_id,
                                  sizeof(cc_global.distinct_id));
    }
    cc_buf_append_str(b, ",\"event_id\":\"");
    cc_buf_append_str(b, cc_global.session_id);
    cc_buf_append_str(b, id_suffix);
    cc_buf_append_str(b, "\",\"session_id\":\"");
    cc_buf_append_str(b, cc_global.session_id);
    cc_buf_append_str(b, "\",");
    cc_buf_append(b, cc_global.lib_json, cc_global.lib_json_len);
    cc_buf_append_str(b, ",\"properties\":{");
    cc_buf_append(b, cc_global.static_props, cc_global.static_props_len);
    if (cc_global.static_props_len > 0) cc_buf_append_str(b, ",");
    cc_buf_append_str(b, "\"$pid\":");
    cc_buf_append_i64(b, (int64_t)getpid());
    cc_buf_append_str(b, ",\"$lib_method\":\"autoTrack\"");
}

// Module names for the readable text come from the install-time JSON: find the n-th
// "path" value without parsing the whole thing.
void cc_append_module_name(cc_buf *b, const cc_crash *c, long index) {
    if (index < 0) {
        cc_buf_append_str(b, "???");
        return;
    }
    const char *late = cc_module_path(c, index, NULL);
    if (late != NULL) {
        cc_buf_append_json_escaped(b, cc_basename(late), 256);
        return;
    }
    const char *json = c->map->json;
    size_t len = c->map->json_len;
    long seen = -1;
    for (size_t i = 0; i + 8 < len; i++) {
        if (memcmp(json + i, "{\"path\":\"", 9) != 0) continue;
        if (++seen != index) continue;
        size_t start = i + 9, end = start, base = start;
        while (end < len && !(json[end] == '"' && json[end - 1] != '\\')) {
            if (json[end] == '/') base = end + 1;
            end++;
        }
        cc_buf_append(b, json + base, end - base);
        return;
    }
    cc_buf_append_str(b, "???");
}

static void cc_append_reason(cc_buf *b, const cc_crash *c) {
    const siginfo_t *info = c->info;
    cc_buf_append_str(b, "\"app_crashed_reason\":\"");
    size_t start = b->len;
    cc_buf_append_str(b, cc_signal_name(c->signo));
    cc_buf_append_str(b, " (");
    cc_buf_append_str(b, ccf_code_name(c->signo, info->si_code));
    cc_buf_append_str(b, ")");
    // A sent signal (kill, sigqueue, tgkill: si_code <= 0) has no address: the union's field
    // holds the sender's pid and uid instead.
    bool fault = info->si_code > 0;
    if (fault && (c->signo == SIGSEGV || c->signo == SIGBUS || c->signo == SIGILL || c->signo == SIGFPE)) {
        cc_buf_append_str(b, " at ");
        cc_buf_append_hex(b, (uintptr_t)info->si_addr);
    }
    if (!fault) {
        cc_buf_append_str(b, " sent by pid ");
        cc_buf_append_i64(b, info->si_pid);
        cc_buf_append_str(b, " (uid ");
        cc_buf_append_u64(b, info->si_uid);
        cc_buf_append_str(b, ")");
    }
    cc_buf_append_str(b, "\\nthread ");
    cc_buf_append_i64(b, c->tid);
    cc_buf_append_str(b, " \\\"");
    cc_buf_append_json_escaped(b, cc_found.thread_name, sizeof(cc_found.thread_name));
    cc_buf_append_str(b, "\\\"");
    if (c->tid == c->pid) cc_buf_append_str(b, " (main)");
    if (cc_found.swift_message[0] != '\0') {
        cc_buf_append_str(b, "\\n");
        cc_buf_append_json_escaped(b, cc_found.swift_message, 2048);
    }
    if (cc_found.exception_type[0] != '\0') {
        cc_buf_append_str(b, "\\nuncaught C++ exception of type ");
        cc_buf_append_json_escaped(b, cc_found.exception_type, 256);
        if (cc_found.exception_what[0] != '\0') {
            cc_buf_append_str(b, ": ");
            cc_buf_append_json_escaped(b, cc_found.exception_what, 1024);
        }
    }
    for (size_t i = 0; i < cc_found.frame_count && i < 32 && b->len - start < 12 * 1024; i++) {
        uintptr_t bias = 0;
        long index = cc_find_module(c->map, cc_found.frames[i], &bias);
        cc_buf_append_str(b, "\\n#");
        cc_buf_append_u64(b, i);
        cc_buf_append_str(b, " ");
        cc_buf_append_hex(b, cc_found.frames[i]);
        cc_buf_append_str(b, " ");
        cc_append_module_name(b, c, index);
        if (index >= 0) {
            cc_buf_append_str(b, " +");
            cc_buf_append_hex(b, cc_found.frames[i] - bias);
        }
    }
    cc_buf_append_str(b, "\"");
}

static void cc_append_crash_properties(cc_buf *b, const cc_crash *c) {
    const siginfo_t *info = c->info;
    cc_buf_append_str(b, ",\"crash_signal\":");
    cc_buf_append_i64(b, c->signo);
    cc_buf_append_str(b, ",\"crash_signal_name\":\"");
    cc_buf_append_str(b, cc_signal_name(c->signo));
    cc_buf_append_str(b, "\",\"crash_code\":");
    cc_buf_append_i64(b, info->si_code);
    cc_buf_append_str(b, ",\"crash_code_name\":\"");
    cc_buf_append_str(b, ccf_code_name(c->signo, info->si_code));
    cc_buf_append_str(b, "\"");
    // Only a fault has an address; a sent signal names its sender (below).
    if (info->si_code > 0) {
        cc_buf_append_str(b, ",\"crash_fault_address\":");
        cc_buf_append_quoted_hex(b, (uintptr_t)info->si_addr);
    }
    if (c->signo == SIGSYS && info->si_code > 0) {
        // The system call the filter refused, by number, and the audit architecture it was
        // made under (a 32-bit call from a 64-bit process has numbers of its own).
        cc_buf_append_str(b, ",\"crash_syscall\":");
        cc_buf_append_i64(b, info->si_syscall);
        cc_buf_append_str(b, ",\"crash_syscall_arch\":");
        cc_buf_append_quoted_hex(b, info->si_arch);
    }
    if (info->si_code <= 0) {
        cc_buf_append_str(b, ",\"crash_sender_pid\":");
        cc_buf_append_i64(b, info->si_pid);
        cc_buf_append_str(b, ",\"crash_sender_uid\":");
        cc_buf_append_u64(b, info->si_uid);
        if (info->si_code == SI_QUEUE) {
            cc_buf_append_str(b, ",\"crash_signal_value\":");
            cc_buf_append_i64(b, info->si_value.sival_int);
        }
    }
    cc_buf_append_str(b, ",\"crash_tid\":");
    cc_buf_append_i64(b, c->tid);
    cc_buf_append_str(b, ",\"crash_thread_name\":");
    cc_buf_append_json_string(b, cc_found.thread_name, sizeof(cc_found.thread_name));
    cc_buf_append_str(b, ",\"crash_main_thread\":");
    cc_buf_append_str(b, c->tid == c->pid ? "true" : "false");
    if (cc_found.swift_message[0] != '\0') {
        cc_buf_append_str(b, ",\"crash_swift_message\":");
        cc_buf_append_json_string(b, cc_found.swift_message, sizeof(cc_found.swift_message));
    }
    if (cc_found.exception_type[0] != '\0') {
        cc_buf_append_str(b, ",\"crash_exception_type\":");
        cc_buf_append_json_string(b, cc_found.exception_type, sizeof(cc_found.exception_type));
    }
    if (cc_found.exception_what[0] != '\0') {
        cc_buf_append_str(b, ",\"crash_exception_what\":");
        cc_buf_append_json_string(b, cc_found.exception_what, sizeof(cc_found.exception_what));
    }
    cc_buf_append_str(b, ",\"crash_unwinder\":\"");
    cc_buf_append_str(b, cc_found.used_libunwind ? "libunwind" : "frame-pointer");
    cc_buf_append_str(b, "\",\"crash_handler_faults\":[");
    bool first = true;
    for (int s = 0; s < CC_STAGE_COUNT; s++) {
        if (!(c->faulted_stages & (1u << s))) continue;
        if (!first) cc_buf_append_str(b, ",");
        first = false;
        cc_buf_append_str(b, "\"");
        cc_buf_append_str(b, cc_stage_names[s]);
        cc_buf_append_str(b, "\"");
    }
    cc_buf_append_str(b, "],\"crash_handler_ms\":");
    cc_buf_append_thousandths(b, (cc_monotonic_ns() - c->entry_ns) / 1000);
}

static void cc_append_state(cc_buf *b, char state) {
    cc_buf_append_str(b, ",\"state\":");
    char text[2] = {state, '\0'};
    cc_buf_append_json_string(b, text, 2);
}

// Each other thread, as its slot holds it; past `limit` the rest are only counted. A hang
// report marks the watched thread (`hung_tid`) and what each thread waits for.
void cc_append_other_threads(cc_buf *b, size_t limit, pid_t hung_tid, int *listed, int *left_out) {
    for (int i = 0; cc_thread_slot_at(i) != NULL; i++) {
        const cc_thread_slot *slot = cc_thread_slot_at(i);
        // A thread of the largest kind takes about 3.5 KiB; past the limit the rest are counted.
        if (b->len + 4096 > limit) {
            (*left_out)++;
            continue;
        }
        (*listed)++;
        if (*listed > 1) cc_buf_append_str(b, ",");
        cc_buf_append_str(b, "{\"tid\":");
        cc_buf_append_i64(b, slot->tid);
        cc_buf_append_str(b, ",\"name\":");
        cc_buf_append_json_string(b, slot->name, sizeof(slot->name));
        cc_append_state(b, cc_thread_state(slot));
        if (hung_tid != 0 && slot->tid == hung_tid) cc_buf_append_str(b, ",\"hung\":true");
        if (cc_thread_crashed_too(slot->tid)) cc_buf_append_str(b, ",\"crashed_too\":true");
        if (slot->waits_for != 0) {
            cc_buf_append_str(b, ",\"waits_for\":");
            cc_buf_append_i64(b, slot->waits_for);
            cc_buf_append_str(b, ",\"waits_on_lock\":");
            cc_buf_append_quoted_hex(b, slot->waits_on_lock);
        }
        if (!cc_thread_captured(slot)) {
            cc_buf_append_str(b, ",\"captured\":false,\"why\":");
            cc_buf_append_json_string(b, slot->why != NULL ? slot->why : "unknown", 128);
            cc_buf_append_str(b, "}");
            continue;
        }
        cc_buf_append_str(b, ",\"captured\":true,\"registers\":");
        cc_append_registers(b, &slot->context);
        cc_buf_append_str(b, ",\"frames\":[");
        for (size_t f = 0; f < slot->frame_count; f++) {
            if (f > 0) cc_buf_append_str(b, ",");
            cc_buf_append_quoted_hex(b, slot->frames[f]);
        }
        cc_buf_append_str(b, "]");
        if (slot->task_name[0] != '\0') {
            cc_buf_append_str(b, ",\"task_name\":");
            cc_buf_append_json_string(b, slot->task_name, sizeof(slot->task_name));
        }
        if (slot->async_frame_count > 0) {
            cc_buf_append_str(b, ",\"async_owner\":");
            cc_buf_append_quoted_hex(b, slot->async_owner);
            cc_buf_append_str(b, ",\"async_frames\":[");
            for (size_t f = 0; f < slot->async_frame_count; f++) {
                if (f > 0) cc_buf_append_str(b, ",");
                cc_buf_append_quoted_hex(b, slot->async_frames[f]);
            }
            cc_buf_append_str(b, "]");
        }
        if (slot->unwind_faulted) cc_buf_append_str(b, ",\"unwind_faulted\":true");
        if (slot->frame_count == CC_THREAD_FRAMES) cc_buf_append_str(b, ",\"frames_truncated\":true");
        cc_buf_append_str(b, "}");
    }
}

// After the threads' array: how they were held, and how many there were.
void cc_append_threads_summary(cc_buf *b, int listed, int left_out) {
    int total = cc_threads_total_count();
    int method = cc_threads_freeze_method();
    cc_buf_append_str(b, ",\"threads_frozen_by\":\"");
    cc_buf_append_str(b, method == CC_FROZEN_BY_PTRACE ? "ptrace" : method == CC_FROZEN_BY_SIGNAL ? "signal" : "none");
    cc_buf_append_str(b, "\"");
    const char *note = cc_threads_freeze_note();
    if (note != NULL) {
        cc_buf_append_str(b, ",\"threads_freeze_note\":");
        cc_buf_append_json_string(b, note, 256);
    }
    cc_buf_append_str(b, ",\"threads_total\":");
    cc_buf_append_i64(b, total > listed + left_out ? total : listed + left_out);
    cc_buf_append_str(b, ",\"threads_listed\":");
    cc_buf_append_i64(b, listed);
    if (cc_found.report_trimmed) cc_buf_append_str(b, ",\"threads_trimmed_to_fit\":true");
}

// Every thread, the crashing one first (its frames are the report's own). After the modules,
// so that a report too large for the record loses threads (counted), never the modules.
static void cc_append_threads(cc_buf *b, const cc_crash *c, size_t limit) {
    cc_buf_append_str(b, ",\"threads\":[{\"tid\":");
    cc_buf_append_i64(b, c->tid);
    cc_buf_append_str(b, ",\"name\":");
    cc_buf_append_json_string(b, cc_found.thread_name, sizeof(cc_found.thread_name));
    cc_buf_append_str(b, ",\"state\":\"R\",\"crashed\":true}");
    int listed = 1, left_out = 0;
    cc_append_other_threads(b, limit, 0, &listed, &left_out);
    cc_buf_append_str(b, "]");
    cc_append_threads_summary(b, listed, left_out);
}

// One frame: its address, and the module holding it with the offset there when one does.
static void cc_append_frame(cc_buf *b, const cc_crash *c, uintptr_t pc) {
    uintptr_t bias = 0;
    long index = cc_find_module(c->map, pc, &bias);
    cc_buf_append_str(b, "{\"pc\":");
    cc_buf_append_quoted_hex(b, pc);
    if (index >= 0) {
        cc_buf_append_str(b, ",\"module\":");
        cc_buf_append_i64(b, index);
        cc_buf_append_str(b, ",\"offset\":");
        cc_buf_append_quoted_hex(b, pc - bias);
    }
    cc_buf_append_str(b, "}");
}

// The modules: those listed at install, then those the crash found loaded since.
void cc_append_modules(cc_buf *b, const cc_module_map *map, size_t limit) {
    cc_buf_append_str(b, "\"modules\":[");
    if (map != NULL && b->len + map->json_len < limit) cc_buf_append(b, map->json, map->json_len);
    for (size_t i = 0; i < cc_found.late_module_count && b->len < limit; i++) {
        const cc_late_module *m = &cc_found.late_modules[i];
        if (b->len > 0 && b->data[b->len - 1] != '[') cc_buf_append_str(b, ",");
        cc_buf_append_str(b, "{\"path\":");
        cc_buf_append_json_string(b, m->path != NULL ? m->path : "", 4096);
        cc_buf_append_str(b, ",\"load_bias\":");
        cc_buf_append_quoted_hex(b, m->range.load_bias);
        cc_buf_append_str(b, ",\"start\":");
        cc_buf_append_quoted_hex(b, m->range.start);
        cc_buf_append_str(b, ",\"end\":");
        cc_buf_append_quoted_hex(b, m->range.end);
        cc_buf_append_str(b, ",\"build_id\":\"");
        cc_buf_append_str(b, m->build_id);
        cc_buf_append_str(b, "\",\"loaded_after_install\":true}");
    }
    cc_buf_append_str(b, "]");
}

static void cc_append_crash_details(cc_buf *b, const cc_crash *c) {
    // Leave room to close the JSON whatever happens: frames and modules stop early instead.
    size_t limit = b->cap > 4096 ? b->cap - 4096 : 0;
    cc_buf_append_str(b, ",\"crash\":{\"registers\":");
    cc_append_registers(b, c->uc);
    cc_buf_append_str(b, ",\"frames\":[");
    size_t written = 0;
    for (; written < cc_found.frame_count && b->len < limit; written++) {
        if (written > 0) cc_buf_append_str(b, ",");
        cc_append_frame(b, c, cc_found.frames[written]);
    }
    cc_buf_append_str(b, "],\"frames_truncated\":");
    cc_buf_append_str(b, written < cc_found.frame_count || cc_found.frame_count == CC_MAX_FRAMES ? "true" : "false");
    if (cc_found.task_name[0] != '\0') {
        cc_buf_append_str(b, ",\"task_name\":");
        cc_buf_append_json_string(b, cc_found.task_name, sizeof(cc_found.task_name));
    }
    if (cc_found.async_frame_count > 0) {
        cc_buf_append_str(b, ",\"async_owner\":");
        cc_append_frame(b, c, cc_found.async_owner);
        cc_buf_append_str(b, ",\"async_frames\":[");
        for (size_t i = 0; i < cc_found.async_frame_count && b->len < limit; i++) {
            if (i > 0) cc_buf_append_str(b, ",");
            cc_append_frame(b, c, cc_found.async_frames[i]);
        }
        cc_buf_append_str(b, "]");
    }
    cc_buf_append_str(b, ",");
    cc_append_modules(b, c->map, limit);
    cc_registers r = cc_registers_from(c->uc);
    // A fault address means something only for faults the hardware raised.
    bool has_fault = c->info->si_code > 0 && (c->signo == SIGSEGV || c->signo == SIGBUS);
    cc_append_memory(b, r.sp, r.pc, (uintptr_t)c->info->si_addr, has_fault);
    cc_append_attachments(b, limit);
    cc_append_process_state(b, cc_threads_total_count());
    cc_append_threads(b, c, limit);
    cc_buf_append_str(b, "}");
}

size_t cc_build_crashed_event(char *out, size_t cap, const cc_crash *c) {
    cc_buf b = {out, 0, cap, false};
    cc_append_event_head(&b, "$AppCrashed", "-crash", c->time_ms);
    cc_buf_append_str(&b, ",");
    cc_append_reason(&b, c);
    cc_append_crash_properties(&b, c);
    cc_buf_append_str(&b, "}");
    cc_append_crash_details(&b, c);
    cc_buf_append_str(&b, "}");
    return b.overflow ? 0 : b.len;
}

// Used when the full event did not fit: signal facts only, never nothing.
size_t cc_build_minimal_event(char *out, size_t cap, const cc_crash *c) {
    cc_buf b = {out, 0, cap, false};
    cc_append_event_head(&b, "$AppCrashed", "-crash", c->time_ms);
    cc_buf_append_str(&b, ",\"app_crashed_reason\":\"");
    cc_buf_append_str(&b, cc_signal_name(c->signo));
    cc_buf_append_str(&b, " (");
    cc_buf_append_str(&b, ccf_code_name(c->signo, c->info->si_code));
    cc_buf_append_str(&b, ")\"");
    cc_append_crash_properties(&b, c);
    cc_buf_append_str(&b, ",\"crash_minimal\":true}}");
    return b.overflow ? 0 : b.len;
}

size_t cc_build_end_event(char *out, size_t cap, const cc_crash *c) {
    cc_buf b = {out, 0, cap, false};
    cc_append_event_head(&b, "$AppEnd", "-end", c->time_ms);
    cc_buf_append_str(&b, ",\"$event_duration\":");
    cc_buf_append_thousandths(&b, (c->entry_ns - cc_global.start_mono_ns) / 1000000);
    cc_buf_append_str(&b, ",\"$app_end_reason\":\"crash\"}}");
    return b.overflow ? 0 : b.len;
}

size_t cc_build_timing(char *out, size_t cap, int64_t handler_ns, int64_t write_ns, int64_t sync_ns,
                              int64_t publish_ns, int sync_ok, bool named_before_sync, bool directory_flushed) {
    cc_buf b = {out, 0, cap, false};
    cc_buf_append_str(&b, "{\"event_id\":\"");
    cc_buf_append_str(&b, cc_global.session_id);
    cc_buf_append_str(&b, "-crash\",\"handler_ns\":");
    cc_buf_append_i64(&b, handler_ns);
    cc_buf_append_str(&b, ",\"write_ns\":");
    cc_buf_append_i64(&b, write_ns);
    cc_buf_append_str(&b, ",\"fdatasync_ns\":");
    cc_buf_append_i64(&b, sync_ns);
    cc_buf_append_str(&b, ",\"publish_ns\":");
    cc_buf_append_i64(&b, publish_ns);
    cc_buf_append_str(&b, ",\"fdatasync_ok\":");
    cc_buf_append_str(&b, sync_ok ? "true" : "false");
    cc_buf_append_str(&b, ",\"named_before_sync\":");
    cc_buf_append_str(&b, named_before_sync ? "true" : "false");
    cc_buf_append_str(&b, ",\"directory_flushed\":");
    cc_buf_append_str(&b, directory_flushed ? "true" : "false");
    cc_buf_append_str(&b, ",\"threads_ns\":");
    cc_buf_append_i64(&b, cc_found.other_threads_ns);
    cc_buf_append_str(&b, ",\"threads_asked_ns\":");
    cc_buf_append_i64(&b, cc_found.threads_asked_ns);
    cc_buf_append_str(&b, ",\"kept_files_ns\":");
    cc_buf_append_i64(&b, cc_found.kept_files_ns);
    cc_buf_append_str(&b, ",\"unwind_ns\":");
    cc_buf_append_i64(&b, cc_found.unwind_ns);
    cc_buf_append_str(&b, ",\"events_ns\":");
    cc_buf_append_i64(&b, cc_found.events_ns);
    cc_buf_append_str(&b, ",\"stacks_ns\":");
    cc_buf_append_i64(&b, cc_found.stacks_ns);
    cc_buf_append_str(&b, ",\"stacks_write_ns\":");
    cc_buf_append_i64(&b, cc_found.stacks_write_ns);
    cc_buf_append_str(&b, ",\"stacks_bytes\":");
    cc_buf_append_u64(&b, cc_found.stacks_bytes);
    cc_buf_append_str(&b, ",\"threads\":");
    cc_buf_append_i64(&b, cc_threads_total_count());
    cc_buf_append_str(&b, "}");
    return b.overflow ? 0 : b.len;
}
