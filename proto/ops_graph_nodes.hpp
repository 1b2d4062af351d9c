// Payloads of the graph node opcodes (ops 117..128): event record and wait nodes, host nodes,
// memory allocation and free nodes, the setters and queries the shim cannot answer itself
// (memset and memcpy nodes' new parameters among them), and the calls that change a graph's
// shape (destroy a node, remove edges, clone). Every kGraphAdd* request here is followed by its
// dependency ids, as GraphAddNodeHeader says (proto/ops.hpp).
#pragma once

#include <cstdint>

#include "proto/ops.hpp"

namespace mpsshim::proto {

enum class GraphEventNodeKind : std::uint32_t { kRecord = 0, kWait = 1 };

// kGraphAddEventNode -> GraphRep.
struct GraphEventNodeReq {
  GraphAddNodeHeader node;
  WireHandle event;
  std::uint32_t kind;  // GraphEventNodeKind
  std::uint32_t reserved;
};

// kGraphAddHostNode -> GraphRep. The callback is the client's (its id in the client's callback
// table); the driver runs the server's host function, which has the client run it, at every
// replay (as a captured cuLaunchHostFunc).
struct GraphHostNodeReq {
  GraphAddNodeHeader node;
  std::uint64_t callback_id;
};

// kGraphAddMemAllocNode -> GraphMemAllocRep. Pinned device memory of the server's GPU, readable
// and writable by it only (the shim refuses other pool properties and access descriptors).
struct GraphMemAllocNodeReq {
  GraphAddNodeHeader node;
  std::uint64_t bytes;
};
struct GraphMemAllocRep {
  WireHandle node;
  std::uint64_t dptr;  // fixed for every instantiation and launch, as the driver says
};

// kGraphAddMemFreeNode -> GraphRep: frees graph memory (an allocation node's).
struct GraphMemFreeNodeReq {
  GraphAddNodeHeader node;
  std::uint64_t dptr;
};

// kGraphNodeParams -> GraphNodeValueRep: one parameter of a node of a graph (exec 0) or of an
// executable graph made from the node's graph.
enum class GraphNodeParam : std::uint32_t {
  kEvent = 0,         // set: value is an event id (an event record or wait node)
  kHostCallback = 1,  // set: value is the client's callback id (a host node)
  kEnabled = 2,       // executable graphs only; set: value 0 or 1; get: the reply
};
struct GraphNodeParamsReq {
  WireHandle exec;  // 0: the node itself
  WireHandle node;
  std::uint64_t value;
  std::uint32_t param;  // GraphNodeParam
  std::uint32_t set;    // 1: set, 0: get
};
struct GraphNodeValueRep {
  std::uint64_t value;
};

// kGraphNodeFindInClone -> GraphRep: the node of `clone` that `node` became.
struct GraphFindInCloneReq {
  WireHandle node;
  WireHandle clone;
};

// kDeviceGraphMem -> GraphNodeValueRep: the GPU's graph memory (every client's, as under NVIDIA
// MPS, where one process owns the GPU's contexts too).
enum class DeviceGraphMemMode : std::uint32_t { kTrim = 0, kGet = 1, kSet = 2 };
struct DeviceGraphMemReq {
  std::uint32_t mode;       // DeviceGraphMemMode
  std::uint32_t attribute;  // CUgraphMem_attribute (get, set)
  std::uint64_t value;      // set
};

// kGraphMemsetNodeSetParams: a memset node's new parameters (as GraphMemsetNodeReq's), on the
// graph's node (exec 0) or an executable graph's.
struct GraphMemsetNodeSetReq {
  WireHandle exec;
  WireHandle node;
  std::uint64_t dst;
  std::uint64_t pitch;
  std::uint64_t width;   // elements per row
  std::uint64_t height;  // rows
  std::uint32_t value;
  std::uint32_t element_bytes;
};

// kGraphCopyNodeSetParams: a memcpy node's new one-dimensional device-to-device copy.
struct GraphCopyNodeSetReq {
  WireHandle exec;
  WireHandle node;
  std::uint64_t dst;
  std::uint64_t src;
  std::uint64_t bytes;
};

static_assert(kWireSafe<GraphEventNodeReq> && sizeof(GraphEventNodeReq) == 32);
static_assert(kWireSafe<GraphHostNodeReq> && sizeof(GraphHostNodeReq) == 24);
static_assert(kWireSafe<GraphMemAllocNodeReq> && sizeof(GraphMemAllocNodeReq) == 24);
static_assert(kWireSafe<GraphMemAllocRep> && sizeof(GraphMemAllocRep) == 16);
static_assert(kWireSafe<GraphMemFreeNodeReq> && sizeof(GraphMemFreeNodeReq) == 24);
static_assert(kWireSafe<GraphNodeParamsReq> && sizeof(GraphNodeParamsReq) == 32);
static_assert(kWireSafe<GraphNodeValueRep> && sizeof(GraphNodeValueRep) == 8);
static_assert(kWireSafe<GraphFindInCloneReq> && sizeof(GraphFindInCloneReq) == 16);
static_assert(kWireSafe<DeviceGraphMemReq> && sizeof(DeviceGraphMemReq) == 16);
static_assert(kWireSafe<GraphMemsetNodeSetReq> && sizeof(GraphMemsetNodeSetReq) == 56);
static_assert(kWireSafe<GraphCopyNodeSetReq> && sizeof(GraphCopyNodeSetReq) == 40);

}  // namespace mpsshim::proto
