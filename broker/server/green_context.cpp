#include "broker/server/green_context.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mpsshim::server {

unsigned first_group_of_slot(unsigned slot, unsigned slots, unsigned groups, unsigned needed) {
  if (slots == 0 || needed >= groups) return 0;
  const unsigned start = static_cast<unsigned>(std::uint64_t{slot % slots} * groups / slots);
  return std::min(start, groups - needed);
}

namespace {

// The slot's run of granularity-sized groups, as one descriptor's resources.
tl::expected<std::vector<CUdevResource>, CUresult> placed_groups(const DriverTable& cu,
                                                                 const CUdevResource& device_sms,
                                                                 const SmQuota& quota,
                                                                 unsigned granularity,
                                                                 SmPlacement placement) {
  unsigned count = 0;
  CUresult r = cu.cuDevSmResourceSplitByCount(nullptr, &count, &device_sms, nullptr,
                                              quota.split_flags, granularity);
  if (r != CUDA_SUCCESS) return tl::unexpected(r);
  if (count == 0) return tl::unexpected(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  std::vector<CUdevResource> groups(count);
  CUdevResource remaining{};
  r = cu.cuDevSmResourceSplitByCount(groups.data(), &count, &device_sms, &remaining,
                                     quota.split_flags, granularity);
  if (r != CUDA_SUCCESS) return tl::unexpected(r);
  groups.resize(count);
  const unsigned needed = std::clamp((quota.target + granularity - 1) / granularity, 1u, count);
  const unsigned first = first_group_of_slot(placement.slot, placement.slots, count, needed);
  return std::vector<CUdevResource>(groups.begin() + first, groups.begin() + first + needed);
}

}  // namespace

tl::expected<GreenContext, CUresult> make_green_context(const DriverTable& cu, CUdevice device,
                                                        const CUdevResource& device_sms,
                                                        const SmQuota& quota, unsigned granularity,
                                                        SmPlacement placement) {
  std::vector<CUdevResource> resources{device_sms};
  if (!quota.whole_device && placement.slots != 0 && granularity != 0) {
    auto placed = placed_groups(cu, device_sms, quota, granularity, placement);
    if (!placed) return tl::unexpected(placed.error());
    resources = std::move(*placed);
  } else if (!quota.whole_device) {
    CUdevResource group{};
    CUdevResource remaining{};
    unsigned groups = 1;
    CUresult r = cu.cuDevSmResourceSplitByCount(&group, &groups, &device_sms, &remaining,
                                                quota.split_flags, quota.target);
    if (r != CUDA_SUCCESS) return tl::unexpected(r);
    if (groups != 1) return tl::unexpected(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    resources = {group};
  }
  CUdevResourceDesc desc = nullptr;
  CUresult r = cu.cuDevResourceGenerateDesc(&desc, resources.data(),
                                            static_cast<unsigned>(resources.size()));
  if (r != CUDA_SUCCESS) return tl::unexpected(r);
  GreenContext out;
  r = cu.cuGreenCtxCreate(&out.green, desc, device, CU_GREEN_CTX_DEFAULT_STREAM);
  if (r != CUDA_SUCCESS) return tl::unexpected(r);
  r = cu.cuCtxFromGreenCtx(&out.context, out.green);
  if (r != CUDA_SUCCESS) {
    cu.cuGreenCtxDestroy(out.green);
    return tl::unexpected(r);
  }
  out.sm_count = 0;
  for (const CUdevResource& resource : resources) out.sm_count += resource.sm.smCount;
  return out;
}

}  // namespace mpsshim::server
