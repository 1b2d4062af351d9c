#include "broker/server/scheduling/quota.hpp"

#include <cuda.h>

#include <algorithm>

namespace mpsshim::server {

unsigned sm_granularity(unsigned min_partition, unsigned coscheduled_alignment,
                        bool ignore_coscheduling) {
  if (ignore_coscheduling) return kIgnoreCoschedulingGranularity;
  return std::max({min_partition, coscheduled_alignment, 1u});
}

SmQuota plan_sm_quota(unsigned sm_count, unsigned granularity, int percentage,
                      bool ignore_coscheduling) {
  SmQuota quota;
  int p = std::clamp(percentage, 1, 100);
  granularity = std::max(granularity, 1u);
  std::uint64_t wanted = (std::uint64_t{sm_count} * static_cast<unsigned>(p) + 99) / 100;
  std::uint64_t target = (wanted + granularity - 1) / granularity * granularity;
  target = std::max<std::uint64_t>(target, granularity);
  if (p == 100 || target >= sm_count) {
    quota.whole_device = true;
    quota.target = sm_count;
    return quota;
  }
  quota.target = static_cast<unsigned>(target);
  quota.split_flags = ignore_coscheduling ? CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING : 0;
  return quota;
}

}  // namespace mpsshim::server
