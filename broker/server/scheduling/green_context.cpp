#include "broker/server/scheduling/green_context.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace mpsshim::server {

std::unique_lock<std::mutex> hold_green_builds() {
  static std::mutex builds;
  return std::unique_lock(builds);
}

unsigned first_group_of_slot(unsigned slot, unsigned slots, unsigned groups, unsigned needed) {
  if (slots == 0 || needed >= groups) return 0;
  const unsigned start = static_cast<unsigned>(std::uint64_t{slot % slots} * groups / slots);
  return std::min(start, groups - needed);
}

tl::expected<unsigned, CUresult> count_sm_groups(const DriverTable& cu,
                                                 const CUdevResource& device_sms,
                                                 unsigned granularity) {
  auto building = hold_green_builds();
  unsigned count = 0;
  CUresult r =
      cu.cuDevSmResourceSplitByCount(nullptr, &count, &device_sms, nullptr, 0, granularity);
  if (r != CUDA_SUCCESS) return tl::unexpected(r);
  return count;
}

PlannedQuota plan_client_quota(const proto::DeviceSnapshot& snapshot, int percentage,
                               bool ignore_coscheduling, const SmPlacement& placement) {
  PlannedQuota planned;
  planned.ignore_coscheduling = ignore_coscheduling && placement.partition == 0;
  planned.granularity = sm_granularity(snapshot.sm_min_partition, snapshot.sm_coscheduled_alignment,
                                       planned.ignore_coscheduling);
  if (placement.partition == 0) {
    planned.quota = plan_sm_quota(snapshot.sm_count, planned.granularity, percentage,
                                  planned.ignore_coscheduling);
    return planned;
  }
  // A share of the partition; all of it is still a split of the device.
  const unsigned partition_sms = placement.groups * planned.granularity;
  planned.quota = plan_sm_quota(partition_sms, planned.granularity, percentage, false);
  planned.quota.whole_device = false;
  planned.quota.target = std::min(planned.quota.target, partition_sms);
  return planned;
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
  unsigned needed = std::clamp((quota.target + granularity - 1) / granularity, 1u, count);
  unsigned first = first_group_of_slot(placement.slot, placement.slots, count, needed);
  if (placement.partition != 0) {
    // The daemon cut the partition from this same split; a device that splits otherwise now
    // (another driver) cannot hold it.
    if (placement.groups == 0 || placement.first_group + placement.groups > count) {
      return tl::unexpected(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    }
    needed = std::min(needed, placement.groups);
    first = placement.first_group;
  } else if (placement.at_device_end) {
    first = count - needed;
  }
  return std::vector<CUdevResource>(groups.begin() + first, groups.begin() + first + needed);
}

// make_green_context's branches, in its order.
bool is_placed(const SmQuota& quota, unsigned granularity, const SmPlacement& placement) {
  return !quota.whole_device && placement.placed() && granularity != 0;
}

}  // namespace

GreenShape green_shape(const SmQuota& quota, unsigned granularity, const SmPlacement& placement) {
  GreenShape shape;
  if (quota.whole_device) {
    shape.kind = GreenShape::Kind::kWholeDevice;
    return shape;
  }
  shape.split_flags = quota.split_flags;
  shape.target = quota.target;
  if (!is_placed(quota, granularity, placement)) {
    shape.kind = GreenShape::Kind::kSplit;
    return shape;
  }
  shape.kind = GreenShape::Kind::kPlaced;
  shape.granularity = granularity;
  if (placement.partition != 0) {  // placed_groups: a partition overrides the slot
    shape.first_group = placement.first_group;
    shape.groups = placement.groups;
  } else if (placement.slots == 0) {  // at_device_end: the last groups
    shape.at_device_end = placement.at_device_end;
  } else {
    shape.slot = placement.slot % placement.slots;
    shape.slots = placement.slots;
  }
  return shape;
}

tl::expected<GreenContext, CUresult> make_green_context(const DriverTable& cu, CUdevice device,
                                                        const CUdevResource& device_sms,
                                                        const SmQuota& quota, unsigned granularity,
                                                        SmPlacement placement) {
  auto building = hold_green_builds();
  std::vector<CUdevResource> resources{device_sms};
  if (is_placed(quota, granularity, placement)) {
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
  auto out = green_context_of(cu, device, std::move(resources));
  if (out) out->shape = green_shape(quota, granularity, placement);
  return out;
}

tl::expected<GreenContext, CUresult> green_context_of(const DriverTable& cu, CUdevice device,
                                                      std::vector<CUdevResource> resources) {
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
