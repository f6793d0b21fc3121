// The module map: which file each code address belongs to, with its GNU build-id, so that
// a frame can be written as module + offset in the handler and symbolicated later.
// Built at install (and on refresh) into the spare of two maps, then published with one
// atomic store, so a crash during a refresh still sees a whole map.
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cc_internal.h"

static pthread_mutex_t cc_modules_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct cc_scan {
    cc_module_map *map;
    cc_buf json;
    char exe_path[PATH_MAX];
} cc_scan;

static int cc_add_module(struct dl_phdr_info *info, size_t size, void *context) {
    (void)size;
    cc_scan *scan = context;
    cc_module_map *map = scan->map;
    if (map->count >= CC_MAX_MODULES) return 1;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (size_t i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD) continue;
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (start < lo) lo = start;
        if (start + ph->p_memsz > hi) hi = start + ph->p_memsz;
    }
    if (hi <= lo) return 0;
    // The main program has an empty name; the vDSO is named by the kernel.
    const char *path = info->dlpi_name;
    if (path == NULL || path[0] == '\0') path = map->count == 0 ? scan->exe_path : "[unnamed]";
    char build_id[65];
    if (!cc_read_build_id(info->dlpi_addr, info->dlpi_phdr, info->dlpi_phnum, build_id, sizeof(build_id)))
        build_id[0] = '\0';

    size_t mark = scan->json.len;
    cc_buf *b = &scan->json;
    if (map->count > 0) cc_buf_append_str(b, ",");
    cc_buf_append_str(b, "{\"path\":");
    cc_buf_append_json_string(b, path, PATH_MAX);
    cc_buf_append_str(b, ",\"load_bias\":\"");
    cc_buf_append_hex(b, info->dlpi_addr);
    cc_buf_append_str(b, "\",\"start\":\"");
    cc_buf_append_hex(b, lo);
    cc_buf_append_str(b, "\",\"end\":\"");
    cc_buf_append_hex(b, hi);
    cc_buf_append_str(b, "\",\"build_id\":\"");
    cc_buf_append_str(b, build_id);
    cc_buf_append_str(b, "\"}");
    if (b->overflow) {
        b->len = mark;
        b->overflow = false;
        return 1;
    }
    if (strstr(path, "libswift_Concurrency") != NULL) {
        map->concurrency_start = lo;
        map->concurrency_end = hi;
    }
    map->modules[map->count].start = lo;
    map->modules[map->count].end = hi;
    map->modules[map->count].load_bias = info->dlpi_addr;
    map->count++;
    return 0;
}

// Where a Swift task's name is, for a report's [async] callers: the runtime exports, for
// debuggers, its tasks' metadata and the version of the layout their fields follow. Only the
// layout read here (version 1: the job flags 32 bytes in, the innermost status record 104 bytes
// in, a name record of kind 6 with its text 16 bytes in) is trusted; another leaves names out.
// A runtime linked into the program (--static-swift-stdlib) exports neither: it came from the
// toolchain that compiled this file, whose layout is version 1, and its task metadata is
// learned from a running task (crashcapture_note_current_task).
void cc_find_swift_task_layout(void) {
    if (sizeof(void *) != 8) return;
    const unsigned *version = dlsym(RTLD_DEFAULT, "_swift_concurrency_debug_internal_layout_version");
    void *const *metadata = dlsym(RTLD_DEFAULT, "_swift_concurrency_debug_asyncTaskMetadata");
    if (version != NULL && metadata != NULL) {
        if (*version != 1) return;
        cc_global.swift_task_current = (uintptr_t(*)(void))dlsym(RTLD_DEFAULT, "swift_task_getCurrent");
        atomic_store(&cc_global.swift_task_metadata, (uintptr_t)*metadata);
        return;
    }
    const cc_static_swift_runtime *linked = cc_static_swift_runtime_known();
    if (linked->task_get_current != 0) cc_global.swift_task_current = (uintptr_t(*)(void))linked->task_get_current;
}

int crashcapture_task_metadata_known(void) { return atomic_load(&cc_global.swift_task_metadata) != 0; }

int crashcapture_note_current_task(void) {
    if (atomic_load(&cc_global.swift_task_metadata) != 0) return 1;
    // A runtime linked into the program: its table read (waiting for the reader if it is at it).
    const cc_static_swift_runtime *linked = cc_static_swift_runtime_find();
    if (cc_global.swift_task_current == NULL && linked->task_get_current != 0)
        cc_global.swift_task_current = (uintptr_t(*)(void))linked->task_get_current;
    if (cc_global.swift_task_current == NULL) return 0;
    uintptr_t task = cc_global.swift_task_current();
    if (task == 0) return 0;
    atomic_store(&cc_global.swift_task_metadata, *(const uintptr_t *)task);
    return 1;
}

int cc_modules_capture(void) {
    pthread_mutex_lock(&cc_modules_lock);
    if (cc_global.module_maps[0] == NULL) {
        // mmap, not malloc: the maps live as long as the process, and pages never written
        // cost no resident memory.
        void *memory =
            mmap(NULL, 2 * sizeof(cc_module_map), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (memory == MAP_FAILED) {
            pthread_mutex_unlock(&cc_modules_lock);
            return -1;
        }
        cc_global.module_maps[0] = memory;
        cc_global.module_maps[1] = (cc_module_map *)memory + 1;
    }
    cc_module_map *current = atomic_load(&cc_global.module_map);
    cc_module_map *spare = current == cc_global.module_maps[0] ? cc_global.module_maps[1] : cc_global.module_maps[0];
    static cc_scan scan;
    scan.map = spare;
    spare->count = 0;
    scan.json = (cc_buf){spare->json, 0, sizeof(spare->json), false};
    ssize_t n = readlink("/proc/self/exe", scan.exe_path, sizeof(scan.exe_path) - 1);
    scan.exe_path[n > 0 ? n : 0] = '\0';
    dl_iterate_phdr(cc_add_module, &scan);
    spare->json_len = scan.json.len;
    if (spare->concurrency_end == 0) {
        const cc_static_swift_runtime *linked = cc_static_swift_runtime_known();
        spare->concurrency_start = linked->job_run_start;
        spare->concurrency_end = linked->job_run_end;
    }
    if (spare->concurrency_end != 0) cc_find_swift_task_layout();
    atomic_store_explicit(&cc_global.module_map, spare, memory_order_release);
    pthread_mutex_unlock(&cc_modules_lock);
    return 0;
}

