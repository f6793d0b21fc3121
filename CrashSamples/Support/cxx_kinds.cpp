#include <stdexcept>

extern "C" void sample_throw_runtime_error(void);
extern "C" void sample_throw_non_std(void);
extern "C" void sample_throw_from_noexcept(void);

namespace {
struct NotAnException {
    int code;
};

__attribute__((noinline)) void throwing_inside_noexcept() noexcept { throw std::logic_error("thrown from noexcept"); }
}  // namespace

extern "C" __attribute__((noinline)) void sample_throw_runtime_error(void) {
    throw std::runtime_error("sample runtime_error");
}

extern "C" __attribute__((noinline)) void sample_throw_non_std(void) { throw NotAnException{42}; }

extern "C" __attribute__((noinline)) void sample_throw_from_noexcept(void) { throwing_inside_noexcept(); }
