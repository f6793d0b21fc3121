// Hooks for the crash-test harness and the tests, outside the public header: apps never see
// them. The C sample reaches this file through its own header search path.
#ifndef CRASHCAPTURE_TESTING_H
#define CRASHCAPTURE_TESTING_H

#include "crashcapture.h"

#ifdef __cplusplus
extern "C" {
#endif

/// When set, the next crash report faults inside the handler on purpose, to prove that a
/// fault in our own handler still leaves a record and re-raises: 1 while unwinding the
/// crashing thread, 2 in the other threads' stage once they are unwound; 0 turns it off.
CRASHCAPTURE_API void crashcapture_test_fault_in_handler(int where);

/// The last install's steps as a JSON object of nanoseconds ({"configuration":41000,...}),
/// written into `out`; the length written, or 0 when it does not fit.
CRASHCAPTURE_API size_t crashcapture_test_install_steps(char *out, size_t capacity);

/// Returns once the install's rest (its files, libunwind, the module list; deferred to a thread
/// of ours a few ms after a C install) has been done, doing it now if it has not begun: for a
/// sample that must crash after it, whatever the machine's load.
CRASHCAPTURE_API void crashcapture_test_finish_install(void);

/// The crash path's CRC-32 of `n` bytes (IEEE, as zlib's crc32 and the crash file's records):
/// for a test that holds it to another implementation at every length.
CRASHCAPTURE_API uint32_t crashcapture_test_crc32(uint32_t crc, const void *data, size_t n);

#ifdef __cplusplus
}
#endif

#endif
