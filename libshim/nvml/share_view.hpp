// This process's share of each GPU, as mpsshimd sees it (kClientView; docs/nvml.md): asked of
// the daemon the shim would connect to, kept for kRefresh, and asked again after that. Safe
// from any thread: one mutex over the cached answer, held while the daemon is asked, so one
// thread asks and the others take its answer.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "libshim/nvml/nvml_api.hpp"

namespace mpsshim::nvml {

struct ShareProcess {
  unsigned pid = 0;  // as this process sees it
  std::uint64_t memory_used = 0;
  std::string program;  // its name, as the client gave it
};

struct GpuShare {
  std::string uuid;                           // "GPU-…", as nvmlDeviceGetUUID gives it
  std::uint64_t total_memory = 0;             // the GPU's
  std::optional<std::uint64_t> memory_limit;  // what the scope may hold; none: no limit
  std::uint64_t memory_used = 0;              // what the scope's clients hold
  unsigned sms = 0;                           // a client of the scope's SMs
  std::optional<double> busy_percent;         // the scope's share of GPU busy time
  std::vector<ShareProcess> processes;
};

inline constexpr auto kRefresh = std::chrono::seconds(1);
// After the daemon could not be asked, the physical view is answered for this long before
// asking again.
inline constexpr auto kRetryAfterFailure = std::chrono::seconds(5);

// The share of the GPU `uuid`, or nullopt: the daemon cannot be reached or refused, or this
// process cannot use that GPU (then NVML answers for the physical GPU; logged once).
std::optional<GpuShare> share_of(const std::string& uuid);

// The same for an NVML device handle (its UUID asked of the real library).
std::optional<GpuShare> share_of_device(Device device);

// The daemon's JSON answer, read (exposed for the unit test).
std::optional<std::vector<GpuShare>> parse_view(const std::string& json);

}  // namespace mpsshim::nvml
