// Static SM partitions, as NVIDIA MPS's static partitioning mode has them
// (`sm_partition add`, `sm_partition rm`, `lspart`, CUDA_MPS_SM_PARTITION): the operator cuts a
// GPU's SMs into partitions that never overlap, and a client that names a partition runs on its
// SMs only, so clients of different partitions never share an SM.
//
// A partition is a run of the groups the GPU's SM resource splits into in steps of its
// green-context granularity (8 SMs on H100/H200). How many groups there are depends on how the
// SMs lie in the GPU's GPCs (SMs a GPC has beyond a multiple of 8 are in none), so the GPU's
// server counts them with the driver (its `sm_partition_groups` command). The server builds
// each pinned client's green context from its partition's groups
// (broker/server/scheduling/green_context.hpp). Partitions live as long as the daemon (as MPS keeps
// them for its control daemon's life) and survive a server restart.
//
// Owned by the daemon's event loop (Supervisor::partitions()): commands change the table, the
// client gate reads it when a client attaches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tl/expected.hpp>

namespace mpsshim::daemon {

struct SmPartition {
  std::uint32_t id = 0;  // what CUDA_MPS_SM_PARTITION names; never reused while the daemon runs
  int gpu = 0;
  unsigned first_group = 0;
  unsigned groups = 0;
  unsigned granularity = 0;  // SMs per group
  unsigned sms() const { return groups * granularity; }
};

// How a GPU splits, as its server counted it.
struct SmGroups {
  unsigned count = 0;
  unsigned granularity = 0;
};

class SmPartitionTable {
 public:
  // A partition of at least `sms` SMs (rounded up to the granularity) on `gpu`, in the first run
  // of free groups that is long enough. Refused, with what is free, when none is.
  tl::expected<SmPartition, std::string> add(int gpu, unsigned sms, SmGroups split);
  // Forgets it; the caller made sure no client runs in it.
  bool remove(std::uint32_t id);
  const SmPartition* find(std::uint32_t id) const;
  const std::vector<SmPartition>& all() const { return partitions_; }

 private:
  std::vector<SmPartition> partitions_;  // by id
  std::uint32_t next_id_ = 1;
};

}  // namespace mpsshim::daemon
