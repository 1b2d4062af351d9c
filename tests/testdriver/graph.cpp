// Stream capture and graphs: a capturing stream records its work as graph nodes; an executable
// graph replays them, in a topological order, as one work item of the stream it is launched on.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "tests/testdriver/fault_injection.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {

// A graph by handle: one of the table's, or one embedded in a child graph node still alive.
std::shared_ptr<Graph> find_graph(State& s, CUgraph handle) {
  if (auto g = s.graphs.shared(handle)) return g;
  auto it = s.embedded_graphs.find(handle);
  if (it == s.embedded_graphs.end()) return nullptr;
  auto g = it->second.lock();
  if (!g) s.embedded_graphs.erase(it);
  return g;
}

// A deep copy of `g` (what cuGraphAddChildGraphNode embeds): new nodes with the same work and
// edges, embedded graphs copied too and registered.
std::shared_ptr<Graph> clone_graph(State& s, const Graph& g) {
  auto copy = std::make_shared<Graph>();
  copy->device = g.device;
  std::map<CUgraphNode, CUgraphNode> renamed;
  for (const auto& node : g.nodes) {
    auto n = std::make_unique<GraphNode>(*node);
    n->cloned_from = handle_of(node.get());
    if (node->child) n->child = clone_graph(s, *node->child);
    for (CUgraphNode& d : n->deps) d = renamed.at(d);
    renamed[handle_of(node.get())] = handle_of(n.get());
    copy->nodes.push_back(std::move(n));
  }
  s.embedded_graphs[copy->handle()] = copy;
  return copy;
}

// Node index by handle, in creation order.
std::map<CUgraphNode, std::size_t> index_of(const Graph& g) {
  std::map<CUgraphNode, std::size_t> index;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) index[handle_of(g.nodes[i].get())] = i;
  return index;
}

GraphShape shape_of(const Graph& g) {
  const auto index = index_of(g);
  GraphShape shape;
  for (const auto& node : g.nodes) {
    shape.types.push_back(node->type);
    std::vector<std::size_t> deps;
    for (CUgraphNode d : node->deps) deps.push_back(index.at(d));
    std::sort(deps.begin(), deps.end());
    shape.deps.push_back(std::move(deps));
  }
  return shape;
}

std::shared_ptr<const std::vector<Work>> replay_order(const Graph& g, const GraphShape& shape,
                                                      std::vector<std::size_t>* positions);

// A conditional node's replay: its bodies' orders, fixed now, run as its handle says then.
Work conditional_work(const GraphNode& node) {
  std::vector<std::shared_ptr<const std::vector<Work>>> bodies;
  for (const auto& body : node.bodies) {
    auto order = replay_order(*body, shape_of(*body), nullptr);
    if (!order) return nullptr;
    bodies.push_back(std::move(order));
  }
  auto run = [](const std::vector<Work>& order) {
    for (const Work& w : order) (*w)();
  };
  return std::make_shared<const std::function<void()>>(
      [cell = node.condition, type = node.condition_type, bodies, run] {
        auto value = [&] { return cell->value.load(std::memory_order_acquire); };
        switch (type) {
          case CU_GRAPH_COND_TYPE_IF:
            if (value() != 0) {
              run(*bodies[0]);
            } else if (bodies.size() == 2) {
              run(*bodies[1]);
            }
            break;
          case CU_GRAPH_COND_TYPE_WHILE:
            while (value() != 0) run(*bodies[0]);
            break;
          case CU_GRAPH_COND_TYPE_SWITCH:
            if (value() < bodies.size()) run(*bodies[value()]);
            break;
        }
      });
}

// The nodes' work in an order that runs every node after its dependencies (Kahn). `positions`
// (when given) gets each node's index in that order (nodes without work: none).
std::shared_ptr<const std::vector<Work>> replay_order(
    const Graph& g, const GraphShape& shape, std::vector<std::size_t>* positions = nullptr) {
  const std::size_t n = g.nodes.size();
  std::vector<std::size_t> waiting(n);
  std::vector<std::vector<std::size_t>> dependents(n);
  for (std::size_t i = 0; i < n; ++i) {
    waiting[i] = shape.deps[i].size();
    for (std::size_t d : shape.deps[i]) dependents[d].push_back(i);
  }
  std::vector<std::size_t> ready;
  for (std::size_t i = 0; i < n; ++i)
    if (waiting[i] == 0) ready.push_back(i);
  auto order = std::make_shared<std::vector<Work>>();
  if (positions != nullptr) positions->assign(n, 0);
  // Its conditional handles take their defaults first, at every launch (and every replay of a
  // body that made handles of its own).
  for (const auto& cell : g.conditionals) {
    if (cell->assign_default) {
      order->push_back(std::make_shared<const std::function<void()>>(
          [cell] { cell->value.store(cell->default_value, std::memory_order_relaxed); }));
    }
  }
  std::size_t visited = 0;
  while (!ready.empty()) {
    const std::size_t i = ready.back();
    ready.pop_back();
    ++visited;
    if (positions != nullptr) (*positions)[i] = order->size();
    if (g.nodes[i]->work) order->push_back(g.nodes[i]->work);
    if (const auto& child = g.nodes[i]->child) {  // its embedded graph's work, in its place
      auto inner = replay_order(*child, shape_of(*child));
      if (!inner) return nullptr;
      order->insert(order->end(), inner->begin(), inner->end());
    }
    if (g.nodes[i]->condition) {  // its bodies' work as they are now, chosen at each replay
      auto work = conditional_work(*g.nodes[i]);
      if (!work) return nullptr;
      order->push_back(std::move(work));
    }
    for (std::size_t d : dependents[i])
      if (--waiting[d] == 0) ready.push_back(d);
  }
  if (visited != n) return nullptr;  // a cycle
  return order;
}

// Nodes named by a dependency list, all of graph `g`.
CUresult check_deps(const Graph& g, const CUgraphNode* deps, std::size_t count) {
  if (count != 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (std::size_t i = 0; i < count; ++i) {
    bool found = false;
    for (const auto& node : g.nodes) found = found || handle_of(node.get()) == deps[i];
    if (!found) return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult add_node(State& s, CUgraphNode* out, CUgraph hgraph, const CUgraphNode* deps,
                  std::size_t count, CUgraphNodeType type, std::function<void()> work) {
  Graph* g = find_graph(s, hgraph).get();
  if (g == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_deps(*g, deps, count); r != CUDA_SUCCESS) return r;
  auto node = std::make_unique<GraphNode>();
  node->type = type;
  if (work) node->work = std::make_shared<const std::function<void()>>(std::move(work));
  node->deps.assign(deps, deps + count);
  *out = handle_of(node.get());
  g->nodes.push_back(std::move(node));
  return CUDA_SUCCESS;
}

// The SMs a node runs on: its context's (a green context's own), else the device's.
std::shared_ptr<const std::vector<std::uint16_t>> sms_of(State& s, CUcontext ctx, int device) {
  const CurrentContext c = context_of(s, ctx != nullptr ? ctx : current_context(s).handle);
  if (c.null_stream != nullptr && c.device != nullptr && c.device->ordinal == device)
    return c.null_stream->sms;
  return s.devices[static_cast<std::size_t>(device)]->primary.null_stream
             ? s.devices[static_cast<std::size_t>(device)]->primary.null_stream->sms
             : nullptr;
}

// The context a kernel node runs in: a CUkernel's is the node's ctx (NULL: the current one); a
// CUfunction's is modelled as the context current when the node is made.
CUcontext kernel_context(State& s, const CUDA_KERNEL_NODE_PARAMS& p) {
  if (p.func == nullptr && p.ctx != nullptr) return p.ctx;
  return current_context(s).handle;
}

// A disabled kernel node's work leaves the replay order (an empty node in its place: its
// dependents still wait for what it waited for) and waits in `disabled_work`. Copy on write: a
// queued launch holds the order it was given.
Work no_work() {
  static const Work none = std::make_shared<const std::function<void()>>([] {});
  return none;
}

void disable_kernel(GraphExec& exec, ExecKernel& kernel) {
  auto order = std::make_shared<std::vector<Work>>(*exec.order);
  kernel.disabled_work = std::move((*order)[kernel.position]);
  (*order)[kernel.position] = no_work();
  exec.order = std::move(order);
  kernel.enabled = false;
}

void enable_kernel(GraphExec& exec, ExecKernel& kernel) {
  auto order = std::make_shared<std::vector<Work>>(*exec.order);
  (*order)[kernel.position] = std::move(kernel.disabled_work);
  kernel.disabled_work = nullptr;
  exec.order = std::move(order);
  kernel.enabled = true;
}

// The replay order of `g` and where each kernel node's work sits in it, into `exec`; kernel nodes
// keep the handles they had (an update keeps the original graph's handles working). False for a
// graph with a cycle.
bool order_exec(const Graph& g, GraphExec& exec) {
  std::vector<std::size_t> positions;
  auto order = replay_order(g, exec.shape, &positions);
  if (!order) return false;
  exec.order = std::move(order);
  for (auto& [handle, kernel] : exec.kernels) kernel.position = positions[kernel.node];
  for (auto& [handle, child] : exec.children) child.position = positions[child.node];
  exec.events.clear();
  exec.unfreed.clear();
  exec.positions.clear();
  // The handles of the graph it was instantiated from keep naming its nodes after an update.
  if (exec.handles.empty()) {
    for (const auto& node : g.nodes) exec.handles.push_back(handle_of(node.get()));
  }
  std::vector<CUdeviceptr> freed_here;
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const GraphNode& node = *g.nodes[i];
    const CUgraphNode handle = exec.handles[i];
    if (node.work) exec.positions[handle] = positions[i];
    if (node.event) {
      exec.events.push_back(
          ExecEvent{handle, positions[i], node.event, node.type == CU_GRAPH_NODE_TYPE_WAIT_EVENT});
    }
    if (node.type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) exec.unfreed.push_back(node.memory);
    if (node.type == CU_GRAPH_NODE_TYPE_MEM_FREE) freed_here.push_back(node.memory);
  }
  const std::vector<CUdeviceptr> allocated_here = exec.unfreed;
  std::erase_if(exec.unfreed, [&](CUdeviceptr p) {
    return std::find(freed_here.begin(), freed_here.end(), p) != freed_here.end();
  });
  exec.foreign_frees.clear();
  for (CUdeviceptr p : freed_here) {
    if (std::find(allocated_here.begin(), allocated_here.end(), p) == allocated_here.end())
      exec.foreign_frees.push_back(p);
  }
  std::sort(exec.events.begin(), exec.events.end(),
            [](const ExecEvent& a, const ExecEvent& b) { return a.position < b.position; });
  for (std::size_t i = 0; i < g.nodes.size(); ++i) {
    const GraphNode& node = *g.nodes[i];
    if (node.child) {
      const GraphShape inner = shape_of(*node.child);
      exec.children[handle_of(g.nodes[i].get())] =
          ExecChild{i, positions[i], replay_order(*node.child, inner)->size(), inner};
    }
    if (node.type != CU_GRAPH_NODE_TYPE_KERNEL || !node.work) continue;
    ExecKernel& kernel = exec.kernels[handle_of(g.nodes[i].get())];
    const bool enabled = kernel.enabled;  // a whole-graph update keeps a node's enabled state
    kernel = ExecKernel{i, positions[i], node.context, true, nullptr};
    if (!enabled) disable_kernel(exec, kernel);
  }
  return true;
}

bool capturing(const Stream& stream) {
  return stream.capture != nullptr;
}

// Every node from which `tail` can be reached, `tail` included.
std::set<CUgraphNode> ancestors(const std::vector<CUgraphNode>& tail) {
  std::set<CUgraphNode> seen;
  std::vector<CUgraphNode> todo = tail;
  while (!todo.empty()) {
    CUgraphNode n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    for (CUgraphNode d : node_of(n)->deps) todo.push_back(d);
  }
  return seen;
}

void end_capture_of_streams(Capture& capture) {
  for (Stream* member : capture.streams) {
    member->capture.reset();
    member->capture_tail.clear();
  }
}

// Begins a capture on `hstream`: into a new graph, or into `into` after `after` (its nodes).
CUresult begin_capture(State& s, CUstream hstream, CUstreamCaptureMode mode,
                       std::shared_ptr<Graph> into, std::vector<CUgraphNode> after) {
  // The NULL stream cannot capture: it synchronizes with every blocking stream.
  if (hstream == nullptr || hstream == CU_STREAM_LEGACY || hstream == CU_STREAM_PER_THREAD)
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  Stream* stream = nullptr;
  if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
  if (mode > CU_STREAM_CAPTURE_MODE_RELAXED || mode < CU_STREAM_CAPTURE_MODE_GLOBAL)
    return CUDA_ERROR_INVALID_VALUE;
  if (into && into->device != stream->device) return CUDA_ERROR_INVALID_VALUE;
  if (capturing(*stream)) return CUDA_ERROR_ILLEGAL_STATE;
  auto capture = std::make_shared<Capture>();
  capture->id = s.next_capture_id++;
  capture->mode = mode;
  capture->into_existing = into != nullptr;
  capture->graph = into ? std::move(into) : std::make_shared<Graph>();
  capture->graph->device = stream->device;
  // A new capture graph is the capture's until it ends, but nodes may be added to it by hand
  // meanwhile (cuStreamGetCaptureInfo's graph, as NCCL does): find_graph knows it, as it knows
  // the graphs child nodes embed, and cuGraphDestroy does not.
  if (!capture->into_existing) s.embedded_graphs[capture->graph->handle()] = capture->graph;
  capture->origin = stream;
  capture->streams.push_back(stream);
  stream->capture = std::move(capture);
  stream->capture_tail = std::move(after);
  return CUDA_SUCCESS;
}

// A launch on a capturing stream comes here with its arguments already packed (launch.cpp), from
// kernelParams or from `extra`: capture keeps accepting `extra`, unlike cuGraphAddKernelNode and
// cuGraphExecKernelNodeSetParams. The server issues every eager launch with `extra`
// (CU_LAUNCH_PARAM_BUFFER_POINTER: ops/launch.cpp, and launch_batch.cpp's eager fallback),
// including a client's launches while it captures a stream, and the real driver captures them
// (under the shim on the GPU: tests/gpu rt_graph, and bench's captured graph of 10 kernels in
// docs/benchmarks.md); refusing them here would fail every captured kernel of the server tests
// and the cudart suite.
void capture_node(State& s, Stream& stream, CUgraphNodeType type, std::function<void()> work) {
  Capture& capture = *stream.capture;
  if (capture.invalidated) return;
  (void)s;
  auto node = std::make_unique<GraphNode>();
  node->type = type;
  node->work = std::make_shared<const std::function<void()>>(std::move(work));
  // A captured kernel runs in its stream's context, which an update may not change.
  node->context = stream.context;
  node->deps = stream.capture_tail;
  stream.capture_tail = {handle_of(node.get())};
  capture.graph->nodes.push_back(std::move(node));
}

CUresult forbid_in_capture(State& s, Stream& stream) {
  (void)s;
  if (!capturing(stream)) return CUDA_SUCCESS;
  stream.capture->invalidated = true;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

void leave_capture(State& s, Stream& stream) {
  (void)s;
  if (!capturing(stream)) return;
  Capture& capture = *stream.capture;
  if (capture.origin == &stream) {
    capture.invalidated = true;
    capture.origin = nullptr;
  }
  std::erase(capture.streams, &stream);
  stream.capture.reset();
  stream.capture_tail.clear();
}

CUresult capture_wait(State& s, Stream& stream, const Event& event) {
  std::shared_ptr<Capture> from;
  std::vector<CUgraphNode> nodes;
  if (auto it = s.captured_events.find(&event); it != s.captured_events.end()) {
    from = it->second.capture.lock();
    nodes = it->second.nodes;
  }
  if (!from) {
    if (!capturing(stream)) return CUDA_ERROR_NOT_FOUND;  // an ordinary wait
    if (event.latest() == 0) return CUDA_SUCCESS;
    // Only in-stream order may cross into a capture.
    stream.capture->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  if (capturing(stream) && stream.capture != from) {
    stream.capture->invalidated = true;
    from->invalidated = true;
    return CUDA_ERROR_STREAM_CAPTURE_MERGE;
  }
  if (!capturing(stream)) {  // a fork: the stream joins the capture after the event's nodes
    stream.capture = from;
    stream.capture_tail = nodes;
    from->streams.push_back(&stream);
    return CUDA_SUCCESS;
  }
  for (CUgraphNode n : nodes) {
    if (std::find(stream.capture_tail.begin(), stream.capture_tail.end(), n) ==
        stream.capture_tail.end())
      stream.capture_tail.push_back(n);
  }
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

// ---- capture ----

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hstream,
                                                                   CUstreamCaptureMode mode) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    return begin_capture(s, hstream, mode, nullptr, {});
  });
}

// Work captured on the stream becomes nodes of `hgraph`, the first after `dependencies`. Edge data
// other than the default (ports, programmatic edges) is not modelled.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph(
    CUstream hstream, CUgraph hgraph, const CUgraphNode* dependencies,
    const CUgraphEdgeData* dependency_data, size_t count, CUstreamCaptureMode mode) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::shared_ptr<Graph> graph = find_graph(s, hgraph);
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_deps(*graph, dependencies, count); r != CUDA_SUCCESS) return r;
    if (dependency_data != nullptr) {
      for (std::size_t i = 0; i < count; ++i) {
        const CUgraphEdgeData& e = dependency_data[i];
        if (e.from_port != 0 || e.to_port != 0 || e.type != CU_GRAPH_DEPENDENCY_TYPE_DEFAULT)
          return CUDA_ERROR_NOT_SUPPORTED;
      }
    }
    return begin_capture(s, hstream, mode, std::move(graph),
                         std::vector<CUgraphNode>(dependencies, dependencies + count));
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream hstream, CUgraph* phGraph) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (phGraph == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!capturing(*stream)) return CUDA_ERROR_ILLEGAL_STATE;
    std::shared_ptr<Capture> capture = stream->capture;
    if (capture->origin != stream) return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    // Every stream that forked from the origin must have been joined back into it.
    const std::set<CUgraphNode> joined = ancestors(stream->capture_tail);
    bool unjoined = false;
    for (Stream* member : capture->streams) {
      for (CUgraphNode n : member->capture_tail) unjoined = unjoined || !joined.contains(n);
    }
    end_capture_of_streams(*capture);
    *phGraph = nullptr;
    if (capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (unjoined) return CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    if (!capture->into_existing) {
      s.embedded_graphs.erase(capture->graph->handle());
      *phGraph = s.graphs.add(std::move(capture->graph));
      return CUDA_SUCCESS;
    }
    // The caller's graph, unless it was destroyed while the capture filled it.
    if (!find_graph(s, capture->graph->handle())) return CUDA_ERROR_INVALID_HANDLE;
    *phGraph = capture->graph->handle();
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamIsCapturing(CUstream hstream,
                                                               CUstreamCaptureStatus* status) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!capturing(*stream)) {
      *status = CU_STREAM_CAPTURE_STATUS_NONE;
    } else {
      *status = stream->capture->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                             : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    }
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v3(
    CUstream hstream, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
    const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* count) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (status == nullptr || (edges != nullptr && deps == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    if (!capturing(*stream)) {
      *status = CU_STREAM_CAPTURE_STATUS_NONE;
      return CUDA_SUCCESS;
    }
    const Capture& capture = *stream->capture;
    *status = capture.invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                  : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    if (capture.invalidated) return CUDA_SUCCESS;
    if (id != nullptr) *id = capture.id;
    if (graph != nullptr) *graph = capture.graph->handle();
    if (deps != nullptr) *deps = stream->capture_tail.data();
    if (edges != nullptr) *edges = nullptr;
    if (count != nullptr) *count = stream->capture_tail.size();
    return CUDA_SUCCESS;
  });
}

// Replaces (SET) or adds to (ADD) what the capture's next node depends on; the nodes must be
// the capture graph's. Edge data other than the default is not modelled (nullptr or zeros).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamUpdateCaptureDependencies_v2(
    CUstream hstream, CUgraphNode* deps, const CUgraphEdgeData* edges, size_t count,
    unsigned int flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    (void)edges;
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (!capturing(*stream)) return CUDA_ERROR_ILLEGAL_STATE;
    if (stream->capture->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (flags != CU_STREAM_ADD_CAPTURE_DEPENDENCIES && flags != CU_STREAM_SET_CAPTURE_DEPENDENCIES)
      return CUDA_ERROR_INVALID_VALUE;
    if (count != 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_deps(*stream->capture->graph, deps, count); r != CUDA_SUCCESS) return r;
    std::vector<CUgraphNode>& tail = stream->capture_tail;
    if (flags == CU_STREAM_SET_CAPTURE_DEPENDENCIES) tail.clear();
    for (std::size_t i = 0; i < count; ++i) {
      if (std::find(tail.begin(), tail.end(), deps[i]) == tail.end()) tail.push_back(deps[i]);
    }
    return CUDA_SUCCESS;
  });
}

// ---- graphs ----

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphCreate(CUgraph* phGraph, unsigned int flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    const CurrentContext ctx = current_context(s);
    if (ctx.device == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (phGraph == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    auto graph = std::make_shared<Graph>();
    graph->device = ctx.device->ordinal;
    *phGraph = s.graphs.add(std::move(graph));
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphDestroy(CUgraph hgraph) {
  return entry([&](State& s) {
    std::shared_ptr<GraphMemory> memory;
    {
      std::lock_guard lock(s.mutex);
      // A graph embedded in a child graph node is the node's (find_graph knows it; this does
      // not).
      Graph* g = s.graphs.get(hgraph);
      if (g == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      memory = std::move(g->memory);
      s.graphs.erase(hgraph);  // executable graphs made from it keep their own copy
    }
    release_graph_memory(s, std::move(memory));
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphGetNodes(CUgraph hgraph, CUgraphNode* nodes,
                                                           size_t* count) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Graph* g = find_graph(s, hgraph).get();
    if (g == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (nodes == nullptr) {
      *count = g->nodes.size();
      return CUDA_SUCCESS;
    }
    const std::size_t n = std::min(*count, g->nodes.size());
    for (std::size_t i = 0; i < n; ++i) nodes[i] = handle_of(g->nodes[i].get());
    for (std::size_t i = n; i < *count; ++i) nodes[i] = nullptr;
    *count = n;
    return CUDA_SUCCESS;
  });
}

// Edges in node creation order, each node's dependencies in the order they were added. As the
// real driver: with no arrays, the count; with arrays, up to *count edges, the rest NULL, and
// *count the number written. Every edge is a default one (edge data is not modelled).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphGetEdges_v2(CUgraph hgraph, CUgraphNode* from,
                                                              CUgraphNode* to,
                                                              CUgraphEdgeData* edge_data,
                                                              size_t* count) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Graph* g = find_graph(s, hgraph).get();
    if (g == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (count == nullptr || (from == nullptr) != (to == nullptr) ||
        (edge_data != nullptr && from == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    std::size_t total = 0;
    for (const auto& node : g->nodes) total += node->deps.size();
    if (from == nullptr) {
      *count = total;
      return CUDA_SUCCESS;
    }
    std::size_t written = 0;
    for (const auto& node : g->nodes) {
      for (CUgraphNode dep : node->deps) {
        if (written == *count) break;
        from[written] = dep;
        to[written] = handle_of(node.get());
        if (edge_data != nullptr) edge_data[written] = CUgraphEdgeData{};
        ++written;
      }
    }
    for (std::size_t i = written; i < *count; ++i) {
      from[i] = nullptr;
      to[i] = nullptr;
      if (edge_data != nullptr) edge_data[i] = CUgraphEdgeData{};
    }
    *count = written;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphGetEdges(CUgraph hgraph, CUgraphNode* from,
                                                           CUgraphNode* to, size_t* count) {
  return cuGraphGetEdges_v2(hgraph, from, to, nullptr, count);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* phExec,
                                                                       CUgraph hgraph,
                                                                       unsigned long long flags) {
  return entry([&](State& s) {
    if (inject_failure("cuGraphInstantiateWithFlags")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    Graph* g = find_graph(s, hgraph).get();
    if (g == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (phExec == nullptr) return CUDA_ERROR_INVALID_VALUE;
    constexpr unsigned long long kKnown = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                          CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY;
    if ((flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
    // A graph with memory or conditional nodes has one executable graph at a time (cuda.h;
    // measured).
    const bool single = g->has_memory_nodes || g->has_conditional_nodes;
    if (single && !g->instance.expired()) return CUDA_ERROR_NOT_SUPPORTED;
    auto exec = std::make_shared<GraphExec>();
    exec->device = g->device;
    exec->shape = shape_of(*g);
    if (!order_exec(*g, *exec)) return CUDA_ERROR_INVALID_VALUE;
    exec->memory = g->memory;
    if (single) g->instance = exec;
    *phExec = s.graph_execs.add(std::move(exec));
    ++s.graph_instantiations;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hexec) {
  return entry([&](State& s) {
    std::shared_ptr<GraphMemory> memory;
    {
      std::lock_guard lock(s.mutex);
      GraphExec* exec = s.graph_execs.get(hexec);
      if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
      memory = std::move(exec->memory);
      s.graph_execs.erase(hexec);  // launched replays hold their order
    }
    release_graph_memory(s, std::move(memory));
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphLaunch(CUgraphExec hexec, CUstream hstream) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphExec* exec = s.graph_execs.get(hexec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (stream->device != exec->device) return CUDA_ERROR_INVALID_VALUE;
    CUresult error = CUDA_SUCCESS;
    auto order = launch_order(s, *exec, &error);
    if (!order) return error;
    submit_work(
        s, *stream,
        [order = std::move(order)] {
          for (const Work& w : *order) (*w)();
        },
        CU_GRAPH_NODE_TYPE_GRAPH);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphUpload(CUgraphExec hexec, CUstream hstream) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (s.graph_execs.get(hexec) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    Stream* stream = nullptr;
    return resolve_stream(s, hstream, stream);  // nothing to upload in host memory
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec hexec, CUgraph hgraph,
                                                                CUgraphExecUpdateResultInfo* info) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphExec* exec = s.graph_execs.get(hexec);
    Graph* g = find_graph(s, hgraph).get();
    if (exec == nullptr || g == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (info == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *info = CUgraphExecUpdateResultInfo{};
    GraphShape shape = shape_of(*g);
    if (shape.types.size() != exec->shape.types.size() || shape.deps != exec->shape.deps) {
      info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
      return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    if (shape.types != exec->shape.types) {
      info->result = CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED;
      return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    order_exec(*g, *exec);
    info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    return CUDA_SUCCESS;
  });
}

// ---- explicit construction ----

namespace mpsshim::testdriver {
namespace {

// A kernel node's work for `p` on `device`, run on the SMs of `ctx`; or the driver's answer
// (locked). `required` (not null): the context `p` must name, as an update of an executable graph's
// node may not move it.
CUresult kernel_node_work(State& s, const CUDA_KERNEL_NODE_PARAMS& p, int device, CUcontext ctx,
                          CUcontext required, Work& out) {
  // As the real driver (H100, driver 580, tools/probes/graph_node_args.cpp): a kernel node
  // takes its arguments as kernelParams only; `extra` is refused.
  if (p.extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUfunction handle = p.func != nullptr ? p.func : reinterpret_cast<CUfunction>(p.kern);
  Function* fn = nullptr;
  if (CUresult r = resolve_function(s, handle, device, fn); r != CUDA_SUCCESS) return r;
  if (p.gridDimX == 0 || p.gridDimY == 0 || p.gridDimZ == 0 || p.blockDimX == 0 ||
      p.blockDimY == 0 || p.blockDimZ == 0)
    return CUDA_ERROR_INVALID_VALUE;
  // The node stays in its context. A CUkernel names its context (p.ctx, NULL: the current one),
  // which must be the node's, whatever is current. A CUfunction names none: the real driver
  // takes the context current at the update as the node's new one, and refuses it unless it is
  // the one current when the node was added (H100, driver 580, tools/probes/graph_node_args.cpp:
  // "CUfunction, built green, upd primary" is CUDA_ERROR_INVALID_VALUE).
  if (required != nullptr && kernel_context(s, p) != required) return CUDA_ERROR_INVALID_VALUE;
  auto args = std::make_shared<std::vector<std::byte>>();
  if (CUresult r = pack_arguments(*fn->def, p.kernelParams, p.extra, *args); r != CUDA_SUCCESS)
    return r;
  auto sms = sms_of(s, ctx, device);
  if (!sms) return CUDA_ERROR_INVALID_CONTEXT;
  out = std::make_shared<const std::function<void()>>(
      kernel_work(fn->def, Dim3{p.gridDimX, p.gridDimY, p.gridDimZ},
                  Dim3{p.blockDimX, p.blockDimY, p.blockDimZ}, std::move(sms), std::move(args)));
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace mpsshim::testdriver

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuGraphAddKernelNode_v2(CUgraphNode* out, CUgraph hgraph, const CUgraphNode* deps, size_t count,
                        const CUDA_KERNEL_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Graph* g = find_graph(s, hgraph).get();
    if (g == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    // func runs in its own context; a CUkernel in the node's (a green context's SMs).
    const CUcontext ctx = kernel_context(s, *p);
    Work work;
    if (CUresult r = kernel_node_work(s, *p, g->device, ctx, nullptr, work); r != CUDA_SUCCESS)
      return r;
    CUresult r = add_node(s, out, hgraph, deps, count, CU_GRAPH_NODE_TYPE_KERNEL, *work);
    if (r == CUDA_SUCCESS) node_of(*out)->context = ctx;
    return r;
  });
}

// A kernel node's own function, shape and arguments: executable graphs instantiated later run
// them, those made before keep theirs. A node that is not a kernel node is
// CUDA_ERROR_INVALID_VALUE, as the driver answers.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuGraphKernelNodeSetParams_v2(CUgraphNode hnode, const CUDA_KERNEL_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Graph* g = graph_holding(s, hnode);
    if (g == nullptr || p == nullptr || node_of(hnode)->type != CU_GRAPH_NODE_TYPE_KERNEL)
      return CUDA_ERROR_INVALID_VALUE;
    const CUcontext ctx = kernel_context(s, *p);
    Work work;
    if (CUresult r = kernel_node_work(s, *p, g->device, ctx, nullptr, work); r != CUDA_SUCCESS)
      return r;
    GraphNode* node = node_of(hnode);
    node->work = std::move(work);
    node->context = ctx;
    return CUDA_SUCCESS;
  });
}

// A kernel node's function, shape and arguments in an executable graph: later launches of the
// graph run them, launches already queued keep what they were launched with. The node stays in
// its context (cuda.h: "The owning context of the function cannot change").
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(
    CUgraphExec hexec, CUgraphNode hnode, const CUDA_KERNEL_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphExec* exec = s.graph_execs.get(hexec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto slot = exec->kernels.find(hnode);
    if (slot == exec->kernels.end()) return CUDA_ERROR_INVALID_VALUE;
    const CUcontext ctx = slot->second.context;
    Work work;
    if (CUresult r = kernel_node_work(s, *p, exec->device, ctx, ctx, work); r != CUDA_SUCCESS)
      return r;
    ++s.graph_node_updates;
    if (!slot->second.enabled) {  // runs once the node is enabled again
      slot->second.disabled_work = std::move(work);
      return CUDA_SUCCESS;
    }
    replace_exec_work(*exec, slot->second.position, std::move(work));
    return CUDA_SUCCESS;
  });
}

// Enables or disables a kernel node of an executable graph: a disabled node runs as an empty node
// in later launches (launches already queued keep what they were launched with). The real driver
// also takes memset and memcpy nodes; the server disables only kernel nodes (launch_batch.cpp),
// so this driver refuses the others with CUDA_ERROR_INVALID_VALUE.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphNodeSetEnabled(CUgraphExec hexec,
                                                                 CUgraphNode hnode,
                                                                 unsigned int enabled) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphExec* exec = s.graph_execs.get(hexec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    auto slot = exec->kernels.find(hnode);
    if (slot == exec->kernels.end()) return CUDA_ERROR_INVALID_VALUE;
    if (enabled != 0 && !slot->second.enabled) enable_kernel(*exec, slot->second);
    if (enabled == 0 && slot->second.enabled) disable_kernel(*exec, slot->second);
    ++s.graph_node_toggles;
    return CUDA_SUCCESS;
  });
}

// Test hooks: executable graphs instantiated, graphs and executable graphs alive, and kernel nodes
// of executable graphs updated since the library was loaded.
MPSSHIM_TESTDRIVER_EXPORT unsigned long long mpsshim_testdriver_graph_instantiations(void) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.graph_instantiations;
}

MPSSHIM_TESTDRIVER_EXPORT int mpsshim_testdriver_graph_objects(void) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return static_cast<int>(s.graphs.size() + s.graph_execs.size());
}

MPSSHIM_TESTDRIVER_EXPORT unsigned long long mpsshim_testdriver_graph_node_updates(void) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.graph_node_updates;
}

MPSSHIM_TESTDRIVER_EXPORT unsigned long long mpsshim_testdriver_graph_node_toggles(void) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  return s.graph_node_toggles;
}

namespace mpsshim::testdriver {
namespace {

// A memset node's work, or the driver's answer to parameters it refuses (locked).
CUresult memset_work(State& s, const CUDA_MEMSET_NODE_PARAMS* p, std::function<void()>& work) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t element = p->elementSize;
  if (element != 1 && element != 2 && element != 4) return CUDA_ERROR_INVALID_VALUE;
  if (p->width == 0 || p->height == 0) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t row = p->width * element;
  const std::size_t pitch = p->height > 1 ? p->pitch : row;
  if (pitch < row || p->dst % element != 0) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t extent = (p->height - 1) * pitch + row;
  if (resolve_range_locked(s, p->dst, extent) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUdeviceptr dst = p->dst;
  const unsigned value = p->value;
  const std::size_t width = p->width, height = p->height;
  work = [=] {
    std::byte* base = resolve_range(dst, extent);
    if (base == nullptr) throw DeviceFault{CUDA_ERROR_ILLEGAL_ADDRESS};
    for (std::size_t y = 0; y < height; ++y) {
      for (std::size_t x = 0; x < width; ++x)
        std::memcpy(base + y * pitch + x * element, &value, element);  // little-endian
    }
  };
  return CUDA_SUCCESS;
}

// A memcpy node's work: the one shape modelled, a linear device-to-device copy (locked).
CUresult memcpy_work(State& s, const CUDA_MEMCPY3D* p, std::function<void()>& work) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (p->srcMemoryType != CU_MEMORYTYPE_DEVICE || p->dstMemoryType != CU_MEMORYTYPE_DEVICE ||
      p->Height > 1 || p->Depth > 1 || p->srcY != 0 || p->srcZ != 0 || p->dstY != 0 || p->dstZ != 0)
    return CUDA_ERROR_NOT_SUPPORTED;
  const CUdeviceptr src = p->srcDevice + p->srcXInBytes;
  const CUdeviceptr dst = p->dstDevice + p->dstXInBytes;
  const std::size_t bytes = p->WidthInBytes;
  if (resolve_range_locked(s, src, bytes) == nullptr ||
      resolve_range_locked(s, dst, bytes) == nullptr)
    return CUDA_ERROR_INVALID_VALUE;
  work = [=] {
    std::byte* to = resolve_range(dst, bytes);
    std::byte* from = resolve_range(src, bytes);
    if (to == nullptr || from == nullptr) throw DeviceFault{CUDA_ERROR_ILLEGAL_ADDRESS};
    std::memmove(to, from, bytes);
  };
  return CUDA_SUCCESS;
}

}  // namespace

// A node's own new work (its type must be `type`), for graphs instantiated afterwards.
CUresult set_node_work(State& s, CUgraphNode hnode, CUgraphNodeType type,
                       std::function<void()> work) {
  if (graph_holding(s, hnode) == nullptr || node_of(hnode)->type != type)
    return CUDA_ERROR_INVALID_VALUE;
  node_of(hnode)->work = std::make_shared<const std::function<void()>>(std::move(work));
  return CUDA_SUCCESS;
}

// An executable graph's copy of a node of `type` takes new work; queued launches keep theirs.
CUresult set_exec_work(State& s, CUgraphExec hexec, CUgraphNode hnode, CUgraphNodeType type,
                       std::function<void()> work) {
  GraphExec* exec = s.graph_execs.get(hexec);
  if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  auto slot = exec->positions.find(hnode);
  if (slot == exec->positions.end() || !node_alive(s, hnode) || node_of(hnode)->type != type)
    return CUDA_ERROR_INVALID_VALUE;
  replace_exec_work(*exec, slot->second,
                    std::make_shared<const std::function<void()>>(std::move(work)));
  ++s.graph_node_updates;
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::testdriver

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode* out, CUgraph hgraph,
                                                                const CUgraphNode* deps,
                                                                size_t count,
                                                                const CUDA_MEMSET_NODE_PARAMS* p,
                                                                CUcontext) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::function<void()> work;
    if (CUresult r = memset_work(s, p, work); r != CUDA_SUCCESS) return r;
    return add_node(s, out, hgraph, deps, count, CU_GRAPH_NODE_TYPE_MEMSET, std::move(work));
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode* out, CUgraph hgraph,
                                                                const CUgraphNode* deps,
                                                                size_t count,
                                                                const CUDA_MEMCPY3D* p, CUcontext) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::function<void()> work;
    if (CUresult r = memcpy_work(s, p, work); r != CUDA_SUCCESS) return r;
    return add_node(s, out, hgraph, deps, count, CU_GRAPH_NODE_TYPE_MEMCPY, std::move(work));
  });
}

// New parameters for a memset or memcpy node (of the graph: later instantiations; of an
// executable graph: its later launches), checked as when the node is added.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuGraphMemsetNodeSetParams(CUgraphNode hnode, const CUDA_MEMSET_NODE_PARAMS* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::function<void()> work;
    if (CUresult r = memset_work(s, p, work); r != CUDA_SUCCESS) return r;
    return set_node_work(s, hnode, CU_GRAPH_NODE_TYPE_MEMSET, std::move(work));
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphExecMemsetNodeSetParams(
    CUgraphExec hexec, CUgraphNode hnode, const CUDA_MEMSET_NODE_PARAMS* p, CUcontext) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::function<void()> work;
    if (CUresult r = memset_work(s, p, work); r != CUDA_SUCCESS) return r;
    return set_exec_work(s, hexec, hnode, CU_GRAPH_NODE_TYPE_MEMSET, std::move(work));
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphMemcpyNodeSetParams(CUgraphNode hnode,
                                                                      const CUDA_MEMCPY3D* p) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::function<void()> work;
    if (CUresult r = memcpy_work(s, p, work); r != CUDA_SUCCESS) return r;
    return set_node_work(s, hnode, CU_GRAPH_NODE_TYPE_MEMCPY, std::move(work));
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphExecMemcpyNodeSetParams(CUgraphExec hexec,
                                                                          CUgraphNode hnode,
                                                                          const CUDA_MEMCPY3D* p,
                                                                          CUcontext) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::function<void()> work;
    if (CUresult r = memcpy_work(s, p, work); r != CUDA_SUCCESS) return r;
    return set_exec_work(s, hexec, hnode, CU_GRAPH_NODE_TYPE_MEMCPY, std::move(work));
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode* out, CUgraph hgraph,
                                                               const CUgraphNode* deps,
                                                               size_t count) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    return add_node(s, out, hgraph, deps, count, CU_GRAPH_NODE_TYPE_EMPTY, nullptr);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphAddDependencies_v2(CUgraph hgraph,
                                                                     const CUgraphNode* from,
                                                                     const CUgraphNode* to,
                                                                     const CUgraphEdgeData* edges,
                                                                     size_t count) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    (void)edges;
    Graph* g = find_graph(s, hgraph).get();
    if (g == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (count != 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
    if (CUresult r = check_deps(*g, from, count); r != CUDA_SUCCESS) return r;
    if (CUresult r = check_deps(*g, to, count); r != CUDA_SUCCESS) return r;
    for (std::size_t i = 0; i < count; ++i) {
      if (from[i] == to[i]) return CUDA_ERROR_INVALID_VALUE;
      auto& deps = node_of(to[i])->deps;
      if (std::find(deps.begin(), deps.end(), from[i]) != deps.end())
        return CUDA_ERROR_INVALID_VALUE;  // the edge exists already
    }
    for (std::size_t i = 0; i < count; ++i) node_of(to[i])->deps.push_back(from[i]);
    return CUDA_SUCCESS;
  });
}

// ---- child graphs ----

namespace mpsshim::testdriver {

// `handle` is a node of a live graph (the table's or an embedded one), so node_of may read it.
bool node_alive(State& s, CUgraphNode handle) {
  auto holds = [&](const Graph& g) {
    return std::any_of(g.nodes.begin(), g.nodes.end(),
                       [&](const auto& n) { return handle_of(n.get()) == handle; });
  };
  for (const auto& [h, g] : s.graphs)
    if (holds(*g)) return true;
  for (const auto& [h, weak] : s.embedded_graphs) {
    if (auto g = weak.lock(); g && holds(*g)) return true;
  }
  return false;
}

}  // namespace mpsshim::testdriver

// As the driver: the child is cloned into the node, so it may be changed or destroyed afterwards
// without touching the node. A graph may not be its own child.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode* out,
                                                                    CUgraph hgraph,
                                                                    const CUgraphNode* deps,
                                                                    size_t count, CUgraph child) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    std::shared_ptr<Graph> g = find_graph(s, hgraph);
    std::shared_ptr<Graph> c = find_graph(s, child);
    if (!g) return CUDA_ERROR_INVALID_HANDLE;
    if (!c || c == g || c->device != g->device) return CUDA_ERROR_INVALID_VALUE;
    // cuda.h: not in a child (CUDA_ERROR_NOT_SUPPORTED, measured on an H200 with driver 580).
    if (c->has_conditional_nodes) return CUDA_ERROR_NOT_SUPPORTED;
    std::shared_ptr<Graph> embedded = clone_graph(s, *c);
    CUresult r = add_node(s, out, hgraph, deps, count, CU_GRAPH_NODE_TYPE_GRAPH, nullptr);
    if (r != CUDA_SUCCESS) {
      s.embedded_graphs.erase(embedded->handle());
      return r;
    }
    node_of(*out)->child = std::move(embedded);
    return CUDA_SUCCESS;
  });
}

// The embedded graph itself, not a copy: changes to it show in the node (cuda.h).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hnode,
                                                              CUgraphNodeType* type) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (type == nullptr || !node_alive(s, hnode)) return CUDA_ERROR_INVALID_VALUE;
    *type = node_of(hnode)->type;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hnode,
                                                                         CUgraph* out) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (out == nullptr || !node_alive(s, hnode)) return CUDA_ERROR_INVALID_VALUE;
    const GraphNode* node = node_of(hnode);
    if (node->type != CU_GRAPH_NODE_TYPE_GRAPH || !node->child) return CUDA_ERROR_INVALID_VALUE;
    *out = node->child->handle();
    return CUDA_SUCCESS;
  });
}

// A child graph node of an executable graph replays `child`'s work from now on; launches already
// queued keep what they were launched with. `child` must have the embedded graph's topology.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec hexec,
                                                                              CUgraphNode hnode,
                                                                              CUgraph child) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    GraphExec* exec = s.graph_execs.get(hexec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    auto slot = exec->children.find(hnode);
    std::shared_ptr<Graph> c = find_graph(s, child);
    if (slot == exec->children.end() || !c) return CUDA_ERROR_INVALID_VALUE;
    const GraphShape shape = shape_of(*c);
    if (shape != slot->second.shape) return CUDA_ERROR_INVALID_VALUE;
    auto inner = replay_order(*c, shape);
    if (!inner || inner->size() != slot->second.count) return CUDA_ERROR_INVALID_VALUE;
    // Copy on write: a queued launch holds the order it was given.
    auto order = std::make_shared<std::vector<Work>>(*exec->order);
    std::copy(inner->begin(), inner->end(),
              order->begin() + static_cast<std::ptrdiff_t>(slot->second.position));
    exec->order = std::move(order);
    ++s.graph_node_updates;
    return CUDA_SUCCESS;
  });
}
