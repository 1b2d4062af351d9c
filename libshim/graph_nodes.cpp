// Graph nodes beyond kernels, memsets and copies, and the calls that change a graph's shape:
// event record and wait nodes, host nodes, memory allocation and free nodes, their queries and
// setters, enabling nodes of executable graphs, destroying a node, removing edges, cloning.
//
// Every node lives in the server's graph (proto/ops_graph_nodes.hpp). Queries of the node types
// made here are answered from what the shim keeps of their parameters (graph_objects.hpp); a
// node the shim never saw the parameters of (made by a stream capture) is asked of the server
// for its type, so a query of the wrong type still says CUDA_ERROR_INVALID_VALUE, as the driver
// does, and one of the right type is refused with a log line.
//
// A host node's function runs in this process, at every replay, as a captured cuLaunchHostFunc
// does (host_function.cpp). Graph memory is placed by the server's driver, on the graph's GPU
// only: other locations, peer access descriptors and shareable handles are refused with a log
// line (docs/graphs.md).
#include <cstring>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/graph_objects.hpp"
#include "libshim/host_function.hpp"
#include "libshim/object_pool.hpp"
#include "proto/ops_graph_nodes.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

namespace {

// Sets one parameter of a node (exec null) or of an executable graph's node; on success the
// node remembers `update` (a node's own parameters only: an executable graph's copy is its own).
template <typename Update>
CUresult set_param(CUgraphExec hexec, CUgraphNode hnode, proto::GraphNodeParam param,
                   std::uint64_t value, Update update) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return dead_or_null(hnode);
  proto::WireHandle exec_wire = 0;
  if (CUresult rc = exec_wire_of(hexec, exec_wire); rc != CUDA_SUCCESS) return rc;
  proto::GraphNodeParamsReq request{exec_wire, node->wire, value, static_cast<std::uint32_t>(param),
                                    1};
  if (CUresult rc = node->graph->ctx->session->call(proto::Op::kGraphNodeParams, &request,
                                                    sizeof request, {}, nullptr, 0);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (hexec == nullptr) {
    std::lock_guard lock(node->graph->mutex);
    update(node->params);
  }
  return CUDA_SUCCESS;
}

// An event a node may name: the client's, on the node's server.
Event* node_event(CUevent hevent, GraphNodeObject* node) {
  Event* event = object_of<Event>(hevent);
  if (event == nullptr || event->ctx == nullptr || node == nullptr ||
      event->ctx->session != node->graph->ctx->session) {
    return nullptr;
  }
  return event;
}

CUresult add_event_node(CUgraphNode* out, CUgraph hgraph, const CUgraphNode* deps,
                        std::size_t count, CUevent hevent, proto::GraphEventNodeKind kind) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  Event* event = object_of<Event>(hevent);
  if (graph != nullptr &&
      (event == nullptr || event->ctx == nullptr || event->ctx->session != graph->ctx->session)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  NodeParams params;
  params.type = kind == proto::GraphEventNodeKind::kWait ? CU_GRAPH_NODE_TYPE_WAIT_EVENT
                                                         : CU_GRAPH_NODE_TYPE_EVENT_RECORD;
  params.event = hevent;
  proto::GraphEventNodeReq request{};
  request.event = event != nullptr ? event->wire : 0;
  request.kind = static_cast<std::uint32_t>(kind);
  return add_node(out, hgraph, deps, count, proto::Op::kGraphAddEventNode, request, params);
}

CUresult get_event(CUgraphNode hnode, CUevent* out, CUgraphNodeType type, const char* call) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeParams params;
  if (CUresult rc = query_params(hnode, type, call, params); rc != CUDA_SUCCESS) return rc;
  *out = params.event;
  return CUDA_SUCCESS;
}

CUresult set_event(CUgraphExec hexec, CUgraphNode hnode, CUevent hevent, CUgraphNodeType type) {
  GraphNodeObject* node = node_of(hnode);
  Event* event = node_event(hevent, node);
  if (node != nullptr && event == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (node != nullptr && hexec == nullptr) {  // the server checks an executable graph's node
    NodeParams known;
    {
      std::lock_guard lock(node->graph->mutex);
      known = node->params;
    }
    if (known.known && known.type != type) return CUDA_ERROR_INVALID_VALUE;
  }
  return set_param(hexec, hnode, proto::GraphNodeParam::kEvent, event != nullptr ? event->wire : 0,
                   [&](NodeParams& p) {
                     p.type = type;
                     p.event = hevent;
                     p.known = true;
                   });
}

CUresult set_host(CUgraphExec hexec, CUgraphNode hnode, const CUDA_HOST_NODE_PARAMS* p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return dead_or_null(hnode);
  if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::uint64_t id = keep_host_callback(node->graph->ctx->session, p->fn, p->userData);
  if (id == 0) return CUDA_ERROR_NOT_SUPPORTED;
  const CUDA_HOST_NODE_PARAMS host = *p;
  return set_param(hexec, hnode, proto::GraphNodeParam::kHostCallback, id, [&](NodeParams& n) {
    n.type = CU_GRAPH_NODE_TYPE_HOST;
    n.host = host;
    n.known = true;
  });
}

// Graph memory on the graph's own GPU, readable and writable there: what the server's driver
// can place for this client. Anything else is refused, with the reason.
CUresult check_alloc_params(const GraphObject* graph, const CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  if (p == nullptr || p->bytesize == 0 || p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      (p->accessDescCount != 0 && p->accessDescs == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const int device = graph->ctx->device;
  auto refuse = [](const char* what) {
    log_once(what, LogLevel::kWarn,
             "cuGraphAddMemAllocNode: {} is not supported by mpsshim (graph memory lives on the "
             "graph's GPU, for it alone)",
             what);
    return CUDA_ERROR_NOT_SUPPORTED;
  };
  if (p->poolProps.location.id != device) {
    int count = 0;
    if (cuDeviceGetCount(&count) != CUDA_SUCCESS || p->poolProps.location.id < 0 ||
        p->poolProps.location.id >= count) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return refuse("graph memory on another GPU than the graph's");
  }
  if (p->poolProps.handleTypes != CU_MEM_HANDLE_TYPE_NONE) {
    return refuse("graph memory with a shareable handle type");
  }
  for (std::size_t i = 0; i < p->accessDescCount; ++i) {
    const CUmemAccessDesc& a = p->accessDescs[i];
    if (a.location.type != CU_MEM_LOCATION_TYPE_DEVICE || a.location.id != device ||
        a.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      return refuse("an access descriptor for another GPU, or other than read-write,");
    }
  }
  return CUDA_SUCCESS;
}

CUresult device_graph_mem(CUdevice device, proto::DeviceGraphMemReq request, std::uint64_t* value) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Session* session = nullptr;
  if (CUresult rc = session_for(device, session); rc != CUDA_SUCCESS) return rc;
  proto::GraphNodeValueRep reply{};
  if (CUresult rc =
          session->call(proto::Op::kDeviceGraphMem, request, value != nullptr ? &reply : nullptr);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (value != nullptr) *value = reply.value;
  return CUDA_SUCCESS;
}

CUresult remove_dependencies(CUgraph hgraph, const CUgraphNode* from, const CUgraphNode* to,
                             const CUgraphEdgeData* edges, std::size_t count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (count != 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (count > proto::kMaxNodeDependencies) {
    log_once("cuGraphRemoveDependencies.count", LogLevel::kWarn,
             "cuGraphRemoveDependencies: more than {} edges at once are not supported by "
             "mpsshim; remove them in parts",
             proto::kMaxNodeDependencies);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  std::vector<std::byte> trailing;
  for (std::size_t i = 0; i < count; ++i) {
    // Every edge under the shim is a default one (graph.cpp): another kind names no edge.
    if (edges != nullptr && (edges[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT ||
                             edges[i].from_port != 0 || edges[i].to_port != 0)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult rc = append_dependencies(graph, &from[i], 1, trailing); rc != CUDA_SUCCESS) {
      return rc;
    }
    if (CUresult rc = append_dependencies(graph, &to[i], 1, trailing); rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  proto::GraphAddDependenciesReq request{graph->wire, count};
  return graph->ctx->session->call(proto::Op::kGraphRemoveDependencies, &request, sizeof request,
                                   trailing, nullptr, 0);
}

// The node of `clone` that `original` became, with what the shim knows of the original.
CUresult find_in_clone(GraphNodeObject* original, GraphObject* clone, GraphNodeObject*& out) {
  proto::GraphRep reply{};
  if (CUresult rc = clone->ctx->session->call(
          proto::Op::kGraphNodeFindInClone, proto::GraphFindInCloneReq{original->wire, clone->wire},
          &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  out = node_for(clone, reply.handle);
  NodeParams params;
  {
    std::lock_guard lock(original->graph->mutex);
    params = original->params;
  }
  std::lock_guard lock(clone->mutex);
  if (!out->params.known) out->params = params;
  return CUDA_SUCCESS;
}

// The blocks of every live graph's memory allocation nodes, by base.
struct GraphMemoryBook {
  std::mutex mutex;
  std::unordered_map<CUdeviceptr, GraphObject*> owners;
};
GraphMemoryBook& graph_memory_book() {
  static auto* book = new GraphMemoryBook();  // never destroyed: used from static destructors
  return *book;
}

}  // namespace

namespace mpsshim::shim {

// The node's parameters for a query of a node of `type`: what the shim keeps; or the answer
// that ends the query (not a node, a node of another type, a node whose parameters the shim
// never saw).
CUresult query_params(CUgraphNode hnode, CUgraphNodeType type, const char* call, NodeParams& out) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return dead_or_null(hnode);
  {
    std::lock_guard lock(node->graph->mutex);
    out = node->params;
  }
  if (out.known) return out.type == type ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  proto::GraphNodeTypeRep reply{};
  if (CUresult rc = node->graph->ctx->session->call(proto::Op::kGraphNodeGetType,
                                                    proto::HandleReq{node->wire}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (reply.type != static_cast<std::uint32_t>(type)) return CUDA_ERROR_INVALID_VALUE;
  log_once(call, LogLevel::kWarn,
           "{}: the parameters of a node made by stream capture are not known to mpsshim; "
           "build the node with cuGraphAdd*Node to query them",
           call);
  return CUDA_ERROR_NOT_SUPPORTED;
}

void remember_graph_memory(GraphObject* graph, CUdeviceptr base, std::size_t bytes) {
  DeviceRange range{base, bytes, graph->ctx};
  range.device = graph->ctx->device;
  address_book().add_device(range);
  GraphMemoryBook& book = graph_memory_book();
  std::lock_guard lock(book.mutex);
  book.owners[base] = graph;
}

bool is_graph_memory(CUdeviceptr base) noexcept {
  GraphMemoryBook& book = graph_memory_book();
  std::lock_guard lock(book.mutex);
  return book.owners.contains(base);
}

void forget_graph_memory(GraphObject* graph) noexcept {
  std::vector<CUdeviceptr> blocks;
  {
    GraphMemoryBook& book = graph_memory_book();
    std::lock_guard lock(book.mutex);
    for (auto it = book.owners.begin(); it != book.owners.end();) {
      if (it->second == graph) {
        blocks.push_back(it->first);
        it = book.owners.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (CUdeviceptr base : blocks) address_book().remove_device(base, nullptr);
}

}  // namespace mpsshim::shim

// ---- event record and wait nodes ----

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddEventRecordNode(CUgraphNode* out, CUgraph graph,
                                                          const CUgraphNode* deps, size_t count,
                                                          CUevent event) {
  return add_event_node(out, graph, deps, count, event, proto::GraphEventNodeKind::kRecord);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddEventWaitNode(CUgraphNode* out, CUgraph graph,
                                                        const CUgraphNode* deps, size_t count,
                                                        CUevent event) {
  return add_event_node(out, graph, deps, count, event, proto::GraphEventNodeKind::kWait);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphEventRecordNodeGetEvent(CUgraphNode node, CUevent* out) {
  return get_event(node, out, CU_GRAPH_NODE_TYPE_EVENT_RECORD, "cuGraphEventRecordNodeGetEvent");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphEventWaitNodeGetEvent(CUgraphNode node, CUevent* out) {
  return get_event(node, out, CU_GRAPH_NODE_TYPE_WAIT_EVENT, "cuGraphEventWaitNodeGetEvent");
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphEventRecordNodeSetEvent(CUgraphNode node, CUevent event) {
  return set_event(nullptr, node, event, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphEventWaitNodeSetEvent(CUgraphNode node, CUevent event) {
  return set_event(nullptr, node, event, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecEventRecordNodeSetEvent(CUgraphExec exec,
                                                                   CUgraphNode node,
                                                                   CUevent event) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return set_event(exec, node, event, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecEventWaitNodeSetEvent(CUgraphExec exec, CUgraphNode node,
                                                                 CUevent event) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return set_event(exec, node, event, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

// ---- host nodes ----

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddHostNode(CUgraphNode* out, CUgraph hgraph,
                                                   const CUgraphNode* deps, size_t count,
                                                   const CUDA_HOST_NODE_PARAMS* p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const std::uint64_t id = keep_host_callback(graph->ctx->session, p->fn, p->userData);
  if (id == 0) return CUDA_ERROR_NOT_SUPPORTED;
  NodeParams params;
  params.type = CU_GRAPH_NODE_TYPE_HOST;
  params.host = *p;
  proto::GraphHostNodeReq request{};
  request.callback_id = id;
  return add_node(out, hgraph, deps, count, proto::Op::kGraphAddHostNode, request, params);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphHostNodeGetParams(CUgraphNode node,
                                                         CUDA_HOST_NODE_PARAMS* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeParams params;
  if (CUresult rc = query_params(node, CU_GRAPH_NODE_TYPE_HOST, "cuGraphHostNodeGetParams", params);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *out = params.host;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphHostNodeSetParams(CUgraphNode node,
                                                         const CUDA_HOST_NODE_PARAMS* p) {
  return set_host(nullptr, node, p);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecHostNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                             const CUDA_HOST_NODE_PARAMS* p) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return set_host(exec, node, p);
}

// ---- memory allocation and free nodes ----

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode* out, CUgraph hgraph,
                                                       const CUgraphNode* deps, size_t count,
                                                       CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult rc = check_alloc_params(graph, p); rc != CUDA_SUCCESS) return rc;
  NodeParams params;
  params.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  params.memory_bytes = p->bytesize;
  if (p->accessDescCount != 0) {
    params.access = p->accessDescs[0];
    params.access_count = 1;
  }
  proto::GraphMemAllocNodeReq request{};
  request.bytes = p->bytesize;
  proto::GraphMemAllocRep reply{};
  CUresult rc =
      add_node(out, hgraph, deps, count, proto::Op::kGraphAddMemAllocNode, request, params, &reply);
  if (rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(*out);
  {
    std::lock_guard lock(graph->mutex);
    node->params.memory = reply.dptr;
  }
  remember_graph_memory(graph, reply.dptr, p->bytesize);
  p->dptr = reply.dptr;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddMemFreeNode(CUgraphNode* out, CUgraph graph,
                                                      const CUgraphNode* deps, size_t count,
                                                      CUdeviceptr dptr) {
  if (dptr == 0) return CUDA_ERROR_INVALID_VALUE;
  NodeParams params;
  params.type = CU_GRAPH_NODE_TYPE_MEM_FREE;
  params.memory = dptr;
  proto::GraphMemFreeNodeReq request{};
  request.dptr = dptr;
  return add_node(out, graph, deps, count, proto::Op::kGraphAddMemFreeNode, request, params);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphMemAllocNodeGetParams(CUgraphNode hnode,
                                                             CUDA_MEM_ALLOC_NODE_PARAMS* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeParams params;
  if (CUresult rc =
          query_params(hnode, CU_GRAPH_NODE_TYPE_MEM_ALLOC, "cuGraphMemAllocNodeGetParams", params);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  GraphNodeObject* node = node_of(hnode);
  *out = CUDA_MEM_ALLOC_NODE_PARAMS{};
  out->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  out->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  out->poolProps.location.id = node->graph->ctx->device;
  // As the driver: the descriptors stay valid while the node lives.
  out->accessDescs = params.access_count != 0 ? &node->params.access : nullptr;
  out->accessDescCount = params.access_count;
  out->bytesize = params.memory_bytes;
  out->dptr = params.memory;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeParams params;
  if (CUresult rc =
          query_params(node, CU_GRAPH_NODE_TYPE_MEM_FREE, "cuGraphMemFreeNodeGetParams", params);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *out = params.memory;
  return CUDA_SUCCESS;
}

// The GPU's graph memory: every client's, as under NVIDIA MPS (one process owns the contexts).
MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device) {
  return device_graph_mem(
      device,
      proto::DeviceGraphMemReq{static_cast<std::uint32_t>(proto::DeviceGraphMemMode::kTrim), 0, 0},
      nullptr);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice device,
                                                             CUgraphMem_attribute attr,
                                                             void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::uint64_t got = 0;
  CUresult rc = device_graph_mem(
      device,
      proto::DeviceGraphMemReq{static_cast<std::uint32_t>(proto::DeviceGraphMemMode::kGet),
                               static_cast<std::uint32_t>(attr), 0},
      &got);
  if (rc == CUDA_SUCCESS) *static_cast<cuuint64_t*>(value) = got;
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceSetGraphMemAttribute(CUdevice device,
                                                             CUgraphMem_attribute attr,
                                                             void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return device_graph_mem(
      device,
      proto::DeviceGraphMemReq{static_cast<std::uint32_t>(proto::DeviceGraphMemMode::kSet),
                               static_cast<std::uint32_t>(attr),
                               *static_cast<const cuuint64_t*>(value)},
      nullptr);
}

// ---- enabling nodes of executable graphs ----

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphNodeSetEnabled(CUgraphExec exec, CUgraphNode node,
                                                      unsigned int enabled) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return set_param(exec, node, proto::GraphNodeParam::kEnabled, enabled != 0 ? 1 : 0,
                   [](NodeParams&) {});
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphNodeGetEnabled(CUgraphExec hexec, CUgraphNode hnode,
                                                      unsigned int* enabled) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphExecObject* exec = exec_of(hexec);
  GraphNodeObject* node = node_of(hnode);
  if (exec == nullptr || enabled == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (node == nullptr) return dead_or_null(hnode);
  proto::GraphNodeParamsReq request{exec->wire, node->wire, 0,
                                    static_cast<std::uint32_t>(proto::GraphNodeParam::kEnabled), 0};
  proto::GraphNodeValueRep reply{};
  if (CUresult rc = exec->ctx->session->call(proto::Op::kGraphNodeParams, request, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *enabled = static_cast<unsigned>(reply.value);
  return CUDA_SUCCESS;
}

// ---- a graph's shape ----

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphDestroyNode(CUgraphNode hnode) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return dead_or_null(hnode);
  GraphObject* graph = node->graph;
  if (CUresult rc =
          graph->ctx->session->call(proto::Op::kGraphDestroyNode, proto::HandleReq{node->wire},
                                    static_cast<proto::GraphRep*>(nullptr));
      rc != CUDA_SUCCESS) {
    return rc;
  }
  {
    std::lock_guard lock(graph->mutex);
    graph->nodes.erase(node->wire);
  }
  ObjectPool<GraphNodeObject>::instance().retire(node);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphRemoveDependencies(CUgraph graph, const CUgraphNode* from,
                                                          const CUgraphNode* to, size_t count) {
  return remove_dependencies(graph, from, to, nullptr, count);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphRemoveDependencies_v2(CUgraph graph, const CUgraphNode* from,
                                                             const CUgraphNode* to,
                                                             const CUgraphEdgeData* edges,
                                                             size_t count) {
  return remove_dependencies(graph, from, to, edges, count);
}

// The clone's nodes that the shim knows the parameters of are mapped at once (one round trip
// each), so their queries stay local as the original's are.
MPSSHIM_EXPORT CUresult CUDAAPI cuGraphClone(CUgraph* out, CUgraph horiginal) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* original = graph_of(horiginal);
  if (original == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::GraphRep reply{};
  if (CUresult rc = original->ctx->session->call(proto::Op::kGraphClone,
                                                 proto::HandleReq{original->wire}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  GraphObject* clone = graph_for(original->ctx, reply.handle);
  std::vector<GraphNodeObject*> known;
  {
    std::lock_guard lock(original->mutex);
    for (auto& [wire, node] : original->nodes)
      if (node->params.known) known.push_back(node);
  }
  for (GraphNodeObject* node : known) {
    GraphNodeObject* copy = nullptr;
    if (CUresult rc = find_in_clone(node, clone, copy); rc != CUDA_SUCCESS) {
      log_warn(
          "cuGraphClone: node {:#x} of the clone not found ({}); its parameters "
          "will be asked of the server",
          node->wire, static_cast<int>(rc));
    }
  }
  // The clone holds references of its own to the original's user objects.
  UserObjectRefs refs;
  {
    std::lock_guard lock(original->mutex);
    refs = original->user_refs;
  }
  retain_user_refs(refs);
  {
    std::lock_guard lock(clone->mutex);
    merge_user_refs(clone->user_refs, refs);
  }
  *out = reinterpret_cast<CUgraph>(clone);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphNodeFindInClone(CUgraphNode* out, CUgraphNode horiginal,
                                                       CUgraph hclone) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* original = node_of(horiginal);
  GraphObject* clone = graph_of(hclone);
  if (original == nullptr || clone == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GraphNodeObject* found = nullptr;
  if (CUresult rc = find_in_clone(original, clone, found); rc != CUDA_SUCCESS) return rc;
  *out = reinterpret_cast<CUgraphNode>(found);
  return CUDA_SUCCESS;
}
