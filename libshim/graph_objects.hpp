// The client's graph objects (libshim/graph.cpp, libshim/graph_nodes.cpp): graphs, executable
// graphs and nodes are server handles wrapped in small objects whose magic tells a live handle
// from a stale one. A node also keeps what the shim knows of its parameters (it made or set
// them), so that queries of them need no round trip.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "libshim/client.hpp"
#include "libshim/user_objects.hpp"
#include "proto/ops.hpp"
#include "proto/ops_graph_nodes.hpp"

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
  // The references it holds to user objects (cuGraphRetainUserObject), guarded by `mutex`.
  UserObjectRefs user_refs{};
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
  // Batch memory operation nodes: the operations as given (cuGraphBatchMemOpNodeGetParams
  // answers a pointer to these), the context and flags.
  std::vector<CUstreamBatchMemOpParams> mem_ops;
  CUcontext mem_ops_ctx = nullptr;
  unsigned mem_ops_flags = 0;
  // Kernel nodes: the priority the client set (the server's driver holds it biased).
  int priority = 0;
};

struct GraphNodeObject {
  std::uint32_t magic = kNodeMagic;
  GraphObject* graph = nullptr;
  proto::WireHandle wire = 0;
  NodeParams params;  // guarded by graph->mutex
  // cuGraphKernelNodeGetParams' kernelParams: pointers into params.args, valid until the next
  // query of the node or its end (guarded by graph->mutex).
  std::vector<void*> arg_pointers = {};
  // A conditional node's body graphs, the array its creator was handed (phGraph_out): valid
  // for the node's life.
  std::vector<CUgraph> bodies = {};
};

struct GraphExecObject {
  std::uint32_t magic = kGraphExecMagic;
  Context* ctx = nullptr;
  proto::WireHandle wire = 0;
  std::uint64_t flags = 0;  // its instantiation's (cuGraphExecGetFlags)
  // The user object references its graph held when it was made; let go of after its last
  // launch has run (user_objects.cpp). `last_stream`: where it was last launched.
  std::mutex mutex{};
  UserObjectRefs user_refs{};
  CUstream last_stream = nullptr;
  bool launched = false;
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

// User objects (user_objects.cpp): an executable graph takes its graph's references (and its
// embedded graphs') when it is made, and lets go of them after its last launch has run.
void exec_take_user_refs(GraphExecObject* exec, GraphObject* graph);
void exec_release_user_refs(GraphExecObject* exec);

// Conditional nodes (graph_control_nodes.cpp): the node and its body graphs, which it owns.
CUresult add_conditional_node(CUgraphNode* out, CUgraph hgraph, const CUgraphNode* deps,
                              std::size_t count, CUDA_CONDITIONAL_NODE_PARAMS& params);

// Appends the server ids of `deps` (nodes of `graph`; any graph's if null) to `out`.
CUresult append_dependencies(GraphObject* graph, const CUgraphNode* deps, std::size_t count,
                             std::vector<std::byte>& out);

// Adds a node of `params.type` with `request` (its header filled here) and remembers what the
// shim knows of it. The reply names the node in `handle`, or in `node` where it says more;
// `extra` follows the dependency ids in the record.
template <typename Req, typename Rep = proto::GraphRep>
CUresult add_node(CUgraphNode* out, CUgraph hgraph, const CUgraphNode* deps, std::size_t count,
                  proto::Op op, Req request, NodeParams params, Rep* reply_out = nullptr,
                  std::span<const std::byte> extra = {}) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::byte> trailing;
  if (CUresult rc = append_dependencies(graph, deps, count, trailing); rc != CUDA_SUCCESS) {
    return rc;
  }
  trailing.insert(trailing.end(), extra.begin(), extra.end());
  request.node = proto::GraphAddNodeHeader{graph->wire, static_cast<std::uint32_t>(count), 0};
  Rep reply{};
  if (CUresult rc =
          graph->ctx->session->call(op, &request, sizeof request, trailing, &reply, sizeof reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  GraphNodeObject* node = nullptr;
  if constexpr (requires { reply.node; }) {
    node = node_for(graph, reply.node);
  } else {
    node = node_for(graph, reply.handle);
  }
  params.known = true;
  {
    std::lock_guard lock(graph->mutex);
    node->params = params;
  }
  if (reply_out != nullptr) *reply_out = reply;
  *out = reinterpret_cast<CUgraphNode>(node);
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::shim
