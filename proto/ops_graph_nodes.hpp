// Payloads of the graph node opcodes (ops 117..128, 134..138): event record and wait nodes, host
// nodes, memory allocation and free nodes, conditional nodes, batch memory operation nodes, the
// setters and queries the shim cannot answer itself (memset and memcpy nodes' new parameters and
// kernel nodes' attributes among them), and the calls that change a graph's shape (destroy a
// node, remove edges, clone). Every kGraphAdd* request here is followed by its
// dependency ids, as GraphAddNodeHeader says (proto/ops.hpp).
#pragma once

#include <cstdint>

#include "proto/ops.hpp"
#include "proto/ops_stream_mem.hpp"

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

// kGraphConditionalHandleCreate -> GraphNodeValueRep (the driver's handle: kernels set it with
// cudaGraphSetConditional, so it is the driver's value, not an id).
struct GraphConditionalHandleReq {
  WireHandle graph;
  std::uint32_t default_value;
  std::uint32_t flags;  // CU_GRAPH_COND_ASSIGN_DEFAULT or 0
};

// kGraphAddConditionalNode -> GraphConditionalRep. The handle must be one this session made for
// the node's graph.
struct GraphConditionalNodeReq {
  GraphAddNodeHeader node;
  std::uint64_t handle;
  std::uint32_t type;  // CUgraphConditionalNodeType
  std::uint32_t size;  // body graphs: 1 (while), 1 or 2 (if), up to kMaxConditionalBodies (switch)
};
inline constexpr std::uint32_t kMaxConditionalBodies = 256;
// The node and its body graphs' ids. The node owns its bodies: the client adds nodes to them, but
// cuGraphDestroy of one is refused, and they go with the node's graph.
struct GraphConditionalRep {
  WireHandle node;
  std::uint32_t size;
  std::uint32_t reserved;
  WireHandle bodies[kMaxConditionalBodies];
};

// kGraphAddBatchMemOpNode -> GraphRep. Followed by the dependency ids, then op_count
// StreamMemOpReqs (stream 0), in order. Their addresses are checked as a stream's are.
struct GraphBatchMemOpNodeReq {
  GraphAddNodeHeader node;
  std::uint32_t op_count;
  std::uint32_t flags;  // 0, as the driver requires
};
inline constexpr std::uint32_t kMaxBatchMemOps = 256;

// kGraphBatchMemOpNodeSetParams: a batch memory operation node's new operations, on the graph's
// node (exec 0) or an executable graph's. Followed by op_count StreamMemOpReqs.
struct GraphBatchMemOpSetReq {
  WireHandle exec;
  WireHandle node;
  std::uint32_t op_count;
  std::uint32_t flags;
};

// kGraphKernelNodeAttribute: cuGraphKernelNodeGetAttribute (-> WireLaunchAttribute),
// cuGraphKernelNodeSetAttribute and cuGraphKernelNodeCopyAttributes (-> nothing).
enum class KernelNodeAttributeMode : std::uint32_t { kGet = 0, kSet = 1, kCopy = 2 };
struct GraphKernelNodeAttributeReq {
  WireHandle node;     // get, set: the node; copy: the destination
  WireHandle source;   // copy: the node whose attributes are copied; else 0
  std::uint32_t mode;  // KernelNodeAttributeMode
  std::uint32_t reserved;
  WireLaunchAttribute attribute;  // get: its id; set: id and value
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
static_assert(kWireSafe<GraphConditionalHandleReq> && sizeof(GraphConditionalHandleReq) == 16);
static_assert(kWireSafe<GraphConditionalNodeReq> && sizeof(GraphConditionalNodeReq) == 32);
static_assert(kWireSafe<GraphConditionalRep> && sizeof(GraphConditionalRep) <= kSlotPayloadBytes);
static_assert(kWireSafe<GraphBatchMemOpNodeReq> && sizeof(GraphBatchMemOpNodeReq) == 24);
static_assert(kWireSafe<GraphBatchMemOpSetReq> && sizeof(GraphBatchMemOpSetReq) == 24);
static_assert(kWireSafe<GraphKernelNodeAttributeReq> && sizeof(GraphKernelNodeAttributeReq) == 96);

}  // namespace mpsshim::proto
