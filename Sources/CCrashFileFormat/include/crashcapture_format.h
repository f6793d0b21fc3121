// The crash-file format and the names of signals, defined once for both sides: the C crash
// path writes with these, and the Swift reader (module CrashFileFormat) reads with them.
//
// A crash file is a sequence of framed records, then zeros (the space reserved at install).
// Each record is a 16-byte little-endian header (magic "CCR1", type, payload length, CRC-32
// of type, length and payload) followed by a JSON payload.
//
// Everything here is a constant or a static inline function over constants: it is safe in a
// signal handler, and including it links nothing.
#ifndef CRASHCAPTURE_FORMAT_H
#define CRASHCAPTURE_FORMAT_H

#include <signal.h>
#include <stddef.h>

#define CCF_RECORD_MAGIC "CCR1"
#define CCF_RECORD_HEADER_SIZE 16
/// The largest payload a record may declare, and the most that all the records of one file
/// may hold together (the crash path writes at most CC_RECORD_CAPACITY, 2.06 MiB, of events):
/// this bounds the JSON a reader parses per file.
#define CCF_MAXIMUM_PAYLOAD 4194304  // 4 MiB
/// Readers stop here; anything past it is reported, never loaded.
#define CCF_MAXIMUM_FILE_SIZE 16777216  // 16 MiB
/// The crash path writes a session record, two events and a timing record; readers take at most
/// this many records from one file and report the rest as damage, so a crafted file cannot
/// flood the store or make the reader's memory grow with its record count.
#define CCF_MAXIMUM_RECORDS 16
/// Readers stop scanning a file after this many damaged places; honest damage (a torn tail,
/// a flipped bit) makes one or two.
#define CCF_MAXIMUM_PROBLEMS 16
/// JSON values (objects, arrays and their members) that readers parse from one file's records
/// at most. A crash's report holds a few thousand, about 90,000 at worst (513 threads of 128
/// frames and their registers, 512 modules); parsed, each costs a reader about a hundred
/// bytes, so this bounds the memory a crafted file can make it use.
#define CCF_MAXIMUM_JSON_VALUES 131072
#define CCF_FILE_PREFIX "crash-"
#define CCF_FILE_EXTENSION "ccr"

enum ccf_record_type {
    CCF_RECORD_SESSION = 1,  // written at install: who this session is
    CCF_RECORD_EVENT = 2,    // one event JSON ($AppCrashed, $AppEnd)
    CCF_RECORD_TIMING = 3,   // handler timings, written after the fdatasync of the events
    CCF_RECORD_STACKS = 4,   // binary: each thread's registers and stack memory (below)
};

// The stacks record (type 4): binary, little-endian, written after the events are durable and
// before the timing record. Its frame's CRC-32 covers it like any record's; its own header
// carries a version, so a reader skips a version it does not know rather than misreading it.
//   header (CCF_STACKS_HEADER_SIZE bytes): magic "CCST", u32 version, u32 ELF machine (62
//   x86_64, 183 aarch64), u32 threads, u32 bound (stack bytes the crash path allowed itself),
//   u32 threads left out for want of room, u64 bytes cut (wanted but not kept, all threads)
//   then per thread: u32 tid, u32 flags (CCF_STACK_*), u32 context bytes, u32 stack bytes,
//   u64 address of the stack's first byte, the context (padded to 8), the stack (padded to 8).
// The context: x86_64, the 23 general registers in ucontext's gregs order (r8..r15, rdi, rsi,
// rbp, rbx, rdx, rax, rcx, rsp, rip, eflags, csgsfs, err, trapno, oldmask, cr2), then with
// CCF_STACK_FLOAT the 512-byte FXSAVE area; aarch64, x0..x30, sp, pc, pstate, then with
// CCF_STACK_FLOAT v0..v31 (16 bytes each), fpsr and fpcr (u32 each).
#define CCF_STACKS_MAGIC "CCST"
#define CCF_STACKS_VERSION 1
#define CCF_STACKS_HEADER_SIZE 32
#define CCF_STACKS_ENTRY_HEADER_SIZE 24
#define CCF_STACKS_MACHINE_X86_64 62
#define CCF_STACKS_MACHINE_AARCH64 183
#define CCF_STACKS_X86_64_GREGS 23
#define CCF_STACKS_X86_64_FXSAVE 512
#define CCF_STACKS_AARCH64_GREGS 34
#define CCF_STACKS_AARCH64_FPSIMD 520
enum ccf_stack_flags {
    CCF_STACK_CRASHED = 1,  // the crashing thread (its stack before the signal, not the alternate one)
    CCF_STACK_CUT = 2,      // fewer bytes kept than wanted: the bound was reached
    CCF_STACK_FLOAT = 4,    // the context carries the floating-point/vector registers
};

// A session file (`session-<id>.ccs`) is created at install and named from the start, so
// that it outlives any death of its process: a header page (little-endian, the offsets
// below), then, for the Swift SDK, a ring of journal entries that track() writes through a
// shared mapping before it returns. A clean end removes the file; any other end leaves it
// for the next replay, which imports what the journal holds and pairs the session.
#define CCF_SESSION_FILE_PREFIX "session-"
#define CCF_SESSION_FILE_EXTENSION "ccs"
#define CCF_SESSION_MAGIC "CCS1"
#define CCF_SESSION_VERSION 1
/// The header's fixed part. The context JSON follows it (session and distinct id, app version,
/// static properties, the memory cgroup's OOM counter file); the ring starts at `header_size`.
#define CCF_SESSION_FIXED_SIZE 256
/// The header's entry counts are kept (older writers left them 0).
#define CCF_SESSION_FLAG_ENTRY_COUNTS 1u
#define CCF_SESSION_PAGE 4096
/// Readers refuse larger rings: a corrupt header never makes them read or allocate more.
#define CCF_SESSION_MAXIMUM_RING 268435456  // 256 MiB
#define CCF_SESSION_MAXIMUM_CONTEXT 65536

enum ccf_session_offset {
    CCF_SESSION_AT_MAGIC = 0,             // 4 bytes "CCS1"
    CCF_SESSION_AT_VERSION = 4,           // u32
    CCF_SESSION_AT_HEADER_SIZE = 8,       // u32: where the ring starts, a multiple of 4096
    CCF_SESSION_AT_LIFECYCLE = 12,        // u32: enum ccf_session_lifecycle
    CCF_SESSION_AT_RING_SIZE = 16,        // u64: ring bytes, a multiple of 8 (0: no journal)
    CCF_SESSION_AT_START_WALL_MS = 24,    // i64
    CCF_SESSION_AT_START_MONO_NS = 32,    // i64 CLOCK_MONOTONIC
    CCF_SESSION_AT_PID = 40,              // i64
    CCF_SESSION_AT_START_TICKS = 48,      // u64: /proc/<pid>/stat field 22
    CCF_SESSION_AT_ALIVE_WALL_MS = 56,    // i64, refreshed while the process lives
    CCF_SESSION_AT_ALIVE_MONO_NS = 64,    // i64
    CCF_SESSION_AT_OOM_KILLS = 72,        // u64: the memory cgroup's oom_kill count at start, or all ones
    CCF_SESSION_AT_RESERVED = 80,         // u64: logical end of the ring space handed out
    CCF_SESSION_AT_CONSUMED = 88,         // u64: logical position up to which entries are in the store
    CCF_SESSION_AT_DROPPED = 96,          // u64: events refused because the ring was full
    CCF_SESSION_AT_CONTEXT_SIZE = 104,    // u32: bytes of context JSON at CCF_SESSION_FIXED_SIZE
    CCF_SESSION_AT_FLAGS = 108,           // u32: CCF_SESSION_FLAG_*
    CCF_SESSION_AT_SESSION_ID = 112,      // 32 hex digits, NUL
    CCF_SESSION_AT_BOOT_ID = 152,         // 36 characters, NUL
    CCF_SESSION_AT_PID_NAMESPACE = 192,   // u64: inode of /proc/self/ns/pid
    // Where a crash file's bytes were kept in this file, because the directory no longer took
    // the crash file's name (made read-only after install): written by the crash path once the
    // bytes are durable. 0: nothing kept.
    CCF_SESSION_AT_CRASH_OFFSET = 200,    // u64
    CCF_SESSION_AT_CRASH_SIZE = 208,      // u64
    // A crash whose report was not kept (the directory was over its bound at install): its
    // signal and si_code, then the wall-clock time; written after the fact, fdatasynced.
    CCF_SESSION_AT_NOT_KEPT_SIGNAL = 216,  // i32, 0: none
    CCF_SESSION_AT_NOT_KEPT_CODE = 220,    // i32
    CCF_SESSION_AT_NOT_KEPT_WALL_MS = 224, // i64
    // The notes area: the app's context and breadcrumbs, written in place while it runs, so
    // that a replayed crash carries them at no cost to the crash path. 0: none (older files).
    CCF_SESSION_AT_NOTES_OFFSET = 232,     // u32, a multiple of 8 inside the header
    CCF_SESSION_AT_NOTES_SIZE = 236,       // u32
    // A session of the C API that ended normally with events in its journal (crashcapture_track):
    // the file stays for a replay to import them, and this says when it ended. 0: it did not.
    // The journal's entries counted (when CCF_SESSION_FLAG_ENTRY_COUNTS): every one committed,
    // and every one consumed, each a u32 that wraps. Committed less consumed is how many
    // entries past the consumed position a reader must find: fewer is damage, never silence.
    CCF_SESSION_AT_COMMITTED_ENTRIES = 248,  // u32, counted after each entry's commit
    CCF_SESSION_AT_CONSUMED_ENTRIES = 252,   // u32, counted before the consumed position moves
    CCF_SESSION_AT_CLEAN_END_WALL_MS = 240, // i64
};

/// The notes area: CCF_NOTES_CONTEXT_SLOTS context slots, then CCF_NOTES_BREADCRUMB_SLOTS
/// breadcrumb slots. A context slot: u64 sequence (stored last), u32 length, u32 CRC-32C of
/// the sequence and the text, then the context as one JSON object; a writer fills the slot
/// with the lower sequence, so the one with the higher valid sequence is the latest. A
/// breadcrumb slot: u64 sequence (stored last; slot = (sequence - 1) % slots), u32 length,
/// u32 CRC-32C of the sequence, the time and the text, i64 wall-clock ms, then UTF-8 text.
#define CCF_NOTES_CONTEXT_SLOTS 2
#define CCF_NOTES_CONTEXT_SLOT_SIZE 4096
#define CCF_NOTES_BREADCRUMB_SLOTS 64
#define CCF_NOTES_BREADCRUMB_SLOT_SIZE 256
#define CCF_NOTES_SLOT_HEADER_SIZE 16
#define CCF_NOTES_BREADCRUMB_TEXT_AT 24
#define CCF_NOTES_SIZE \
    (CCF_NOTES_CONTEXT_SLOTS * CCF_NOTES_CONTEXT_SLOT_SIZE + CCF_NOTES_BREADCRUMB_SLOTS * CCF_NOTES_BREADCRUMB_SLOT_SIZE)

enum ccf_session_lifecycle {
    CCF_LIFECYCLE_NONE = 0,      // no lifecycle events for this session
    CCF_LIFECYCLE_TRACKED = 1,   // the SDK tracked $AppStart into the journal; replay adds only a missing $AppEnd
    CCF_LIFECYCLE_AT_REPLAY = 2, // C and preload: replay writes $AppStart, and $AppEnd if none came
};

/// A journal entry: at a multiple of 8 in the ring (wrapping at its end), a 24-byte header
/// then the payload, padded to 8. Header: the commit word (u64, the bitwise complement of the
/// entry's logical position, stored last with release ordering, so zeros never pass for an
/// entry), magic "CCJ1", u32 payload length, u32 type, u32 CRC-32C (Castagnoli) of position
/// (u64), type, length and payload. An entry is whole only when both the commit word and the
/// CRC match, so a torn entry is skipped, never half-read.
#define CCF_JOURNAL_ENTRY_MAGIC "CCJ1"
#define CCF_JOURNAL_HEADER_SIZE 24
enum ccf_journal_entry_type {
    CCF_JOURNAL_EVENT = 1,     // an event's JSON, its shared part replaced by 0x01
    CCF_JOURNAL_IDENTITY = 2,  // {"distinct_id":..[,"login_id":..]} for the events after it
};

/// The `$lib` value of every event CrashCapture writes, from C or from Swift.
#define CCF_LIB_NAME "CrashCapture"

/// Whether a property key or event name is one the Sensors Analytics data model reserves
/// (compared without case). `name` need not be NUL-terminated.
static inline int ccf_is_reserved_name(const char *name, size_t length) {
    static const char *const reserved[] = {"distinct_id", "original_id", "time",    "properties", "id",
                                           "first_id",    "second_id",   "users",   "events",     "event",
                                           "user_id",     "date",        "datetime"};
    for (size_t i = 0; i < sizeof(reserved) / sizeof(reserved[0]); i++) {
        const char *candidate = reserved[i];
        size_t at = 0;
        while (at < length && candidate[at] != '\0') {
            char c = name[at];
            if (c >= 'A' && c <= 'Z') c = (char)(c | 0x20);
            if (c != candidate[at]) break;
            at++;
        }
        if (at == length && candidate[at] == '\0') return 1;
    }
    return 0;
}

/// "SIGSEGV" for SIGSEGV, NULL for a signal this table does not name.
static inline const char *ccf_signal_name(int signo) {
    switch (signo) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGILL: return "SIGILL";
    case SIGFPE: return "SIGFPE";
    case SIGTRAP: return "SIGTRAP";
    case SIGSYS: return "SIGSYS";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGPIPE: return "SIGPIPE";
    default: return NULL;
    }
}

/// The name of a siginfo si_code for a signal ("SEGV_MAPERR", "SI_USER"), or "UNKNOWN".
static inline const char *ccf_code_name(int signo, int code) {
    switch (code) {
    case SI_USER: return "SI_USER";
    case SI_KERNEL: return "SI_KERNEL";
    case SI_QUEUE: return "SI_QUEUE";
    case SI_TIMER: return "SI_TIMER";
    case SI_MESGQ: return "SI_MESGQ";
    case SI_ASYNCIO: return "SI_ASYNCIO";
    case SI_SIGIO: return "SI_SIGIO";
    case SI_TKILL: return "SI_TKILL";
    default: break;
    }
    switch (signo) {
    case SIGSEGV:
        switch (code) {
        case SEGV_MAPERR: return "SEGV_MAPERR";
        case SEGV_ACCERR: return "SEGV_ACCERR";
        case 3: return "SEGV_BNDERR";
        case 4: return "SEGV_PKUERR";
        }
        break;
    case SIGBUS:
        switch (code) {
        case BUS_ADRALN: return "BUS_ADRALN";
        case BUS_ADRERR: return "BUS_ADRERR";
        case BUS_OBJERR: return "BUS_OBJERR";
        case 4: return "BUS_MCEERR_AR";
        case 5: return "BUS_MCEERR_AO";
        }
        break;
    case SIGILL:
        switch (code) {
        case ILL_ILLOPC: return "ILL_ILLOPC";
        case ILL_ILLOPN: return "ILL_ILLOPN";
        case ILL_ILLADR: return "ILL_ILLADR";
        case ILL_ILLTRP: return "ILL_ILLTRP";
        case ILL_PRVOPC: return "ILL_PRVOPC";
        case ILL_PRVREG: return "ILL_PRVREG";
        case ILL_COPROC: return "ILL_COPROC";
        case ILL_BADSTK: return "ILL_BADSTK";
        }
        break;
    case SIGFPE:
        switch (code) {
        case FPE_INTDIV: return "FPE_INTDIV";
        case FPE_INTOVF: return "FPE_INTOVF";
        case FPE_FLTDIV: return "FPE_FLTDIV";
        case FPE_FLTOVF: return "FPE_FLTOVF";
        case FPE_FLTUND: return "FPE_FLTUND";
        case FPE_FLTRES: return "FPE_FLTRES";
        case FPE_FLTINV: return "FPE_FLTINV";
        case FPE_FLTSUB: return "FPE_FLTSUB";
        }
        break;
    case SIGTRAP:
        switch (code) {
        case 1: return "TRAP_BRKPT";
        case 2: return "TRAP_TRACE";
        }
        break;
    case SIGSYS:
        switch (code) {
        case 1: return "SYS_SECCOMP";
        case 2: return "SYS_USER_DISPATCH";
        }
        break;
    }
    return "UNKNOWN";
}

#endif
