// Graph nodes beyond kernels, memsets and copies, as the real driver behaves (measured on an
// H200 with driver 580 where noted): event record and wait nodes, host nodes, memory allocation
// and free nodes, their queries and setters, and the calls that change a graph's shape.
//
// - An event node's work is bound at each launch (launch_order): a record node takes a new
//   capture of its event when the graph is launched and completes it where the node runs; a wait
//   node waits for the capture that was its event's latest at launch. So a stream that waits for
//   the event after the launch waits for the graph, as on the GPU.
// - Graph memory is allocated when its node is added (the driver reserves the address then and
//   maps the memory at launch) and released once neither the graph nor its executable graph is
//   left. A launch allocates what the graph does not free itself: launching again before it
//   was freed (free node of another graph, cuMemFree, cuMemFreeAsync) is
//   CUDA_ERROR_INVALID_VALUE, as the driver answers.
// - A graph with memory nodes may not be cloned, lose nodes or edges, or be instantiated twice
//   at once: CUDA_ERROR_NOT_SUPPORTED (measured).
// - A getter or setter of one node type on a node of another type, a null function or event,
//   a free of memory that is not graph memory: CUDA_ERROR_INVALID_VALUE (measured).
#include <algorithm>
#include <map>
#include <utility>

#include "tests/testdriver/event.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

Work make_work(std::function<void()> f) {
  return std::make_shared<const std::function<void()>>(std::move(f));
}

Work placeholder() {
  static const Work none = make_work([] {});
  return none;
}

Work host_work(const CUDA_HOST_NODE_PARAMS& p) {
  return make_work([fn = p.fn, data = p.userData] { fn(data); });
}

// Graph memory by device: what its blocks hold now and the most they held (cuDevice*GraphMem*).
struct GraphMemUse {
  std::uint64_t used = 0;
  std::uint64_t high = 0;
};
std::map<int, GraphMemUse>& graph_mem_use() {  // locked
  static auto* use = new std::map<int, GraphMemUse>;
  return *use;
}

// A live node of type `type`: its GraphNode, or nullptr.
GraphNode* typed_node(State& s, CUgraphNode handle, CUgraphNodeType type) {
  if (!node_alive(s, handle)) return nullptr;
  GraphNode* node = node_of(handle);
  return node->type == type ? node : nullptr;
}

// The event node `handle` of an executable graph.
ExecEvent* exec_event(GraphExec& exec, CUgraphNode handle, bool wait) {
  for (ExecEvent& e : exec.events)
    if (e.node == handle && e.wait == wait) return &e;
  return nullptr;
}

CUresult add_event_node(CUgraphNode* out, CUgraph hgraph, const CUgraphNode* deps,
                        std::size_t count, CUevent hevent, CUgraphNodeType type) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::shared_ptr<Event> event = hevent != nullptr ? s.events.shared(hevent) : nullptr;
    if (!event) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = add_node(s, out, hgraph, deps, count, type, nullptr);
    if (r != CUDA_SUCCESS) return r;
    node_of(*out)->event = std::move(event);
    node_of(*out)->work = placeholder();
    return CUDA_SUCCESS;
  });
}

CUresult get_event(CUgraphNode hnode, CUevent* out, CUgraphNodeType type) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphNode* node = typed_node(s, hnode, type);
    if (node == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *out = reinterpret_cast<CUevent>(node->event.get());
    return CUDA_SUCCESS;
  });
}

CUresult set_event(CUgraphNode hnode, CUevent hevent, CUgraphNodeType type) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphNode* node = typed_node(s, hnode, type);
    std::shared_ptr<Event> event = hevent != nullptr ? s.events.shared(hevent) : nullptr;
    if (node == nullptr || !event) return CUDA_ERROR_INVALID_VALUE;
    node->event = std::move(event);
    return CUDA_SUCCESS;
  });
}

CUresult exec_set_event(CUgraphExec hexec, CUgraphNode hnode, CUevent hevent, bool wait) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphExec* exec = s.graph_execs.get(hexec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    ExecEvent* slot = exec_event(*exec, hnode, wait);
    std::shared_ptr<Event> event = hevent != nullptr ? s.events.shared(hevent) : nullptr;
    if (slot == nullptr || !event) return CUDA_ERROR_INVALID_VALUE;
    slot->event = std::move(event);  // later launches; queued ones keep what they bound
    ++s.graph_node_updates;
    return CUDA_SUCCESS;
  });
}

}  // namespace

Graph* graph_holding(State& s, CUgraphNode handle) {
  auto holds = [&](const Graph& g) {
    return std::any_of(g.nodes.begin(), g.nodes.end(),
                       [&](const auto& n) { return handle_of(n.get()) == handle; });
  };
  for (const auto& [h, g] : s.graphs)
    if (holds(*g)) return g.get();
  for (const auto& [h, weak] : s.embedded_graphs) {
    if (auto g = weak.lock(); g && holds(*g)) return g.get();
  }
  return nullptr;
}

void replace_exec_work(GraphExec& exec, std::size_t position, Work work) {
  auto order = std::make_shared<std::vector<Work>>(*exec.order);
  (*order)[position] = std::move(work);
  exec.order = std::move(order);
}

std::shared_ptr<const std::vector<Work>> launch_order(State& s, GraphExec& exec, CUresult* error) {
  for (CUdeviceptr block : exec.unfreed) {
    auto it = s.allocations.find(block);
    if (it != s.allocations.end() && it->second.graph_live) {
      *error = CUDA_ERROR_INVALID_VALUE;  // still allocated from an earlier launch (measured)
      return nullptr;
    }
  }
  for (CUdeviceptr block : exec.unfreed) {
    if (auto it = s.allocations.find(block); it != s.allocations.end()) {
      it->second.graph_live = true;
    }
  }
  for (CUdeviceptr block : exec.foreign_frees) free_graph_block(s, block);
  if (exec.events.empty()) return exec.order;
  auto bound = std::make_shared<std::vector<Work>>(*exec.order);
  for (const ExecEvent& e : exec.events) {  // in replay order: a wait sees earlier records
    if (e.wait) {
      const std::uint64_t generation = e.event->latest();
      (*bound)[e.position] = make_work([event = e.event, generation] {
        if (generation != 0) event->wait(generation);
      });
    } else {
      const std::uint64_t generation = e.event->capture();
      (*bound)[e.position] =
          make_work([event = e.event, generation] { event->complete(generation); });
    }
  }
  return bound;
}

bool free_graph_block(State& s, CUdeviceptr block) {
  auto it = s.allocations.find(block);
  if (it == s.allocations.end() || !it->second.graph || !it->second.graph_live) return false;
  it->second.graph_live = false;
  return true;
}

void release_graph_memory(State& s, std::shared_ptr<GraphMemory> memory) {
  if (!memory || memory.use_count() > 1) return;  // the graph or its executable graph has it
  drain(s, -1);                                   // a launch still queued may use it
  std::unique_lock use(s.memory_use);
  std::lock_guard lock(s.mutex);
  for (CUdeviceptr block : memory->blocks) {
    auto it = s.allocations.find(block);
    if (it == s.allocations.end()) continue;
    graph_mem_use()[it->second.device].used -= it->second.size;
    release_allocation(s, block);
  }
}

}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

// ---- event record and wait nodes ----

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphAddEventRecordNode(CUgraphNode* out,
                                                                     CUgraph hgraph,
                                                                     const CUgraphNode* deps,
                                                                     size_t count, CUevent event) {
  return add_event_node(out, hgraph, deps, count, event, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphAddEventWaitNode(CUgraphNode* out, CUgraph hgraph,
                                                                   const CUgraphNode* deps,
                                                                   size_t count, CUevent event) {
  return add_event_node(out, hgraph, deps, count, event, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphEventRecordNodeGetEvent(CUgraphNode node,
                                                                          CUevent* out) {
  return get_event(node, out, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphEventWaitNodeGetEvent(CUgraphNode node,
                                                                        CUevent* out) {
  return get_event(node, out, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphEventRecordNodeSetEvent(CUgraphNode node,
                                                                          CUevent event) {
  return set_event(node, event, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphEventWaitNodeSetEvent(CUgraphNode node,
                                                                        CUevent event) {
  return set_event(node, event, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphExecEventRecordNodeSetEvent(CUgraphExec exec,
                                                                              CUgraphNode node,
                                                                              CUevent event) {
  return exec_set_event(exec, node, event, false);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphExecEventWaitNodeSetEvent(CUgraphExec exec,
                                                                            CUgraphNode node,
                                                                            CUevent event) {
  return exec_set_event(exec, node, event, true);
}

// ---- host nodes ----

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphAddHostNode(CUgraphNode* out, CUgraph hgraph,
                                                              const CUgraphNode* deps, size_t count,
                                                              const CUDA_HOST_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = add_node(s, out, hgraph, deps, count, CU_GRAPH_NODE_TYPE_HOST, nullptr);
    if (r != CUDA_SUCCESS) return r;
    node_of(*out)->host = *p;
    node_of(*out)->work = host_work(*p);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphHostNodeGetParams(CUgraphNode hnode,
                                                                    CUDA_HOST_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphNode* node = typed_node(s, hnode, CU_GRAPH_NODE_TYPE_HOST);
    if (node == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *p = node->host;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuGraphHostNodeSetParams(CUgraphNode hnode, const CUDA_HOST_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphNode* node = typed_node(s, hnode, CU_GRAPH_NODE_TYPE_HOST);
    if (node == nullptr || p == nullptr || p->fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    node->host = *p;
    node->work = host_work(*p);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuGraphExecHostNodeSetParams(CUgraphExec hexec, CUgraphNode hnode, const CUDA_HOST_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphExec* exec = s.graph_execs.get(hexec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    auto slot = exec->positions.find(hnode);
    if (slot == exec->positions.end() || typed_node(s, hnode, CU_GRAPH_NODE_TYPE_HOST) == nullptr ||
        p == nullptr || p->fn == nullptr) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    replace_exec_work(*exec, slot->second, host_work(*p));
    ++s.graph_node_updates;
    return CUDA_SUCCESS;
  });
}

// ---- memory allocation and free nodes ----

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode* out, CUgraph hgraph,
                                                                  const CUgraphNode* deps,
                                                                  size_t count,
                                                                  CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::shared_ptr<Graph> g = find_graph(s, hgraph);
    if (!g) return CUDA_ERROR_INVALID_HANDLE;
    if (out == nullptr || p == nullptr || p->bytesize == 0 ||
        p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        p->poolProps.location.id != g->device ||
        (p->accessDescCount != 0 && p->accessDescs == nullptr)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    for (std::size_t i = 0; i < p->accessDescCount; ++i) {
      const CUmemAccessDesc& a = p->accessDescs[i];
      if (a.location.type != CU_MEM_LOCATION_TYPE_DEVICE || a.location.id < 0 ||
          static_cast<std::size_t>(a.location.id) >= s.devices.size()) {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    if (CUresult r = check_deps(*g, deps, count); r != CUDA_SUCCESS) return r;
    CUdeviceptr block = 0;
    Device& dev = *s.devices[static_cast<std::size_t>(g->device)];
    if (CUresult r = allocate(s, dev, p->bytesize, false, &block); r != CUDA_SUCCESS) return r;
    s.allocations.at(block).graph = true;
    if (CUresult r = add_node(s, out, hgraph, deps, count, CU_GRAPH_NODE_TYPE_MEM_ALLOC, nullptr);
        r != CUDA_SUCCESS) {
      release_allocation(s, block);
      return r;
    }
    GraphNode* node = node_of(*out);
    node->memory = block;
    node->memory_bytes = p->bytesize;
    g->has_memory_nodes = true;
    if (!g->memory) g->memory = std::make_shared<GraphMemory>();
    g->memory->blocks.push_back(block);
    GraphMemUse& use = graph_mem_use()[g->device];
    use.used += s.allocations.at(block).size;
    use.high = std::max(use.high, use.used);
    p->dptr = block;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphAddMemFreeNode(CUgraphNode* out, CUgraph hgraph,
                                                                 const CUgraphNode* deps,
                                                                 size_t count, CUdeviceptr dptr) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::shared_ptr<Graph> g = find_graph(s, hgraph);
    if (!g) return CUDA_ERROR_INVALID_HANDLE;
    auto block = s.allocations.find(dptr);
    // Graph memory only, freed by one free node at most (cuda.h).
    if (block == s.allocations.end() || !block->second.graph || block->second.freed_by_node) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    CUresult r = add_node(s, out, hgraph, deps, count, CU_GRAPH_NODE_TYPE_MEM_FREE, nullptr);
    if (r != CUDA_SUCCESS) return r;
    block->second.freed_by_node = true;
    node_of(*out)->memory = dptr;
    g->has_memory_nodes = true;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuGraphMemAllocNodeGetParams(CUgraphNode hnode, CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphNode* node = typed_node(s, hnode, CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    Graph* g = graph_holding(s, hnode);
    if (node == nullptr || g == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *p = CUDA_MEM_ALLOC_NODE_PARAMS{};
    p->poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p->poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p->poolProps.location.id = g->device;
    p->bytesize = node->memory_bytes;
    p->dptr = node->memory;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphMemFreeNodeGetParams(CUgraphNode hnode,
                                                                       CUdeviceptr* out) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphNode* node = typed_node(s, hnode, CU_GRAPH_NODE_TYPE_MEM_FREE);
    if (node == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *out = node->memory;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceGraphMemTrim(CUdevice device) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (device < 0 || static_cast<std::size_t>(device) >= s.devices.size())
      return CUDA_ERROR_INVALID_DEVICE;
    return CUDA_SUCCESS;  // nothing is cached beyond the blocks graphs hold
  });
}

// Used and reserved are the same here: graph memory is committed when its node is added.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceGetGraphMemAttribute(CUdevice device,
                                                                        CUgraphMem_attribute attr,
                                                                        void* value) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (device < 0 || static_cast<std::size_t>(device) >= s.devices.size())
      return CUDA_ERROR_INVALID_DEVICE;
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const GraphMemUse& use = graph_mem_use()[device];
    cuuint64_t out = 0;
    switch (attr) {
      case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
      case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
        out = use.used;
        break;
      case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
      case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
        out = use.high;
        break;
      default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    *static_cast<cuuint64_t*>(value) = out;
    return CUDA_SUCCESS;
  });
}

// Only the high watermarks may be set, and only to 0 (measured: 5 is CUDA_ERROR_INVALID_VALUE).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceSetGraphMemAttribute(CUdevice device,
                                                                        CUgraphMem_attribute attr,
                                                                        void* value) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (device < 0 || static_cast<std::size_t>(device) >= s.devices.size())
      return CUDA_ERROR_INVALID_DEVICE;
    if (value == nullptr || *static_cast<const cuuint64_t*>(value) != 0 ||
        (attr != CU_GRAPH_MEM_ATTR_USED_MEM_HIGH && attr != CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    GraphMemUse& use = graph_mem_use()[device];
    use.high = use.used;
    return CUDA_SUCCESS;
  });
}

// ---- a graph's shape ----

// Kernel nodes only, as cuGraphNodeSetEnabled here (graph.cpp); a host node is
// CUDA_ERROR_INVALID_VALUE, as the driver answers (measured).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphNodeGetEnabled(CUgraphExec hexec,
                                                                 CUgraphNode hnode,
                                                                 unsigned int* enabled) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphExec* exec = s.graph_execs.get(hexec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    auto slot = exec->kernels.find(hnode);
    if (slot == exec->kernels.end() || enabled == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *enabled = slot->second.enabled ? 1 : 0;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphDestroyNode(CUgraphNode hnode) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Graph* g = graph_holding(s, hnode);
    if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (g->has_memory_nodes) return CUDA_ERROR_NOT_SUPPORTED;
    for (auto& node : g->nodes) std::erase(node->deps, hnode);
    std::erase_if(g->nodes, [&](const auto& n) { return handle_of(n.get()) == hnode; });
    return CUDA_SUCCESS;
  });
}

// Every edge must exist, or none is removed (a missing one: CUDA_ERROR_INVALID_VALUE, measured).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuGraphRemoveDependencies_v2(CUgraph hgraph, const CUgraphNode* from, const CUgraphNode* to,
                             const CUgraphEdgeData* edges, size_t count) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::shared_ptr<Graph> g = find_graph(s, hgraph);
    if (!g) return CUDA_ERROR_INVALID_HANDLE;
    if (count != 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    if (g->has_memory_nodes) return CUDA_ERROR_NOT_SUPPORTED;
    for (std::size_t i = 0; i < count; ++i) {
      if (edges != nullptr && (edges[i].type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT ||
                               edges[i].from_port != 0 || edges[i].to_port != 0)) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (check_deps(*g, &from[i], 1) != CUDA_SUCCESS || check_deps(*g, &to[i], 1) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
      const auto& deps = node_of(to[i])->deps;
      if (std::find(deps.begin(), deps.end(), from[i]) == deps.end())
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (std::size_t i = 0; i < count; ++i) std::erase(node_of(to[i])->deps, from[i]);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphRemoveDependencies(CUgraph hgraph,
                                                                     const CUgraphNode* from,
                                                                     const CUgraphNode* to,
                                                                     size_t count) {
  return cuGraphRemoveDependencies_v2(hgraph, from, to, nullptr, count);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphClone(CUgraph* out, CUgraph horiginal) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::shared_ptr<Graph> g = find_graph(s, horiginal);
    if (!g || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (g->has_memory_nodes || g->has_conditional_nodes) return CUDA_ERROR_NOT_SUPPORTED;
    std::shared_ptr<Graph> copy = clone_graph(s, *g);
    s.embedded_graphs.erase(copy->handle());  // the caller's, not a node's
    *out = s.graphs.add(std::move(copy));
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphNodeFindInClone(CUgraphNode* out,
                                                                  CUgraphNode original,
                                                                  CUgraph hclone) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::shared_ptr<Graph> clone = find_graph(s, hclone);
    if (!clone || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (const auto& node : clone->nodes) {
      if (node->cloned_from == original && original != nullptr) {
        *out = handle_of(node.get());
        return CUDA_SUCCESS;
      }
    }
    return CUDA_ERROR_INVALID_VALUE;
  });
}
