// The file-size limit (RLIMIT_FSIZE, `ulimit -f`) and our writes. A write, ftruncate or
// fallocate past the soft limit raises SIGXFSZ, whose default action ends the process (with
// a core): a limit meant for the app's own files must never end the app through ours.
// Every write outside the crash path checks the limit first (cc_file_size_allowed) and skips
// or shortens what would pass it, and runs with SIGXFSZ held off on its thread
// (cc_file_limit_hold/release), so that one the check did not foresee (the limit lowered by
// another thread meanwhile) fails with EFBIG instead. The app's disposition is never touched:
// the signal is blocked on this thread only, and one our write left pending is taken before
// the mask is put back, but never one that was pending before.
// The crash path does not use the hold (install/file_limit_hold.c: sigpending and
// sigtimedwait are not async-signal-safe): it lifts the soft limit to the hard one for its
// writes instead (crash_path.c), and reads the limit here (getrlimit only).
#include <stdint.h>
#include <sys/resource.h>

#include "cc_internal.h"

uint64_t cc_file_size_allowed(void) {
    struct rlimit limit;
    if (getrlimit(RLIMIT_FSIZE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
    return (uint64_t)limit.rlim_cur;
}
