// Conditional nodes, batch memory operation nodes and kernel node attributes in the test driver,
// as the real driver behaves (cuda.h; docs/graphs.md says what was measured on an H200).
//
// A conditional handle is the address of its cell (graph.hpp, ConditionalCell); the `countdown`
// kernel sets it as cudaGraphSetConditional does, through set_graph_conditional, which refuses a
// handle that is not live (a device fault, as a wild pointer would give). A conditional node
// replays its bodies as they were when its graph was instantiated (graph.cpp, conditional_work).
#include <map>
#include <mutex>

#include "tests/testdriver/graph.hpp"
#include "tests/testdriver/kernels.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

// The live handles, by value. Kernels read it on the launch thread, without the state's lock.
struct ConditionalRegistry {
  std::mutex mutex;
  std::map<std::uint64_t, std::weak_ptr<ConditionalCell>> cells;
};
ConditionalRegistry& registry() {
  static auto* r = new ConditionalRegistry();
  return *r;
}

// The node must be a live kernel node (locked).
GraphNode* kernel_node(State& s, CUgraphNode hnode) {
  if (graph_holding(s, hnode) == nullptr) return nullptr;
  GraphNode* node = node_of(hnode);
  return node->type == CU_GRAPH_NODE_TYPE_KERNEL ? node : nullptr;
}

bool known_attribute(CUkernelNodeAttrID id) {
  switch (id) {
    case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
    case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
    case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
    case CU_LAUNCH_ATTRIBUTE_PRIORITY:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
    case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
    case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      return true;
    default:
      return false;
  }
}

// The operations' work, run in order as one node (locked).
CUresult batch_work(State& s, const CUDA_BATCH_MEM_OP_NODE_PARAMS* p, std::function<void()>& out) {
  if (p == nullptr || p->count == 0 || p->paramArray == nullptr || p->flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::vector<std::function<void()>> works(p->count);
  for (unsigned i = 0; i < p->count; ++i) {
    if (CUresult r = mem_op_work(s, p->paramArray[i], works[i]); r != CUDA_SUCCESS) return r;
  }
  out = [works = std::move(works)] {
    for (const auto& w : works) w();
  };
  return CUDA_SUCCESS;
}

}  // namespace

bool set_graph_conditional(std::uint64_t handle, unsigned value) {
  ConditionalRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.cells.find(handle);
  if (it == r.cells.end()) return false;
  auto cell = it->second.lock();
  if (!cell) return false;
  cell->value.store(value, std::memory_order_release);
  return true;
}

}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuGraphConditionalHandleCreate(CUgraphConditionalHandle* out, CUgraph hgraph, CUcontext,
                               unsigned int default_value, unsigned int flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::shared_ptr<Graph> g = find_graph(s, hgraph);
    if (!g || out == nullptr || (flags & ~unsigned{CU_GRAPH_COND_ASSIGN_DEFAULT}) != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto cell = std::make_shared<ConditionalCell>();
    cell->default_value = default_value;
    cell->assign_default = (flags & CU_GRAPH_COND_ASSIGN_DEFAULT) != 0;
    cell->value.store(default_value);
    g->conditionals.push_back(cell);
    const auto handle = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(cell.get()));
    {
      ConditionalRegistry& r = registry();
      std::lock_guard registered(r.mutex);
      r.cells[handle] = cell;
    }
    *out = handle;
    return CUDA_SUCCESS;
  });
}

// The generic form serves the node types only it can make: conditional nodes.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* out, CUgraph hgraph,
                                                             const CUgraphNode* deps,
                                                             const CUgraphEdgeData* edges,
                                                             size_t count, CUgraphNodeParams* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (p == nullptr || edges != nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (p->type != CU_GRAPH_NODE_TYPE_CONDITIONAL) return CUDA_ERROR_NOT_SUPPORTED;
    std::shared_ptr<Graph> g = find_graph(s, hgraph);
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    CUDA_CONDITIONAL_NODE_PARAMS& c = p->conditional;
    std::shared_ptr<ConditionalCell> cell;
    for (const auto& mine : g->conditionals) {
      if (static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(mine.get())) == c.handle) {
        cell = mine;
      }
    }
    if (!cell) return CUDA_ERROR_INVALID_VALUE;  // a handle made for another graph, or none
    const bool size_ok = c.type == CU_GRAPH_COND_TYPE_SWITCH  ? c.size > 0
                         : c.type == CU_GRAPH_COND_TYPE_IF    ? c.size == 1 || c.size == 2
                         : c.type == CU_GRAPH_COND_TYPE_WHILE ? c.size == 1
                                                              : false;
    if (!size_ok) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = add_node(s, out, hgraph, deps, count, CU_GRAPH_NODE_TYPE_CONDITIONAL, nullptr);
        r != CUDA_SUCCESS) {
      return r;
    }
    GraphNode* node = node_of(*out);
    node->condition = cell;
    node->condition_type = c.type;
    for (unsigned i = 0; i < c.size; ++i) {
      auto body = std::make_shared<Graph>();
      body->device = g->device;
      body->has_conditional_nodes = true;  // inside a conditional: same restrictions
      s.embedded_graphs[body->handle()] = body;
      node->bodies.push_back(std::move(body));
    }
    g->has_conditional_nodes = true;
    // The driver's array of the bodies, valid for the node's life.
    static_assert(sizeof(CUgraph) == sizeof(void*));
    s.conditional_bodies[*out].clear();
    for (const auto& body : node->bodies) s.conditional_bodies[*out].push_back(body->handle());
    c.phGraph_out = s.conditional_bodies[*out].data();
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuGraphAddBatchMemOpNode(CUgraphNode* out, CUgraph hgraph, const CUgraphNode* deps, size_t count,
                         const CUDA_BATCH_MEM_OP_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::function<void()> work;
    if (CUresult r = batch_work(s, p, work); r != CUDA_SUCCESS) return r;
    if (CUresult r =
            add_node(s, out, hgraph, deps, count, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP, std::move(work));
        r != CUDA_SUCCESS) {
      return r;
    }
    node_of(*out)->mem_ops.assign(p->paramArray, p->paramArray + p->count);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuGraphBatchMemOpNodeSetParams(CUgraphNode hnode, const CUDA_BATCH_MEM_OP_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::function<void()> work;
    if (CUresult r = batch_work(s, p, work); r != CUDA_SUCCESS) return r;
    if (CUresult r = set_node_work(s, hnode, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP, std::move(work));
        r != CUDA_SUCCESS) {
      return r;
    }
    node_of(hnode)->mem_ops.assign(p->paramArray, p->paramArray + p->count);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphExecBatchMemOpNodeSetParams(
    CUgraphExec hexec, CUgraphNode hnode, const CUDA_BATCH_MEM_OP_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::function<void()> work;
    if (CUresult r = batch_work(s, p, work); r != CUDA_SUCCESS) return r;
    return set_exec_work(s, hexec, hnode, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP, std::move(work));
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphKernelNodeGetAttribute(
    CUgraphNode hnode, CUkernelNodeAttrID id, CUkernelNodeAttrValue* value) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphNode* node = kernel_node(s, hnode);
    if (node == nullptr || value == nullptr || !known_attribute(id)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto it = node->attributes.find(id);
    *value = it == node->attributes.end() ? CUkernelNodeAttrValue{} : it->second;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphKernelNodeSetAttribute(
    CUgraphNode hnode, CUkernelNodeAttrID id, const CUkernelNodeAttrValue* value) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphNode* node = kernel_node(s, hnode);
    if (node == nullptr || value == nullptr || !known_attribute(id)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (id == CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW &&
        !window_in_memory(s, value->accessPolicyWindow)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    node->attributes[id] = *value;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphKernelNodeCopyAttributes(CUgraphNode dst,
                                                                           CUgraphNode src) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphNode* to = kernel_node(s, dst);
    GraphNode* from = kernel_node(s, src);
    if (to == nullptr || from == nullptr) return CUDA_ERROR_INVALID_VALUE;
    to->attributes = from->attributes;
    return CUDA_SUCCESS;
  });
}
