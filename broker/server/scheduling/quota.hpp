// How many SMs a client gets: its percentage of the device, rounded up to what the hardware
// can split off, and the split that gets it.
#pragma once

#include <cstdint>

namespace mpsshim::server {

// Measured on H100/H200: groups of 8 SMs by default; 2 when the split may ignore SM
// co-scheduling (CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING), at the cost of large
// clusters.
inline constexpr unsigned kIgnoreCoschedulingGranularity = 2;

// The SM count a split can be asked for in steps of.
unsigned sm_granularity(unsigned min_partition, unsigned coscheduled_alignment,
                        bool ignore_coscheduling);

struct SmQuota {
  bool whole_device = false;  // no split: the green context gets the whole SM resource
  unsigned target = 0;        // SMs asked of the split (minCount); sm_count when whole_device
  unsigned split_flags = 0;   // useFlags of cuDevSmResourceSplitByCount
};

// percentage is clamped to 1..100. target = ceil(sm_count * p / 100) rounded up to the
// granularity, at least one group; a target that reaches the device is the whole device.
SmQuota plan_sm_quota(unsigned sm_count, unsigned granularity, int percentage,
                      bool ignore_coscheduling);

}  // namespace mpsshim::server
