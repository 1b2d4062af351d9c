#include "broker/server/ops/array_format.hpp"

#include "common/log.hpp"

namespace mpsshim::server {

CUresult check_array_format(const Session& session, const proto::ArrayDescriptor& d,
                            const char* what) {
  // Deferred-mapping arrays would take memory of the client's without a charge (the size is
  // the driver's, known only from cuArrayGetMemoryRequirements); sparse ones take only what
  // their tiles map, which is charged as the tile pool's (ops/sparse_array.cpp).
  constexpr std::uint32_t kUnsupportedFlags = CUDA_ARRAY3D_DEFERRED_MAPPING;
  if ((d.flags & kUnsupportedFlags) == 0 && proto::element_bytes(d.format, d.channels) != 0) {
    return CUDA_SUCCESS;
  }
  log_warn(
      "{} asked for {} of format {:#x} x{} with flags {:#x}; mpsshim supports plain 8/16/32-bit, "
      "half and float formats with 1, 2 or 4 channels, not deferred-mapping arrays",
      session.who(), what, d.format, d.channels, d.flags);
  return d.channels > 4 ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace mpsshim::server
