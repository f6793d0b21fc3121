// A program linked with `--static-swift-stdlib` carries the Swift runtime, Concurrency and
// Dispatch inside its own file and exports none of their symbols; the linker even drops the
// ones nothing calls (swift_getFatalErrorMessageBuffer, the debugger's task metadata). dlsym
// then finds no swift_job_run, no task accessor and no fatal error buffer, and no module is
// libswift_Concurrency. Their addresses are read once from the program's own symbol table
// (.symtab, kept by `swift build` in release too), once, off the caller's thread
// (static_runtime_reader.c). This file only reads; it calls nothing above it.
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cc_internal.h"

static cc_static_swift_runtime cc_static_runtime;
static pthread_once_t cc_static_runtime_once = PTHREAD_ONCE_INIT;
static _Atomic bool cc_static_runtime_scanned;

bool cc_static_swift_runtime_read(void) { return atomic_load(&cc_static_runtime_scanned); }

static int cc_note_executable_bias(struct dl_phdr_info *info, size_t size, void *context) {
    (void)size;
    *(uintptr_t *)context = info->dlpi_addr;
    return 1;  // the program is the first object the loader lists
}

static bool cc_section_name_is(const char *names, size_t names_size, uint32_t offset, const char *prefix) {
    size_t n = strlen(prefix);
    return offset < names_size && names_size - offset > n && strncmp(names + offset, prefix, n) == 0;
}

// Whether `image` (a whole ELF file of `size` bytes) holds Swift metadata (a swift5_* section)
// and, if so, the addresses its .symtab gives for what the crash path looks for.
static void cc_scan_symbol_table(const unsigned char *image, size_t size, uintptr_t bias) {
    const ElfW(Ehdr) *eh = (const ElfW(Ehdr) *)image;
    if (size < sizeof(*eh) || memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) ||
        eh->e_shentsize != sizeof(ElfW(Shdr)) || eh->e_shoff >= size ||
        (size - eh->e_shoff) / sizeof(ElfW(Shdr)) < eh->e_shnum || eh->e_shstrndx >= eh->e_shnum)
        return;
    const ElfW(Shdr) *sections = (const ElfW(Shdr) *)(image + eh->e_shoff);
    const ElfW(Shdr) *names_section = &sections[eh->e_shstrndx];
    if (names_section->sh_offset >= size || size - names_section->sh_offset < names_section->sh_size) return;
    const char *names = (const char *)image + names_section->sh_offset;
    bool swift = false;
    const ElfW(Shdr) *symtab = NULL;
    for (size_t i = 0; i < eh->e_shnum; i++) {
        if (cc_section_name_is(names, names_section->sh_size, sections[i].sh_name, "swift5_")) swift = true;
        if (sections[i].sh_type == SHT_SYMTAB) symtab = &sections[i];
    }
    if (!swift || symtab == NULL || symtab->sh_link >= eh->e_shnum) return;
    const ElfW(Shdr) *strtab = &sections[symtab->sh_link];
    if (symtab->sh_offset >= size || size - symtab->sh_offset < symtab->sh_size || strtab->sh_offset >= size ||
        size - strtab->sh_offset < strtab->sh_size || symtab->sh_entsize != sizeof(ElfW(Sym)))
        return;
    const ElfW(Sym) *symbols = (const ElfW(Sym) *)(image + symtab->sh_offset);
    const char *strings = (const char *)image + strtab->sh_offset;
    size_t count = symtab->sh_size / sizeof(ElfW(Sym));
    for (size_t i = 0; i < count; i++) {
        const ElfW(Sym) *s = &symbols[i];
        if (s->st_value == 0 || s->st_name >= strtab->sh_size) continue;
        const char *name = strings + s->st_name;
        // Most names are Swift's ($s...) or C++'s: two bytes rule them out before any compare.
        if (name[0] == '$' || (name[0] == '_' && name[1] == 'Z' && name[2] != 'L')) continue;
        uintptr_t address = bias + (uintptr_t)s->st_value;
        if (strcmp(name, "swift_job_run") == 0) {
            cc_static_runtime.job_run_start = address;
            cc_static_runtime.job_run_end = address + (s->st_size > 0 ? s->st_size : 1);
        } else if (strcmp(name, "swift_task_getCurrent") == 0) {
            cc_static_runtime.task_get_current = address;
        } else if (strcmp(name, "_ZL18kFatalErrorMessage") == 0 ||
                   strcmp(name, "swift_getFatalErrorMessageBuffer") == 0) {
            // The buffer itself, or the function that returns it (either may be dropped).
            if (name[0] == '_') cc_static_runtime.fatal_message = address;
            else cc_static_runtime.fatal_message_function = address;
        }
    }
}

static void cc_find_static_swift_runtime(void) {
    // Only a program with no Swift runtime library loaded can carry its own.
    if (dlsym(RTLD_DEFAULT, "swift_job_run") != NULL || dlsym(RTLD_DEFAULT, "swift_release") != NULL) return;
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_size > (off_t)sizeof(ElfW(Ehdr))) {
        // Mapped, not read: only the section headers and the two tables are ever touched.
        void *image = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (image != MAP_FAILED) {
            uintptr_t bias = 0;
            dl_iterate_phdr(cc_note_executable_bias, &bias);
            cc_scan_symbol_table(image, (size_t)st.st_size, bias);
            munmap(image, (size_t)st.st_size);
        }
    }
    close(fd);
}

static void cc_scan_once(void) {
    cc_find_static_swift_runtime();
    atomic_store(&cc_static_runtime_scanned, true);
}

const cc_static_swift_runtime *cc_static_swift_runtime_find(void) {
    pthread_once(&cc_static_runtime_once, cc_scan_once);
    return &cc_static_runtime;
}

const cc_static_swift_runtime *cc_static_swift_runtime_known(void) {
    static const cc_static_swift_runtime none;
    return atomic_load(&cc_static_runtime_scanned) ? &cc_static_runtime : &none;
}
