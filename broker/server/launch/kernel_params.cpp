#include "broker/server/launch/kernel_params.hpp"

#include <algorithm>

#include "proto/ops.hpp"

namespace mpsshim::server {

CUresult read_param_layout(const DriverTable& cu, CUfunction function, bool kernel,
                           ParamLayout& out) {
  out = ParamLayout{};
  for (std::size_t i = 0;; ++i) {
    std::size_t offset = 0, size = 0;
    const CUresult r =
        kernel ? cu.cuKernelGetParamInfo(reinterpret_cast<CUkernel>(function), i, &offset, &size)
               : cu.cuFuncGetParamInfo(function, i, &offset, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) return CUDA_SUCCESS;  // past the last parameter
    if (r != CUDA_SUCCESS) return r;
    // No kernel's block is larger than what a launch record may carry.
    if (offset + size > proto::kMaxArgsBytes) return CUDA_ERROR_NOT_SUPPORTED;
    out.params.push_back(
        ParamLayout::Param{static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(size)});
    out.bytes = std::max(out.bytes, static_cast<std::uint32_t>(offset + size));
  }
}

void** point_at_params(const ParamLayout& layout, std::byte* block, std::vector<void*>& out) {
  out.resize(layout.params.size());
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = block + layout.params[i].offset;
  return out.empty() ? nullptr : out.data();
}

}  // namespace mpsshim::server
