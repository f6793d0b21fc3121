// The what() of an uncaught std::exception, taken in the C++ terminate handler (outside any
// signal handler, before abort) so that the report can carry it. There is no C++ here: the
// exception is matched against std::exception the way a `catch (std::exception &)` does it,
// through the Itanium C++ ABI that libstdc++ implements (the thrown object from
// std::current_exception, std::type_info::__do_catch to find the std::exception in it, and its
// virtual what()). Without libstdc++ in the process, nothing is found and
// nothing is called.
#include <dlfcn.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cc_internal.h"

// std::exception_ptr: one pointer to the thrown object, returned through a hidden pointer
// (it has a destructor), released by that destructor.
typedef struct cc_exception_ptr {
    void *object;
} cc_exception_ptr;
static void (*cc_current_exception)(cc_exception_ptr *result);
static void (*cc_exception_ptr_destroy)(cc_exception_ptr *self);
static const void *cc_std_exception_type;  // typeinfo for std::exception
static char cc_what_text[1024];

void cc_exception_message_prepare(void) {
    cc_current_exception = (void (*)(cc_exception_ptr *))dlsym(RTLD_DEFAULT, "_ZSt17current_exceptionv");
    cc_exception_ptr_destroy =
        (void (*)(cc_exception_ptr *))dlsym(RTLD_DEFAULT, "_ZNSt15__exception_ptr13exception_ptrD1Ev");
    cc_std_exception_type = dlsym(RTLD_DEFAULT, "_ZTISt9exception");
    // The vtable slots below are libstdc++'s; another C++ runtime is left alone. The typeinfo
    // object may be a copy in the program (a copy relocation); its vtable is the runtime's.
    Dl_info where;
    if (cc_std_exception_type != NULL &&
        (dladdr(*(void *const *)cc_std_exception_type, &where) == 0 || where.dli_fname == NULL ||
         strstr(where.dli_fname, "libstdc++") == NULL))
        cc_std_exception_type = NULL;
}

// Slots of the Itanium ABI vtables, as libstdc++ lays them out: std::type_info's
// __do_catch is its fifth virtual function, std::exception's what() its third.
enum { CC_TYPE_INFO_DO_CATCH = 4, CC_EXCEPTION_WHAT = 2 };

void cc_exception_message_capture(const void *thrown_type) {
    if (cc_current_exception == NULL || cc_exception_ptr_destroy == NULL || cc_std_exception_type == NULL ||
        thrown_type == NULL)
        return;
    cc_exception_ptr current = {NULL};
    cc_current_exception(&current);
    void *object = current.object;
    if (object == NULL) return;
    typedef bool (*do_catch_fn)(const void *self, const void *thrown, void **object, unsigned outer);
    do_catch_fn do_catch = (*(do_catch_fn *const *)cc_std_exception_type)[CC_TYPE_INFO_DO_CATCH];
    void *as_exception = object;
    if (do_catch(cc_std_exception_type, thrown_type, &as_exception, 1)) {
        typedef const char *(*what_fn)(const void *self);
        what_fn what = (*(what_fn *const *)as_exception)[CC_EXCEPTION_WHAT];
        const char *text = what(as_exception);
        if (text != NULL) {
            size_t n = strnlen(text, sizeof(cc_what_text) - 1);
            memcpy(cc_what_text, text, n);
            cc_what_text[n] = '\0';
            atomic_store_explicit(&cc_global.exception_what, cc_what_text, memory_order_release);
        }
    }
    cc_exception_ptr_destroy(&current);
}

// The C++ terminate handler: an uncaught exception's type and what(), then the handler that
// was there before us (libstdc++'s prints them too), then abort, which the crash path reports.
void cc_terminate_handler(void) {
    if (cc_global.cxa_current_exception_type != NULL) {
        // std::type_info is { vtable, const char *name }; '*' marks a type local to a unit.
        const char *const *type_info = cc_global.cxa_current_exception_type();
        if (type_info != NULL && type_info[1] != NULL) {
            const char *name = type_info[1];
            if (name[0] == '*') name++;
            atomic_store_explicit(&cc_global.exception_type_name, name, memory_order_release);
        }
        // Still outside any signal handler: the exception's what() may be called here.
        cc_exception_message_capture(type_info);
    }
    if (cc_global.previous_terminate != NULL) cc_global.previous_terminate();
    abort();
}
