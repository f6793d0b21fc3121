// THE CRASH PATH: everything that runs after a fatal signal arrives.
//
// Rules for this file and every other file in signal_safe/ (signal-safety(7));
// CrashPathSymbolTests checks the undefined symbols of every object built from this
// folder against an allowlist, so a slip fails CI:
//   - no malloc/free/realloc, no stdio, no printf-family formatting (we format by hand);
//   - no locks, no pthread_mutex, no dladdr/dlsym/dl_iterate_phdr, no uuid_generate;
//   - no Swift and no C++ runtime calls (the C++ terminate handler, which runs before abort()
//     and outside any signal handler, is in install/exception_message.c);
//   - every buffer, file descriptor and byte of reserved disk is prepared at install
//     (install.c); here we only read that state and the few atomics below;
//   - the libunwind functions are reached through pointers taken at install, so the
//     unwinder's own first-use setup is the only work we do not control;
//   - any memory read that may fault (other stacks, loader structures, message buffers)
//     runs inside a stage guarded by sigsetjmp: a fault there is caught by this handler
//     (SA_NODEFER) and costs that stage only, never the report.
// The process must end exactly as it would have without us: same signal, core dump,
// every earlier handler called with the original siginfo and ucontext.
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "cc_internal.h"
#include "testing/crashcapture_testing.h"

const int cc_handled_signals[CC_HANDLED_SIGNAL_COUNT] = {SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE, SIGTRAP};

// Which thread reports the crash, shared by every copy of CrashCapture in the process: each
// copy defines it, and each uses the one the dynamic loader finds first (install.c).
CRASHCAPTURE_API _Atomic pid_t crashcapture_crash_owner;

// MARK: - Formatting without libc

void cc_buf_append(cc_buf *b, const char *s, size_t n) {
    if (b->overflow) return;
    if (n > b->cap - b->len) {
        b->overflow = true;
        return;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

void cc_buf_append_str(cc_buf *b, const char *s) { cc_buf_append(b, s, strlen(s)); }

static void cc_buf_append_char(cc_buf *b, char c) { cc_buf_append(b, &c, 1); }

void cc_buf_append_u64(cc_buf *b, uint64_t v) {
    char digits[20];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    while (n > 0) cc_buf_append_char(b, digits[--n]);
}

void cc_buf_append_i64(cc_buf *b, int64_t v) {
    if (v < 0) {
        cc_buf_append_char(b, '-');
        cc_buf_append_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        cc_buf_append_u64(b, (uint64_t)v);
    }
}

void cc_buf_append_hex(cc_buf *b, uint64_t v) {
    static const char hex[] = "0123456789abcdef";
    char digits[16];
    size_t n = 0;
    do {
        digits[n++] = hex[v & 0xf];
        v >>= 4;
    } while (v != 0);
    cc_buf_append(b, "0x", 2);
    while (n > 0) cc_buf_append_char(b, digits[--n]);
}

static void cc_buf_append_quoted_hex(cc_buf *b, uint64_t v) {
    cc_buf_append_char(b, '"');
    cc_buf_append_hex(b, v);
    cc_buf_append_char(b, '"');
}

// Escapes for a JSON string body. Bytes of invalid UTF-8 are kept as they are: the reader
// replaces them, and keeping them loses nothing an analyst could use.
static void cc_buf_append_json_escaped(cc_buf *b, const char *s, size_t max_bytes) {
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < max_bytes && s[i] != '\0'; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            cc_buf_append_char(b, '\\');
            cc_buf_append_char(b, (char)c);
        } else if (c == '\n') {
            cc_buf_append(b, "\\n", 2);
        } else if (c == '\t') {
            cc_buf_append(b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 0xf]};
            cc_buf_append(b, esc, 6);
        } else {
            cc_buf_append_char(b, (char)c);
        }
    }
}

void cc_buf_append_json_string(cc_buf *b, const char *s, size_t max_bytes) {
    cc_buf_append_char(b, '"');
    cc_buf_append_json_escaped(b, s, max_bytes);
    cc_buf_append_char(b, '"');
}

// CRC-32 (IEEE 802.3, as zlib). Eight bytes a step through tables that install fills
// (cc_crc32_prepare): a report's 10-20 KiB would take about 50 µs four bits at a time. Before
// install, four bits at a time from 16 constants.
static uint32_t cc_crc32_tables[8][256];
static bool cc_crc32_prepared;

void cc_crc32_prepare(void) {
    if (cc_crc32_prepared) return;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t crc = i;
        for (int bit = 0; bit < 8; bit++) crc = crc & 1 ? (crc >> 1) ^ 0xedb88320u : crc >> 1;
        cc_crc32_tables[0][i] = crc;
    }
    for (int k = 1; k < 8; k++) {
        for (int i = 0; i < 256; i++) {
            uint32_t previous = cc_crc32_tables[k - 1][i];
            cc_crc32_tables[k][i] = (previous >> 8) ^ cc_crc32_tables[0][previous & 0xff];
        }
    }
    cc_crc32_prepared = true;
}

static uint32_t cc_crc32_by_nibble(uint32_t crc, const unsigned char *p, size_t n) {
    static const uint32_t table[16] = {
        0x00000000, 0x1db71064, 0x3b6e20c8, 0x26d930ac, 0x76dc4190, 0x6b6b51f4, 0x4db26158, 0x5005713c,
        0xedb88320, 0xf00f9344, 0xd6d6a3e8, 0xcb61b38c, 0x9b64c2b0, 0x86d3d2d4, 0xa00ae278, 0xbdbdf21c,
    };
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        crc = (crc >> 4) ^ table[crc & 0xf];
        crc = (crc >> 4) ^ table[crc & 0xf];
    }
    return crc;
}

uint32_t cc_crc32(uint32_t crc, const void *data, size_t n) {
    const unsigned char *p = data;
    crc = ~crc;
    if (!cc_crc32_prepared) return ~cc_crc32_by_nibble(crc, p, n);
    const uint32_t(*t)[256] = cc_crc32_tables;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t low = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = t[7][low & 0xff] ^ t[6][(low >> 8) & 0xff] ^ t[5][(low >> 16) & 0xff] ^ t[4][low >> 24] ^
              t[3][p[4]] ^ t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
    }
    for (; n > 0; n--, p++) crc = (crc >> 8) ^ t[0][(crc ^ *p) & 0xff];
    return ~crc;
}

static void cc_put_le32(char *out, uint32_t v) {
    out[0] = (char)(v & 0xff);
    out[1] = (char)((v >> 8) & 0xff);
    out[2] = (char)((v >> 16) & 0xff);
    out[3] = (char)((v >> 24) & 0xff);
}

// Writes the 16-byte header in front of a payload that already sits at out + 16.
static void cc_frame_in_place(char *out, uint32_t type, size_t len) {
    memcpy(out, CCF_RECORD_MAGIC, 4);
    cc_put_le32(out + 4, type);
    cc_put_le32(out + 8, (uint32_t)len);
    uint32_t crc = cc_crc32(0, out + 4, 8);
    crc = cc_crc32(crc, out + CCF_RECORD_HEADER_SIZE, len);
    cc_put_le32(out + 12, crc);
}

size_t cc_frame_record(char *out, size_t cap, uint32_t type, const char *payload, size_t len) {
    if (len > CCF_MAXIMUM_PAYLOAD || cap < CCF_RECORD_HEADER_SIZE || len > cap - CCF_RECORD_HEADER_SIZE) return 0;
    memmove(out + CCF_RECORD_HEADER_SIZE, payload, len);
    cc_frame_in_place(out, type, len);
    return CCF_RECORD_HEADER_SIZE + len;
}

int cc_write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int64_t cc_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t cc_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// Finds NT_GNU_BUILD_ID among a module's PT_NOTE segments. Used at install and for
// modules first seen at crash time (inside a guarded stage).
bool cc_read_build_id(uintptr_t load_bias, const void *phdrs, size_t phnum, char *hex_out, size_t hex_cap) {
    static const char hex[] = "0123456789abcdef";
    const ElfW(Phdr) *ph = phdrs;
    for (size_t i = 0; i < phnum; i++) {
        if (ph[i].p_type != PT_NOTE) continue;
        const char *p = (const char *)(load_bias + ph[i].p_vaddr);
        const char *end = p + ph[i].p_memsz;
        while (p + sizeof(ElfW(Nhdr)) <= end) {
            const ElfW(Nhdr) *note = (const ElfW(Nhdr) *)p;
            const char *name = p + sizeof(ElfW(Nhdr));
            const char *desc = name + ((note->n_namesz + 3) & ~3u);
            const char *next = desc + ((note->n_descsz + 3) & ~3u);
            if (next > end) break;
            if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 && memcmp(name, "GNU", 4) == 0) {
                if (note->n_descsz * 2 + 1 > hex_cap) return false;
                const unsigned char *d = (const unsigned char *)desc;
                for (size_t k = 0; k < note->n_descsz; k++) {
                    hex_out[2 * k] = hex[d[k] >> 4];
                    hex_out[2 * k + 1] = hex[d[k] & 0xf];
                }
                hex_out[note->n_descsz * 2] = '\0';
                return true;
            }
            p = next;
        }
    }
    return false;
}

// MARK: - Names

static const char *cc_signal_name(int signo) {
    const char *name = ccf_signal_name(signo);
    return name != NULL ? name : "SIGNAL";
}

// Whether returning from the handler re-executes the faulting instruction. int3 leaves the
// PC after the trap, so SIGTRAP never counts; signals sent by kill/raise/abort never recur.
static bool cc_fault_recurs(int signo, const siginfo_t *info) {
    if (info->si_code <= 0) return false;
    return signo == SIGSEGV || signo == SIGBUS || signo == SIGILL || signo == SIGFPE;
}

static pid_t cc_gettid(void) { return (pid_t)syscall(SYS_gettid); }

// MARK: - Registers

typedef struct cc_registers {
    uintptr_t pc, sp, fp;
} cc_registers;

static cc_registers cc_registers_from(const ucontext_t *uc) {
    cc_registers r = {0, 0, 0};
#if defined(__x86_64__)
    r.pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    r.sp = (uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
    r.fp = (uintptr_t)uc->uc_mcontext.gregs[REG_RBP];
#elif defined(__aarch64__)
    r.pc = (uintptr_t)uc->uc_mcontext.pc;
    r.sp = (uintptr_t)uc->uc_mcontext.sp;
    r.fp = (uintptr_t)uc->uc_mcontext.regs[29];
#endif
    return r;
}

static void cc_append_registers(cc_buf *b, const ucontext_t *uc) {
#if defined(__x86_64__)
    static const struct {
        const char *name;
        int index;
    } regs[] = {
        {"rip", REG_RIP}, {"rsp", REG_RSP}, {"rbp", REG_RBP}, {"rax", REG_RAX}, {"rbx", REG_RBX},
        {"rcx", REG_RCX}, {"rdx", REG_RDX}, {"rsi", REG_RSI}, {"rdi", REG_RDI}, {"r8", REG_R8},
        {"r9", REG_R9},   {"r10", REG_R10}, {"r11", REG_R11}, {"r12", REG_R12}, {"r13", REG_R13},
        {"r14", REG_R14}, {"r15", REG_R15}, {"eflags", REG_EFL}, {"trapno", REG_TRAPNO}, {"err", REG_ERR},
        {"cr2", REG_CR2},
    };
    cc_registers r = cc_registers_from(uc);
    cc_buf_append_str(b, "{\"pc\":");
    cc_buf_append_quoted_hex(b, r.pc);
    cc_buf_append_str(b, ",\"sp\":");
    cc_buf_append_quoted_hex(b, r.sp);
    cc_buf_append_str(b, ",\"fp\":");
    cc_buf_append_quoted_hex(b, r.fp);
    for (size_t i = 0; i < sizeof(regs) / sizeof(regs[0]); i++) {
        cc_buf_append_str(b, ",\"");
        cc_buf_append_str(b, regs[i].name);
        cc_buf_append_str(b, "\":");
        cc_buf_append_quoted_hex(b, (uint64_t)uc->uc_mcontext.gregs[regs[i].index]);
    }
    cc_buf_append_str(b, "}");
#elif defined(__aarch64__)
    cc_registers r = cc_registers_from(uc);
    cc_buf_append_str(b, "{\"pc\":");
    cc_buf_append_quoted_hex(b, r.pc);
    cc_buf_append_str(b, ",\"sp\":");
    cc_buf_append_quoted_hex(b, r.sp);
    cc_buf_append_str(b, ",\"fp\":");
    cc_buf_append_quoted_hex(b, r.fp);
    for (int i = 0; i < 31; i++) {
        cc_buf_append_str(b, ",\"x");
        cc_buf_append_u64(b, (uint64_t)i);
        cc_buf_append_str(b, "\":");
        cc_buf_append_quoted_hex(b, uc->uc_mcontext.regs[i]);
    }
    cc_buf_append_str(b, "}");
#else
    cc_buf_append_str(b, "{}");
#endif
}

// MARK: - Crash-time state

// One thread reports; the others wait for it. A nested fault on the reporting thread is
// recognised by its tid and jumps back to the stage it interrupted.
static _Atomic pid_t cc_reporting_tid;
static _Atomic int cc_report_written;
static _Atomic int cc_report_named;  // 1: linked in the directory; 2: kept in the session file; 3: noted in its header
static int64_t cc_other_threads_ns;  // listing, asking, waiting for and unwinding the other threads
static int64_t cc_threads_asked_ns;  // of which listing and asking them (they answer while this thread works)
// Where the rest of the handler's own work goes, for the timing record: reading the kept
// process-state files, unwinding the crashing thread, building the two events.
static int64_t cc_kept_files_ns, cc_unwind_ns, cc_events_ns;
static sigjmp_buf cc_stage_jump;
static volatile sig_atomic_t cc_stage_armed;
// Each other thread's unwinding has a guard of its own inside the threads stage, taken before
// the stage's: sharing the stage's would leave the rest of the stage unguarded.
static sigjmp_buf cc_thread_unwind_jump;
static volatile sig_atomic_t cc_thread_unwind_armed;
static volatile sig_atomic_t cc_fault_on_purpose;

static uintptr_t cc_frames[CC_MAX_FRAMES];
static volatile size_t cc_frame_count;
static volatile int cc_used_libunwind;

// Modules the loader gained after the last refresh, found through _r_debug at crash time.
#define CC_MAX_LATE_MODULES 64
typedef struct cc_late_module {
    cc_module range;
    const char *path;
    char build_id[65];
} cc_late_module;
static cc_late_module cc_late_modules[CC_MAX_LATE_MODULES];
static volatile size_t cc_late_module_count;

static char cc_thread_name[32];
static char cc_swift_message[4096];
static char cc_exception_type[512];
static char cc_exception_what[1024];
static char cc_record[CC_RECORD_CAPACITY];

// Writes a byte to every page of [p, p + n): the first write to a page of our static buffers
// otherwise costs a page fault (1-3 µs in a VM) inside the handler.
void cc_touch_pages(void *p, size_t n) {
    volatile char *bytes = p;
    for (size_t at = 0; at < n; at += 4096) bytes[at] = 0;
    if (n > 0) bytes[n - 1] = 0;
}

// At install: the parts of the buffers that every report writes into get their pages now
// (about 60 KiB resident; a one-thread report fits in the first 16 KiB of cc_record).
void cc_crash_path_prepare(void) {
    cc_crc32_prepare();
    cc_touch_pages(cc_record, 16 * 1024);
    cc_touch_pages(cc_frames, sizeof(cc_frames));
    cc_touch_pages(cc_swift_message, 1);
    cc_process_state_prepare();
    cc_threads_prepare();
}

void crashcapture_test_fault_in_handler(int where) { cc_fault_on_purpose = where; }

static void cc_fault_here_on_purpose(int where) {
    if (cc_fault_on_purpose == where) {
        volatile int *volatile nowhere = 0;
        *nowhere = 1;
    }
}

// MARK: - Stages

enum cc_stage {
    CC_STAGE_UNWIND = 0,
    CC_STAGE_LATE_MODULES,
    CC_STAGE_TEXTS,
    CC_STAGE_THREADS,
    CC_STAGE_COUNT,
};
static const char *const cc_stage_names[CC_STAGE_COUNT] = {"unwind", "late_modules", "texts", "threads"};

static bool cc_in_module(const cc_module *m, uintptr_t pc) { return pc >= m->start && pc < m->end; }

static bool cc_in_any_module(uintptr_t pc) {
    const cc_module_map *map = atomic_load_explicit(&cc_global.module_map, memory_order_acquire);
    if (map == NULL) return false;
    for (size_t i = 0; i < map->count; i++)
        if (cc_in_module(&map->modules[i], pc)) return true;
    return false;
}

// A call through a bad function pointer faults at the bad address, where no unwind info
// exists, and unwinders then skip the caller. The call has just pushed its return address
// (x86_64: at sp; aarch64: in the link register): put that frame back.
static void cc_recover_bad_call(const ucontext_t *uc) {
    if (cc_frame_count == 0 || cc_in_any_module(cc_frames[0])) return;
#if defined(__x86_64__)
    uintptr_t caller = *(const uintptr_t *)(uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
    uintptr_t caller = (uintptr_t)uc->uc_mcontext.regs[30];
#else
    uintptr_t caller = 0;
#endif
    if (!cc_in_any_module(caller) || (cc_frame_count > 1 && cc_frames[1] == caller)) return;
    size_t count = cc_frame_count < CC_MAX_FRAMES ? cc_frame_count + 1 : CC_MAX_FRAMES;
    for (size_t i = count - 1; i > 1; i--) cc_frames[i] = cc_frames[i - 1];
    cc_frames[1] = caller;
    cc_frame_count = count;
}

static void cc_walk_stack(ucontext_t *uc);

// libunwind probes memory by writing to a pipe it made at install (two non-blocking
// descriptors). A program that closed them and reused the numbers (a full blocking pipe, say)
// would block it: then the stacks are walked by frame pointers instead.
static bool cc_libunwind_usable = true;

static void cc_check_libunwind_pipe(void) {
    cc_libunwind_usable = true;
    for (int i = 0; i < 2; i++)
        if (cc_global.unwinder_pipe[i] >= 0 &&
            !cc_holds_file(cc_global.unwinder_pipe[i], cc_global.unwinder_pipe_dev, cc_global.unwinder_pipe_ino))
            cc_libunwind_usable = false;
}

static void cc_unwind(ucontext_t *uc) {
    cc_walk_stack(uc);
    cc_recover_bad_call(uc);
}

// Walks a stack from a saved context into `frames`: libunwind when it was found at install,
// else (or when it finds no caller) frame pointers. *count grows as frames are found, so a
// fault part-way (caught by the stage guard) keeps the frames found before it.
static void cc_walk(ucontext_t *uc, uintptr_t *frames, size_t max, volatile size_t *count, volatile int *used_libunwind) {
    *count = 0;
    *used_libunwind = 0;
    if (cc_global.unw_init_local2 != NULL && cc_libunwind_usable) {
        unw_cursor_t cursor;
        if (cc_global.unw_init_local2(&cursor, (unw_context_t *)uc, UNW_INIT_SIGNAL_FRAME) == 0) {
            *used_libunwind = 1;
            do {
                unw_word_t ip = 0;
                if (cc_global.unw_get_reg(&cursor, UNW_REG_IP, &ip) != 0 || ip == 0) break;
                frames[*count] = (uintptr_t)ip;
                *count = *count + 1;
            } while (*count < max && cc_global.unw_step(&cursor) > 0);
            if (*count > 1) return;
        }
    }
    // A bad frame pointer faults, which the stage guard turns into a shorter stack.
    cc_registers r = cc_registers_from(uc);
    *used_libunwind = 0;
    frames[0] = r.pc;
    *count = 1;
    uintptr_t fp = r.fp;
    while (*count < max && fp != 0 && (fp & (sizeof(uintptr_t) - 1)) == 0 && fp >= r.sp) {
        const uintptr_t *frame = (const uintptr_t *)fp;
        uintptr_t next = frame[0];
        uintptr_t ret = frame[1];
        if (ret == 0) break;
        frames[*count] = ret;
        *count = *count + 1;
        if (next <= fp) break;
        fp = next;
    }
}

static void cc_walk_stack(ucontext_t *uc) {
    cc_fault_here_on_purpose(1);
    cc_walk(uc, cc_frames, CC_MAX_FRAMES, &cc_frame_count, &cc_used_libunwind);
}

// The other threads that have answered and are not unwound yet, each from the context it
// saved, each under a guard of its own: a corrupt stack costs that thread's frames only.
// Called while the rest are still answering, and once more after. Whether it unwound any.
static bool cc_unwind_other_threads(void) {
    volatile bool unwound_any = false;
    for (volatile int i = 0; cc_thread_slot_at(i) != NULL; i++) {
        cc_thread_slot *slot = cc_thread_slot_at(i);
        if (slot->unwound || !cc_thread_captured(slot)) continue;
        slot->unwound = true;
        unwound_any = true;
        volatile int used_libunwind = 0;
        if (sigsetjmp(cc_thread_unwind_jump, 1) == 0) {
            cc_thread_unwind_armed = 1;
            cc_walk(&slot->context, slot->frames, CC_THREAD_FRAMES, &slot->frame_count, &used_libunwind);
            cc_thread_unwind_armed = 0;
        } else {
            cc_thread_unwind_armed = 0;
            slot->unwind_faulted = true;
        }
    }
    return unwound_any;
}

// Index of the module holding pc in the combined list (install-time map, then late ones).
static long cc_find_module(const cc_module_map *map, uintptr_t pc, uintptr_t *bias) {
    if (map != NULL) {
        for (size_t i = 0; i < map->count; i++) {
            if (cc_in_module(&map->modules[i], pc)) {
                *bias = map->modules[i].load_bias;
                return (long)i;
            }
        }
    }
    size_t base = map != NULL ? map->count : 0;
    for (size_t i = 0; i < cc_late_module_count; i++) {
        if (cc_in_module(&cc_late_modules[i].range, pc)) {
            *bias = cc_late_modules[i].range.load_bias;
            return (long)(base + i);
        }
    }
    return -1;
}

static bool cc_bias_known(const cc_module_map *map, uintptr_t bias) {
    if (map == NULL) return false;
    for (size_t i = 0; i < map->count; i++)
        if (map->modules[i].load_bias == bias) return true;
    return false;
}

// Libraries dlopen'ed after the last module refresh: walk the loader's public list,
// lock-free, and read each new object's program headers from its mapped ELF header.
static void cc_scan_late_modules(const cc_module_map *map) {
    cc_late_module_count = 0;
    bool missing = false;
    uintptr_t unused;
    for (size_t i = 0; i < cc_frame_count; i++)
        if (cc_find_module(map, cc_frames[i], &unused) < 0) missing = true;
    if (!missing) return;
    for (struct link_map *l = _r_debug.r_map; l != NULL && cc_late_module_count < CC_MAX_LATE_MODULES; l = l->l_next) {
        if (l->l_addr == 0 || cc_bias_known(map, l->l_addr)) continue;
        const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)l->l_addr;
        if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0) continue;
        const ElfW(Phdr) *ph = (const ElfW(Phdr) *)(l->l_addr + eh->e_phoff);
        cc_late_module *m = &cc_late_modules[cc_late_module_count];
        uintptr_t lo = UINTPTR_MAX, hi = 0;
        for (size_t k = 0; k < eh->e_phnum; k++) {
            if (ph[k].p_type != PT_LOAD) continue;
            uintptr_t start = l->l_addr + ph[k].p_vaddr;
            if (start < lo) lo = start;
            if (start + ph[k].p_memsz > hi) hi = start + ph[k].p_memsz;
        }
        if (hi <= lo) continue;
        m->range.start = lo;
        m->range.end = hi;
        m->range.load_bias = l->l_addr;
        m->path = l->l_name;
        if (!cc_read_build_id(l->l_addr, ph, eh->e_phnum, m->build_id, sizeof(m->build_id))) m->build_id[0] = '\0';
        cc_late_module_count = cc_late_module_count + 1;
    }
}

static void cc_copy_text(char *dst, size_t cap, const char *src) {
    size_t i = 0;
    if (src != NULL)
        for (; i + 1 < cap && src[i] != '\0'; i++) dst[i] = src[i];
    dst[i] = '\0';
}

static void cc_gather_texts(void) {
    if (prctl(PR_GET_NAME, cc_thread_name) != 0) cc_thread_name[0] = '\0';
    cc_thread_name[sizeof(cc_thread_name) - 1] = '\0';
    const char *message = NULL;
    if (cc_global.swift_fatal_message != NULL)
        message = atomic_load_explicit(cc_global.swift_fatal_message, memory_order_acquire);
    cc_copy_text(cc_swift_message, sizeof(cc_swift_message), message);
    cc_copy_text(cc_exception_what, sizeof(cc_exception_what),
                 atomic_load_explicit(&cc_global.exception_what, memory_order_acquire));
    cc_copy_text(cc_exception_type, sizeof(cc_exception_type),
                 atomic_load_explicit(&cc_global.exception_type_name, memory_order_acquire));
}

static unsigned cc_run_stages(ucontext_t *uc, const cc_module_map *map) {
    // volatile: both live across siglongjmp back into this frame.
    volatile unsigned faulted = 0;
    cc_thread_name[0] = cc_swift_message[0] = cc_exception_type[0] = cc_exception_what[0] = '\0';
    for (volatile int stage = 0; stage < CC_STAGE_COUNT; stage++) {
        if (sigsetjmp(cc_stage_jump, 1) == 0) {
            cc_stage_armed = 1;
            switch (stage) {
            case CC_STAGE_UNWIND: {
                int64_t start = cc_monotonic_ns();
                cc_unwind(uc);
                cc_unwind_ns = cc_monotonic_ns() - start;
                break;
            }
            case CC_STAGE_LATE_MODULES: cc_scan_late_modules(map); break;
            case CC_STAGE_TEXTS: cc_gather_texts(); break;
            case CC_STAGE_THREADS: {
                int64_t start = cc_monotonic_ns();
                cc_threads_await(cc_unwind_other_threads);
                cc_unwind_other_threads();
                cc_fault_here_on_purpose(2);
                cc_other_threads_ns += cc_monotonic_ns() - start;
                break;
            }
            }
            cc_stage_armed = 0;
        } else {
            cc_stage_armed = 0;
            faulted |= 1u << stage;
            if (stage == CC_STAGE_UNWIND && cc_frame_count == 0) {
                cc_frames[0] = cc_registers_from(uc).pc;
                cc_frame_count = 1;
            }
        }
    }
    return faulted;
}

// MARK: - Serialization

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

static const char *cc_basename(const char *path) {
    const char *base = path;
    for (const char *p = path; *p != '\0'; p++)
        if (*p == '/') base = p + 1;
    return base;
}

static const char *cc_module_path(const cc_crash *c, long index, const char *fallback) {
    size_t base = c->map != NULL ? c->map->count : 0;
    if (index >= 0 && (size_t)index >= base) return cc_late_modules[(size_t)index - base].path;
    return fallback;
}

static void cc_append_event_head(cc_buf *b, const char *event, const char *id_suffix, int64_t time_ms) {
    cc_buf_append_str(b, "{\"type\":\"track\",\"event\":\"");
    cc_buf_append_str(b, event);
    cc_buf_append_str(b, "\",\"time\":");
    cc_buf_append_i64(b, time_ms);
    cc_buf_append_str(b, ",\"distinct_id\":");
    const char *distinct_id = atomic_load_explicit(&cc_global.current_distinct_id, memory_order_acquire);
    cc_buf_append_json_string(b, distinct_id != NULL ? distinct_id : cc_global.distinct_id, sizeof(cc_global.distinct_id));
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
}

// Module names for the readable text come from the install-time JSON: find the n-th
// "path" value without parsing the whole thing.
static void cc_append_module_name(cc_buf *b, const cc_crash *c, long index) {
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
    if (c->signo == SIGSEGV || c->signo == SIGBUS || c->signo == SIGILL || c->signo == SIGFPE) {
        cc_buf_append_str(b, " at ");
        cc_buf_append_hex(b, (uintptr_t)info->si_addr);
    }
    if (info->si_code <= 0) {
        cc_buf_append_str(b, " sent by pid ");
        cc_buf_append_i64(b, info->si_pid);
    }
    cc_buf_append_str(b, "\\nthread ");
    cc_buf_append_i64(b, c->tid);
    cc_buf_append_str(b, " \\\"");
    cc_buf_append_json_escaped(b, cc_thread_name, sizeof(cc_thread_name));
    cc_buf_append_str(b, "\\\"");
    if (c->tid == c->pid) cc_buf_append_str(b, " (main)");
    if (cc_swift_message[0] != '\0') {
        cc_buf_append_str(b, "\\n");
        cc_buf_append_json_escaped(b, cc_swift_message, 2048);
    }
    if (cc_exception_type[0] != '\0') {
        cc_buf_append_str(b, "\\nuncaught C++ exception of type ");
        cc_buf_append_json_escaped(b, cc_exception_type, 256);
        if (cc_exception_what[0] != '\0') {
            cc_buf_append_str(b, ": ");
            cc_buf_append_json_escaped(b, cc_exception_what, 1024);
        }
    }
    for (size_t i = 0; i < cc_frame_count && i < 32 && b->len - start < 12 * 1024; i++) {
        uintptr_t bias = 0;
        long index = cc_find_module(c->map, cc_frames[i], &bias);
        cc_buf_append_str(b, "\\n#");
        cc_buf_append_u64(b, i);
        cc_buf_append_str(b, " ");
        cc_buf_append_hex(b, cc_frames[i]);
        cc_buf_append_str(b, " ");
        cc_append_module_name(b, c, index);
        if (index >= 0) {
            cc_buf_append_str(b, " +");
            cc_buf_append_hex(b, cc_frames[i] - bias);
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
    cc_buf_append_str(b, "\",\"crash_fault_address\":");
    cc_buf_append_quoted_hex(b, (uintptr_t)info->si_addr);
    if (info->si_code <= 0) {
        cc_buf_append_str(b, ",\"crash_sender_pid\":");
        cc_buf_append_i64(b, info->si_pid);
        if (info->si_code == SI_QUEUE) {
            cc_buf_append_str(b, ",\"crash_signal_value\":");
            cc_buf_append_i64(b, info->si_value.sival_int);
        }
    }
    cc_buf_append_str(b, ",\"crash_tid\":");
    cc_buf_append_i64(b, c->tid);
    cc_buf_append_str(b, ",\"crash_thread_name\":");
    cc_buf_append_json_string(b, cc_thread_name, sizeof(cc_thread_name));
    cc_buf_append_str(b, ",\"crash_main_thread\":");
    cc_buf_append_str(b, c->tid == c->pid ? "true" : "false");
    if (cc_swift_message[0] != '\0') {
        cc_buf_append_str(b, ",\"crash_swift_message\":");
        cc_buf_append_json_string(b, cc_swift_message, sizeof(cc_swift_message));
    }
    if (cc_exception_type[0] != '\0') {
        cc_buf_append_str(b, ",\"crash_exception_type\":");
        cc_buf_append_json_string(b, cc_exception_type, sizeof(cc_exception_type));
    }
    if (cc_exception_what[0] != '\0') {
        cc_buf_append_str(b, ",\"crash_exception_what\":");
        cc_buf_append_json_string(b, cc_exception_what, sizeof(cc_exception_what));
    }
    cc_buf_append_str(b, ",\"crash_unwinder\":\"");
    cc_buf_append_str(b, cc_used_libunwind ? "libunwind" : "frame-pointer");
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
    int64_t elapsed_us = (cc_monotonic_ns() - c->entry_ns) / 1000;
    cc_buf_append_i64(b, elapsed_us / 1000);
    cc_buf_append_str(b, ".");
    char frac[3] = {(char)('0' + (elapsed_us / 100) % 10), (char)('0' + (elapsed_us / 10) % 10),
                    (char)('0' + elapsed_us % 10)};
    cc_buf_append(b, frac, 3);
}

static void cc_append_state(cc_buf *b, char state) {
    cc_buf_append_str(b, ",\"state\":");
    char text[2] = {state, '\0'};
    cc_buf_append_json_string(b, text, 2);
}

// Every thread, the crashing one first (its frames are the report's own). After the modules,
// so that a report too large for the record loses threads (counted), never the modules.
static void cc_append_threads(cc_buf *b, const cc_crash *c, size_t limit) {
    cc_buf_append_str(b, ",\"threads\":[{\"tid\":");
    cc_buf_append_i64(b, c->tid);
    cc_buf_append_str(b, ",\"name\":");
    cc_buf_append_json_string(b, cc_thread_name, sizeof(cc_thread_name));
    cc_buf_append_str(b, ",\"state\":\"R\",\"crashed\":true}");
    int listed = 1, left_out = 0;
    for (int i = 0; cc_thread_slot_at(i) != NULL; i++) {
        const cc_thread_slot *slot = cc_thread_slot_at(i);
        // A thread of the largest kind takes about 3.5 KiB; past the limit the rest are counted.
        if (b->len + 4096 > limit) {
            left_out++;
            continue;
        }
        listed++;
        cc_buf_append_str(b, ",{\"tid\":");
        cc_buf_append_i64(b, slot->tid);
        cc_buf_append_str(b, ",\"name\":");
        cc_buf_append_json_string(b, slot->name, sizeof(slot->name));
        cc_append_state(b, cc_thread_state(slot));
        if (cc_thread_crashed_too(slot->tid)) cc_buf_append_str(b, ",\"crashed_too\":true");
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
        if (slot->unwind_faulted) cc_buf_append_str(b, ",\"unwind_faulted\":true");
        if (slot->frame_count == CC_THREAD_FRAMES) cc_buf_append_str(b, ",\"frames_truncated\":true");
        cc_buf_append_str(b, "}");
    }
    int total = cc_threads_total_count();
    int method = cc_threads_freeze_method();
    cc_buf_append_str(b, "],\"threads_frozen_by\":\"");
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
}

static void cc_append_crash_details(cc_buf *b, const cc_crash *c) {
    // Leave room to close the JSON whatever happens: frames and modules stop early instead.
    size_t limit = b->cap > 4096 ? b->cap - 4096 : 0;
    cc_buf_append_str(b, ",\"crash\":{\"registers\":");
    cc_append_registers(b, c->uc);
    cc_buf_append_str(b, ",\"frames\":[");
    size_t written = 0;
    for (; written < cc_frame_count && b->len < limit; written++) {
        uintptr_t bias = 0;
        long index = cc_find_module(c->map, cc_frames[written], &bias);
        if (written > 0) cc_buf_append_str(b, ",");
        cc_buf_append_str(b, "{\"pc\":");
        cc_buf_append_quoted_hex(b, cc_frames[written]);
        if (index >= 0) {
            cc_buf_append_str(b, ",\"module\":");
            cc_buf_append_i64(b, index);
            cc_buf_append_str(b, ",\"offset\":");
            cc_buf_append_quoted_hex(b, cc_frames[written] - bias);
        }
        cc_buf_append_str(b, "}");
    }
    cc_buf_append_str(b, "],\"frames_truncated\":");
    cc_buf_append_str(b, written < cc_frame_count || cc_frame_count == CC_MAX_FRAMES ? "true" : "false");
    cc_buf_append_str(b, ",\"modules\":[");
    if (c->map != NULL && b->len + c->map->json_len < limit) cc_buf_append(b, c->map->json, c->map->json_len);
    for (size_t i = 0; i < cc_late_module_count && b->len < limit; i++) {
        const cc_late_module *m = &cc_late_modules[i];
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
    cc_registers r = cc_registers_from(c->uc);
    // A fault address means something only for faults the hardware raised.
    bool has_fault = c->info->si_code > 0 && (c->signo == SIGSEGV || c->signo == SIGBUS);
    cc_append_memory(b, r.sp, r.pc, (uintptr_t)c->info->si_addr, has_fault);
    cc_append_process_state(b, cc_threads_total_count());
    cc_append_threads(b, c, limit);
    cc_buf_append_str(b, "}");
}

static size_t cc_build_crashed_event(char *out, size_t cap, const cc_crash *c) {
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
static size_t cc_build_minimal_event(char *out, size_t cap, const cc_crash *c) {
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

static size_t cc_build_end_event(char *out, size_t cap, const cc_crash *c) {
    cc_buf b = {out, 0, cap, false};
    cc_append_event_head(&b, "$AppEnd", "-end", c->time_ms);
    int64_t ms = (c->entry_ns - cc_global.start_mono_ns) / 1000000;
    if (ms < 0) ms = 0;
    cc_buf_append_str(&b, ",\"$event_duration\":");
    cc_buf_append_i64(&b, ms / 1000);
    char frac[4] = {'.', (char)('0' + (ms / 100) % 10), (char)('0' + (ms / 10) % 10), (char)('0' + ms % 10)};
    cc_buf_append(&b, frac, 4);
    cc_buf_append_str(&b, ",\"$app_end_reason\":\"crash\"}}");
    return b.overflow ? 0 : b.len;
}

static size_t cc_build_timing(char *out, size_t cap, int64_t handler_ns, int64_t write_ns, int64_t sync_ns,
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
    cc_buf_append_i64(&b, cc_other_threads_ns);
    cc_buf_append_str(&b, ",\"threads_asked_ns\":");
    cc_buf_append_i64(&b, cc_threads_asked_ns);
    cc_buf_append_str(&b, ",\"kept_files_ns\":");
    cc_buf_append_i64(&b, cc_kept_files_ns);
    cc_buf_append_str(&b, ",\"unwind_ns\":");
    cc_buf_append_i64(&b, cc_unwind_ns);
    cc_buf_append_str(&b, ",\"events_ns\":");
    cc_buf_append_i64(&b, cc_events_ns);
    cc_buf_append_str(&b, ",\"threads\":");
    cc_buf_append_i64(&b, cc_threads_total_count());
    cc_buf_append_str(&b, "}");
    return b.overflow ? 0 : b.len;
}

bool cc_holds_file(int fd, dev_t dev, ino_t ino) {
    struct stat status;
    return fd >= 0 && fstat(fd, &status) == 0 && status.st_dev == dev && status.st_ino == ino;
}

bool cc_note_file(int fd, dev_t *dev, ino_t *ino) {
    struct stat status;
    if (fd < 0 || fstat(fd, &status) != 0) return false;
    *dev = status.st_dev;
    *ino = status.st_ino;
    return true;
}

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

static int cc_crash_signal;
static int cc_crash_code;

// Over the directory's bound: no report of its own, only the crash's signal in the session
// file's header, durable before the process goes on dying.
static bool cc_note_crash_not_kept(void) {
    int fd = atomic_load(&cc_global.session_fd);
    if (!cc_holds_file(fd, cc_global.session_dev, cc_global.session_ino)) return false;
    struct {
        int32_t signal;
        int32_t code;
        int64_t wall_ms;
    } note = {cc_crash_signal, cc_crash_code, cc_wall_ms()};
    return cc_write_at(fd, &note, sizeof(note), CCF_SESSION_AT_NOT_KEPT_SIGNAL) == 0 && fdatasync(fd) == 0;
}

// Names an unnamed crash file (a forked child's): linked into the directory, or into the
// directory made again where it was if it was removed; the directory is flushed unless the
// file's own flush, which follows, covers the name (flush_directory false). In a directory
// that was at its bound at install, the crash is only noted in the session file.
static void cc_publish(bool flush_directory) {
    if (cc_global.over_bound) {
        if (cc_note_crash_not_kept()) atomic_store(&cc_report_named, 3);
        return;
    }
    if (linkat(AT_FDCWD, cc_global.proc_fd_path, cc_global.dir_fd, cc_global.file_name, AT_SYMLINK_FOLLOW) == 0) {
        if (flush_directory) fsync(cc_global.dir_fd);
        atomic_store(&cc_report_named, 1);
    } else if (errno == ENOENT && cc_link_into_recreated_directory()) {
        atomic_store(&cc_report_named, 1);
    }
}

static void cc_write_report(char *out, size_t total, size_t cap, int64_t entry_ns, uint64_t allowed);
static void cc_write_timing(int fd, char *out, size_t total, size_t cap, uint64_t allowed, int64_t handler_ns,
                            int64_t write_ns, int64_t sync_ns, int64_t publish_ns, int sync_ok,
                            bool named_before_sync, bool directory_flushed);

// One line on stderr, so that a crash shows in the logs even when the capture directory is
// lost. Written only if stderr takes it at once: a full pipe nobody drains must not hang us.
static void cc_write_crash_line(const cc_crash *c) {
    if (!cc_global.crash_line) return;
    char line[1024];
    cc_buf b = {line, 0, sizeof(line) - 1, false};
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
    while (name_length < sizeof(cc_thread_name) && cc_thread_name[name_length] != '\0') name_length++;
    cc_buf_append(&b, cc_thread_name, name_length);
    cc_buf_append_str(&b, "\" at ");
    if (cc_frame_count > 0) {
        uintptr_t bias = 0;
        long index = cc_find_module(c->map, cc_frames[0], &bias);
        if (index >= 0) {
            cc_append_module_name(&b, c, index);
            cc_buf_append_str(&b, "+");
            cc_buf_append_hex(&b, cc_frames[0] - bias);
        } else {
            cc_buf_append_hex(&b, cc_frames[0]);
        }
    } else {
        cc_buf_append_str(&b, "?");
    }
    int named = atomic_load(&cc_report_named);
    cc_buf_append_str(&b, named == 1   ? "; report "
                          : named == 2 ? "; report kept in the session file for "
                          : named == 3 ? "; no report kept: the crash directory is full (noted in its session file) "
                                       : "; no report written");
    if (named != 0 && named != 3) cc_buf_append_str(&b, cc_global.file_path);
    if (named == 3) cc_buf_append_str(&b, cc_global.directory);
    cc_buf_append_str(&b, "\n");
    if (b.overflow) line[b.len - 1] = '\n';
    struct pollfd out = {.fd = STDERR_FILENO, .events = POLLOUT};
    if (poll(&out, 1, 0) == 1 && (out.revents & POLLOUT)) (void)!write(STDERR_FILENO, line, b.len);
}

static void cc_report(int signo, siginfo_t *info, ucontext_t *uc, int64_t entry_ns) {
    cc_crash_signal = signo;
    cc_crash_code = info != NULL ? info->si_code : 0;
    // The process-state files kept since install are read first, then every reserved
    // descriptor is given back: libunwind's pipe, the listing of the threads (and a named crash
    // file, if one must be reopened) find room even when the process had none left.
    int64_t kept_start = cc_monotonic_ns();
    cc_process_state_read_kept();
    cc_kept_files_ns = cc_monotonic_ns() - kept_start;
    cc_check_libunwind_pipe();
    cc_crash c = {
        .signo = signo,
        .info = info,
        .uc = uc,
        .map = atomic_load_explicit(&cc_global.module_map, memory_order_acquire),
        .pid = getpid(),
        .tid = cc_gettid(),
        .time_ms = cc_wall_ms(),
        .entry_ns = entry_ns,
    };
    // The other threads are asked first, so the report shows them as they were when the crash
    // came; they answer while this thread unwinds itself (the stages before CC_STAGE_THREADS).
    int64_t asked = cc_monotonic_ns();
    cc_threads_ask(c.tid, asked + CC_THREAD_ANSWER_NS);
    cc_other_threads_ns = cc_threads_asked_ns = cc_monotonic_ns() - asked;
    c.faulted_stages = cc_run_stages(uc, c.map);

    char *out = cc_record;
    size_t cap = sizeof(cc_record);
    int64_t events_start = cc_monotonic_ns();
    // The $AppEnd that follows needs a few hundred bytes; 16 KiB are left for it.
    size_t crashed = cc_build_crashed_event(out + CCF_RECORD_HEADER_SIZE, cap - 16384, &c);
    if (crashed == 0) crashed = cc_build_minimal_event(out + CCF_RECORD_HEADER_SIZE, cap - 16384, &c);
    cc_frame_in_place(out, CCF_RECORD_EVENT, crashed);
    size_t total = CCF_RECORD_HEADER_SIZE + crashed;
    // A session already ended normally ($AppEnd tracked, then a crash in an atexit handler)
    // must not get a second $AppEnd.
    if (!atomic_load(&cc_global.session_ended)) {
        size_t end = cc_build_end_event(out + total + CCF_RECORD_HEADER_SIZE, cap - total - CCF_RECORD_HEADER_SIZE, &c);
        cc_frame_in_place(out + total, CCF_RECORD_EVENT, end);
        total += CCF_RECORD_HEADER_SIZE + end;
    }
    cc_events_ns = cc_monotonic_ns() - events_start;

    // RLIMIT_FSIZE lowered since install: a write past it raises SIGXFSZ, and the process would
    // die of that instead of its own signal. The soft limit is lifted to the hard one for our
    // writes and put back after; nothing is written past what remains allowed.
    struct rlimit fsize;
    bool limited = getrlimit(RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY;
    bool lifted = false;
    uint64_t allowed = UINT64_MAX;
    if (limited) {
        struct rlimit hard = {fsize.rlim_max, fsize.rlim_max};
        lifted = fsize.rlim_max > fsize.rlim_cur && setrlimit(RLIMIT_FSIZE, &hard) == 0;
        allowed = lifted ? (fsize.rlim_max == RLIM_INFINITY ? UINT64_MAX : fsize.rlim_max) : fsize.rlim_cur;
    }
    cc_write_report(out, total, cap, entry_ns, allowed);
    if (lifted) setrlimit(RLIMIT_FSIZE, &fsize);
    cc_write_crash_line(&c);
    // The other threads stay frozen: cc_chain lets go of them only for a handler of the app's.
}

// A named crash file that will hold no report (no room under the file-size limit, or the
// write failed) is removed: the session file tells of the session, and no name is left on a
// file that holds nothing, or half a report.
static void cc_remove_named_crash_file(void) {
    if (!cc_global.anonymous_file) unlinkat(cc_global.dir_fd, cc_global.file_name, 0);
}

static void cc_write_report(char *out, size_t total, size_t cap, int64_t entry_ns, uint64_t allowed) {
    if (cc_global.record_offset + total > allowed) {
        cc_remove_named_crash_file();
        return;
    }
    int fd = cc_crash_fd();
    if (fd < 0) return;
    int64_t write_start = cc_monotonic_ns();
    if (lseek(fd, (off_t)cc_global.record_offset, SEEK_SET) < 0 || cc_write_all(fd, out, total) != 0) {
        cc_remove_named_crash_file();
        return;
    }
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
                atomic_store(&cc_report_named, 1);
                cc_write_timing(again, out, total, cap, allowed, done - entry_ns, written - write_start, 0,
                                done - written, 1, false, true);
                close(again);
            } else if (cc_keep_in_session_file(out, total, allowed)) {
                // No new file in the directory either (read-only): the session file keeps it.
                atomic_store(&cc_report_named, 2);
                atomic_store(&cc_report_written, 1);
            }
            return;
        }
        // On ext4 the file's flush also makes its name durable: without a journal,
        // ext4_sync_parent writes the directory of a file named since its last flush; with one,
        // fdatasync commits the transaction that reserved the file's space, which install began
        // after the one that named it. Elsewhere the directory is flushed too.
        sync_ok = fdatasync(fd) == 0;
        int64_t synced = cc_monotonic_ns();
        if (!cc_global.fsync_covers_new_name) fsync(cc_global.dir_fd);
        atomic_store(&cc_report_named, 1);
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
        directory_flushed = !named_before_sync && atomic_load(&cc_report_named) == 1;
    }
    int64_t done = cc_monotonic_ns();
    cc_write_timing(fd, out, total, cap, allowed, done - entry_ns, written - write_start, sync_ns, publish_ns,
                    sync_ok, named_before_sync, directory_flushed);
}

// Timings are known only at the end; they ride in a record of their own that the kernel
// flushes on its own schedule (the page cache outlives the process).
static void cc_write_timing(int fd, char *out, size_t total, size_t cap, uint64_t allowed, int64_t handler_ns,
                            int64_t write_ns, int64_t sync_ns, int64_t publish_ns, int sync_ok,
                            bool named_before_sync, bool directory_flushed) {
    atomic_store(&cc_report_written, 1);
    size_t timing = cc_build_timing(out + CCF_RECORD_HEADER_SIZE, cap - CCF_RECORD_HEADER_SIZE, handler_ns,
                                    write_ns, sync_ns, publish_ns, sync_ok, named_before_sync, directory_flushed);
    if (timing > 0 && cc_global.record_offset + total + CCF_RECORD_HEADER_SIZE + timing <= allowed) {
        cc_frame_in_place(out, CCF_RECORD_TIMING, timing);
        cc_write_all(fd, out, CCF_RECORD_HEADER_SIZE + timing);
    }
}

// MARK: - Chaining

static void cc_set_default(int signo) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(signo, &dfl, NULL);
}

// Sends the signal again to this thread with the original siginfo (si_code, si_pid,
// si_value), under the default action, so the process ends by it with a core dump.
static void cc_reraise(int signo, siginfo_t *info) {
    cc_set_default(signo);
    siginfo_t copy = *info;
    if (syscall(SYS_rt_tgsigqueueinfo, getpid(), cc_gettid(), signo, &copy) != 0)
        syscall(SYS_tgkill, getpid(), cc_gettid(), signo);
    sigset_t unblock;
    sigemptyset(&unblock);
    sigaddset(&unblock, signo);
    pthread_sigmask(SIG_UNBLOCK, &unblock, NULL);
}

static bool cc_is_default(const struct sigaction *sa) {
    return !(sa->sa_flags & SA_SIGINFO) && sa->sa_handler == SIG_DFL;
}

static bool cc_is_ignore(const struct sigaction *sa) {
    return !(sa->sa_flags & SA_SIGINFO) && sa->sa_handler == SIG_IGN;
}

static void cc_chain(int signo, siginfo_t *info, void *context) {
    struct sigaction previous = cc_global.previous[signo];
    bool recurs = cc_fault_recurs(signo, info);
    if (cc_is_ignore(&previous)) {
        // Only a hardware fault gets here (sent signals returned early), and the kernel
        // does not let one be ignored: the default action is what would have happened.
        cc_set_default(signo);
        if (!recurs) cc_reraise(signo, info);
        return;
    }
    sigaction(signo, &previous, NULL);
    if (cc_is_default(&previous)) {
        if (!recurs) cc_reraise(signo, info);
        return;
    }
    // An earlier handler (the Swift runtime's backtracer, the app's own) may want the other
    // threads (to list or suspend them itself), and may let the process go on: the report is
    // durable, so the threads go on first.
    cc_threads_release();
    // Call the previous handler as the kernel would have: its sa_mask added to the mask of
    // the interrupted code, the signal itself blocked unless SA_NODEFER, reset if asked.
    if (previous.sa_flags & SA_RESETHAND) cc_set_default(signo);
    sigset_t mask = ((ucontext_t *)context)->uc_sigmask;
    for (int s = 1; s < NSIG; s++)
        if (sigismember(&previous.sa_mask, s) == 1) sigaddset(&mask, s);
    if (previous.sa_flags & SA_NODEFER)
        sigdelset(&mask, signo);
    else
        sigaddset(&mask, signo);
    sigset_t saved;
    pthread_sigmask(SIG_SETMASK, &mask, &saved);
    if (previous.sa_flags & SA_SIGINFO)
        previous.sa_sigaction(signo, info, context);
    else
        previous.sa_handler(signo);
    pthread_sigmask(SIG_SETMASK, &saved, NULL);
    cc_threads_release_held();
    // A fault that recurs meets whatever disposition the previous handler left; a sent
    // signal does not come back by itself, and the session is over: end it as the default would.
    if (!recurs) cc_reraise(signo, info);
}

// MARK: - Entry points

// The crash belongs to the first thread, in any copy of CrashCapture in the process, to take
// the word that every copy finds at install (crashcapture_crash_owner, looked up by name).
static bool cc_claim(pid_t self) {
    pid_t none = 0;
    return atomic_compare_exchange_strong(cc_global.crash_owner, &none, self) || none == self;
}

// This copy's session is the other copy's: its files go, so that replay finds one session
// that crashed, not a second one that seems killed. A journal of events is kept for replay.
static void cc_give_way_to_other_copy(void) {
    atomic_store(&cc_global.session_ended, 1);
    if (!cc_global.anonymous_file) unlinkat(cc_global.dir_fd, cc_global.file_name, 0);
    if (cc_global.sdk_session) return;
    char name[128];
    cc_buf b = {name, 0, sizeof(name) - 1, false};
    cc_buf_append_str(&b, CCF_SESSION_FILE_PREFIX);
    cc_buf_append_str(&b, cc_global.session_id);
    cc_buf_append_str(&b, "." CCF_SESSION_FILE_EXTENSION);
    name[b.len] = '\0';
    if (!b.overflow) unlinkat(cc_global.dir_fd, name, 0);
}

// For the exit paths (atexit, the preload's and the SDK's ends of a session): while a crash
// is being reported, a thread that reaches them must neither end the session as clean nor
// delete anything. Another thread waits here until the process dies (bounded); the reporting
// thread itself (a handler we chained to called exit) returns at once. 1: a crash was seen.
int crashcapture_crash_in_progress(void) {
    pid_t reporting = atomic_load(&cc_reporting_tid);
    if (reporting == 0) return 0;
    if (reporting != cc_gettid()) {
        struct timespec tick = {0, 10 * 1000000};
        for (int waited = 0; waited < 3000; waited++) nanosleep(&tick, NULL);
    }
    return 1;
}

void cc_signal_handler(int signo, siginfo_t *info, void *context) {
    int saved_errno = errno;
    int64_t entry_ns = cc_monotonic_ns();
    const struct sigaction *previous = &cc_global.previous[signo];
    if (info->si_code <= 0 && cc_is_ignore(previous)) {
        // Without us a sent signal would have been ignored: stay invisible.
        errno = saved_errno;
        return;
    }
    if (!atomic_load(&cc_global.installed)) {
        // Uninstalled, but a handler installed after us still chains here: pass it on.
        cc_chain(signo, info, context);
        errno = saved_errno;
        return;
    }
    pid_t self = cc_gettid();
    pid_t expected = 0;
    if (atomic_load(&cc_reporting_tid) == self) {
        if (cc_thread_unwind_armed) siglongjmp(cc_thread_unwind_jump, 1);
        if (cc_stage_armed) siglongjmp(cc_stage_jump, 1);
        // A fault after the report (in a chained handler, say): let it take its course.
        cc_chain(signo, info, context);
    } else if (atomic_load(cc_global.crash_owner) == self &&
               atomic_compare_exchange_strong(&cc_reporting_tid, &expected, self)) {
        // Another copy of CrashCapture in this process (the preload library beside a linked
        // install) reported this crash before chaining to us: one crash, one report.
        cc_give_way_to_other_copy();
        atomic_store(&cc_report_written, 1);
        cc_chain(signo, info, context);
    } else if (cc_claim(self) && atomic_compare_exchange_strong(&cc_reporting_tid, &expected, self)) {
        cc_report(signo, info, (ucontext_t *)context, entry_ns);
        atomic_store(&cc_report_written, 1);
        cc_chain(signo, info, context);
    } else {
        // Another thread is reporting. Give it time to finish and to end the process with
        // its own signal; if it does not within the bound, end it with ours.
        cc_threads_note_waiting_crasher(self);
        // Answer the reporter's request for this thread's context while waiting: the report
        // then shows this crash's stack too (libunwind crosses this handler's signal frame).
        if (cc_global.thread_signal > 0) {
            sigset_t ask;
            sigemptyset(&ask);
            sigaddset(&ask, cc_global.thread_signal);
            pthread_sigmask(SIG_UNBLOCK, &ask, NULL);
        }
        struct timespec tick = {0, 1000000};
        for (int waited_ms = 0; waited_ms < 20000 && !atomic_load(&cc_report_written); waited_ms++)
            nanosleep(&tick, NULL);
        for (int waited_ms = 0; waited_ms < 10000; waited_ms++) nanosleep(&tick, NULL);
        cc_chain(signo, info, context);
    }
    errno = saved_errno;
}
