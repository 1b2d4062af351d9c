#include "tests/darkapi/fake_core.hpp"

#include "libshim/client_view.hpp"

namespace mpsshim::test {
namespace {

FakeCore core;
thread_local CUcontext current = nullptr;

}  // namespace

FakeCore& reset_fake_core() {
  core = FakeCore{};
  current = nullptr;
  return core;
}

FakeCore& fake_core() {
  return core;
}
void set_current_context(CUcontext ctx) {
  current = ctx;
}

}  // namespace mpsshim::test

namespace mpsshim::shim {

using test::core;

int advertised_driver_version() noexcept {
  return core.driver_version;
}
int visible_device_count() noexcept {
  return static_cast<int>(core.devices.size());
}

const proto::DeviceSnapshot* device_snapshot(int ordinal) noexcept {
  if (ordinal < 0 || ordinal >= visible_device_count()) return nullptr;
  return &core.devices[static_cast<std::size_t>(ordinal)];
}

CUcontext current_context() noexcept {
  return test::current;
}

bool context_identity(CUcontext ctx, int* ordinal, std::uint64_t* id) noexcept {
  const auto it = core.contexts.find(ctx);
  if (it == core.contexts.end()) return false;
  *ordinal = it->second.first;
  *id = it->second.second;
  return true;
}

CUresult primary_context_handle(CUdevice device, CUcontext* out) noexcept {
  if (device < 0 || static_cast<std::size_t>(device) >= core.primary.size()) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  *out = core.primary[static_cast<std::size_t>(device)];
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::shim

extern "C" {

CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  mpsshim::test::core.module_image = image;
  if (mpsshim::test::core.module_result == CUDA_SUCCESS) *module = mpsshim::test::fake_module();
  return mpsshim::test::core.module_result;
}

CUresult CUDAAPI cuModuleGetFunctionCount(unsigned int* count, CUmodule module) {
  if (module != mpsshim::test::fake_module()) return CUDA_ERROR_INVALID_HANDLE;
  *count = static_cast<unsigned int>(mpsshim::test::core.module_functions.size());
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleEnumerateFunctions(CUfunction* functions, unsigned int count,
                                            CUmodule module) {
  if (module != mpsshim::test::fake_module()) return CUDA_ERROR_INVALID_HANDLE;
  const auto& all = mpsshim::test::core.module_functions;
  for (std::size_t i = 0; i < count && i < all.size(); ++i) functions[i] = all[i].first;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction function) {
  for (const auto& [f, n] : mpsshim::test::core.module_functions) {
    if (f == function) {
      *name = n;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_HANDLE;
}

CUresult CUDAAPI cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option*, void**,
                                   unsigned int, CUlibraryOption*, void**, unsigned int) {
  mpsshim::test::core.library_code = code;
  if (mpsshim::test::core.library_result == CUDA_SUCCESS) {
    *library = mpsshim::test::fake_library();
  }
  return mpsshim::test::core.library_result;
}

CUresult CUDAAPI cuLibraryGetModule(CUmodule* module, CUlibrary library) {
  mpsshim::test::core.library_of_module = library;
  *module = mpsshim::test::fake_module();
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLibraryUnload(CUlibrary) {
  ++mpsshim::test::core.library_unloads;
  return CUDA_SUCCESS;
}

}  // extern "C"
