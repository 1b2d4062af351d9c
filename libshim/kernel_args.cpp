#include "libshim/kernel_args.hpp"

#include <cstring>

namespace mpsshim::shim {

CUresult argument_bytes(const Function* f, void** params, void** extra, const void*& buffer,
                        std::size_t& bytes) {
  buffer = nullptr;
  bytes = 0;
  if (extra != nullptr) {
    for (void** e = extra; *e != CU_LAUNCH_PARAM_END; e += 2) {
      if (*e == CU_LAUNCH_PARAM_BUFFER_POINTER) {
        buffer = e[1];
      } else if (*e == CU_LAUNCH_PARAM_BUFFER_SIZE) {
        bytes = *static_cast<std::size_t*>(e[1]);
      } else {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    if (params != nullptr || (bytes != 0 && buffer == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
  }
  bytes = f->args_bytes;
  if (bytes != 0 && params == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

void pack_arguments(const Function* f, void** params, const void* buffer, std::size_t bytes,
                    std::byte* out) {
  if (buffer != nullptr) {
    std::memcpy(out, buffer, bytes);
    return;
  }
  std::memset(out, 0, bytes);
  for (std::size_t i = 0; i < f->params.size(); ++i) {
    const proto::ParamSlot& p = f->params[i];
    std::memcpy(out + p.offset, params[i], p.size);
  }
}

}  // namespace mpsshim::shim
