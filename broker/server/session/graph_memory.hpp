// Graph memory: what a graph's memory allocation node holds (ops/graph_nodes.cpp). The driver
// places it and keeps its address for every instantiation and launch; the session records it
// in its memory map (RangeKind::kGraph, owned by the graph's id), counts it against the client's
// limit until that graph is destroyed, and hands cuMemFree / cuMemFreeAsync of it to the driver
// without forgetting the range: a later launch of the graph allocates it again at the same
// address.
#pragma once

#include "broker/server/session/allocation_map.hpp"

namespace mpsshim::server {

inline bool is_graph_memory(const DeviceRange& range) {
  return range.kind == RangeKind::kGraph;
}

}  // namespace mpsshim::server
