// Stream capture and CUDA graphs. Capture happens on the server, on the client's real stream;
// graphs, executable graphs and nodes are server handles wrapped in small client objects.
//
// cuStreamIsCapturing is polled on every allocation by PyTorch: while this process has no
// capture open it is answered here, in nanoseconds; otherwise the server asks the driver (exact,
// streams that joined a capture through an event wait included).
//
// The server captures in relaxed mode; the capture modes of the application (global, thread
// local) are kept here for cuThreadExchangeStreamCaptureMode and the same-thread rule of
// cuStreamEndCapture. The "unsafe call" prohibitions of global mode are not emulated.
//
// cuStreamBeginCaptureToGraph captures into a graph the client already holds: the server begins
// the capture into the real graph behind it, so cuStreamEndCapture's answer maps back to the same
// GraphObject through the book below.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/capture.hpp"
#include "libshim/client.hpp"
#include "libshim/graph_objects.hpp"
#include "libshim/kernel_args.hpp"
#include "libshim/kernel_lookup.hpp"
#include "libshim/object_pool.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

namespace {

// ---- capture bookkeeping ----

struct CaptureRecord {
  CUstreamCaptureMode mode;
  std::thread::id thread;
};

struct CaptureBook {
  std::mutex mutex;
  std::unordered_map<const Stream*, CaptureRecord> origins;
  // Graph objects by server id, so that the graph cuStreamGetCaptureInfo showed is the one
  // cuStreamEndCapture returns.
  std::unordered_map<proto::WireHandle, GraphObject*> graphs;
};
CaptureBook& book() {
  static CaptureBook* b = new CaptureBook();  // never destroyed: used from static destructors
  return *b;
}

std::atomic<int> g_open_captures{0};
thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

}  // namespace

namespace mpsshim::shim {

GraphObject* graph_for(Context* ctx, proto::WireHandle wire) {
  CaptureBook& b = book();
  std::lock_guard lock(b.mutex);
  auto it = b.graphs.find(wire);
  if (it != b.graphs.end() && it->second->magic == kGraphMagic) return it->second;
  GraphObject* graph = ObjectPool<GraphObject>::instance().make();
  graph->ctx = ctx;
  graph->wire = wire;
  b.graphs[wire] = graph;
  return graph;
}

GraphNodeObject* node_for(GraphObject* graph, proto::WireHandle wire) {
  std::lock_guard lock(graph->mutex);
  GraphNodeObject*& node = graph->nodes[wire];
  if (node == nullptr)
    node = ObjectPool<GraphNodeObject>::instance().make(kNodeMagic, graph, wire, NodeParams{});
  return node;
}

}  // namespace mpsshim::shim

namespace {

// Opens a capture on `stream` with `send` (which asks the server) and books it: the mode and
// thread for cuStreamEndCapture's rules, the count for cuStreamIsCapturing's fast path.
template <typename Send>
CUresult open_capture(Stream* stream, CUstreamCaptureMode mode, Send send) {
  if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Counted first: a racing cuStreamIsCapturing must ask the server from now on.
  g_open_captures.fetch_add(1, std::memory_order_seq_cst);
  if (CUresult rc = send(); rc != CUDA_SUCCESS) {
    g_open_captures.fetch_sub(1, std::memory_order_seq_cst);
    return rc;
  }
  std::lock_guard lock(book().mutex);
  book().origins[stream] = CaptureRecord{mode, std::this_thread::get_id()};
  return CUDA_SUCCESS;
}

CUresult begin_capture(CUstream handle, CUstreamCaptureMode mode, DefaultStream dmode) {
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, dmode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  return open_capture(stream, mode, [&] {
    proto::BeginCaptureReq request{stream->wire, static_cast<std::uint32_t>(mode), 0};
    return ctx->session->call(proto::Op::kStreamBeginCapture, request, static_cast<int*>(nullptr));
  });
}

// Default edges: what crosses the wire (edge data is not sent to the server).
bool default_edges(const CUgraphEdgeData* edges, std::size_t count) {
  if (edges == nullptr) return true;
  const CUgraphEdgeData none{};
  for (std::size_t i = 0; i < count; ++i) {
    if (std::memcmp(&edges[i], &none, sizeof none) != 0) return false;
  }
  return true;
}

// Edge data the shim accepts as a full dependency. Programmatic and launch-order edges (a
// kernel's out-port, CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC) let the dependent start before its
// dependency ends; a full dependency is stricter and gives the same results (the dependent's
// cudaGridDependencySynchronize returns at once), only without the overlap. A to-port is
// reserved (0) and an unknown type or port is the caller's error, as natively.
CUresult edges_as_full_dependencies(const CUgraphEdgeData* edges, std::size_t count,
                                    const char* api) {
  if (default_edges(edges, count)) return CUDA_SUCCESS;
  for (std::size_t i = 0; i < count; ++i) {
    const CUgraphEdgeData& e = edges[i];
    if (e.to_port != 0 || e.type > CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC ||
        e.from_port > CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER) {
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
  log_once(std::string(api) + ".edges", LogLevel::kInfo,
           "{}: edge data other than the default (programmatic or launch-order dependencies) "
           "is added as full dependencies by mpsshim: same results, no overlap",
           api);
  return CUDA_SUCCESS;
}

// The captured work becomes nodes of the client's own graph, after `deps`; cuStreamEndCapture
// hands back the same graph.
CUresult begin_capture_to_graph(CUstream handle, CUgraph hgraph, const CUgraphNode* deps,
                                const CUgraphEdgeData* edges, std::size_t count,
                                CUstreamCaptureMode mode, DefaultStream dmode) {
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, dmode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr || graph->ctx->session != ctx->session) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = edges_as_full_dependencies(edges, count, "cuStreamBeginCaptureToGraph");
      rc != CUDA_SUCCESS) {
    return rc;
  }
  std::vector<std::byte> trailing;
  if (CUresult rc = append_dependencies(graph, deps, count, trailing); rc != CUDA_SUCCESS) {
    return rc;
  }
  return open_capture(stream, mode, [&] {
    proto::BeginCaptureToGraphReq request{stream->wire, graph->wire,
                                          static_cast<std::uint32_t>(mode),
                                          static_cast<std::uint32_t>(count)};
    return ctx->session->call(proto::Op::kStreamBeginCaptureToGraph, &request, sizeof request,
                              trailing, nullptr, 0);
  });
}

CUresult end_capture(CUstream handle, CUgraph* out, DefaultStream dmode) {
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, dmode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  bool origin = false;
  {
    CaptureBook& b = book();
    std::lock_guard lock(b.mutex);
    auto it = b.origins.find(stream);
    if (it != b.origins.end()) {
      if (it->second.mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
          it->second.thread != std::this_thread::get_id()) {
        return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
      }
      b.origins.erase(it);
      origin = true;
    }
  }
  proto::EndCaptureRep reply{};
  CUresult rc =
      ctx->session->call(proto::Op::kStreamEndCapture, proto::HandleReq{stream->wire}, &reply);
  if (origin) g_open_captures.fetch_sub(1, std::memory_order_seq_cst);
  *out = nullptr;
  if (rc != CUDA_SUCCESS) return rc;
  *out = reinterpret_cast<CUgraph>(graph_for(ctx, reply.graph));
  return CUDA_SUCCESS;
}

CUresult capture_info(CUstream handle, DefaultStream dmode, proto::CaptureInfoRep& reply,
                      Context*& ctx) {
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, dmode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  reply = proto::CaptureInfoRep{};
  reply.status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (g_open_captures.load(std::memory_order_seq_cst) == 0) return CUDA_SUCCESS;
  return ctx->session->call(proto::Op::kStreamCaptureInfo, proto::HandleReq{stream->wire}, &reply);
}

CUresult is_capturing(CUstream handle, CUstreamCaptureStatus* status, DefaultStream dmode) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (g_open_captures.load(std::memory_order_acquire) == 0) {
    // The fast path: validates the handle and answers NONE without the server.
    Context* ctx = nullptr;
    Stream* stream = nullptr;
    if (CUresult rc = resolve_stream(handle, dmode, ctx, stream); rc != CUDA_SUCCESS) return rc;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  }
  proto::CaptureInfoRep reply{};
  Context* ctx = nullptr;
  if (CUresult rc = capture_info(handle, dmode, reply, ctx); rc != CUDA_SUCCESS) return rc;
  *status = static_cast<CUstreamCaptureStatus>(reply.status);
  return CUDA_SUCCESS;
}

CUresult get_capture_info(CUstream handle, DefaultStream dmode, CUstreamCaptureStatus* status,
                          cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                          const CUgraphEdgeData** edges, size_t* count) {
  if (status == nullptr || (edges != nullptr && deps == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  proto::CaptureInfoRep reply{};
  Context* ctx = nullptr;
  if (CUresult rc = capture_info(handle, dmode, reply, ctx); rc != CUDA_SUCCESS) return rc;
  *status = static_cast<CUstreamCaptureStatus>(reply.status);
  if (reply.status != CU_STREAM_CAPTURE_STATUS_ACTIVE) return CUDA_SUCCESS;
  if (id != nullptr) *id = reply.id;
  if (graph != nullptr) {
    *graph = reply.graph != 0 ? reinterpret_cast<CUgraph>(graph_for(ctx, reply.graph)) : nullptr;
  }
  if (deps != nullptr) *deps = nullptr;
  if (edges != nullptr) *edges = nullptr;
  if (count != nullptr) *count = reply.dependency_count;
  if (deps == nullptr || reply.dependency_count == 0) return CUDA_SUCCESS;
  // The nodes themselves, a page at a time, as the capture graph's node objects.
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, dmode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  GraphObject* capture_graph = graph_for(ctx, reply.graph);
  std::vector<CUgraphNode> nodes;
  std::uint64_t total = 0;
  do {
    proto::GraphGetNodesRep page{};
    if (CUresult rc =
            ctx->session->call(proto::Op::kStreamCaptureDependencies,
                               proto::StreamCaptureDepsReq{stream->wire, nodes.size()}, &page);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    total = page.total;
    if (page.count == 0) break;
    for (std::uint64_t i = 0; i < page.count; ++i) {
      nodes.push_back(reinterpret_cast<CUgraphNode>(node_for(capture_graph, page.nodes[i])));
    }
  } while (nodes.size() < total);
  CaptureBook& b = book();
  std::lock_guard lock(b.mutex);
  stream->capture_deps = std::move(nodes);
  // Every dependency of a capture under the shim is a full one (programmatic edges are made
  // full when added): default edge data, all zeros.
  stream->capture_edges.assign(stream->capture_deps.size(), CUgraphEdgeData{});
  *deps = stream->capture_deps.data();
  if (edges != nullptr) *edges = stream->capture_edges.data();
  if (count != nullptr) *count = stream->capture_deps.size();
  return CUDA_SUCCESS;
}

// cuStreamUpdateCaptureDependencies(_v2): the nodes must be the capture graph's.
CUresult update_capture_dependencies(CUstream handle, DefaultStream dmode, CUgraphNode* deps,
                                     const CUgraphEdgeData* edges, size_t count,
                                     unsigned int flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, dmode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (count != 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (count > proto::kMaxNodeDependencies) {
    log_once("cuStreamUpdateCaptureDependencies.count", LogLevel::kWarn,
             "cuStreamUpdateCaptureDependencies: more than {} nodes at once are not supported by "
             "mpsshim",
             proto::kMaxNodeDependencies);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  if (CUresult rc = edges_as_full_dependencies(edges, count, "cuStreamUpdateCaptureDependencies");
      rc != CUDA_SUCCESS) {
    return rc;
  }
  // Nodes of any graph here: the server knows the capture's graph and refuses another's.
  std::vector<std::byte> trailing;
  if (CUresult rc = append_dependencies(nullptr, deps, count, trailing); rc != CUDA_SUCCESS) {
    return rc;
  }
  proto::StreamUpdateCaptureDepsReq request{stream->wire, flags, static_cast<std::uint32_t>(count)};
  return ctx->session->call(proto::Op::kStreamUpdateCaptureDependencies, &request, sizeof request,
                            trailing, nullptr, 0);
}

// ---- graphs ----

CUresult instantiate(CUgraphExec* out, CUgraph hgraph, std::uint64_t flags, CUstream upload,
                     CUgraphInstantiateResult* result) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH) != 0) {
    log_once("cuGraphInstantiate.device_launch", LogLevel::kWarn,
             "cuGraphInstantiate: device-launchable graphs are not supported by mpsshim; "
             "instantiate without CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  proto::GraphInstantiateReq request{graph->wire, 0, flags};
  if ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0) {
    Context* ctx = nullptr;
    Stream* stream = nullptr;
    if (CUresult rc = resolve_stream(upload, DefaultStream::kLegacy, ctx, stream);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    request.upload_stream = stream->wire;
  }
  proto::GraphInstantiateRep reply{};
  CUresult rc = graph->ctx->session->call(proto::Op::kGraphInstantiate, request, &reply);
  if (result != nullptr) {
    *result = rc == CUDA_SUCCESS  ? CUDA_GRAPH_INSTANTIATE_SUCCESS
              : reply.result != 0 ? static_cast<CUgraphInstantiateResult>(reply.result)
                                  : CUDA_GRAPH_INSTANTIATE_ERROR;
  }
  if (rc != CUDA_SUCCESS) return rc;
  GraphExecObject* exec =
      ObjectPool<GraphExecObject>::instance().make(kGraphExecMagic, graph->ctx, reply.exec, flags);
  exec_take_user_refs(exec, graph);
  *out = reinterpret_cast<CUgraphExec>(exec);
  return CUDA_SUCCESS;
}

CUresult launch_graph(CUgraphExec hexec, CUstream handle, DefaultStream dmode, proto::Op op) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphExecObject* exec = exec_of(hexec);
  if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Context* ctx = nullptr;
  Stream* stream = nullptr;
  if (CUresult rc = resolve_stream(handle, dmode, ctx, stream); rc != CUDA_SUCCESS) return rc;
  if (ctx->session != exec->ctx->session) return CUDA_ERROR_INVALID_VALUE;
  if (op == proto::Op::kGraphLaunch) {
    std::lock_guard lock(exec->mutex);
    exec->last_stream = handle;
    exec->launched = true;
  }
  return ctx->session->post(op, proto::GraphLaunchReq{exec->wire, stream->wire});
}

CUresult exec_update(CUgraphExec hexec, CUgraph hgraph, CUgraphExecUpdateResult* result) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphExecObject* exec = exec_of(hexec);
  GraphObject* graph = graph_of(hgraph);
  if (exec == nullptr || graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  proto::GraphExecUpdateRep reply{};
  CUresult rc = exec->ctx->session->call(
      proto::Op::kGraphExecUpdate, proto::GraphExecUpdateReq{exec->wire, graph->wire}, &reply);
  if (result != nullptr) *result = static_cast<CUgraphExecUpdateResult>(reply.result);
  return rc;
}

// Checks a dependency list against the graph (any graph when nullptr) and appends the nodes'
// ids to `out`.
}  // namespace

namespace mpsshim::shim {

CUresult append_dependencies(GraphObject* graph, const CUgraphNode* deps, std::size_t count,
                             std::vector<std::byte>& out) {
  if (count != 0 && deps == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (count > proto::kMaxNodeDependencies) {
    log_once("cuGraphAddNode.deps", LogLevel::kWarn,
             "cuGraphAdd*Node: more than {} dependencies of one node are not supported by "
             "mpsshim; add them with cuGraphAddDependencies",
             proto::kMaxNodeDependencies);
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  for (std::size_t i = 0; i < count; ++i) {
    GraphNodeObject* node = node_of(deps[i]);
    if (node == nullptr || (graph != nullptr && node->graph != graph)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const auto* bytes = reinterpret_cast<const std::byte*>(&node->wire);
    out.insert(out.end(), bytes, bytes + sizeof node->wire);
  }
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::shim

namespace {

// Sends an add whose record the caller built (kernel nodes carry their arguments after the
// dependency ids); the node object for the reply. add_node (graph_objects.hpp) does the rest
// for node types whose record is a request and the dependencies alone.
template <typename Req>
CUresult send_add_node(CUgraphNode* out, GraphObject* graph, proto::Op op, const Req& request,
                       std::span<const std::byte> trailing) {
  proto::GraphRep reply{};
  CUresult rc =
      graph->ctx->session->call(op, &request, sizeof request, trailing, &reply, sizeof reply);
  if (rc != CUDA_SUCCESS) return rc;
  *out = reinterpret_cast<CUgraphNode>(node_for(graph, reply.handle));
  return CUDA_SUCCESS;
}

// What cuGraphKernelNodeGetParams gives back for a kernel node: the launch as given, the
// arguments as packed.
void remember_kernel(NodeParams& p, const Function* f, CUfunction func, CUkernel kern,
                     unsigned const grid[3], unsigned const block[3], unsigned shared,
                     std::span<const std::byte> packed) {
  p.func = func;
  p.kern = kern;
  std::copy(grid, grid + 3, p.grid);
  std::copy(block, block + 3, p.block);
  p.shared_bytes = shared;
  p.args.assign(packed.begin(), packed.end());
  p.arg_offsets.clear();
  for (const proto::ParamSlot& slot : f->params) p.arg_offsets.push_back(slot.offset);
}

CUresult add_kernel_node(CUgraphNode* out, CUgraph hgraph, const CUgraphNode* deps,
                         std::size_t count, CUfunction func, CUkernel kern, unsigned const grid[3],
                         unsigned const block[3], unsigned shared, void** params, void** extra) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Function* f =
      object_of<Function>(func != nullptr ? static_cast<void*>(func) : static_cast<void*>(kern));
  if (f == nullptr || f->ctx == nullptr || f->ctx->session != graph->ctx->session) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (CUresult rc = usable(f); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::byte> trailing;
  if (CUresult rc = append_dependencies(graph, deps, count, trailing); rc != CUDA_SUCCESS) {
    return rc;
  }
  // Arguments packed as launches pack them: at the offsets of the cached parameter layout.
  const void* buffer = nullptr;
  std::size_t bytes = 0;
  if (CUresult rc = argument_bytes(f, params, extra, buffer, bytes); rc != CUDA_SUCCESS) return rc;
  if (bytes > proto::kMaxArgsBytes) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t at = trailing.size();
  trailing.resize(at + bytes);
  pack_arguments(f, params, buffer, bytes, trailing.data() + at);
  proto::GraphKernelNodeReq request{{graph->wire, static_cast<std::uint32_t>(count), 0},
                                    f->wire,
                                    {grid[0], grid[1], grid[2]},
                                    {block[0], block[1], block[2]},
                                    shared,
                                    static_cast<std::uint32_t>(trailing.size() - at)};
  if (CUresult rc = send_add_node(out, graph, proto::Op::kGraphAddKernelNode, request, trailing);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  NodeParams known;
  known.known = true;
  known.type = CU_GRAPH_NODE_TYPE_KERNEL;
  remember_kernel(known, f, func, kern, grid, block, shared, std::span(trailing).subspan(at));
  GraphNodeObject* node = node_of(*out);
  std::lock_guard lock(graph->mutex);
  node->params = std::move(known);
  return CUDA_SUCCESS;
}

}  // namespace

namespace mpsshim::shim {

CUresult kernel_node_set_params(CUgraphExec hexec, CUgraphNode hnode, CUfunction func,
                                CUkernel kern, unsigned const grid[3], unsigned const block[3],
                                unsigned shared, void** params, void** extra) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphExecObject* exec = nullptr;
  if (hexec != nullptr) {
    exec = exec_of(hexec);
    if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  }
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return exec != nullptr ? CUDA_ERROR_INVALID_VALUE : dead_or_null(hnode);
  Context* ctx = exec != nullptr ? exec->ctx : node->graph->ctx;
  if (node->graph->ctx->session != ctx->session) return CUDA_ERROR_INVALID_VALUE;
  Function* f =
      object_of<Function>(func != nullptr ? static_cast<void*>(func) : static_cast<void*>(kern));
  if (f == nullptr || f->ctx == nullptr || f->ctx->session != ctx->session) {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  if (CUresult rc = usable(f); rc != CUDA_SUCCESS) return rc;
  const void* buffer = nullptr;
  std::size_t bytes = 0;
  if (CUresult rc = argument_bytes(f, params, extra, buffer, bytes); rc != CUDA_SUCCESS) return rc;
  if (bytes > proto::kMaxArgsBytes) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::byte> packed(bytes);
  pack_arguments(f, params, buffer, bytes, packed.data());
  // exec 0: the graph's own node (cuGraphKernelNodeSetParams).
  proto::GraphExecKernelNodeReq request{exec != nullptr ? exec->wire : 0,
                                        node->wire,
                                        f->wire,
                                        {grid[0], grid[1], grid[2]},
                                        {block[0], block[1], block[2]},
                                        shared,
                                        static_cast<std::uint32_t>(bytes)};
  if (CUresult rc = ctx->session->call(proto::Op::kGraphExecKernelNodeSetParams, &request,
                                       sizeof request, packed, nullptr, 0);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (exec == nullptr) {  // an executable graph's copy is its own
    std::lock_guard lock(node->graph->mutex);
    node->params.known = true;
    node->params.type = CU_GRAPH_NODE_TYPE_KERNEL;
    remember_kernel(node->params, f, func, kern, grid, block, shared, packed);
  }
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::shim

namespace {

CUresult add_dependencies(CUgraph hgraph, const CUgraphNode* from, const CUgraphNode* to,
                          const CUgraphEdgeData* edges, std::size_t count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (count != 0 && (from == nullptr || to == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = edges_as_full_dependencies(edges, count, "cuGraphAddDependencies");
      rc != CUDA_SUCCESS) {
    return rc;
  }
  std::vector<std::byte> pairs;
  for (std::size_t done = 0; done < count;) {
    const std::size_t n = std::min<std::size_t>(count - done, proto::kMaxNodeDependencies);
    pairs.clear();
    for (std::size_t i = done; i < done + n; ++i) {
      GraphNodeObject* a = node_of(from[i]);
      GraphNodeObject* b = node_of(to[i]);
      if (a == nullptr || b == nullptr || a->graph != graph || b->graph != graph) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      for (proto::WireHandle w : {a->wire, b->wire}) {
        const auto* bytes = reinterpret_cast<const std::byte*>(&w);
        pairs.insert(pairs.end(), bytes, bytes + sizeof w);
      }
    }
    proto::GraphAddDependenciesReq request{graph->wire, n};
    if (CUresult rc = graph->ctx->session->call(proto::Op::kGraphAddDependencies, &request,
                                                sizeof request, pairs, nullptr, 0);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    done += n;
  }
  return CUDA_SUCCESS;
}

// cuGraphGetEdges(_v2): a page of edges at a time from the server. Without arrays, the count;
// with them, up to *count edges, the rest NULL. `data` NULL asks for default edges only, and a
// non-default one is CUDA_ERROR_LOSSY_QUERY, as in the driver.
CUresult get_edges(CUgraph hgraph, CUgraphNode* from, CUgraphNode* to, CUgraphEdgeData* data,
                   std::size_t* count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (count == nullptr || (from == nullptr) != (to == nullptr) ||
      (data != nullptr && from == nullptr)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::size_t room = from == nullptr ? 0 : *count;
  std::size_t filled = 0;
  std::uint64_t total = 0;
  bool lossy = false;
  do {
    proto::GraphGetEdgesRep reply{};
    // Only the total when no array was given: the first page is skipped past the end.
    const std::uint64_t first = from == nullptr ? ~std::uint64_t{0} : filled;
    if (CUresult rc = graph->ctx->session->call(
            proto::Op::kGraphGetEdges, proto::GraphGetEdgesReq{graph->wire, first}, &reply);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    total = reply.total;
    if (from == nullptr || reply.count == 0) break;
    for (std::uint64_t i = 0; i < reply.count && filled < room; ++i, ++filled) {
      const proto::WireEdge& edge = reply.edges[i];
      from[filled] = reinterpret_cast<CUgraphNode>(node_for(graph, edge.from));
      to[filled] = reinterpret_cast<CUgraphNode>(node_for(graph, edge.to));
      CUgraphEdgeData got{};
      got.from_port = edge.from_port;
      got.to_port = edge.to_port;
      got.type = edge.type;
      if (data != nullptr) data[filled] = got;
      lossy = lossy || !default_edges(&got, 1);
    }
  } while (filled < room && filled < total);
  if (from == nullptr) {
    *count = total;
    return CUDA_SUCCESS;
  }
  for (std::size_t i = filled; i < room; ++i) {
    from[i] = nullptr;
    to[i] = nullptr;
    if (data != nullptr) data[i] = CUgraphEdgeData{};
  }
  *count = filled;
  return data == nullptr && lossy ? CUDA_ERROR_LOSSY_QUERY : CUDA_SUCCESS;
}

// The graph's nodes and default edges, for the topology queries the driver answers from them
// (root nodes, a node's dependencies and dependents): the shim asks for both and filters.
struct Topology {
  std::vector<CUgraphNode> nodes;  // in cuGraphGetNodes order
  std::vector<CUgraphNode> from, to;
  std::vector<CUgraphEdgeData> data;
};

CUresult topology_of(CUgraph hgraph, Topology& out) {
  std::size_t count = 0;
  if (CUresult rc = cuGraphGetNodes(hgraph, nullptr, &count); rc != CUDA_SUCCESS) return rc;
  out.nodes.assign(count, nullptr);
  if (count != 0) {
    if (CUresult rc = cuGraphGetNodes(hgraph, out.nodes.data(), &count); rc != CUDA_SUCCESS)
      return rc;
    out.nodes.resize(count);
  }
  std::size_t edges = 0;
  if (CUresult rc = get_edges(hgraph, nullptr, nullptr, nullptr, &edges); rc != CUDA_SUCCESS)
    return rc;
  out.from.assign(edges, nullptr);
  out.to.assign(edges, nullptr);
  out.data.assign(edges, CUgraphEdgeData{});
  if (edges != 0) {
    if (CUresult rc = get_edges(hgraph, out.from.data(), out.to.data(), out.data.data(), &edges);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    out.from.resize(edges);
    out.to.resize(edges);
    out.data.resize(edges);
  }
  return CUDA_SUCCESS;
}

// Fills `out` (room *count; NULL: only the count) the way the driver's node-list queries do:
// the rest of the array NULL, *count the number written; with edge data where asked, and
// CUDA_ERROR_LOSSY_QUERY when it was not asked for and an edge is not a default one.
CUresult answer_nodes(const std::vector<CUgraphNode>& found,
                      const std::vector<CUgraphEdgeData>& found_data, CUgraphNode* out,
                      CUgraphEdgeData* out_data, std::size_t* count) {
  if (count == nullptr || (out_data != nullptr && out == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (out == nullptr) {
    *count = found.size();
    return CUDA_SUCCESS;
  }
  const std::size_t n = std::min(*count, found.size());
  bool lossy = false;
  for (std::size_t i = 0; i < *count; ++i) {
    out[i] = i < n ? found[i] : nullptr;
    if (out_data != nullptr) out_data[i] = i < n ? found_data[i] : CUgraphEdgeData{};
    if (i < n && !found_data.empty()) lossy = lossy || !default_edges(&found_data[i], 1);
  }
  *count = n;
  return out_data == nullptr && lossy ? CUDA_ERROR_LOSSY_QUERY : CUDA_SUCCESS;
}

// A node's dependencies (`dependents` false: the nodes with an edge into it) or dependents.
CUresult node_neighbours(CUgraphNode hnode, bool dependents, CUgraphNode* out,
                         CUgraphEdgeData* data, std::size_t* count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return dead_or_null(hnode);
  Topology t;
  if (CUresult rc = topology_of(reinterpret_cast<CUgraph>(node->graph), t); rc != CUDA_SUCCESS) {
    return rc;
  }
  std::vector<CUgraphNode> found;
  std::vector<CUgraphEdgeData> found_data;
  for (std::size_t i = 0; i < t.from.size(); ++i) {
    const CUgraphNode self = dependents ? t.from[i] : t.to[i];
    if (self != hnode) continue;
    found.push_back(dependents ? t.to[i] : t.from[i]);
    found_data.push_back(t.data[i]);
  }
  return answer_nodes(found, found_data, out, data, count);
}

// cuGraphAddNode(_v2), the generic form: each node type the shim supports goes to its own add
// call (XLA adds kernel nodes this way, with programmatic edges; graph_nodes.cpp has host, event
// and memory nodes, graph_control_nodes.cpp conditional and batch memory operation nodes).
// External semaphore nodes and a child graph moved rather than cloned are refused with a log
// line.
CUresult add_generic_node(CUgraphNode* out, CUgraph graph, const CUgraphNode* deps,
                          const CUgraphEdgeData* edges, std::size_t count, CUgraphNodeParams* p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = edges_as_full_dependencies(edges, count, "cuGraphAddNode");
      rc != CUDA_SUCCESS) {
    return rc;
  }
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL: {
      const CUDA_KERNEL_NODE_PARAMS_v3& k = p->kernel;
      const unsigned grid[3] = {k.gridDimX, k.gridDimY, k.gridDimZ};
      const unsigned block[3] = {k.blockDimX, k.blockDimY, k.blockDimZ};
      return add_kernel_node(out, graph, deps, count, k.func, k.kern, grid, block, k.sharedMemBytes,
                             k.kernelParams, k.extra);
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const CUDA_MEMSET_NODE_PARAMS_v2& m = p->memset;
      CUDA_MEMSET_NODE_PARAMS v1{};
      v1.dst = m.dst;
      v1.pitch = m.pitch;
      v1.value = m.value;
      v1.elementSize = m.elementSize;
      v1.width = m.width;
      v1.height = m.height;
      return cuGraphAddMemsetNode(out, graph, deps, count, &v1, m.ctx);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      if (p->memcpy.flags != 0) return CUDA_ERROR_INVALID_VALUE;
      return cuGraphAddMemcpyNode(out, graph, deps, count, &p->memcpy.copyParams,
                                  p->memcpy.copyCtx);
    case CU_GRAPH_NODE_TYPE_EMPTY:
      return cuGraphAddEmptyNode(out, graph, deps, count);
    case CU_GRAPH_NODE_TYPE_GRAPH:
      if (p->graph.ownership != CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE) {
        log_once("cuGraphAddNode.move", LogLevel::kWarn,
                 "cuGraphAddNode: a child graph moved into its node (CU_GRAPH_CHILD_GRAPH_"
                 "OWNERSHIP_MOVE) is not supported by mpsshim; clone it");
        return CUDA_ERROR_NOT_SUPPORTED;
      }
      return cuGraphAddChildGraphNode(out, graph, deps, count, p->graph.graph);
    case CU_GRAPH_NODE_TYPE_HOST: {
      const CUDA_HOST_NODE_PARAMS v1{p->host.fn, p->host.userData};
      return cuGraphAddHostNode(out, graph, deps, count, &v1);
    }
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      return cuGraphAddEventRecordNode(out, graph, deps, count, p->eventRecord.event);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      return cuGraphAddEventWaitNode(out, graph, deps, count, p->eventWait.event);
    case CU_GRAPH_NODE_TYPE_MEM_ALLOC: {
      CUDA_MEM_ALLOC_NODE_PARAMS v1{};
      v1.poolProps = p->alloc.poolProps;
      v1.accessDescs = p->alloc.accessDescs;
      v1.accessDescCount = p->alloc.accessDescCount;
      v1.bytesize = p->alloc.bytesize;
      CUresult rc = cuGraphAddMemAllocNode(out, graph, deps, count, &v1);
      if (rc == CUDA_SUCCESS) p->alloc.dptr = v1.dptr;
      return rc;
    }
    case CU_GRAPH_NODE_TYPE_MEM_FREE:
      return cuGraphAddMemFreeNode(out, graph, deps, count, p->free.dptr);
    case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: {
      const CUDA_BATCH_MEM_OP_NODE_PARAMS v1{p->memOp.ctx, p->memOp.count, p->memOp.paramArray,
                                             p->memOp.flags};
      return cuGraphAddBatchMemOpNode(out, graph, deps, count, &v1);
    }
    case CU_GRAPH_NODE_TYPE_CONDITIONAL:
      return add_conditional_node(out, graph, deps, count, p->conditional);
    default:
      log_warn("cuGraphAddNode: node type {} is not supported by mpsshim",
               static_cast<int>(p->type));
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

constexpr auto kLegacy = DefaultStream::kLegacy;
constexpr auto kPerThread = DefaultStream::kPerThread;

}  // namespace

namespace mpsshim::shim {

bool process_has_open_capture() noexcept {
  return g_open_captures.load(std::memory_order_acquire) != 0;
}

void forget_capture_origin(const Stream* stream) noexcept {
  CaptureBook& b = book();
  std::lock_guard lock(b.mutex);
  if (b.origins.erase(stream) != 0) g_open_captures.fetch_sub(1, std::memory_order_seq_cst);
}

CUresult refuse_staged_copy_in_capture(Context* ctx, Stream* stream) noexcept {
  if (!process_has_open_capture()) return CUDA_SUCCESS;
  proto::CaptureInfoRep reply{};
  if (CUresult rc =
          ctx->session->call(proto::Op::kStreamCaptureInfo, proto::HandleReq{stream->wire}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (reply.status == CU_STREAM_CAPTURE_STATUS_NONE) return CUDA_SUCCESS;
  // As the real driver: the copy is refused and the capture invalidated (a query on a
  // capturing stream does that on the server).
  ctx->session->call(proto::Op::kStreamQuery, proto::HandleReq{stream->wire},
                     static_cast<int*>(nullptr));
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

}  // namespace mpsshim::shim

// ---- capture entry points ----

MPSSHIM_EXPORT CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr || *mode < CU_STREAM_CAPTURE_MODE_GLOBAL ||
      *mode > CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::swap(*mode, t_mode);
  return CUDA_SUCCESS;
}

#define MPSSHIM_CAPTURE_ENTRIES(SUFFIX, MODE)                                                  \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2##SUFFIX(CUstream h,                  \
                                                                  CUstreamCaptureMode mode) {  \
    return begin_capture(h, mode, MODE);                                                       \
  }                                                                                            \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamBeginCapture##SUFFIX(CUstream h) {                   \
    return begin_capture(h, CU_STREAM_CAPTURE_MODE_GLOBAL, MODE);                              \
  }                                                                                            \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamEndCapture##SUFFIX(CUstream h, CUgraph* g) {         \
    return end_capture(h, g, MODE);                                                            \
  }                                                                                            \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamIsCapturing##SUFFIX(CUstream h,                      \
                                                              CUstreamCaptureStatus* status) { \
    return is_capturing(h, status, MODE);                                                      \
  }                                                                                            \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo##SUFFIX(                              \
      CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id) {                             \
    return get_capture_info(h, MODE, status, id, nullptr, nullptr, nullptr, nullptr);          \
  }                                                                                            \
  MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v2##SUFFIX(                           \
      CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,               \
      const CUgraphNode** deps, size_t* count) {                                               \
    return get_capture_info(h, MODE, status, id, graph, deps, nullptr, count);                 \
  }                                                                                            \
  MPSSHIM_EXPORT CUresult CUDAAPI cuGraphLaunch##SUFFIX(CUgraphExec e, CUstream h) {           \
    return launch_graph(e, h, MODE, proto::Op::kGraphLaunch);                                  \
  }                                                                                            \
  MPSSHIM_EXPORT CUresult CUDAAPI cuGraphUpload##SUFFIX(CUgraphExec e, CUstream h) {           \
    return launch_graph(e, h, MODE, proto::Op::kGraphUpload);                                  \
  }

MPSSHIM_CAPTURE_ENTRIES(, kLegacy)
MPSSHIM_CAPTURE_ENTRIES(_ptsz, kPerThread)
#undef MPSSHIM_CAPTURE_ENTRIES

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream h, CUgraph graph,
                                                            const CUgraphNode* deps,
                                                            const CUgraphEdgeData* edges,
                                                            size_t count,
                                                            CUstreamCaptureMode mode) {
  return begin_capture_to_graph(h, graph, deps, edges, count, mode, kLegacy);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream h, CUgraph graph,
                                                                 const CUgraphNode* deps,
                                                                 const CUgraphEdgeData* edges,
                                                                 size_t count,
                                                                 CUstreamCaptureMode mode) {
  return begin_capture_to_graph(h, graph, deps, edges, count, mode, kPerThread);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamUpdateCaptureDependencies(CUstream h, CUgraphNode* deps,
                                                                  size_t count,
                                                                  unsigned int flags) {
  return update_capture_dependencies(h, kLegacy, deps, nullptr, count, flags);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamUpdateCaptureDependencies_ptsz(CUstream h,
                                                                       CUgraphNode* deps,
                                                                       size_t count,
                                                                       unsigned int flags) {
  return update_capture_dependencies(h, kPerThread, deps, nullptr, count, flags);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamUpdateCaptureDependencies_v2(CUstream h, CUgraphNode* deps,
                                                                     const CUgraphEdgeData* edges,
                                                                     size_t count,
                                                                     unsigned int flags) {
  return update_capture_dependencies(h, kLegacy, deps, edges, count, flags);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamUpdateCaptureDependencies_v2_ptsz(
    CUstream h, CUgraphNode* deps, const CUgraphEdgeData* edges, size_t count, unsigned int flags) {
  return update_capture_dependencies(h, kPerThread, deps, edges, count, flags);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus* status,
                                                          cuuint64_t* id, CUgraph* graph,
                                                          const CUgraphNode** deps,
                                                          const CUgraphEdgeData** edges,
                                                          size_t* count) {
  return get_capture_info(h, kLegacy, status, id, graph, deps, edges, count);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(
    CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, CUgraph* graph,
    const CUgraphNode** deps, const CUgraphEdgeData** edges, size_t* count) {
  return get_capture_info(h, kPerThread, status, id, graph, deps, edges, count);
}

// ---- graphs ----

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphCreate(CUgraph* out, unsigned int flags) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  proto::GraphRep reply{};
  if (CUresult rc = ctx->session->call(proto::Op::kGraphCreate,
                                       proto::GraphCreateReq{ctx->wire, flags, 0}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *out = reinterpret_cast<CUgraph>(graph_for(ctx, reply.handle));
  return CUDA_SUCCESS;
}

namespace {

// The graph's handles (its nodes', its embedded graphs', theirs) fail from now on; the objects go
// back to their pools (object_pool.hpp), so that a stale handle reads a dead magic, or a newer
// object's, rather than freed memory.
void kill_graph(GraphObject* graph) {
  {
    std::lock_guard lock(book().mutex);
    book().graphs.erase(graph->wire);
  }
  forget_graph_memory(graph);  // the server forgets it with the graph
  std::vector<GraphObject*> embedded;
  std::vector<GraphNodeObject*> nodes;
  UserObjectRefs user_refs;
  {
    std::lock_guard lock(graph->mutex);
    user_refs.swap(graph->user_refs);
    for (auto& [wire, node] : graph->nodes) nodes.push_back(node);
    graph->nodes.clear();
    graph->magic = kDeadMagic;
    embedded.swap(graph->embedded);
  }
  release_user_refs(user_refs);
  for (GraphNodeObject* node : nodes) ObjectPool<GraphNodeObject>::instance().retire(node);
  for (GraphObject* inner : embedded) kill_graph(inner);
  ObjectPool<GraphObject>::instance().retire(graph);
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphDestroy(CUgraph hgraph) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // A child graph node's embedded graph is the node's: it goes with the graph that holds it.
  if (graph->owner != nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult rc = graph->ctx->session->post(proto::Op::kGraphDestroy, proto::HandleReq{graph->wire});
  kill_graph(graph);
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphGetNodes(CUgraph hgraph, CUgraphNode* nodes, size_t* count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t room = nodes == nullptr ? 0 : *count;
  std::size_t filled = 0;
  std::uint64_t total = 0;
  do {
    proto::GraphGetNodesRep reply{};
    // Only the total when no array was given: the first page is skipped past the end.
    const std::uint64_t first = nodes == nullptr ? ~std::uint64_t{0} : filled;
    if (CUresult rc = graph->ctx->session->call(
            proto::Op::kGraphGetNodes, proto::GraphGetNodesReq{graph->wire, first}, &reply);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    total = reply.total;
    if (nodes == nullptr || reply.count == 0) break;
    for (std::uint64_t i = 0; i < reply.count && filled < room; ++i) {
      nodes[filled++] = reinterpret_cast<CUgraphNode>(node_for(graph, reply.nodes[i]));
    }
  } while (filled < room && filled < total);
  if (nodes == nullptr) {
    *count = total;
  } else {
    for (std::size_t i = filled; i < room; ++i) nodes[i] = nullptr;
    *count = filled;
  }
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphGetEdges_v2(CUgraph graph, CUgraphNode* from,
                                                   CUgraphNode* to, CUgraphEdgeData* data,
                                                   size_t* count) {
  return get_edges(graph, from, to, data, count);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphGetEdges(CUgraph graph, CUgraphNode* from, CUgraphNode* to,
                                                size_t* count) {
  return get_edges(graph, from, to, nullptr, count);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphGetRootNodes(CUgraph hgraph, CUgraphNode* roots,
                                                    size_t* count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (graph_of(hgraph) == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Topology t;
  if (CUresult rc = topology_of(hgraph, t); rc != CUDA_SUCCESS) return rc;
  // The nodes no edge leads into, in the graph's node order.
  std::vector<CUgraphNode> found;
  for (CUgraphNode n : t.nodes) {
    if (std::find(t.to.begin(), t.to.end(), n) == t.to.end()) found.push_back(n);
  }
  return answer_nodes(found, {}, roots, nullptr, count);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphNodeGetDependencies(CUgraphNode node, CUgraphNode* deps,
                                                           size_t* count) {
  return node_neighbours(node, false, deps, nullptr, count);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphNodeGetDependencies_v2(CUgraphNode node, CUgraphNode* deps,
                                                              CUgraphEdgeData* data,
                                                              size_t* count) {
  return node_neighbours(node, false, deps, data, count);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphNodeGetDependentNodes(CUgraphNode node,
                                                             CUgraphNode* dependents,
                                                             size_t* count) {
  return node_neighbours(node, true, dependents, nullptr, count);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphNodeGetDependentNodes_v2(CUgraphNode node,
                                                                CUgraphNode* dependents,
                                                                CUgraphEdgeData* data,
                                                                size_t* count) {
  return node_neighbours(node, true, dependents, data, count);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecGetFlags(CUgraphExec hexec, cuuint64_t* flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphExecObject* exec = exec_of(hexec);
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *flags = exec->flags;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec* out, CUgraph graph,
                                                            unsigned long long flags) {
  if ((flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0) return CUDA_ERROR_INVALID_VALUE;
  return instantiate(out, graph, flags, nullptr, nullptr);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphInstantiate(CUgraphExec* out, CUgraph graph,
                                                   CUgraphNode* error_node, char* log,
                                                   size_t log_bytes) {
  if (error_node != nullptr) *error_node = nullptr;
  if (log != nullptr && log_bytes != 0) log[0] = '\0';
  return instantiate(out, graph, 0, nullptr, nullptr);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec* out, CUgraph graph,
                                                      CUgraphNode* error_node, char* log,
                                                      size_t log_bytes) {
  return cuGraphInstantiate(out, graph, error_node, log, log_bytes);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec* out, CUgraph graph,
                                                             CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  p->hErrNode_out = nullptr;
  return instantiate(out, graph, p->flags, p->hUploadStream, &p->result_out);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(
    CUgraphExec* out, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS* p) {
  return cuGraphInstantiateWithParams(out, graph, p);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hexec) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphExecObject* exec = exec_of(hexec);
  if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  // Launched replays still run: the server destroys it behind fences, and its user objects are
  // let go of behind its last launch.
  CUresult rc =
      exec->ctx->session->post(proto::Op::kGraphExecDestroy, proto::HandleReq{exec->wire});
  exec_release_user_refs(exec);
  ObjectPool<GraphExecObject>::instance().retire(exec);
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph,
                                                     CUgraphExecUpdateResultInfo* info) {
  if (info == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *info = CUgraphExecUpdateResultInfo{};
  return exec_update(exec, graph, &info->result);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec exec, CUgraph graph,
                                                  CUgraphNode* error_node,
                                                  CUgraphExecUpdateResult* result) {
  if (error_node == nullptr || result == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *error_node = nullptr;
  return exec_update(exec, graph, result);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddKernelNode_v2(CUgraphNode* out, CUgraph graph,
                                                        const CUgraphNode* deps, size_t count,
                                                        const CUDA_KERNEL_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
  const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  return add_kernel_node(out, graph, deps, count, p->func, p->kern, grid, block, p->sharedMemBytes,
                         p->kernelParams, p->extra);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddKernelNode(CUgraphNode* out, CUgraph graph,
                                                     const CUgraphNode* deps, size_t count,
                                                     const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
  const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  return add_kernel_node(out, graph, deps, count, p->func, nullptr, grid, block, p->sharedMemBytes,
                         p->kernelParams, p->extra);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecKernelNodeSetParams_v2(
    CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
  const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  return kernel_node_set_params(exec, node, p->func, p->kern, grid, block, p->sharedMemBytes,
                                p->kernelParams, p->extra);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecKernelNodeSetParams(
    CUgraphExec exec, CUgraphNode node, const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
  const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  return kernel_node_set_params(exec, node, p->func, nullptr, grid, block, p->sharedMemBytes,
                                p->kernelParams, p->extra);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddMemsetNode(CUgraphNode* out, CUgraph hgraph,
                                                     const CUgraphNode* deps, size_t count,
                                                     const CUDA_MEMSET_NODE_PARAMS* p, CUcontext) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (graph_of(hgraph) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::GraphMemsetNodeReq request{{},        p->dst,   p->pitch,      p->width,
                                    p->height, p->value, p->elementSize};
  NodeParams known;
  known.type = CU_GRAPH_NODE_TYPE_MEMSET;
  known.memset = *p;
  return add_node(out, hgraph, deps, count, proto::Op::kGraphAddMemsetNode, request, known);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddMemcpyNode(CUgraphNode* out, CUgraph hgraph,
                                                     const CUgraphNode* deps, size_t count,
                                                     const CUDA_MEMCPY3D* p, CUcontext) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (graph_of(hgraph) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (out == nullptr || p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto device_side = [](CUmemorytype type, CUdeviceptr address) {
    return type == CU_MEMORYTYPE_DEVICE ||
           (type == CU_MEMORYTYPE_UNIFIED && address_book().find_device(address, nullptr));
  };
  if (!device_side(p->srcMemoryType, p->srcDevice) ||
      !device_side(p->dstMemoryType, p->dstDevice) || p->Height > 1 || p->Depth > 1 ||
      p->srcY != 0 || p->srcZ != 0 || p->dstY != 0 || p->dstZ != 0) {
    log_once("cuGraphAddMemcpyNode.shape", LogLevel::kWarn,
             "cuGraphAddMemcpyNode: only one-dimensional device-to-device copies are supported "
             "by mpsshim in explicitly built graphs; capture other copies from a stream "
             "(pinned host memory) instead");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  proto::GraphCopyNodeReq request{
      {}, p->dstDevice + p->dstXInBytes, p->srcDevice + p->srcXInBytes, p->WidthInBytes};
  NodeParams known;
  known.type = CU_GRAPH_NODE_TYPE_MEMCPY;
  known.memcpy = *p;
  return add_node(out, hgraph, deps, count, proto::Op::kGraphAddCopyNode, request, known);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddEmptyNode(CUgraphNode* out, CUgraph hgraph,
                                                    const CUgraphNode* deps, size_t count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::byte> trailing;
  if (CUresult rc = append_dependencies(graph, deps, count, trailing); rc != CUDA_SUCCESS) {
    return rc;
  }
  proto::GraphAddNodeHeader request{graph->wire, static_cast<std::uint32_t>(count), 0};
  return send_add_node(out, graph, proto::Op::kGraphAddEmptyNode, request, trailing);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddDependencies_v2(CUgraph graph, const CUgraphNode* from,
                                                          const CUgraphNode* to,
                                                          const CUgraphEdgeData* edges,
                                                          size_t count) {
  return add_dependencies(graph, from, to, edges, count);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddDependencies(CUgraph graph, const CUgraphNode* from,
                                                       const CUgraphNode* to, size_t count) {
  return add_dependencies(graph, from, to, nullptr, count);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphDebugDotPrint(CUgraph, const char*, unsigned int) {
  log_once("cuGraphDebugDotPrint", LogLevel::kWarn,
           "cuGraphDebugDotPrint is not supported by mpsshim: the graph lives in the server");
  return CUDA_ERROR_NOT_SUPPORTED;
}

// ---- child graphs ----

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode* out, CUgraph hgraph,
                                                         const CUgraphNode* deps, size_t count,
                                                         CUgraph hchild) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  GraphObject* child = graph_of(hchild);
  if (out == nullptr || child == nullptr || child->ctx->session != graph->ctx->session) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::vector<std::byte> trailing;
  if (CUresult rc = append_dependencies(graph, deps, count, trailing); rc != CUDA_SUCCESS) {
    return rc;
  }
  proto::GraphChildNodeReq request{{graph->wire, static_cast<std::uint32_t>(count), 0},
                                   child->wire};
  return send_add_node(out, graph, proto::Op::kGraphAddChildGraphNode, request, trailing);
}

// The embedded graph, as a graph object the client may query and build on; the node owns it
// (cuGraphDestroy of it is refused) and it dies with the node's graph.
MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode* out, CUgraph graph,
                                                  const CUgraphNode* deps,
                                                  const CUgraphEdgeData* edges, size_t count,
                                                  CUgraphNodeParams* p) {
  return add_generic_node(out, graph, deps, edges, count, p);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddNode(CUgraphNode* out, CUgraph graph,
                                               const CUgraphNode* deps, size_t count,
                                               CUgraphNodeParams* p) {
  return add_generic_node(out, graph, deps, nullptr, count, p);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hnode, CUgraphNodeType* type) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return dead_or_null(hnode);
  if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::GraphNodeTypeRep reply{};
  if (CUresult rc = node->graph->ctx->session->call(proto::Op::kGraphNodeGetType,
                                                    proto::HandleReq{node->wire}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *type = static_cast<CUgraphNodeType>(reply.type);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphChildGraphNodeGetGraph(CUgraphNode hnode, CUgraph* out) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return dead_or_null(hnode);
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GraphObject* parent = node->graph;
  proto::GraphRep reply{};
  if (CUresult rc = parent->ctx->session->call(proto::Op::kGraphChildGraphNodeGetGraph,
                                               proto::HandleReq{node->wire}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  GraphObject* embedded = graph_for(parent->ctx, reply.handle);
  std::lock_guard lock(parent->mutex);
  if (embedded->owner == nullptr) {
    embedded->owner = parent;
    parent->embedded.push_back(embedded);
  }
  *out = reinterpret_cast<CUgraph>(embedded);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec hexec,
                                                                   CUgraphNode hnode,
                                                                   CUgraph hchild) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphExecObject* exec = exec_of(hexec);
  if (exec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  GraphNodeObject* node = node_of(hnode);
  GraphObject* child = graph_of(hchild);
  if (node == nullptr || child == nullptr || node->graph->ctx->session != exec->ctx->session ||
      child->ctx->session != exec->ctx->session) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return exec->ctx->session->call(proto::Op::kGraphExecChildGraphNodeSetParams,
                                  proto::GraphExecChildNodeReq{exec->wire, node->wire, child->wire},
                                  static_cast<int*>(nullptr));
}
