// The journal's ring, shared by the session file (journal/session_journal.c), which places it
// in its mapping, and the ring's own operations (journal/journal_ring.c).
#ifndef CC_JOURNAL_RING_H
#define CC_JOURNAL_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "crashcapture_sdk.h"

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
    // Entries committed and consumed, each wrapping: in the session file's header when it has
    // one (cc_journal_keep_counts), so that a reader knows how many entries it must find.
    _Atomic uint32_t *committed_entries;
    _Atomic uint32_t *consumed_entries;
    _Atomic uint32_t counts[2];
};

// The installed session's journal; its counters live in the session file's header.
extern crashcapture_journal cc_session_journal;

void cc_journal_init(crashcapture_journal *j, char *ring, uint64_t size, bool persistent, _Atomic uint64_t *words);
// Where the journal counts its committed and consumed entries (the session file's header).
void cc_journal_keep_counts(crashcapture_journal *j, _Atomic uint32_t *committed, _Atomic uint32_t *consumed);
// Wakes the track() callers waiting for room (after a consume, or when the journal closes).
void cc_journal_wake_waiters(crashcapture_journal *j);

#endif
