// Test-only stand-in for the shim's core (libshim/client_view.hpp) and for the driver entry
// points the dark-API tables call (cuModuleLoadData, cuLibraryLoadData, ...): lets the darkapi
// objects be linked and driven without a broker, a GPU or the rest of libmpsshim.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "proto/device_snapshot.hpp"

namespace mpsshim::test {

struct FakeCore {
  int driver_version = 13000;
  std::vector<proto::DeviceSnapshot> devices;
  std::map<CUcontext, std::pair<int, std::uint64_t>> contexts;  // -> (ordinal, id)
  std::vector<CUcontext> primary;                               // per ordinal

  // What the tables asked of the driver entry points.
  const void* module_image = nullptr;     // last cuModuleLoadData image
  const void* library_code = nullptr;     // last cuLibraryLoadData code
  CUlibrary library_of_module = nullptr;  // last cuLibraryGetModule library
  int library_unloads = 0;
  CUresult module_result = CUDA_SUCCESS;
  // The functions of fake_module(), in order, for cuModuleEnumerateFunctions / cuFuncGetName.
  std::vector<std::pair<CUfunction, const char*>> module_functions;
  CUresult library_result = CUDA_SUCCESS;
};

// Fresh state for each test case; also clears the calling thread's current context.
FakeCore& reset_fake_core();
FakeCore& fake_core();
void set_current_context(CUcontext ctx);

// Handles the fake driver hands out.
inline CUmodule fake_module() {
  return reinterpret_cast<CUmodule>(std::uintptr_t{0x1000});
}
inline CUlibrary fake_library() {
  return reinterpret_cast<CUlibrary>(std::uintptr_t{0x2000});
}
inline CUcontext fake_context(std::uintptr_t n) {
  return reinterpret_cast<CUcontext>(n << 4);
}

}  // namespace mpsshim::test
