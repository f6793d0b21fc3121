// Stacks: registers out of a context, the walk (libunwind when it was found at install, else
// frame pointers), which module holds an address, and the modules loaded since install.
// The rules of crash_path.c apply here: this runs after a fatal signal (signal-safety(7)),
// allocates nothing, takes no lock, and calls nothing above it in the crash path.
#include <link.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <ucontext.h>
#include <unistd.h>

#include "cc_internal.h"
#include "crash_report.h"

// MARK: - Registers


cc_registers cc_registers_from(const ucontext_t *uc) {
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

void cc_append_registers(cc_buf *b, const ucontext_t *uc) {
    // pc, sp and fp under the same names on every architecture, then the architecture's own.
    cc_registers r = cc_registers_from(uc);
    cc_buf_append_str(b, "{\"pc\":");
    cc_buf_append_quoted_hex(b, r.pc);
    cc_buf_append_str(b, ",\"sp\":");
    cc_buf_append_quoted_hex(b, r.sp);
    cc_buf_append_str(b, ",\"fp\":");
    cc_buf_append_quoted_hex(b, r.fp);
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
    for (size_t i = 0; i < sizeof(regs) / sizeof(regs[0]); i++) {
        cc_buf_append_str(b, ",\"");
        cc_buf_append_str(b, regs[i].name);
        cc_buf_append_str(b, "\":");
        cc_buf_append_quoted_hex(b, (uint64_t)uc->uc_mcontext.gregs[regs[i].index]);
    }
#elif defined(__aarch64__)
    for (int i = 0; i < 31; i++) {
        cc_buf_append_str(b, ",\"x");
        cc_buf_append_u64(b, (uint64_t)i);
        cc_buf_append_str(b, "\":");
        cc_buf_append_quoted_hex(b, uc->uc_mcontext.regs[i]);
    }
#endif
    cc_buf_append_str(b, "}");
}

// What the crashing thread found, for the report (crash_report.h).
cc_findings cc_found;


static bool cc_in_module(const cc_module *m, uintptr_t pc) { return pc >= m->start && pc < m->end; }

bool cc_in_any_module(uintptr_t pc) {
    const cc_module_map *map = atomic_load_explicit(&cc_global.module_map, memory_order_acquire);
    if (map == NULL) return false;
    for (size_t i = 0; i < map->count; i++)
        if (cc_in_module(&map->modules[i], pc)) return true;
    return false;
}

// A call through a bad function pointer faults at the bad address, where no unwind info
// exists, and unwinders then skip the caller. The call has just pushed its return address
// (x86_64: at sp; aarch64: in the link register): put that frame back.
void cc_recover_bad_call(const ucontext_t *uc) {
    if (cc_found.frame_count == 0 || cc_in_any_module(cc_found.frames[0])) return;
#if defined(__x86_64__)
    uintptr_t caller = *(const uintptr_t *)(uintptr_t)uc->uc_mcontext.gregs[REG_RSP];
#elif defined(__aarch64__)
    uintptr_t caller = (uintptr_t)uc->uc_mcontext.regs[30];
#else
    uintptr_t caller = 0;
#endif
    if (!cc_in_any_module(caller) || (cc_found.frame_count > 1 && cc_found.frames[1] == caller)) return;
    size_t count = cc_found.frame_count < CC_MAX_FRAMES ? cc_found.frame_count + 1 : CC_MAX_FRAMES;
    for (size_t i = count - 1; i > 1; i--) cc_found.frames[i] = cc_found.frames[i - 1];
    cc_found.frames[1] = caller;
    cc_found.frame_count = count;
}

// libunwind probes memory by writing to a pipe it made at install (two non-blocking
// descriptors). A program that closed them and reused the numbers (a full blocking pipe, say)
// would block it: then the stacks are walked by frame pointers instead.
static bool cc_libunwind_usable = true;

void cc_check_libunwind_pipe(void) {
    cc_libunwind_usable = true;
    for (int i = 0; i < 2; i++)
        if (cc_global.unwinder_pipe[i] >= 0 &&
            !cc_holds_file(cc_global.unwinder_pipe[i], cc_global.unwinder_pipe_dev, cc_global.unwinder_pipe_ino))
            cc_libunwind_usable = false;
}

// Walks a stack from a saved context into `frames`: libunwind when it was found at install,
// else (or when it finds no caller) frame pointers. *count grows as frames are found, so a
// fault part-way (caught by the stage guard) keeps the frames found before it.
void cc_walk(ucontext_t *uc, uintptr_t *frames, size_t max, volatile size_t *count, volatile int *used_libunwind) {
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

// Words of this process's memory, read by the kernel: an unmapped address fails the call
// instead of faulting in the crash path.
static bool cc_read_words(uintptr_t address, uintptr_t *out, size_t n) {
    struct iovec local = {out, n * sizeof(*out)};
    struct iovec remote = {(void *)address, n * sizeof(*out)};
    return syscall(SYS_process_vm_readv, getpid(), &local, 1UL, &remote, 1UL, 0UL) == (long)(n * sizeof(*out));
}

// A Swift async function keeps its async context in the word below its frame record (the
// swiftasync convention; Swift on Linux does not mark such records, as it does on Darwin). A
// context begins with its parent context and the function the parent resumes at: following
// parents gives the task's logical callers, which after a suspension are on no stack at all.
// Which frame is async is not known here, so the first frame whose word below the record
// leads to a chain of resume functions inside loaded modules is taken, and the function
// owning that frame is recorded: replay keeps the chain only if that function is async.
void cc_walk_async_chain(uintptr_t pc, uintptr_t fp, uintptr_t sp, uintptr_t *frames, size_t max,
                         volatile size_t *count, volatile uintptr_t *owner) {
    *count = 0;
    *owner = 0;
    uintptr_t function_pc = pc;
    for (int depth = 0; depth < 64 && fp != 0 && (fp & 7) == 0 && fp > sp; depth++) {
        // The word below the record, the saved frame pointer and the return address: one read.
        uintptr_t record[3];
        if (!cc_read_words(fp - sizeof(uintptr_t), record, 3)) return;
        uintptr_t context = record[0], saved = record[1], ret = record[2];
        // A context lives on the heap or in a task's slab, never on this thread's stack.
        if (context != 0 && (context & 7) == 0 && (context < sp || context > fp + (1 << 23))) {
            size_t found = 0;
            uintptr_t link[2];  // the parent context, and the function it resumes at
            // A context's parent is another context (or none), never an address in a module: a
            // heap object's first word, its type's metadata, is, which tells the two apart.
            // A task's chain ends at its root context, whose parent is none; a word that only
            // looked like a context leads, a link or two on, to one that is neither: that chain
            // is dropped and the walk goes on up the stack (a stale heap pointer in a non-async
            // frame's slot once hid a release server's whole request path).
            bool ended = false;
            while (found < max) {
                if (context == 0) {
                    ended = true;
                    break;
                }
                if ((context & 7) != 0 || !cc_read_words(context, link, 2) || !cc_in_any_module(link[1]) ||
                    cc_in_any_module(link[0]) || link[0] == context)
                    break;
                frames[found++] = link[1];
                context = link[0];
            }
            if (found > 0 && (ended || found == max)) {
                *owner = function_pc;
                *count = found;
                return;
            }
        }
        if (saved <= fp) return;
        function_pc = ret;
        fp = saved;
    }
}

// Index of the module holding pc in the combined list (install-time map, then late ones).
long cc_find_module(const cc_module_map *map, uintptr_t pc, uintptr_t *bias) {
    if (map != NULL) {
        for (size_t i = 0; i < map->count; i++) {
            if (cc_in_module(&map->modules[i], pc)) {
                *bias = map->modules[i].load_bias;
                return (long)i;
            }
        }
    }
    size_t base = map != NULL ? map->count : 0;
    for (size_t i = 0; i < cc_found.late_module_count; i++) {
        if (cc_in_module(&cc_found.late_modules[i].range, pc)) {
            *bias = cc_found.late_modules[i].range.load_bias;
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
void cc_scan_late_modules(const cc_module_map *map) {
    cc_found.late_module_count = 0;
    bool missing = false;
    uintptr_t unused;
    for (size_t i = 0; i < cc_found.frame_count; i++)
        if (cc_find_module(map, cc_found.frames[i], &unused) < 0) missing = true;
    if (!missing) return;
    for (struct link_map *l = _r_debug.r_map; l != NULL && cc_found.late_module_count < CC_MAX_LATE_MODULES; l = l->l_next) {
        if (l->l_addr == 0 || cc_bias_known(map, l->l_addr)) continue;
        const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)l->l_addr;
        if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0) continue;
        const ElfW(Phdr) *ph = (const ElfW(Phdr) *)(l->l_addr + eh->e_phoff);
        cc_late_module *m = &cc_found.late_modules[cc_found.late_module_count];
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
        // The program itself is "" in the loader's list: its path is read now (readlink is
        // async-signal-safe), once.
        if (l->l_name != NULL && l->l_name[0] == '\0' && cc_global.executable_path[0] == '\0') {
            ssize_t n = readlink("/proc/self/exe", cc_global.executable_path, sizeof(cc_global.executable_path) - 1);
            cc_global.executable_path[n > 0 ? n : 0] = '\0';
        }
        m->path = l->l_name != NULL && l->l_name[0] == '\0' && cc_global.executable_path[0] != '\0'
                      ? cc_global.executable_path
                      : l->l_name;
        if (!cc_read_build_id(l->l_addr, ph, eh->e_phnum, m->build_id, sizeof(m->build_id))) m->build_id[0] = '\0';
        cc_found.late_module_count = cc_found.late_module_count + 1;
    }
}

// MARK: - The name of a Swift task

// Reads up to n bytes of our own memory at `address` without risking a fault: process_vm_readv
// on ourselves stops where the memory does. The bytes read.
static size_t cc_read_own(void *out, uintptr_t address, size_t n) {
    struct iovec local = {out, n}, remote = {(void *)address, n};
    long got = syscall(SYS_process_vm_readv, getpid(), &local, 1L, &remote, 1L, 0L);
    return got > 0 ? (size_t)got : 0;
}

// The task layout of cc_find_swift_task_layout (version 1, 64-bit).
#define CC_TASK_JOB_FLAGS 32
#define CC_TASK_HAS_NAME (1u << 30)
#define CC_TASK_STATUS_FLAGS 96
#define CC_TASK_STATUS_RUNNING 0x800u
#define CC_TASK_INNERMOST_RECORD 104
#define CC_TASK_RECORD_KIND_NAME 6

static uintptr_t cc_task_stack_words[2048];  // the reporting thread's alone (a crash or a hang)

uintptr_t cc_task_on_stack(uintptr_t sp) {
    uintptr_t metadata = atomic_load(&cc_global.swift_task_metadata);
    if (metadata == 0 || sp == 0) return 0;
    size_t words = cc_read_own(cc_task_stack_words, sp & ~(uintptr_t)7, sizeof(cc_task_stack_words)) / 8;
    int looked = 0;
    for (size_t i = 0; i < words && looked < 256; i++) {
        uintptr_t word = cc_task_stack_words[i];
        // A task is a heap object: 16-byte aligned, in the user half of the address space.
        if (word < 65536 || (word & 15) != 0 || word >= ((uintptr_t)1 << 47)) continue;
        looked++;
        uintptr_t isa = 0;
        if (cc_read_own(&isa, word, sizeof(isa)) != sizeof(isa) || isa != metadata) continue;
        uint32_t status = 0;
        if (cc_read_own(&status, word + CC_TASK_STATUS_FLAGS, sizeof(status)) != sizeof(status)) continue;
        if (status & CC_TASK_STATUS_RUNNING) return word;
    }
    return 0;
}

bool cc_task_name(uintptr_t task, char *out, size_t cap) {
    out[0] = '\0';
    uintptr_t metadata = atomic_load(&cc_global.swift_task_metadata);
    if (task == 0 || metadata == 0 || cap < 2) return false;
    uintptr_t head[CC_TASK_INNERMOST_RECORD / 8 + 1];
    if (cc_read_own(head, task, sizeof(head)) != sizeof(head) || head[0] != metadata) return false;
    uint32_t flags;
    memcpy(&flags, (const char *)head + CC_TASK_JOB_FLAGS, sizeof(flags));
    if (!(flags & CC_TASK_HAS_NAME)) return false;
    uintptr_t record = head[CC_TASK_INNERMOST_RECORD / 8];
    for (int i = 0; i < 16 && record != 0; i++) {
        uintptr_t fields[3];  // flags (the kind in the low byte), parent, and a name record's text
        if (cc_read_own(fields, record, sizeof(fields)) != sizeof(fields)) return false;
        if ((fields[0] & 0xff) == CC_TASK_RECORD_KIND_NAME) {
            size_t got = cc_read_own(out, fields[2], cap - 1);
            out[got] = '\0';
            return out[0] != '\0';
        }
        record = fields[1];
    }
    return false;
}
