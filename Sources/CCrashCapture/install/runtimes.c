// The optional runtimes install finds and prepares for the crash path: libunwind, loaded with
// RTLD_LOCAL and set up by one step now rather than in the handler; the Swift runtime's fatal
// error message buffer; the C++ terminate handler, chained.
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cc_internal.h"

#define CC_STRINGIFY2(x) #x
#define CC_STRINGIFY(x) CC_STRINGIFY2(x)

// libunwind makes its pipe (pipe2) in its first step, on the two lowest free descriptors: the
// two found free just before, if they now hold one pipe, are kept to be checked at a crash.
static void cc_note_libunwind_pipe(int lowest, int next) {
    struct stat a, b;
    if (lowest < 0 || next < 0 || fstat(lowest, &a) != 0 || fstat(next, &b) != 0 || !S_ISFIFO(a.st_mode) ||
        a.st_dev != b.st_dev || a.st_ino != b.st_ino)
        return;
    cc_global.unwinder_pipe[0] = lowest;
    cc_global.unwinder_pipe[1] = next;
    cc_global.unwinder_pipe_dev = a.st_dev;
    cc_global.unwinder_pipe_ino = a.st_ino;
}

// RTLD_LOCAL keeps libunwind's _Unwind_* out of the global scope, where libstdc++ and the
// Swift runtime would otherwise bind to them instead of libgcc_s.
void cc_load_libunwind(void) {
    if (cc_global.unw_init_local2 != NULL) return;
    // An escape hatch, and how the frame-pointer fallback is tested: stacks as without libunwind.
    const char *disabled = getenv("CRASHCAPTURE_NO_LIBUNWIND");
    if (disabled != NULL && disabled[0] != '\0' && strcmp(disabled, "0") != 0) return;
    void *handle = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
    cc_step_done(CC_STEP_LIBUNWIND_LOAD);
    if (handle == NULL) return;
    cc_unw_init_local2_fn init = (cc_unw_init_local2_fn)dlsym(handle, CC_STRINGIFY(unw_init_local2));
    cc_unw_step_fn step = (cc_unw_step_fn)dlsym(handle, CC_STRINGIFY(unw_step));
    cc_unw_get_reg_fn get_reg = (cc_unw_get_reg_fn)dlsym(handle, CC_STRINGIFY(unw_get_reg));
    if (init == NULL || step == NULL || get_reg == NULL) return;
    cc_global.unw_step = step;
    cc_global.unw_get_reg = get_reg;
    cc_global.unw_init_local2 = init;
    // libunwind sets itself up on first use: memory pools mapped, the pipe it probes memory
    // with opened. One step here does that now rather than in the crash handler.
    cc_unw_getcontext_fn getcontext = (cc_unw_getcontext_fn)dlsym(handle, CC_STRINGIFY(unw_tdep_getcontext));
    unw_context_t context;
    unw_cursor_t cursor;
    int lowest = open("/dev/null", O_RDONLY | O_CLOEXEC), next = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (lowest >= 0) close(lowest);
    if (next >= 0) close(next);
    if (getcontext != NULL && getcontext(&context) == 0 && init(&cursor, &context, 0) == 0) step(&cursor);
    cc_note_libunwind_pipe(lowest, next);
}

void cc_hook_runtimes(void) {
    typedef _Atomic(const char *) *(*fatal_buffer_fn)(void);
    fatal_buffer_fn fatal_buffer = (fatal_buffer_fn)dlsym(RTLD_DEFAULT, "swift_getFatalErrorMessageBuffer");
    if (fatal_buffer != NULL) cc_global.swift_fatal_message = fatal_buffer();
    else cc_hook_static_fatal_message();

    cc_global.set_terminate = (void *(*)(void (*)(void)))dlsym(RTLD_DEFAULT, "_ZSt13set_terminatePFvvE");
    cc_global.cxa_current_exception_type = (void *(*)(void))dlsym(RTLD_DEFAULT, "__cxa_current_exception_type");
    if (cc_global.set_terminate != NULL) {
        cc_exception_message_prepare();
        cc_global.previous_terminate = (void (*)(void))cc_global.set_terminate(cc_terminate_handler);
    }
}

// The buffer of a runtime linked into the program, once its symbols were read.
void cc_hook_static_fatal_message(void) {
    typedef _Atomic(const char *) *(*fatal_buffer_fn)(void);
    const cc_static_swift_runtime *linked = cc_static_swift_runtime_known();
    _Atomic(const char *) *buffer = NULL;
    if (linked->fatal_message != 0) buffer = (_Atomic(const char *) *)linked->fatal_message;
    else if (linked->fatal_message_function != 0) buffer = ((fatal_buffer_fn)linked->fatal_message_function)();
    // The crash path reads it with one load: a whole pointer, stored at once.
    if (buffer != NULL) __atomic_store_n(&cc_global.swift_fatal_message, buffer, __ATOMIC_RELEASE);
}

void cc_unhook_runtimes(void) {
    if (cc_global.set_terminate == NULL) return;
    void (*current)(void) = (void (*)(void))cc_global.set_terminate(cc_global.previous_terminate);
    if (current != cc_terminate_handler) cc_global.set_terminate(current);  // someone replaced us: keep theirs
}
