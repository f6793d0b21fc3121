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

#ifdef __cplusplus
}
#endif

#endif
