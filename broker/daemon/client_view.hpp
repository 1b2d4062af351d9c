// What a process sees of its share of the GPUs through NVML (libmpsshim-nvml.so, docs/nvml.md):
// for each GPU it may see, the memory limit that applies to it, the device memory its scope's
// clients hold, their processes and their share of the GPU's busy time.
//
// The scope is the requester's Kubernetes allocation when its hello carries a token (the pod's
// share), otherwise its cgroup (a container, a systemd unit or a login session): the processes
// an operator would call "this job". Built on the event loop's thread only, from the servers'
// `ps` answers (client_table.hpp); nothing here is shared with another thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "broker/daemon/client_table.hpp"

namespace mpsshim::daemon {

struct ViewScope {
  std::uint32_t allocation_id = 0;  // 0: the cgroup is the scope
  std::string pod;                  // "ns/name" of the allocation, "-" when unnamed
  std::string cgroup;               // the requester's cgroup v2 path ("" when unknown)
};

// One GPU the requester may see, with the quota an attach to it would get.
struct ViewGpu {
  int gpu = 0;      // the daemon's ordinal
  int ordinal = 0;  // the requester's CUDA ordinal (CUDA_VISIBLE_DEVICES applied)
  std::string uuid;
  std::uint64_t total_memory = 0;  // the GPU's
  unsigned sms = 0;                // the GPU's
  std::uint64_t memory_limit = 0;  // what the scope may hold; 0: no limit
  int sm_percentage = 100;         // what a client of the scope gets
};

// GPU busy time of every client, read from successive `ps` answers: the share of a window that
// the scope's clients kept the GPU busy. Needs mpsshimd --busy-time on (busy_us= in `ps`).
class BusySampler {
 public:
  using Clock = std::chrono::steady_clock;
  // A window shorter than this is noise; one longer than kMaxWindow is stale.
  static constexpr auto kMinWindow = std::chrono::milliseconds(100);
  static constexpr auto kMaxWindow = std::chrono::seconds(10);

  // True when a GPU of `ps` whose clients report busy time has no reading from which a window
  // ending now can be measured: take() this answer, and read again after kMinWindow.
  bool needs_reading(const std::vector<ServerClients>& ps, Clock::time_point now) const;

  // Busy microseconds per client since the last reading of its GPU (key: gpu/group/client),
  // and each GPU's window; the readings are kept for the next call, unless the window is
  // shorter than kMinWindow (then the older readings stay, so a fast poller still measures).
  struct Deltas {
    std::map<std::string, double, std::less<>> busy_us;
    std::map<int, Clock::duration> window;
  };
  Deltas take(const std::vector<ServerClients>& ps, Clock::time_point now);

  // The key of one `ps` client line: "gpu/isolation group/client id".
  static std::string key(int gpu, const ClientFields& fields);

 private:
  struct GpuReadings {
    Clock::time_point at;
    std::map<std::string, double, std::less<>> busy_us;
  };
  std::map<int, GpuReadings> readings_;
};

struct ViewContext {
  ViewScope scope;
  std::vector<ViewGpu> gpus;
  // The pid to show for a client (its pid in the requester's pid namespace), or nullopt when
  // the requester cannot see it: it is counted, not listed.
  std::function<std::optional<long>(long pid)> visible_pid;
  // The cgroup of a client (the scope's test when there is no allocation).
  std::function<std::string(long pid)> cgroup_of;
};

// The answer's JSON (docs/nvml.md): {"scope": ..., "gpus": [{"uuid", "gpu", "ordinal",
// "memory_total_bytes", "memory_limit_bytes", "memory_used_bytes", "sms", "busy_percent",
// "processes": [{"pid", "memory_used_bytes", "program"}]}]}.
nlohmann::json build_client_view(const ViewContext& context, const std::vector<ServerClients>& ps,
                                 const BusySampler::Deltas& deltas);

// What the scope compares when there is no allocation: the cgroup v2 path of `pid` (the "0::"
// line of /proc/<pid>/cgroup); on a host with cgroup v1 alone, every hierarchy's path, which
// processes of one container or unit share. "" when unknown (the process is gone).
std::string cgroup_identity(long pid);

// `pid` (in the daemon's pid namespace) as `requester` sees it: its innermost NSpid when both
// share a pid namespace, itself when the requester is in the daemon's namespace, else nullopt.
std::optional<long> pid_seen_by(long pid, long requester);

}  // namespace mpsshim::daemon
