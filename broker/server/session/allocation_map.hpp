// The device memory one client may name: its own allocations, the module and library globals
// it looked up, the device side of its pinned host regions, and its virtual-memory mappings
// that it made read-write accessible. A pointer range a client sends is used only if it lies
// inside one of these.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

namespace mpsshim::server {

// kMapped: a cuMemMap'ed range with read-write access (ops/vmm.cpp). Consecutive mapped ranges
// are one contiguous span of device addresses, as for the driver: a pointer range may cross
// from one into the next (an expandable allocator grows a buffer a mapping at a time).
// kOpened: another client's allocation opened with cuIpcOpenMemHandle (ipc_memory.cpp); usable
// as the client's own, freed only with cuIpcCloseMemHandle.
// kPeer: another GPU's memory of the same client, mapped here at its own address (ops/peer.cpp),
// a physical allocation at a time: consecutive ones are one span, as consecutive kMapped ones.
enum class RangeKind : std::uint8_t {
  kAllocation,
  kGlobal,
  kPinned,
  kMapped,
  kOpened,
  kPeer,
  kGraph,  // a graph's memory allocation node's (graph_memory.hpp)
};
inline constexpr std::size_t kRangeKinds = static_cast<std::size_t>(RangeKind::kGraph) + 1;

struct DeviceRange {
  std::uint64_t base = 0;
  std::uint64_t bytes = 0;
  RangeKind kind = RangeKind::kAllocation;
  // allocation: context id (pool id for pool memory); global: module/library id; pinned: region
  // id; mapped: the physical allocation's id; opened: the export's registry token; peer: 0;
  // graph: the id of the graph whose allocation node holds it
  std::uint64_t owner = 0;
};

class AllocationMap {
 public:
  // False if the range wraps past 2^64 or its base is already known (a global looked up twice
  // is remembered once).
  bool add(const DeviceRange& range);

  // [p, p + n) lies inside one known range, or a run of back-to-back mapped or peer ranges. Zero
  // bytes touch nothing and are always fine.
  bool contains(std::uint64_t p, std::uint64_t n) const;

  const DeviceRange* find(std::uint64_t base) const;
  // The range that holds `address` (its base or inside it), if any.
  const DeviceRange* find_containing(std::uint64_t address) const;
  std::optional<DeviceRange> remove(std::uint64_t base);
  std::vector<DeviceRange> remove_if(const std::function<bool(const DeviceRange&)>& pred);

  std::size_t size() const { return ranges_.size(); }
  // Ranges of one kind: the per-client allocation cap counts kAllocation (client_limits.hpp).
  std::size_t count(RangeKind kind) const { return by_kind_[static_cast<std::size_t>(kind)]; }

 private:
  std::map<std::uint64_t, DeviceRange> ranges_;     // by base
  std::array<std::size_t, kRangeKinds> by_kind_{};  // ranges_ counted by RangeKind
};

}  // namespace mpsshim::server
