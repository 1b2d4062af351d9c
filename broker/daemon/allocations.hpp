// Allocations: what the Kubernetes device plugin registered for each pod (docs/kubernetes.md).
// An allocation carries the quota a pod's clients get at most, and a random token the plugin
// puts into the pod's environment. A client presents the token in its hello; the daemon, not
// the client, decides its quota from it, so a pod cannot raise its own.
//
// Ownership: the daemon's event-loop thread only (commands register and revoke, the client gate
// looks tokens up). Nothing here is persisted: after a restart of mpsshimd the plugin registers
// the allocations again (it re-sends every allocation it made, docs/kubernetes.md).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <tl/expected.hpp>

namespace mpsshim::daemon {

struct Allocation {
  std::uint32_t id = 0;
  std::string token;               // kTokenHexDigits hex digits, from getrandom()
  int sm_percentage = 0;           // 1-100; 0 = no cap
  std::uint64_t memory_limit = 0;  // per GPU, shared by every client of the allocation; 0 = none
  std::vector<int> gpus;           // physical ordinals its clients may use; empty = any
  // Where its SMs lie: slot sm_slot of sm_slots equal parts of the GPU (the plugin passes the
  // replica); sm_slots 0 = no placement.
  unsigned sm_slot = 0;
  unsigned sm_slots = 0;
  std::vector<std::string> devices;  // the kubelet's device IDs (replicas) it holds
  std::string pod_namespace;         // for ps and the metrics, when the plugin knows them
  std::string pod_name;
  // isolation=own: its clients get servers of their own (isolation group allocation:ID),
  // whatever mpsshimd --isolation says (docs/isolation.md).
  bool own_isolation_group = false;
};

class AllocationRegistry {
 public:
  static constexpr std::size_t kTokenHexDigits = 32;  // 128 random bits
  static constexpr std::size_t kMaxAllocations = 65536;

  // Parses `key=value` words: sm=P memory=SIZE gpus=0,1 devices=a,b namespace=NS pod=NAME
  // slot=N/M (SMs in part N of M of the GPU) token=HEX (to register again, after a daemon restart,
  // a token the pod already holds) isolation=own|shared (own: an isolation group of its own).
  // Registering replaces every allocation that holds one of the same devices: the kubelet gives a
  // device to one container at a time, so an older holder has gone.
  tl::expected<const Allocation*, std::string> add(const std::vector<std::string>& words);
  bool revoke(std::uint32_t id);
  // Sets namespace and pod of allocation `id`; false if there is none.
  bool label(std::uint32_t id, std::string pod_namespace, std::string pod_name);

  const Allocation* find_token(std::string_view token) const;
  const Allocation* find(std::uint32_t id) const;
  const std::map<std::uint32_t, Allocation>& all() const { return by_id_; }

  // mpsshimd --require-allocation-token: clients without a token get the node's defaults, not
  // what they ask for.
  bool tokens_required = false;

 private:
  std::map<std::uint32_t, Allocation> by_id_;
  std::uint32_t next_id_ = 1;
};

// Letters, digits, '-', '.', '_', at most 253: what Kubernetes allows in names and device IDs,
// and nothing that would break a `key=value` line of ps.
bool is_kubernetes_name(std::string_view text);

// Appends ` namespace=NS pod=NAME` to every line of a server's `ps` answer whose
// `allocation=` names a registered allocation with a pod (for the metrics' labels).
std::string with_pod_fields(const AllocationRegistry& allocations, const std::string& ps_text);

// "ns/pod" or "-": how ps and list_allocations name an allocation's pod.
std::string pod_of(const Allocation& allocation);

}  // namespace mpsshim::daemon
