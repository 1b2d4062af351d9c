// What quota a client gets, decided by the daemon from its allocation token (or the node's
// defaults), never from what the client asks alone: a pod can set its own environment, so
// CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT can only lower what
// its allocation allows (docs/kubernetes.md, "Per-pod quotas").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "broker/daemon/allocations.hpp"
#include "broker/daemon/supervisor.hpp"
#include "proto/control.hpp"

namespace mpsshim::daemon {

struct AdmissionQuota {
  proto::ClientHello hello;  // the client's, with the quota fields as decided
  std::uint32_t allocation_id = 0;
  std::uint64_t allocation_memory_limit = 0;  // shared by the allocation's clients on one GPU
  unsigned sm_slot = 0;                       // where its SMs lie (Allocation::sm_slot)
  unsigned sm_slots = 0;
  std::string pod;                  // "ns/name" or "-", for the log
  std::vector<std::string> clamps;  // one sentence per request that was lowered
};

// `gpu`: the physical ordinal an attach resolved to; -1 for a device query. An unknown token,
// or a GPU the allocation does not hold, is an error (the sentence the client is refused with).
tl::expected<AdmissionQuota, std::string> decide_quota(const AllocationRegistry& allocations,
                                                       const ServerDefaults& defaults,
                                                       const proto::ClientHello& hello, int gpu);

}  // namespace mpsshim::daemon
