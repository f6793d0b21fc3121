// For CrashCapture's Swift SDK only: the session file and its journal. Not part of the C
// API (the shared libraries do not export these), and it may change in any release.
#ifndef CRASHCAPTURE_SDK_H
#define CRASHCAPTURE_SDK_H

#include <stddef.h>
#include <stdint.h>

#include "crashcapture.h"

#ifdef __cplusplus
extern "C" {
#endif

/// crashcapture_install for the SDK: the session file gets a journal of `journal_bytes`
/// (rounded to 8), and says whether the SDK tracks $AppStart/$AppEnd itself.
int crashcapture_install_sdk(const crashcapture_config *config, size_t journal_bytes, int tracks_lifecycle);

/// 1 when the installed session's static properties (the SDK's own and the app's) name `key`:
/// track() refuses such a key, which the event would then name twice. 0 otherwise.
int crashcapture_is_static_property(const char *key);

/// A ring of framed entries. The session's lives in its session file; one in memory serves
/// as the fallback when the file has no room for it, and in tests.
typedef struct crashcapture_journal crashcapture_journal;

/// The installed session's journal, or NULL (not installed, or a forked child).
crashcapture_journal *crashcapture_session_journal(void);
crashcapture_journal *crashcapture_journal_create_in_memory(size_t bytes);
void crashcapture_journal_destroy_in_memory(crashcapture_journal *journal);

/// Appends one entry (enum ccf_journal_entry_type) before returning: once this returns 0 the
/// entry survives any death of the process (for the session's journal). A full journal makes
/// the caller wait for the writer to consume, at most `wait_ns`; while an earlier wait ran out
/// and the writer has consumed nothing since, no caller waits again. Not appended, the entry is
/// counted as dropped: -1 the journal is closed (or a forked child's) or the entry is larger
/// than it; -2 it stayed full for `wait_ns`.
int crashcapture_journal_append(crashcapture_journal *journal, uint32_t type, const void *payload, size_t length,
                                int64_t wait_ns);

/// One committed entry. `payload` points into the journal, or into the caller's scratch
/// buffer when the entry wraps around the ring's end.
typedef struct crashcapture_journal_entry {
    uint64_t position;
    uint64_t next;
    uint32_t type;
    uint32_t length;
    const char *payload;
} crashcapture_journal_entry;

/// The entry at `position` if it is committed: 1, or 0 when none is (yet). Entries stay valid
/// until crashcapture_journal_consume moves past them.
int crashcapture_journal_read(crashcapture_journal *journal, uint64_t position, crashcapture_journal_entry *entry,
                              char *scratch, size_t scratch_size);

/// Where reading starts: the first entry not yet in the store.
uint64_t crashcapture_journal_consumed(crashcapture_journal *journal);
/// Entries before `position` are in the store: their space may be reused.
void crashcapture_journal_consume(crashcapture_journal *journal, uint64_t position);
/// The logical end of the space handed out so far.
uint64_t crashcapture_journal_reserved(crashcapture_journal *journal);
uint64_t crashcapture_journal_dropped(crashcapture_journal *journal);
/// Ring bytes; whether they live in the session file (1) or only in memory (0).
uint64_t crashcapture_journal_size(crashcapture_journal *journal);
int crashcapture_journal_is_persistent(crashcapture_journal *journal);
/// Faults the ring's pages in for writing up to `ahead` bytes past what was handed out, so
/// track() does not wait for the kernel to do it; the writer calls it as the ring fills.
void crashcapture_journal_prefault(crashcapture_journal *journal, size_t ahead);

/// crashcapture_set_context with the value already JSON (a number, a list...), for the SDK,
/// which validates typed values itself. NULL removes the key.
int crashcapture_set_context_json(const char *key, const char *value_json);

/// Whether the distinct id is a login id: the crash path's events then carry it as `login_id`
/// too, as every event after a login does.
void crashcapture_set_logged_in(int logged_in);

/// At install: where the program carries the Swift runtime itself (--static-swift-stdlib), a
/// thread of ours reads its symbol table (swift_job_run, the fatal error buffer); elsewhere
/// nothing happens.
void crashcapture_read_static_runtime_in_background(void);

/// Whether the task metadata that names tasks is known (a runtime library exports it).
int crashcapture_task_metadata_known(void);

/// Called from inside a task, once, at install: where the Swift runtime is linked into the
/// program it exports no task metadata, and a running task's own is what names tasks in a
/// report. 1 when the metadata is known (before or now), 0 when it cannot be learned here.
int crashcapture_note_current_task(void);

/// The session file's path, or NULL.
const char *crashcapture_session_file_path(void);
/// Removes the session file after a clean end whose $AppEnd is in the store.
void crashcapture_session_retire(void);

#ifdef __cplusplus
}
#endif

#endif
