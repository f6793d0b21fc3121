// Each thread's stack memory and full registers, for readers that unwind with the binaries'
// CFI (a minidump's lldb, minidump-stackwalk): the stacks record (CCF_RECORD_STACKS, its layout
// in crashcapture_format.h). The crashing thread first, from the stack pointer its context holds
// (the stack it ran on before the signal, never the alternate stack), then every captured thread,
// each from its frozen registers, within one bound that the crash file's reservation holds.
// The rules of crash_path.c apply: this runs after a fatal signal, allocates nothing, takes no
// lock; every read of a stack goes through process_vm_readv on ourselves, which stops where the
// mapping does instead of faulting, so a stack shorter than asked costs nothing.
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#include "cc_internal.h"
#include "crash_report.h"

// Below the stack pointer: x86_64's red zone, where a leaf function keeps its locals.
#define CC_STACK_BELOW_SP 128
#define CC_STACK_CRASHED_WANT (64 * 1024)
#define CC_STACK_OTHER_WANT (32 * 1024)
// Less than this is not worth a thread's entry: a parked thread's few frames need about 1 KiB.
#define CC_STACK_SMALLEST 1024

static size_t cc_read_own_memory(void *out, uintptr_t address, size_t n) {
    struct iovec local = {out, n}, remote = {(void *)address, n};
    long got = syscall(SYS_process_vm_readv, getpid(), &local, 1L, &remote, 1L, 0L);
    return got > 0 ? (size_t)got : 0;
}

static void cc_le32(unsigned char *out, uint32_t v) {
    for (int i = 0; i < 4; i++) out[i] = (unsigned char)(v >> (8 * i));
}

static void cc_le64(unsigned char *out, uint64_t v) {
    for (int i = 0; i < 8; i++) out[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t cc_read_le64(const unsigned char *in) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)in[i] << (8 * i);
    return v;
}

static size_t cc_pad8(size_t n) { return (n + 7) & ~(size_t)7; }

// The context's bytes into out (room for the largest): general registers, then the
// floating-point ones when `with_float` and the context points to them. Its size.
static size_t cc_put_context(unsigned char *out, const ucontext_t *uc, bool with_float, uint32_t *flags) {
#if defined(__x86_64__)
    for (int i = 0; i < CCF_STACKS_X86_64_GREGS; i++) cc_le64(out + 8 * i, (uint64_t)uc->uc_mcontext.gregs[i]);
    size_t size = 8 * CCF_STACKS_X86_64_GREGS;
    if (with_float && uc->uc_mcontext.fpregs != NULL &&
        cc_read_own_memory(out + size, (uintptr_t)uc->uc_mcontext.fpregs, CCF_STACKS_X86_64_FXSAVE) ==
            CCF_STACKS_X86_64_FXSAVE) {
        size += CCF_STACKS_X86_64_FXSAVE;
        *flags |= CCF_STACK_FLOAT;
    }
    return size;
#elif defined(__aarch64__)
    for (int i = 0; i < 31; i++) cc_le64(out + 8 * i, uc->uc_mcontext.regs[i]);
    cc_le64(out + 8 * 31, uc->uc_mcontext.sp);
    cc_le64(out + 8 * 32, uc->uc_mcontext.pc);
    cc_le64(out + 8 * 33, uc->uc_mcontext.pstate);
    size_t size = 8 * CCF_STACKS_AARCH64_GREGS;
    if (!with_float) return size;
    // The kernel's signal frame: records of {magic, size} in __reserved; FPSIMD_MAGIC's holds
    // fpsr, fpcr, then the 32 vector registers.
    const unsigned char *reserved = (const unsigned char *)uc->uc_mcontext.__reserved;
    for (size_t at = 0; at + 8 <= sizeof(uc->uc_mcontext.__reserved);) {
        uint32_t magic, record_size;
        memcpy(&magic, reserved + at, 4);
        memcpy(&record_size, reserved + at + 4, 4);
        if (magic == 0 || record_size < 8 || at + record_size > sizeof(uc->uc_mcontext.__reserved)) break;
        if (magic == 0x46508001u && record_size >= 16 + 512) {
            memcpy(out + size, reserved + at + 16, 512);  // v0..v31
            memcpy(out + size + 512, reserved + at + 8, 8);  // fpsr, fpcr
            *flags |= CCF_STACK_FLOAT;
            return size + CCF_STACKS_AARCH64_FPSIMD;
        }
        at += record_size;
    }
    return size;
#else
    (void)uc, (void)with_float, (void)flags;
    return 0;
#endif
}

typedef struct cc_stacks_writer {
    unsigned char *out;
    size_t len, cap;
    size_t bound_left;  // stack bytes still allowed
    uint32_t threads, left_out;
    uint64_t bytes_cut;
} cc_stacks_writer;

// A thread's entry as laid out before its stack is read: every thread's stack is then read
// in one process_vm_readv (256 calls of their own took 0.1 ms more), and the entries whose
// stack was shorter than its share are moved down over the gap.
typedef struct cc_stack_entry {
    size_t at;        // the entry's header, from w->out
    size_t stack_at;  // its stack bytes
    size_t share;     // asked
    size_t want;
    size_t got;
    bool bounded;
} cc_stack_entry;

static cc_stack_entry cc_entries[CC_MAX_THREADS + 1];
static struct iovec cc_local_iov[CC_MAX_THREADS + 1], cc_remote_iov[CC_MAX_THREADS + 1];

// Lays out one thread's entry: its context, then room for up to `share` bytes of stack from
// SP-128 up; false when there is no room left.
static bool cc_plan_thread(cc_stacks_writer *w, cc_stack_entry *e, pid_t tid, const ucontext_t *uc, bool crashed,
                           size_t want, size_t share) {
    size_t context_room = 8 * 34 + 520;
    if (w->len + CCF_STACKS_ENTRY_HEADER_SIZE + context_room + CC_STACK_SMALLEST > w->cap) {
        w->left_out++;
        return false;
    }
    unsigned char *entry = w->out + w->len;
    uint32_t flags = crashed ? CCF_STACK_CRASHED : 0;
    size_t context_size = cc_put_context(entry + CCF_STACKS_ENTRY_HEADER_SIZE, uc, crashed, &flags);
    size_t at = w->len + CCF_STACKS_ENTRY_HEADER_SIZE + cc_pad8(context_size);
    uintptr_t sp = cc_registers_from(uc).sp;
    uintptr_t start = sp > CC_STACK_BELOW_SP ? sp - CC_STACK_BELOW_SP : 0;
    if (share > w->bound_left) share = w->bound_left;
    bool bounded = share < want;
    // The main thread's stack ends where argc, argv and the environment begin: never copied
    // (and not a cut: there is nothing of the stack's own past it).
    uintptr_t end = cc_global.main_stack_end;
    if (end != 0 && start < end && start + share > end) {
        share = end - start;
        bounded = false;
    }
    if (share > w->cap - at) share = (w->cap - at) & ~(size_t)7;
    if (start == 0) share = 0;
    cc_le32(entry, (uint32_t)tid);
    cc_le32(entry + 4, flags);
    cc_le32(entry + 8, (uint32_t)context_size);
    cc_le64(entry + 16, start);
    *e = (cc_stack_entry){w->len, at, share, want, 0, bounded};
    w->len = at + cc_pad8(share);  // room for the padding too: a share need not be whole words
    w->bound_left -= share;
    w->threads++;
    return true;
}

// Reads every planned stack, as far as each one's mapping allows. The kernel stops at the
// first address it cannot read and says how many bytes it copied: the entry it stopped in is
// short, and the reads go on from the next entry.
static void cc_read_stacks(cc_stacks_writer *w, cc_stack_entry *entries, uint32_t count) {
    uint32_t asked = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (entries[i].share == 0) continue;
        cc_local_iov[asked] = (struct iovec){w->out + entries[i].stack_at, entries[i].share};
        cc_remote_iov[asked] = (struct iovec){(void *)(uintptr_t)cc_read_le64(w->out + entries[i].at + 16),
                                              entries[i].share};
        asked++;
    }
    pid_t pid = getpid();
    uint32_t next = 0;  // the first iovec not yet read
    for (uint32_t i = 0; i < count && next < asked; i++) {
        if (entries[i].share == 0) continue;
        // The entries before `i` are settled; read from entry i's iovec (`next`) on.
        long n = syscall(SYS_process_vm_readv, pid, &cc_local_iov[next], (long)(asked - next), &cc_remote_iov[next],
                         (long)(asked - next), 0L);
        size_t copied = n > 0 ? (size_t)n : 0;
        // Entries read whole, then the one the read stopped in.
        for (; i < count; i++) {
            if (entries[i].share == 0) continue;
            next++;
            if (copied >= entries[i].share) {
                entries[i].got = entries[i].share;
                copied -= entries[i].share;
                continue;
            }
            entries[i].got = copied;
            break;
        }
    }
}

// The entries' stack lengths, their flags, and each moved down over what the reads before it
// left unfilled.
static void cc_settle_stacks(cc_stacks_writer *w, cc_stack_entry *entries, uint32_t count) {
    size_t to = entries[0].at;
    for (uint32_t i = 0; i < count; i++) {
        cc_stack_entry *e = &entries[i];
        unsigned char *entry = w->out + e->at;
        uint32_t flags = (uint32_t)(cc_read_le64(entry) >> 32);
        // Read whole: the mapping may have held more than the share allowed.
        if (e->got == e->share && e->bounded && e->share > 0) {
            flags |= CCF_STACK_CUT;
            w->bytes_cut += e->want - e->share;
        }
        cc_le32(entry + 4, flags);
        cc_le32(entry + 12, (uint32_t)e->got);
        size_t padded = cc_pad8(e->got);
        memset(w->out + e->stack_at + e->got, 0, padded - e->got);
        size_t length = e->stack_at - e->at + padded;
        if (to != e->at) memmove(w->out + to, entry, length);
        to += length;
    }
    w->len = to;
}

size_t cc_build_stacks(char *out, size_t cap, const cc_crash *c, size_t bound) {
    if (cap < CCF_RECORD_HEADER_SIZE + CCF_STACKS_HEADER_SIZE) return 0;
    cc_stacks_writer w = {(unsigned char *)out + CCF_RECORD_HEADER_SIZE, CCF_STACKS_HEADER_SIZE,
                          cap - CCF_RECORD_HEADER_SIZE, bound, 0, 0, 0};
    uint32_t count = 0;
    count += cc_plan_thread(&w, &cc_entries[count], c->tid, c->uc, true, CC_STACK_CRASHED_WANT,
                            CC_STACK_CRASHED_WANT);
    int others = 0;
    for (int i = 0; cc_thread_slot_at(i) != NULL; i++) others += cc_thread_captured(cc_thread_slot_at(i));
    for (int i = 0; cc_thread_slot_at(i) != NULL && count < CC_MAX_THREADS + 1; i++) {
        const cc_thread_slot *slot = cc_thread_slot_at(i);
        if (!cc_thread_captured(slot)) continue;
        // An equal share of what is left for each thread still to come, 32 KiB at most: a bound
        // reached cuts every thread a little rather than leaving the last ones out.
        size_t share = w.bound_left / (size_t)(others > 0 ? others : 1);
        others--;
        if (share > CC_STACK_OTHER_WANT) share = CC_STACK_OTHER_WANT;
        share &= ~(size_t)7;
        if (share < CC_STACK_SMALLEST) {
            w.left_out++;
            continue;
        }
        count += cc_plan_thread(&w, &cc_entries[count], slot->tid, &slot->context, false, CC_STACK_OTHER_WANT,
                                share);
    }
    if (count > 0) {
        cc_read_stacks(&w, cc_entries, count);
        cc_settle_stacks(&w, cc_entries, count);
    }
    unsigned char *head = w.out;
    memcpy(head, CCF_STACKS_MAGIC, 4);
    cc_le32(head + 4, CCF_STACKS_VERSION);
#if defined(__x86_64__)
    cc_le32(head + 8, CCF_STACKS_MACHINE_X86_64);
#elif defined(__aarch64__)
    cc_le32(head + 8, CCF_STACKS_MACHINE_AARCH64);
#else
    cc_le32(head + 8, 0);
#endif
    cc_le32(head + 12, w.threads);
    cc_le32(head + 16, (uint32_t)bound);
    cc_le32(head + 20, w.left_out);
    cc_le64(head + 24, w.bytes_cut);
    if (w.len > CCF_MAXIMUM_PAYLOAD) return 0;
    cc_frame_in_place(out, CCF_RECORD_STACKS, w.len);
    return CCF_RECORD_HEADER_SIZE + w.len;
}
