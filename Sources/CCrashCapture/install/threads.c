// Alternate signal stacks for every thread. A stack overflow can only be reported from
// another stack, and the kernel keeps alternate stacks per thread: the Swift runtime gives
// one to the main thread only. We define pthread_create, forward to the real one, and give
// each new thread (Dispatch, Foundation Thread, Swift concurrency, plain pthreads) its own
// stack with a guard page before its start routine runs.
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cc_internal.h"

static _Atomic int cc_threads_enabled;
static pthread_key_t cc_altstack_key;
static pthread_once_t cc_altstack_key_once = PTHREAD_ONCE_INIT;

typedef int (*cc_pthread_create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

void cc_threads_enable(bool enabled) { atomic_store(&cc_threads_enabled, enabled ? 1 : 0); }

static void cc_release_altstack(void *mapping) {
    stack_t current;
    if (sigaltstack(NULL, &current) == 0 && !(current.ss_flags & SS_ONSTACK)) {
        stack_t off = {.ss_flags = SS_DISABLE};
        sigaltstack(&off, NULL);
    }
    munmap(mapping, CC_ALTSTACK_SIZE + (size_t)sysconf(_SC_PAGESIZE));
}

static void cc_make_key(void) { pthread_key_create(&cc_altstack_key, cc_release_altstack); }

int crashcapture_install_thread_stack(void) {
    stack_t current;
    if (sigaltstack(NULL, &current) != 0) return -1;
    // Keep a stack someone else set up if it is big enough for us and whatever we chain to.
    if (!(current.ss_flags & SS_DISABLE) && current.ss_size >= CC_ALTSTACK_SIZE) return 0;
    pthread_once(&cc_altstack_key_once, cc_make_key);
    if (pthread_getspecific(cc_altstack_key) != NULL) return 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *mapping = mmap(NULL, CC_ALTSTACK_SIZE + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                         -1, 0);
    if (mapping == MAP_FAILED) return -1;
    // Guard page below the stack: overflowing the alternate stack faults instead of
    // silently writing over whatever is mapped next to it.
    if (mprotect(mapping, page, PROT_NONE) != 0) {
        int saved = errno;
        munmap(mapping, CC_ALTSTACK_SIZE + page);
        errno = saved;
        return -1;
    }
    stack_t ss = {.ss_sp = mapping + page, .ss_size = CC_ALTSTACK_SIZE, .ss_flags = 0};
    if (sigaltstack(&ss, NULL) != 0) {
        int saved = errno;
        munmap(mapping, CC_ALTSTACK_SIZE + page);
        errno = saved;
        return -1;
    }
    pthread_setspecific(cc_altstack_key, mapping);
    return 0;
}

typedef struct cc_thread_start {
    void *(*routine)(void *);
    void *argument;
} cc_thread_start;

static void *cc_thread_trampoline(void *context) {
    cc_thread_start start = *(cc_thread_start *)context;
    free(context);
    crashcapture_install_thread_stack();
    return start.routine(start.argument);
}

static cc_pthread_create_fn cc_real_pthread_create(void) {
    static _Atomic(cc_pthread_create_fn) real;
    cc_pthread_create_fn fn = atomic_load(&real);
    if (fn == NULL) {
        fn = (cc_pthread_create_fn)dlsym(RTLD_NEXT, "pthread_create");
        atomic_store(&real, fn);
    }
    return fn;
}

// A thread of our own, made without the wrapper: it needs no alternate stack, and freeing the
// wrapper's note in a new thread would make glibc set up a malloc arena for it (a 64 MiB
// mapping) before it has anything to do.
int cc_create_own_thread(pthread_t *thread, const pthread_attr_t *attr, void *(*routine)(void *), void *argument) {
    cc_pthread_create_fn real = cc_real_pthread_create();
    return real != NULL ? real(thread, attr, routine, argument) : EAGAIN;
}

CRASHCAPTURE_API int pthread_create(pthread_t *thread, const pthread_attr_t *attr, void *(*routine)(void *), void *argument) {
    cc_pthread_create_fn real = cc_real_pthread_create();
    if (real == NULL) return EAGAIN;
    if (!atomic_load(&cc_threads_enabled)) return real(thread, attr, routine, argument);
    cc_thread_start *start = malloc(sizeof(*start));
    if (start == NULL) return real(thread, attr, routine, argument);
    start->routine = routine;
    start->argument = argument;
    int result = real(thread, attr, cc_thread_trampoline, start);
    if (result != 0) free(start);
    return result;
}
