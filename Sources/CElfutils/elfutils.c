#include "crashcapture_elfutils.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include "libdw_abi.h"
#include "safe_paths.h"

static struct {
    const char *unavailable;
    Dwfl *(*begin)(const Dwfl_Callbacks *);
    void (*end)(Dwfl *);
    int (*error_number)(void);
    const char *(*error_message)(int);
    void (*report_begin)(Dwfl *);
    Dwfl_Module *(*report_elf)(Dwfl *, const char *, const char *, int, Dwarf_Addr, bool);
    int (*report_end)(Dwfl *, int (*)(Dwfl_Module *, void *, const char *, Dwarf_Addr, void *), void *);
    int (*module_build_id)(Dwfl_Module *, const unsigned char **, Dwarf_Addr *);
    const char *(*module_info)(
        Dwfl_Module *, void ***, Dwarf_Addr *, Dwarf_Addr *, Dwarf_Addr *, Dwarf_Addr *, const char **,
        const char **);
    Dwarf *(*module_getdwarf)(Dwfl_Module *, Dwarf_Addr *);
    const char *(*module_addrinfo)(Dwfl_Module *, Dwarf_Addr, Dwarf_Addr *, Elf64_Sym *, uint32_t *, Elf **, Dwarf_Addr *);
    Dwarf_Die *(*module_addrdie)(Dwfl_Module *, Dwarf_Addr, Dwarf_Addr *);
    Dwfl_find_elf *build_id_find_elf;
    Dwfl_find_debuginfo *standard_find_debuginfo;
    Dwfl_section_address *offline_section_address;
    int (*child)(Dwarf_Die *, Dwarf_Die *);
    int (*siblingof)(Dwarf_Die *, Dwarf_Die *);
    int (*haspc)(Dwarf_Die *, Dwarf_Addr);
    uint64_t (*dieoffset)(Dwarf_Die *);
    int (*lowpc)(Dwarf_Die *, Dwarf_Addr *);
    int (*tag)(Dwarf_Die *);
    Dwarf_Attribute *(*attr_integrate)(Dwarf_Die *, unsigned int, Dwarf_Attribute *);
    const char *(*formstring)(Dwarf_Attribute *);
    int (*formudata)(Dwarf_Attribute *, Dwarf_Word *);
    int (*getsrcfiles)(Dwarf_Die *, Dwarf_Files **, size_t *);
    const char *(*filesrc)(Dwarf_Files *, size_t, Dwarf_Word *, Dwarf_Word *);
    Dwarf_Die *(*module_nextcu)(Dwfl_Module *, Dwarf_Die *, Dwarf_Addr *);
    ptrdiff_t (*ranges)(Dwarf_Die *, ptrdiff_t, Dwarf_Addr *, Dwarf_Addr *, Dwarf_Addr *);
    Dwarf_Line *(*getsrc_die)(Dwarf_Die *, Dwarf_Addr);
    const char *(*linesrc)(Dwarf_Line *, Dwarf_Word *, Dwarf_Word *);
    int (*lineno)(Dwarf_Line *, int *);
    int (*linecol)(Dwarf_Line *, int *);
} dw;

static pthread_once_t dw_once = PTHREAD_ONCE_INIT;

#define RESOLVE(field, symbol)                                                                                     \
    do {                                                                                                           \
        *(void **)&dw.field = dlsym(library, symbol);                                                              \
        if (dw.field == NULL) {                                                                                    \
            dw.unavailable = "libdw.so.1 lacks " symbol;                                                          \
            return;                                                                                                \
        }                                                                                                          \
    } while (0)

static void load_libdw(void) {
    void *library = dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        dw.unavailable = "libdw.so.1 is not installed (Debian: apt-get install libdw1)";
        return;
    }
    RESOLVE(begin, "dwfl_begin");
    RESOLVE(end, "dwfl_end");
    RESOLVE(error_number, "dwfl_errno");
    RESOLVE(error_message, "dwfl_errmsg");
    RESOLVE(report_begin, "dwfl_report_begin");
    RESOLVE(report_elf, "dwfl_report_elf");
    RESOLVE(report_end, "dwfl_report_end");
    RESOLVE(module_build_id, "dwfl_module_build_id");
    RESOLVE(module_info, "dwfl_module_info");
    RESOLVE(module_getdwarf, "dwfl_module_getdwarf");
    RESOLVE(module_addrinfo, "dwfl_module_addrinfo");
    RESOLVE(module_addrdie, "dwfl_module_addrdie");
    RESOLVE(build_id_find_elf, "dwfl_build_id_find_elf");
    RESOLVE(standard_find_debuginfo, "dwfl_standard_find_debuginfo");
    RESOLVE(offline_section_address, "dwfl_offline_section_address");
    RESOLVE(child, "dwarf_child");
    RESOLVE(siblingof, "dwarf_siblingof");
    RESOLVE(haspc, "dwarf_haspc");
    RESOLVE(dieoffset, "dwarf_dieoffset");
    RESOLVE(lowpc, "dwarf_lowpc");
    RESOLVE(tag, "dwarf_tag");
    RESOLVE(attr_integrate, "dwarf_attr_integrate");
    RESOLVE(formstring, "dwarf_formstring");
    RESOLVE(formudata, "dwarf_formudata");
    RESOLVE(getsrcfiles, "dwarf_getsrcfiles");
    RESOLVE(filesrc, "dwarf_filesrc");
    RESOLVE(module_nextcu, "dwfl_module_nextcu");
    RESOLVE(ranges, "dwarf_ranges");
    RESOLVE(getsrc_die, "dwarf_getsrc_die");
    RESOLVE(linesrc, "dwarf_linesrc");
    RESOLVE(lineno, "dwarf_lineno");
    RESOLVE(linecol, "dwarf_linecol");
    dw.unavailable = NULL;
}

const char *ccs_libdw_unavailable(void) {
    pthread_once(&dw_once, load_libdw);
    return dw.unavailable;
}

typedef struct {
    Dwarf_Addr start;
    Dwarf_Addr end;
    Dwarf_Die unit;
} unit_range;

// One unit's functions by address, read the first time an address falls in the unit: later
// lookups search it instead of walking the unit's top-level DIEs (types included) again.
typedef struct {
    uint64_t unit_offset;
    unit_range *functions;
    size_t count;
} unit_functions;

struct ccs_module {
    Dwfl_Callbacks callbacks;
    char *debuginfo_path;
    int debuginfo_searched_in_vain;
    Dwfl *dwfl;
    Dwfl_Module *module;
    // Compilation units by address, from each unit's own ranges: for files without
    // .debug_aranges (clang and swiftc emit none), which libdw 0.188 needs to find a unit.
    unit_range *units;
    size_t unit_count;
    int units_read;
    // dwfl_module_getdwarf's answer, asked once.
    int dwarf_searched;
    Dwarf *dwarf;
    Dwarf_Addr dwarf_bias;
    char dwarf_error[256];
    unit_functions *indexed;
    size_t indexed_count;
    size_t indexed_capacity;
    size_t last_indexed;
};


// Build-ids whose separate debug info was searched for in vain, in this process: a module opened
// again (from a symbol store, a download) is not searched again, so that a debuginfod server
// that does not answer costs one timeout per build-id and run, not one per question.
#define CCS_VAIN_BUILD_IDS 1024
static char vain_build_ids[CCS_VAIN_BUILD_IDS][41];
static size_t vain_count;
static pthread_mutex_t vain_lock = PTHREAD_MUTEX_INITIALIZER;

static void build_id_key(Dwfl_Module *module, char key[41]) {
    const unsigned char *bits = NULL;
    Dwarf_Addr address = 0;
    int length = dw.module_build_id(module, &bits, &address);
    key[0] = '\0';
    for (int index = 0; index < length && index < 20; index++) snprintf(key + 2 * index, 3, "%02x", bits[index]);
}

static int searched_before(const char *key) {
    pthread_mutex_lock(&vain_lock);
    int found = 0;
    for (size_t index = 0; index < vain_count && !found; index++) found = strcmp(vain_build_ids[index], key) == 0;
    pthread_mutex_unlock(&vain_lock);
    return found;
}

static void remember_vain(const char *key) {
    pthread_mutex_lock(&vain_lock);
    if (vain_count < CCS_VAIN_BUILD_IDS) snprintf(vain_build_ids[vain_count++], 41, "%s", key);
    pthread_mutex_unlock(&vain_lock);
}

// libdwfl looks for a module's separate debug info again each time it is asked for DWARF or
// for a symbol table after a search that found nothing, and each search may ask debuginfod
// (with its retries): a server that does not answer would cost a timeout per question. One
// search per module (its failure kept in the module's userdata) and per build-id.
static int find_debuginfo_once(
    Dwfl_Module *module, void **userdata, const char *name, Dwarf_Addr base, const char *file_name,
    const char *debuglink_file, uint32_t debuglink_crc, char **debuginfo_file_name) {
    ccs_module *ours = *userdata;
    if (ours != NULL && ours->debuginfo_searched_in_vain) return -1;
    char key[41];
    build_id_key(module, key);
    if ((key[0] != '\0' && searched_before(key)) ||
        !ccs_search_is_harmless(ours != NULL ? ours->debuginfo_path : NULL, file_name, debuglink_file, key)) {
        if (ours != NULL) ours->debuginfo_searched_in_vain = 1;
        return -1;
    }
    // libdwfl's own search keeps its state in the userdata: it gets an empty one, ours is put back.
    void *theirs = NULL;
    int fd = dw.standard_find_debuginfo(
        module, &theirs, name, base, file_name, debuglink_file, debuglink_crc, debuginfo_file_name);
    if (fd < 0) {
        if (ours != NULL) ours->debuginfo_searched_in_vain = 1;
        if (key[0] != '\0') remember_vain(key);
    }
    return fd;
}

// Inside an app's process: no separate debug info (its path comes from the module's contents,
// and the search may ask the network).
static int find_no_debuginfo(
    Dwfl_Module *module, void **userdata, const char *name, Dwarf_Addr base, const char *file_name,
    const char *debuglink_file, uint32_t debuglink_crc, char **debuginfo_file_name) {
    (void)module, (void)userdata, (void)name, (void)base, (void)file_name, (void)debuglink_file;
    (void)debuglink_crc, (void)debuginfo_file_name;
    return -1;
}

static void copy_message(char *destination, size_t size, const char *message) {
    if (destination != NULL && size > 0) snprintf(destination, size, "%s", message);
}

ccs_module *ccs_module_open(
    const char *path, const char *debuginfo_path, int local_only, char *error, size_t error_size) {
    const char *unavailable = ccs_libdw_unavailable();
    if (unavailable != NULL) {
        copy_message(error, error_size, unavailable);
        return NULL;
    }
    ccs_module *module = calloc(1, sizeof *module);
    if (module == NULL) {
        copy_message(error, error_size, strerror(ENOMEM));
        return NULL;
    }
    module->debuginfo_path = debuginfo_path != NULL ? strdup(debuginfo_path) : NULL;
    module->callbacks.find_elf = dw.build_id_find_elf;
    module->callbacks.find_debuginfo = local_only ? find_no_debuginfo : find_debuginfo_once;
    module->callbacks.section_address = dw.offline_section_address;
    module->callbacks.debuginfo_path = module->debuginfo_path != NULL ? &module->debuginfo_path : NULL;
    module->dwfl = dw.begin(&module->callbacks);
    if (module->dwfl == NULL) {
        copy_message(error, error_size, dw.error_message(-1));
        ccs_module_close(module);
        return NULL;
    }
    dw.report_begin(module->dwfl);
    // Given to libdwfl, which closes it with the module. Links are followed: the loader
    // names libraries by their soname links; what they end at must be a regular file.
    int descriptor = ccs_open_regular(path, CCS_MAXIMUM_MODULE_BYTES);
    if (descriptor < 0) {
        copy_message(error, error_size,
                     errno == EINVAL  ? "not a regular file"
                     : errno == EFBIG ? "larger than 4 GiB, the most a module file is read"
                                      : strerror(errno));
        ccs_module_close(module);
        return NULL;
    }
    module->module = dw.report_elf(module->dwfl, path, path, descriptor, 0, false);
    if (module->module == NULL) {
        copy_message(error, error_size, dw.error_message(-1));
        close(descriptor);
        ccs_module_close(module);
        return NULL;
    }
    dw.report_end(module->dwfl, NULL, NULL);
    // The search callback finds this module (its search path, what it already tried) here.
    void **userdata = NULL;
    dw.module_info(module->module, &userdata, NULL, NULL, NULL, NULL, NULL, NULL);
    if (userdata != NULL) *userdata = module;
    return module;
}

void ccs_module_close(ccs_module *module) {
    if (module == NULL) return;
    if (module->dwfl != NULL) dw.end(module->dwfl);
    free(module->units);
    for (size_t index = 0; index < module->indexed_count; index++) free(module->indexed[index].functions);
    free(module->indexed);
    free(module->debuginfo_path);
    free(module);
}

int ccs_module_build_id(ccs_module *module, char *hex, size_t hex_size) {
    const unsigned char *bits = NULL;
    Dwarf_Addr address = 0;
    int length = dw.module_build_id(module->module, &bits, &address);
    if (length <= 0 || (size_t)length * 2 + 1 > hex_size) return 0;
    for (int index = 0; index < length; index++) snprintf(hex + 2 * index, 3, "%02x", bits[index]);
    return 1;
}

static Dwarf *module_dwarf(ccs_module *module, Dwarf_Addr *bias) {
    if (!module->dwarf_searched) {
        module->dwarf_searched = 1;
        module->dwarf = dw.module_getdwarf(module->module, &module->dwarf_bias);
        if (module->dwarf == NULL) copy_message(module->dwarf_error, sizeof module->dwarf_error, dw.error_message(-1));
    }
    *bias = module->dwarf_bias;
    return module->dwarf;
}

const char *ccs_module_debug_file(ccs_module *module, char *why, size_t why_size) {
    Dwarf_Addr bias = 0;
    if (module_dwarf(module, &bias) == NULL) {
        copy_message(why, why_size, module->dwarf_error);
        return NULL;
    }
    const char *main_file = NULL;
    const char *debug_file = NULL;
    dw.module_info(module->module, NULL, NULL, NULL, NULL, NULL, &main_file, &debug_file);
    return debug_file != NULL ? debug_file : main_file;
}

const char *ccs_module_symbol(ccs_module *module, uint64_t address, uint64_t *offset) {
    Elf64_Sym symbol;
    Dwarf_Addr within = 0;
    const char *name = dw.module_addrinfo(module->module, address, &within, &symbol, NULL, NULL, NULL);
    if (name != NULL && offset != NULL) *offset = within;
    return name;
}

static const char *function_name(Dwarf_Die *die) {
    Dwarf_Attribute attribute;
    static const unsigned int names[] = {CC_DW_AT_linkage_name, CC_DW_AT_MIPS_linkage_name, CC_DW_AT_name};
    for (size_t index = 0; index < sizeof names / sizeof names[0]; index++) {
        if (dw.attr_integrate(die, names[index], &attribute) != NULL) {
            const char *name = dw.formstring(&attribute);
            if (name != NULL) return name;
        }
    }
    return NULL;
}

static int unsigned_attribute(Dwarf_Die *die, unsigned int name, Dwarf_Word *value) {
    Dwarf_Attribute attribute;
    return dw.attr_integrate(die, name, &attribute) != NULL && dw.formudata(&attribute, value) == 0;
}

static int compare_ranges(const void *left, const void *right) {
    const unit_range *a = left;
    const unit_range *b = right;
    return a->start < b->start ? -1 : a->start > b->start;
}

/// The DIE of the range (sorted by start) that holds `address`, or NULL. Ranges rarely
/// overlap; the search looks back a little in case they do.
static Dwarf_Die *range_containing(unit_range *ranges, size_t count, Dwarf_Addr address) {
    size_t low = 0;
    size_t high = count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (ranges[middle].start <= address) low = middle + 1;
        else high = middle;
    }
    for (size_t index = low; index > 0 && low - index < 8; index--) {
        unit_range *range = &ranges[index - 1];
        if (address >= range->start && address < range->end) return &range->unit;
    }
    return NULL;
}

static void read_unit_ranges(ccs_module *module) {
    module->units_read = 1;
    size_t capacity = 0;
    Dwarf_Addr bias = 0;
    Dwarf_Die *unit = NULL;
    while ((unit = dw.module_nextcu(module->module, unit, &bias)) != NULL) {
        Dwarf_Addr base = 0;
        Dwarf_Addr start = 0;
        Dwarf_Addr end = 0;
        ptrdiff_t offset = 0;
        while ((offset = dw.ranges(unit, offset, &base, &start, &end)) > 0) {
            if (end <= start) continue;
            if (module->unit_count == capacity) {
                size_t grown = capacity == 0 ? 64 : capacity * 2;
                unit_range *larger = realloc(module->units, grown * sizeof *larger);
                if (larger == NULL) return;
                module->units = larger;
                capacity = grown;
            }
            module->units[module->unit_count++] = (unit_range){start, end, *unit};
        }
    }
    qsort(module->units, module->unit_count, sizeof *module->units, compare_ranges);
}

/// The unit holding `address` (a DWARF address), by aranges when the file has them, else by
/// the units' own ranges.
static Dwarf_Die *unit_at(ccs_module *module, Dwarf_Addr address, Dwarf_Addr *bias) {
    Dwarf_Die *unit = dw.module_addrdie(module->module, address + *bias, bias);
    if (unit != NULL) return unit;
    if (!module->units_read) read_unit_ranges(module);
    return range_containing(module->units, module->unit_count, address);
}

/// Fills `chain` from `depth` on with the inlined functions under `parent` (outermost first)
/// whose code holds `address`, and returns the new depth. Our own walk rather than
/// dwarf_getscopes: that one prunes every DIE without an address range, and swiftc nests all
/// functions inside a DW_TAG_module, which has none.
static int function_chain(Dwarf_Die *parent, Dwarf_Addr address, Dwarf_Die *chain, int depth, int capacity) {
    Dwarf_Die child;
    if (dw.child(parent, &child) != 0) return depth;
    do {
        int tag = dw.tag(&child);
        if (dw.haspc(&child, address) == 1) {
            if (tag == CC_DW_TAG_subprogram || tag == CC_DW_TAG_inlined_subroutine || tag == CC_DW_TAG_entry_point) {
                if (depth == capacity) return depth;
                chain[depth++] = child;
            }
            return function_chain(&child, address, chain, depth, capacity);
        }
        if (tag == CC_DW_TAG_module || tag == CC_DW_TAG_namespace) {
            int found = function_chain(&child, address, chain, depth, capacity);
            if (found > depth) return found;
        }
    } while (dw.siblingof(&child, &child) == 0);
    return depth;
}

static bool append_range(unit_range **ranges, size_t *count, size_t *capacity, unit_range range) {
    if (*count == *capacity) {
        size_t grown = *capacity == 0 ? 64 : *capacity * 2;
        unit_range *larger = realloc(*ranges, grown * sizeof *larger);
        if (larger == NULL) return false;
        *ranges = larger;
        *capacity = grown;
    }
    (*ranges)[(*count)++] = range;
    return true;
}

// The out-of-line functions under `parent`, looking inside modules and namespaces (where
// swiftc and C++ put them) but not into types or function bodies.
static void collect_functions(Dwarf_Die *parent, unit_range **ranges, size_t *count, size_t *capacity) {
    Dwarf_Die child;
    if (dw.child(parent, &child) != 0) return;
    do {
        int tag = dw.tag(&child);
        if (tag == CC_DW_TAG_subprogram || tag == CC_DW_TAG_entry_point) {
            Dwarf_Addr base = 0;
            Dwarf_Addr start = 0;
            Dwarf_Addr end = 0;
            ptrdiff_t offset = 0;
            while ((offset = dw.ranges(&child, offset, &base, &start, &end)) > 0)
                if (end > start && !append_range(ranges, count, capacity, (unit_range){start, end, child})) return;
        } else if (tag == CC_DW_TAG_module || tag == CC_DW_TAG_namespace) {
            collect_functions(&child, ranges, count, capacity);
        }
    } while (dw.siblingof(&child, &child) == 0);
}

static unit_functions *functions_of(ccs_module *module, Dwarf_Die *unit) {
    uint64_t offset = dw.dieoffset(unit);
    if (module->last_indexed < module->indexed_count && module->indexed[module->last_indexed].unit_offset == offset)
        return &module->indexed[module->last_indexed];
    for (size_t index = 0; index < module->indexed_count; index++) {
        if (module->indexed[index].unit_offset == offset) {
            module->last_indexed = index;
            return &module->indexed[index];
        }
    }
    if (module->indexed_count == module->indexed_capacity) {
        size_t grown = module->indexed_capacity == 0 ? 16 : module->indexed_capacity * 2;
        unit_functions *larger = realloc(module->indexed, grown * sizeof *larger);
        if (larger == NULL) return NULL;
        module->indexed = larger;
        module->indexed_capacity = grown;
    }
    unit_functions *entry = &module->indexed[module->indexed_count];
    *entry = (unit_functions){offset, NULL, 0};
    size_t capacity = 0;
    collect_functions(unit, &entry->functions, &entry->count, &capacity);
    qsort(entry->functions, entry->count, sizeof *entry->functions, compare_ranges);
    module->last_indexed = module->indexed_count++;
    return entry;
}

/// The out-of-line function whose code holds `address`, or NULL.
static Dwarf_Die *function_at(ccs_module *module, Dwarf_Die *unit, Dwarf_Addr address) {
    unit_functions *functions = functions_of(module, unit);
    return functions != NULL ? range_containing(functions->functions, functions->count, address) : NULL;
}

int ccs_module_frames(ccs_module *module, uint64_t address, ccs_frame *frames, int capacity) {
    if (capacity <= 0) return 0;
    Dwarf_Addr bias = 0;
    if (module_dwarf(module, &bias) == NULL) return 0;
    Dwarf_Addr dwarf_address = address - bias;
    Dwarf_Die *unit = unit_at(module, dwarf_address, &bias);
    if (unit == NULL) return 0;
    const char *file = NULL;
    int line = 0;
    int column = 0;
    Dwarf_Line *row = dw.getsrc_die(unit, dwarf_address);
    if (row != NULL) {
        file = dw.linesrc(row, NULL, NULL);
        dw.lineno(row, &line);
        dw.linecol(row, &column);
    }

    Dwarf_Die chain[64];
    int depth = 0;
    Dwarf_Die *function = function_at(module, unit, dwarf_address);
    if (function != NULL) {
        chain[depth++] = *function;
        depth = function_chain(function, dwarf_address, chain, depth, 64);
    }
    int count = 0;
    Dwarf_Files *files = NULL;
    int have_files = -1;
    for (int index = depth - 1; index >= 0 && count < capacity; index--) {
        Dwarf_Die *scope = &chain[index];
        int inlined = dw.tag(scope) == CC_DW_TAG_inlined_subroutine;
        frames[count] = (ccs_frame){function_name(scope), file, line, column, 0, 0};
        Dwarf_Addr low = 0;
        if (index == 0 && dw.lowpc(scope, &low) == 0) {
            frames[count].has_start = 1;
            frames[count].start = low + bias;
        }
        count++;
        if (!inlined || index == 0) break;
        // The next frame out is positioned at this inlined call.
        Dwarf_Word call_file = 0;
        Dwarf_Word call_line = 0;
        Dwarf_Word call_column = 0;
        file = NULL;
        if (unsigned_attribute(scope, CC_DW_AT_call_file, &call_file)) {
            if (have_files < 0) have_files = dw.getsrcfiles(unit, &files, NULL) == 0;
            if (have_files > 0) file = dw.filesrc(files, call_file, NULL, NULL);
        }
        line = unsigned_attribute(scope, CC_DW_AT_call_line, &call_line) ? (int)call_line : 0;
        column = unsigned_attribute(scope, CC_DW_AT_call_column, &call_column) ? (int)call_column : 0;
    }
    if (count == 0 && file != NULL) {
        // Line tables without a function DIE (assembly, some runtimes): the position alone.
        frames[0] = (ccs_frame){NULL, file, line, column, 0, 0};
        count = 1;
    }
    return count;
}
