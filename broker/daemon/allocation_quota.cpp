#include "broker/daemon/allocation_quota.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "broker/daemon/sizes.hpp"

namespace mpsshim::daemon {

namespace {

std::string token_of(const proto::ClientHello& hello) {
  return std::string(hello.allocation_token,
                     ::strnlen(hello.allocation_token, sizeof hello.allocation_token));
}

std::string gpu_list(const std::vector<int>& gpus) {
  return fmt::format("{}", fmt::join(gpus, ","));
}

void clamp_to_allocation(AdmissionQuota& quota, const Allocation& allocation) {
  proto::ClientHello& hello = quota.hello;
  const std::string whose = fmt::format("allocation {} (pod {})", allocation.id, quota.pod);
  if (allocation.sm_percentage != 0) {
    if (hello.active_thread_percentage == proto::kUnset) {
      hello.active_thread_percentage = allocation.sm_percentage;
    } else if (hello.active_thread_percentage > allocation.sm_percentage) {
      quota.clamps.push_back(fmt::format(
          "asked for {}% of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); its {} allows {}%; "
          "clamped to {}%",
          hello.active_thread_percentage, whose, allocation.sm_percentage,
          allocation.sm_percentage));
      hello.active_thread_percentage = allocation.sm_percentage;
    }
  }
  if (allocation.memory_limit != 0) {
    if (hello.device_memory_limit == 0) {
      hello.device_memory_limit = allocation.memory_limit;
    } else if (hello.device_memory_limit > allocation.memory_limit) {
      quota.clamps.push_back(fmt::format(
          "asked for a memory limit of {} (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT); its {} allows {}; "
          "clamped to {}",
          format_size(hello.device_memory_limit), whose, format_size(allocation.memory_limit),
          format_size(allocation.memory_limit)));
      hello.device_memory_limit = allocation.memory_limit;
    }
  }
  quota.allocation_id = allocation.id;
  quota.allocation_memory_limit = allocation.memory_limit;
  quota.sm_slot = allocation.sm_slot;
  quota.sm_slots = allocation.sm_slots;
}

// --require-allocation-token: a client without a token gets at most the node's defaults.
void clamp_to_defaults(AdmissionQuota& quota, const ServerDefaults& defaults, int gpu) {
  proto::ClientHello& hello = quota.hello;
  const int percentage = defaults.sm_percentage.value_or(100);
  if (hello.active_thread_percentage != proto::kUnset &&
      hello.active_thread_percentage > percentage) {
    quota.clamps.push_back(fmt::format(
        "has no allocation token and asked for {}% of the SMs; this node requires a token "
        "(mpsshimd --require-allocation-token), so it gets the default, {}%",
        hello.active_thread_percentage, percentage));
    hello.active_thread_percentage = percentage;
  }
  if (gpu < 0) return;
  const std::uint64_t limit = defaults.memory_limit_of(gpu);
  if (limit != 0 && hello.device_memory_limit > limit) {
    quota.clamps.push_back(fmt::format(
        "has no allocation token and asked for a memory limit of {}; this node requires a token "
        "(mpsshimd --require-allocation-token), so it gets the default, {}",
        format_size(hello.device_memory_limit), format_size(limit)));
    hello.device_memory_limit = limit;
  }
}

}  // namespace

tl::expected<AdmissionQuota, std::string> decide_quota(const AllocationRegistry& allocations,
                                                       const ServerDefaults& defaults,
                                                       const proto::ClientHello& hello, int gpu) {
  AdmissionQuota quota;
  quota.hello = hello;
  quota.pod = "-";
  const std::string token = token_of(hello);
  if (token.empty()) {
    if (allocations.tokens_required) clamp_to_defaults(quota, defaults, gpu);
    return quota;
  }
  const Allocation* allocation = allocations.find_token(token);
  if (allocation == nullptr) {
    return tl::unexpected(std::string(
        "its allocation token (MPSSHIM_ALLOCATION_TOKEN) is not one this mpsshimd issued, or "
        "it was revoked when the pod's device was given to another pod; the mpsshim device "
        "plugin puts a valid one into every container that requests its resource"));
  }
  quota.pod = pod_of(*allocation);
  if (gpu >= 0 && !allocation->gpus.empty() &&
      std::find(allocation->gpus.begin(), allocation->gpus.end(), gpu) == allocation->gpus.end()) {
    return tl::unexpected(fmt::format(
        "its allocation {} (pod {}) holds GPU {}, not GPU {}; keep the CUDA_VISIBLE_DEVICES the "
        "device plugin set",
        allocation->id, quota.pod, gpu_list(allocation->gpus), gpu));
  }
  clamp_to_allocation(quota, *allocation);
  return quota;
}

}  // namespace mpsshim::daemon
