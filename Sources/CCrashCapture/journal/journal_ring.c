// The journal's ring: a lock-free multi-writer log in a shared mapping (the session file's,
// or anonymous memory). Writers reserve space with a compare-and-swap on `reserved`, copy the
// entry, and publish it by storing its commit word last; the SDK's writer thread reads entries
// in position order and, once they are in SQLite, advances `consumed` so their space is reused.
// A full ring makes a writer wait on a futex for the consume, within a bound.
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cc_internal.h"
#include "crashcapture_sdk.h"
#include "journal_ring.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

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
    // One cpuid, when the first journal entry is written: __builtin_cpu_supports would link the
    // compiler runtime's CPU probe, a constructor that runs a dozen cpuid at every load of the
    // library, each an exit to the hypervisor on a VM (about 60 µs a process here).
    unsigned int eax, ebx, ecx, edx;
    if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_SSE4_2)) cc_crc32c = cc_crc32c_hardware;
#endif
}

static pthread_once_t cc_crc32c_once = PTHREAD_ONCE_INIT;



crashcapture_journal cc_session_journal;

void cc_journal_init(crashcapture_journal *j, char *ring, uint64_t size, bool persistent,
                            _Atomic uint64_t *words) {
    pthread_once(&cc_crc32c_once, cc_crc32c_init);
    j->ring = ring;
    j->size = ring != NULL ? size : 0;
    j->persistent = persistent;
    j->prefaulted = 0;
    j->reserved = &words[0];
    j->consumed = &words[1];
    j->dropped = &words[2];
    j->committed_entries = &j->counts[0];
    j->consumed_entries = &j->counts[1];
    atomic_store(&j->closed, false);
    atomic_store(&j->stalled, false);
}

void cc_journal_keep_counts(crashcapture_journal *j, _Atomic uint32_t *committed, _Atomic uint32_t *consumed) {
    j->committed_entries = committed;
    j->consumed_entries = consumed;
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

void cc_journal_wake_waiters(crashcapture_journal *j) {
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

uint32_t cc_journal_crc32c(uint32_t crc, const void *data, size_t n) {
    pthread_once(&cc_crc32c_once, cc_crc32c_init);
    return cc_crc32c(crc, data, n);
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
            // Saturating: a bound too long to add to the clock means no deadline at all.
            if (deadline == 0) deadline = wait_ns > INT64_MAX - (int64_t)now ? INT64_MAX : (int64_t)now + wait_ns;
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
    // Counted after the commit: a process killed in between leaves one entry more than counted,
    // which a reader allows (fewer than counted is what damage looks like).
    atomic_fetch_add_explicit(j->committed_entries, 1, memory_order_relaxed);
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
    // The entries consumed, counted before the position moves: killed in between, a reader
    // finds more entries than the counts say, never fewer. The writer consumes whole committed
    // entries, so their lengths lead from the old position to the new one.
    uint64_t from = atomic_load(j->consumed);
    uint32_t entries = 0;
    while (j->ring != NULL && from < position) {
        uint32_t length;
        cc_ring_get(j, from + 12, &length, sizeof(length));
        if (length > CCF_MAXIMUM_PAYLOAD) break;
        from += cc_entry_size(length);
        entries++;
    }
    atomic_fetch_add_explicit(j->consumed_entries, entries, memory_order_relaxed);
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
