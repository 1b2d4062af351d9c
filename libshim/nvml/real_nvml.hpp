// The real libnvidia-ml.so.1 behind this one. This library has its SONAME, so a program's
// dlopen("libnvidia-ml.so.1") finds this one; the real one is opened by its path, with
// RTLD_DEEPBIND so that its calls to its own entry points stay inside it.
#pragma once

#include <string>

namespace mpsshim::nvml {

// The real library's handle, opened on first use; nullptr when none was found (logged once).
void* real_library() noexcept;

// The real library's `name`, or nullptr.
void* real_symbol(const char* name) noexcept;

template <typename Fn>
Fn* real(const char* name) noexcept {
  return reinterpret_cast<Fn*>(real_symbol(name));
}

// Where the real library is looked for: MPSSHIM_REAL_NVML when set, else libnvidia-ml.so.1 in
// each LD_LIBRARY_PATH directory and then the directories drivers install it to. A file that is
// this library itself is skipped.
std::string find_real_library() noexcept;

}  // namespace mpsshim::nvml
