// The weak default definition of every entry point (see entry_points.inc for how a strong
// definition elsewhere replaces it). cuda.h stays out of this file: its prototypes would clash
// with the parameterless stubs, which are ABI-safe on x86-64 SysV because a function that
// ignores its arguments may be called with any, and CUresult is returned in eax like int.
#include <atomic>
#include <string_view>

#include "common/log.hpp"

// The generated lists; tests/entry builds these stubs from short lists of its own, to see an
// entry point that is neither served nor refused answer (libmpsshim has none).
#ifndef MPSSHIM_ENTRY_POINTS_INC
#define MPSSHIM_ENTRY_POINTS_INC "libshim/entry/entry_points.inc"
#define MPSSHIM_REFUSALS_INC "libshim/entry/refusals.inc"
#endif

namespace {

// CUDA_ERROR_NOT_SUPPORTED, spelled out because cuda.h is not included.
constexpr int kNotSupported = 801;

// Entry points refused on purpose (libshim/entry/refused.tsv) and why.
struct Refusal {
  const char* name;
  const char* reason;
};
#define MPSSHIM_REFUSAL(name, reason) {#name, reason},
constexpr Refusal kRefusals[] = {
#include MPSSHIM_REFUSALS_INC
    {nullptr, nullptr}};
#undef MPSSHIM_REFUSAL

[[gnu::cold]] int not_implemented(std::atomic<bool>& logged, const char* name) noexcept {
  for (const Refusal& refusal : kRefusals) {
    if (refusal.name != nullptr && std::string_view(refusal.name) == name) {
      mpsshim::log_once(logged, mpsshim::LogLevel::kWarn,
                        "{} is refused by mpsshim: {}; returning CUDA_ERROR_NOT_SUPPORTED", name,
                        refusal.reason);
      return kNotSupported;
    }
  }
  mpsshim::log_once(logged, mpsshim::LogLevel::kWarn,
                    "{} is not implemented by mpsshim; returning CUDA_ERROR_NOT_SUPPORTED", name);
  return kNotSupported;
}

}  // namespace

#define MPSSHIM_ENTRY_POINT(name)                                      \
  extern "C" __attribute__((weak, visibility("default"))) int name() { \
    static constinit std::atomic<bool> logged{false};                  \
    return not_implemented(logged, #name);                             \
  }
#include MPSSHIM_ENTRY_POINTS_INC
#undef MPSSHIM_ENTRY_POINT
