// Hooks for the crash-test harness and the tests, outside the public header: apps never see
// them. The C sample reaches this file through its own header search path.
#ifndef CRASHCAPTURE_TESTING_H
#define CRASHCAPTURE_TESTING_H

#include "crashcapture.h"

#ifdef __cplusplus
extern "C" {
#endif

/// When set to 1, the next crash report faults inside the handler on purpose, to prove that
/// a fault in our own handler still leaves a minimal record and re-raises.
CRASHCAPTURE_API void crashcapture_test_fault_in_handler(int enabled);

/// The last install's steps as a JSON object of nanoseconds ({"configuration":41000,...}),
/// written into `out`; the length written, or 0 when it does not fit.
CRASHCAPTURE_API size_t crashcapture_test_install_steps(char *out, size_t capacity);

#ifdef __cplusplus
}
#endif

#endif
