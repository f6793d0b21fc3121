// Symbolication on elfutils (libdw, libdwfl), loaded with dlopen on first use so that nothing
// that links CrashCapture gains a NEEDED entry: without libdw the symbolicator falls back to
// the symbol tables. One ccs_module is one ELF file with its debug info, found the way
// systemd-coredump and perf find it (build-id, .gnu_debuglink with its CRC, compressed
// sections, MiniDebugInfo, and debuginfod when DEBUGINFOD_URLS is set).
#ifndef CRASHCAPTURE_ELFUTILS_H
#define CRASHCAPTURE_ELFUTILS_H

#include <stddef.h>
#include <stdint.h>

/// NULL once libdw.so.1 is loaded, else why it is not (the same answer every call).
const char *ccs_libdw_unavailable(void);

typedef struct ccs_module ccs_module;

/// Opens `path` as an ELF file placed at address 0, so that the addresses asked of it are the
/// file's own virtual addresses. `debuginfo_path` is libdwfl's search string
/// (":.debug:/usr/lib/debug:/more/dirs"). The path must end at a regular file of at most
/// CCS_MAXIMUM_MODULE_BYTES, opened without blocking (a FIFO or a device is refused at once).
/// `local_only`: no separate debug info is looked for (no file named by the module's contents
/// is opened, no server asked), for an app's own process; the module's own symbol tables and
/// DWARF still serve. NULL with `error` filled when the file is unusable.
ccs_module *ccs_module_open(
    const char *path, const char *debuginfo_path, int local_only, char *error, size_t error_size);
#define CCS_MAXIMUM_MODULE_BYTES 4294967296LL  // 4 GiB

/// Opens `path` for reading as ccs_module_open does: without blocking, a regular file only, at
/// most `maximum_bytes`. -1 with errno set (EINVAL: not a regular file; EFBIG: too large).
int ccs_open_regular(const char *path, int64_t maximum_bytes);
void ccs_module_close(ccs_module *module);

/// The GNU build-id of the file as lower-case hex into `hex` (at least 2 * 64 + 1 bytes);
/// 0 when it has none.
int ccs_module_build_id(ccs_module *module, char *hex, size_t hex_size);

/// The file the debug info came from (the module itself, a separate file, a debuginfod
/// download), or NULL with `why` filled when there is none.
const char *ccs_module_debug_file(ccs_module *module, char *why, size_t why_size);

/// The symbol-table symbol covering `address`, or NULL; `offset` is the address's distance
/// from its start. The name lives as long as the module.
const char *ccs_module_symbol(ccs_module *module, uint64_t address, uint64_t *offset);

typedef struct {
    /// Linkage name when DWARF has one, else the plain name; NULL when unnamed.
    const char *function;
    const char *file;
    int line;
    int column;
    /// Where the function's code starts (an address of the module), when `has_start`; set on
    /// the out-of-line function only.
    int has_start;
    uint64_t start;
} ccs_frame;

/// The inline chain at `address`, innermost first: each function with the source position
/// reached in it, each inlined into the next, the last the out-of-line function. Returns how many of `capacity` were filled; 0 when DWARF does not cover
/// the address. Strings live as long as the module.
int ccs_module_frames(ccs_module *module, uint64_t address, ccs_frame *frames, int capacity);

/// Fetches an ELF file by build-id from the debuginfod servers of DEBUGINFOD_URLS (the
/// executable when `executable`, else its debug info) into libdebuginfod's cache; its path
/// into `path`, or 0 with `why` filled. Each build-id and kind is asked once a process: a
/// second call answers from the first. Bounded by ccs_bound_debuginfod's limits.

int ccs_debuginfod_find(
    const unsigned char *build_id, size_t build_id_size, int executable, char *path, size_t path_size, char *why,
    size_t why_size);

/// Sets libdebuginfod's limits where the environment sets none, before its first use: 10 s to
/// connect and start a transfer (DEBUGINFOD_TIMEOUT), 60 s in all (DEBUGINFOD_MAXTIME), 512 MiB a
/// file (DEBUGINFOD_MAXSIZE), one try a question (DEBUGINFOD_RETRY_LIMIT 0, not 2). For a
/// command-line tool's process, at its start: setenv is not
/// safe while other threads read the environment.
void ccs_bound_debuginfod(void);

#endif
