#include "broker/server/driver/driver.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

namespace mpsshim::server {

tl::expected<DriverTable, StartError> load_driver(const std::string& path) {
  void* library = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = ::dlerror();
    return tl::unexpected(StartError{
        CUDA_ERROR_SHARED_OBJECT_INIT_FAILED,
        fmt::format("cannot load the CUDA driver {}: {}", path, why ? why : "unknown error")});
  }
  DriverTable table;
#define MPSSHIM_RESOLVE(name, ret, params)                                                  \
  table.name = reinterpret_cast<ret(CUDAAPI*) params>(::dlsym(library, #name));             \
  if (table.name == nullptr) {                                                              \
    return tl::unexpected(StartError{                                                       \
        CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND,                                          \
        fmt::format("the CUDA driver {} does not export {}, which the server needs; is it " \
                    "older than CUDA 13.0?",                                                \
                    path, #name)});                                                         \
  }
  MPSSHIM_DRIVER_FUNCTIONS(MPSSHIM_RESOLVE)
#undef MPSSHIM_RESOLVE
  return table;
}

std::string describe(const DriverTable& cu, CUresult result) {
  const char* name = nullptr;
  if (cu.cuGetErrorName == nullptr || cu.cuGetErrorName(result, &name) != CUDA_SUCCESS ||
      name == nullptr) {
    return fmt::format("CUresult {}", static_cast<int>(result));
  }
  return fmt::format("{} ({})", name, static_cast<int>(result));
}

bool is_sticky(CUresult result, bool from_completion) {
  switch (result) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_ASSERT:
      return true;
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
      return from_completion;
    default:
      return false;
  }
}

}  // namespace mpsshim::server
