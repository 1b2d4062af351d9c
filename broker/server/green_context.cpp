#include "broker/server/green_context.hpp"

namespace mpsshim::server {

tl::expected<GreenContext, CUresult> make_green_context(const DriverTable& cu, CUdevice device,
                                                        const CUdevResource& device_sms,
                                                        const SmQuota& quota) {
  CUdevResource resource = device_sms;
  if (!quota.whole_device) {
    CUdevResource group{};
    CUdevResource remaining{};
    unsigned groups = 1;
    CUresult r = cu.cuDevSmResourceSplitByCount(&group, &groups, &device_sms, &remaining,
                                                quota.split_flags, quota.target);
    if (r != CUDA_SUCCESS) return tl::unexpected(r);
    if (groups != 1) return tl::unexpected(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    resource = group;
  }
  CUdevResourceDesc desc = nullptr;
  CUresult r = cu.cuDevResourceGenerateDesc(&desc, &resource, 1);
  if (r != CUDA_SUCCESS) return tl::unexpected(r);
  GreenContext out;
  r = cu.cuGreenCtxCreate(&out.green, desc, device, CU_GREEN_CTX_DEFAULT_STREAM);
  if (r != CUDA_SUCCESS) return tl::unexpected(r);
  r = cu.cuCtxFromGreenCtx(&out.context, out.green);
  if (r != CUDA_SUCCESS) {
    cu.cuGreenCtxDestroy(out.green);
    return tl::unexpected(r);
  }
  out.sm_count = resource.sm.smCount;
  return out;
}

}  // namespace mpsshim::server
