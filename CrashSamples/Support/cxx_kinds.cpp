#include <stdexcept>

extern "C" void sample_throw_runtime_error(void);
extern "C" void sample_throw_non_std(void);
extern "C" void sample_throw_from_noexcept(void);

namespace {
struct NotAnException {
    int code;
};

// The throw that escapes noexcept is the sample (std::terminate, as a C++ program dies of it): the
// compiler's warning about exactly that is silenced here, and only here.
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wexceptions"
__attribute__((noinline)) void throwing_inside_noexcept() noexcept { throw std::logic_error("thrown from noexcept"); }
#pragma clang diagnostic pop
}  // namespace

extern "C" __attribute__((noinline)) void sample_throw_runtime_error(void) {
    throw std::runtime_error("sample runtime_error");
}

extern "C" __attribute__((noinline)) void sample_throw_non_std(void) { throw NotAnException{42}; }

extern "C" __attribute__((noinline)) void sample_throw_from_noexcept(void) { throwing_inside_noexcept(); }
