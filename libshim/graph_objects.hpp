// The client's graph objects (libshim/graph.cpp, libshim/graph_nodes.cpp): graphs, executable
// graphs and nodes are server handles wrapped in small objects whose magic tells a live handle
// from a stale one. A node also keeps what the shim knows of its parameters (it made or set
// them), so that queries of them need no round trip.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "libshim/client.hpp"
#include "proto/ops.hpp"

namespace mpsshim::shim {

inline constexpr std::uint32_t kGraphMagic = 0x47524631;      // "GRF1"
inline constexpr std::uint32_t kGraphExecMagic = 0x47455831;  // "GEX1"
inline constexpr std::uint32_t kNodeMagic = 0x474e4431;       // "GND1"
inline constexpr std::uint32_t kDeadMagic = 0;

struct GraphNodeObject;

struct GraphObject {
  std::uint32_t magic = kGraphMagic;
  Context* ctx = nullptr;
  proto::WireHandle wire = 0;
  std::mutex mutex;
  std::unordered_map<proto::WireHandle, GraphNodeObject*> nodes;
  // The graph embedded in a child graph node of this one is owned by the node: it dies with this
  // graph (`embedded`), and cuGraphDestroy of it is refused (`owner` is set).
  std::vector<GraphObject*> embedded;
  GraphObject* owner = nullptr;
};

// What the shim knows of a node's parameters: the type it was made as (EMPTY with `known`
// false: made by a capture, or listed by cuGraphGetNodes, so the server knows), and the
// parameters of the node types the shim answers queries of itself.
struct NodeParams {
  bool known = false;
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  CUevent event = nullptr;       // event record and wait nodes
  CUDA_HOST_NODE_PARAMS host{};  // host nodes
  CUdeviceptr memory = 0;        // memory allocation and free nodes
  std::size_t memory_bytes = 0;  // memory allocation nodes
  CUmemAccessDesc access{};      // memory allocation nodes: the one access descriptor given
  std::size_t access_count = 0;
  // Kernel nodes: the launch as given, its arguments packed at the function's layout.
  CUfunction func = nullptr;
  CUkernel kern = nullptr;
  unsigned grid[3]{};
  unsigned block[3]{};
  unsigned shared_bytes = 0;
  std::vector<std::byte> args;
  std::vector<std::uint32_t> arg_offsets;
  // Memset and memcpy nodes: their parameters as given.
  CUDA_MEMSET_NODE_PARAMS memset{};
  CUDA_MEMCPY3D memcpy{};
};

struct GraphNodeObject {
  std::uint32_t magic = kNodeMagic;
  GraphObject* graph = nullptr;
  proto::WireHandle wire = 0;
  NodeParams params;  // guarded by graph->mutex
  // cuGraphKernelNodeGetParams' kernelParams: pointers into params.args, valid until the next
  // query of the node or its end (guarded by graph->mutex).
  std::vector<void*> arg_pointers = {};
};

struct GraphExecObject {
  std::uint32_t magic = kGraphExecMagic;
  Context* ctx = nullptr;
  proto::WireHandle wire = 0;
  std::uint64_t flags = 0;  // its instantiation's (cuGraphExecGetFlags)
};

template <typename T>
T* live(void* handle, std::uint32_t magic) {
  auto* object = static_cast<T*>(handle);
  return object != nullptr && object->magic == magic ? object : nullptr;
}
inline GraphObject* graph_of(CUgraph h) {
  return live<GraphObject>(h, kGraphMagic);
}
inline GraphExecObject* exec_of(CUgraphExec h) {
  return live<GraphExecObject>(h, kGraphExecMagic);
}
inline GraphNodeObject* node_of(CUgraphNode h) {
  return live<GraphNodeObject>(h, kNodeMagic);
}
// The server id of an executable graph a setter names, 0 for none (the graph's own node);
// CUDA_ERROR_INVALID_HANDLE for one that is not live.
inline CUresult exec_wire_of(CUgraphExec hexec, proto::WireHandle& wire) {
  wire = 0;
  if (hexec == nullptr) return CUDA_SUCCESS;
  GraphExecObject* exec = exec_of(hexec);
  if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  wire = exec->wire;
  return CUDA_SUCCESS;
}
// What a call on a node that is not live answers: no node at all is an invalid value, as the
// driver says; a node of a destroyed graph (or a forged one) an invalid handle.
inline CUresult dead_or_null(CUgraphNode h) {
  return h == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE;
}

// The graph object for a server graph id (one per id, made on first sight).
GraphObject* graph_for(Context* ctx, proto::WireHandle wire);
// The node object for a server node id of `graph` (one per id, made on first sight).
GraphNodeObject* node_for(GraphObject* graph, proto::WireHandle wire);
// Graph memory (graph_nodes.cpp): a memory allocation node's block is a device range of the
// process from the node's creation until its graph is destroyed; cuMemFree and cuMemFreeAsync of
// it free it for the graph's next launch, which allocates it again at the same address, so they
// leave it in the address book.
void remember_graph_memory(GraphObject* graph, CUdeviceptr base, std::size_t bytes);
bool is_graph_memory(CUdeviceptr base) noexcept;
void forget_graph_memory(GraphObject* graph) noexcept;

// The node's parameters for a query of a node of `type` (`call` names the query in a log line):
// what the shim keeps; or the answer that ends the query (not a node, a node of another type,
// a node whose parameters the shim never saw: asked of the server for its type).
CUresult query_params(CUgraphNode hnode, CUgraphNodeType type, const char* call, NodeParams& out);

// New parameters for a kernel node of a graph (hexec null) or of an executable graph made from
// it, packed as for a new kernel node; a graph's node remembers them (graph.cpp).
CUresult kernel_node_set_params(CUgraphExec hexec, CUgraphNode hnode, CUfunction func,
                                CUkernel kern, unsigned const grid[3], unsigned const block[3],
                                unsigned shared, void** params, void** extra);

// Appends the server ids of `deps` (nodes of `graph`; any graph's if null) to `out`.
CUresult append_dependencies(GraphObject* graph, const CUgraphNode* deps, std::size_t count,
                             std::vector<std::byte>& out);

}  // namespace mpsshim::shim
