// Stream capture and graphs. Capture runs on the client's real stream in relaxed mode (see
// proto/ops.hpp); graphs, executable graphs and nodes are handles of the session; executable
// graphs are destroyed behind fences, as GPU work may still run them.
#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "broker/server/ops/graph_targets.hpp"
#include "broker/server/ops/ops.hpp"
#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/capture.hpp"
#include "broker/server/session/graph_memory.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/retire.hpp"

namespace mpsshim::server {

std::uint64_t remember_node(Session& session, CUgraphNode node, std::uint64_t graph_id) {
  return remember(session, node, GraphNodeObj{node, graph_id});
}

std::uint64_t remember_graph(Session& session, CUgraph graph, std::uint64_t ctx, bool owned) {
  std::uint64_t id = remember(session, graph, GraphObj{graph, ctx, owned});
  if (GraphObj* g = session.objects.get<GraphObj>(id)) g->owned = g->owned || owned;
  return id;
}

namespace {

// The dependency list after a kGraphAdd*Node request, as driver nodes of `graph_id`.
bool read_dependencies(Call& call, std::size_t request_bytes, const proto::GraphAddNodeHeader& h,
                       std::vector<CUgraphNode>& out, CUresult& error) {
  std::vector<proto::WireHandle> ids(h.dependency_count);
  if (!ids.empty()) {
    std::memcpy(ids.data(),
                call.trailing(request_bytes, ids.size() * sizeof(proto::WireHandle)).data(),
                ids.size() * sizeof(proto::WireHandle));
  }
  error = CUDA_SUCCESS;
  for (proto::WireHandle id : ids) {
    const GraphNodeObj* node = call.session.objects.get<GraphNodeObj>(id);
    if (node == nullptr || node->graph != h.graph) {
      error = CUDA_ERROR_INVALID_VALUE;
      return true;
    }
    out.push_back(node->node);
  }
  return true;
}

}  // namespace

tl::expected<NodeTarget, OpResult> node_target(Call& call, std::size_t request_bytes,
                                               const proto::GraphAddNodeHeader& h,
                                               std::uint64_t extra) {
  if (h.dependency_count > proto::kMaxNodeDependencies ||
      !call.exact(request_bytes, std::uint64_t{h.dependency_count} * 8 + extra)) {
    return tl::unexpected(malformed_node(call));
  }
  NodeTarget target;
  target.graph = call.session.objects.get<GraphObj>(h.graph);
  if (target.graph == nullptr) return tl::unexpected(call.done(CUDA_ERROR_INVALID_HANDLE));
  CUresult error = CUDA_SUCCESS;
  read_dependencies(call, request_bytes, h, target.deps, error);
  if (error != CUDA_SUCCESS) return tl::unexpected(call.done(error));
  return target;
}

OpResult node_reply(Call& call, std::uint64_t graph_id, CUresult r, CUgraphNode node) {
  if (r != CUDA_SUCCESS) return call.done(r);
  std::uint64_t id = remember_node(call.session, node, graph_id);
  if (id == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  return call.reply(proto::GraphRep{id});
}

OpResult malformed_node(Call& call) {
  return call.malformed("sent a graph node whose dependency list the record does not hold");
}

std::size_t forget_graphs(Session& session) {
  std::size_t destroyed = 0;
  for (std::uint64_t id : session.objects.ids<GraphObj>()) {
    const GraphObj* graph = session.objects.get<GraphObj>(id);
    if (graph == nullptr) continue;  // embedded in a graph forgotten before it
    destroyed += graph->owned ? 1 : 0;
    forget_graph(session, id);
  }
  return destroyed;
}

void forget_graph(Session& session, std::uint64_t graph_id) {
  for (std::uint64_t id : session.objects.ids_where<GraphNodeObj>(
           [&](const GraphNodeObj& n) { return n.graph == graph_id; })) {
    session.ids_by_driver_handle.erase(session.objects.take<GraphNodeObj>(id)->node);
  }
  // The graphs embedded in its child graph nodes go with it: the driver frees them.
  for (std::uint64_t id : session.objects.ids_where<GraphObj>(
           [&](const GraphObj& g) { return g.embedded_in == graph_id; })) {
    forget_graph(session, id);
  }
  // Its memory nodes' memory stops counting against the client (graph_memory.hpp).
  for (const DeviceRange& r : session.memory.remove_if(
           [&](const DeviceRange& r) { return is_graph_memory(r) && r.owner == graph_id; })) {
    session.charge.release(r.bytes);
  }
  auto graph = session.objects.take<GraphObj>(graph_id);
  if (!graph) return;
  session.ids_by_driver_handle.erase(graph->graph);
  if (graph->owned) session.cu().cuGraphDestroy(graph->graph);
}

// ---- capture ----

namespace {

// Begins a capture on the client's stream with `begin` (given the driver stream), once the
// server's own bookkeeping is out of its way. `into` is the graph id the capture fills (0: the
// driver makes a new graph).
template <typename Begin>
OpResult begin_capture_on(Call& call, std::uint64_t stream_id, std::uint64_t into, Begin begin) {
  Session& session = call.session;
  CUresult error = CUDA_SUCCESS;
  // Legacy joins now, outside the capture: in-stream order may cross into it.
  StreamObj* stream = use_stream(call, stream_id, false, &error);
  if (stream == nullptr) return call.done(error);
  // The legacy default stream synchronizes with every blocking stream: it cannot capture.
  if (stream->is_default) return call.done(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (capturing(session, *stream)) return call.done(CUDA_ERROR_ILLEGAL_STATE);
  close_busy_span(session, stream->stream);  // what follows is captured, not run
  if (CUresult r = mark_capture_fence(session, *stream); r != CUDA_SUCCESS) return call.done(r);
  // Relaxed on the driver whatever the client asked: this thread serves every client, and a
  // global-mode capture would forbid the calls it makes for the others.
  if (CUresult r = begin(stream->stream); r != CUDA_SUCCESS) {
    session.release_event(stream->capture_fence);
    stream->capture_fence = nullptr;
    return call.done(r);
  }
  stream->capture_origin = true;
  stream->capture_graph = into;
  ++session.active_captures;
  return call.done();
}

}  // namespace

OpResult op_stream_begin_capture(Call& call) {
  auto req = call.request<proto::BeginCaptureReq>();
  if (req.mode > CU_STREAM_CAPTURE_MODE_RELAXED) return call.done(CUDA_ERROR_INVALID_VALUE);
  // The capture makes a graph.
  if (!within_client_limit(call.session, ClientLimit::kGraphs)) {
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return begin_capture_on(call, req.stream, 0, [&](CUstream stream) {
    return call.cu.cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_RELAXED);
  });
}

// The captured work goes into a graph the client owns, after the nodes of it that it named. The
// graph stays the client's throughout: the end of the capture hands back the same id, and a failed
// capture does not take it.
OpResult op_stream_begin_capture_to_graph(Call& call) {
  auto req = call.request<proto::BeginCaptureToGraphReq>();
  Session& session = call.session;
  if (req.dependency_count > proto::kMaxNodeDependencies ||
      !call.exact(sizeof req, std::uint64_t{req.dependency_count} * sizeof(proto::WireHandle))) {
    return call.malformed(
        "began a capture into a graph with a dependency list the record does not hold");
  }
  if (req.mode > CU_STREAM_CAPTURE_MODE_RELAXED) return call.done(CUDA_ERROR_INVALID_VALUE);
  const GraphObj* graph = session.objects.get<GraphObj>(req.graph);
  // A graph another capture still builds is the driver's until that capture ends.
  if (graph == nullptr || !graph->owned) return call.done(CUDA_ERROR_INVALID_VALUE);
  const CUgraph driver_graph = graph->graph;
  std::vector<CUgraphNode> deps;
  CUresult error = CUDA_SUCCESS;
  read_dependencies(call, sizeof req, proto::GraphAddNodeHeader{req.graph, req.dependency_count, 0},
                    deps, error);
  if (error != CUDA_SUCCESS) return call.done(error);
  return begin_capture_on(call, req.stream, req.graph, [&](CUstream stream) {
    return call.cu.cuStreamBeginCaptureToGraph(stream, driver_graph, deps.data(), nullptr,
                                               deps.size(), CU_STREAM_CAPTURE_MODE_RELAXED);
  });
}

OpResult op_stream_end_capture(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  StreamObj* stream = session.objects.get<StreamObj>(req.handle);
  if (stream == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  CUgraph graph = nullptr;
  CUresult r = call.cu.cuStreamEndCapture(stream->stream, &graph);
  if (!stream->capture_origin) return call.done(r);  // not a capture this stream began
  stream->capture_origin = false;
  --session.active_captures;
  // The graph the client may hold an id of: owned now, or gone with the failed capture.
  const std::uint64_t handed_out = std::exchange(stream->capture_graph, 0);
  if (handed_out != 0) {
    const GraphObj* g = session.objects.get<GraphObj>(handed_out);
    // A graph the client owns (captured into by cuStreamBeginCaptureToGraph) stays its own.
    if (g != nullptr && !g->owned && (r != CUDA_SUCCESS || g->graph != graph)) {
      forget_graph(session, handed_out);
    }
  }
  release_capture_fences(session);
  if (r != CUDA_SUCCESS) return call.done(r);
  std::uint64_t ctx = stream->ctx;
  std::uint64_t id = remember_graph(session, graph, ctx, true);
  if (id == 0) {
    call.cu.cuGraphDestroy(graph);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return call.reply(proto::EndCaptureRep{id});
}

OpResult op_stream_capture_info(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  StreamObj* stream = session.objects.get<StreamObj>(req.handle);
  if (stream == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  proto::CaptureInfoRep rep{};
  rep.status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (session.active_captures == 0) return call.reply(rep);
  if (stream->is_default && blocking_stream_capturing(session, stream->ctx)) {
    return call.done(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  }
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  CUgraph graph = nullptr;
  std::size_t dependencies = 0;
  if (CUresult r = call.cu.cuStreamGetCaptureInfo_v3(stream->stream, &status, &id, &graph, nullptr,
                                                     nullptr, &dependencies);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  rep.status = status;
  if (status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    rep.id = id;
    rep.dependency_count = dependencies;
    if (graph != nullptr) {
      rep.graph = remember_graph(session, graph, stream->ctx, false);
      // The origin ends the capture and settles the id; a joined stream reports the origin's.
      for (std::uint64_t sid : session.objects.ids_where<StreamObj>(
               [](const StreamObj& s) { return s.capture_origin; })) {
        StreamObj* origin = session.objects.get<StreamObj>(sid);
        CUgraph origin_graph = nullptr;
        CUstreamCaptureStatus st{};
        if (call.cu.cuStreamGetCaptureInfo_v3(origin->stream, &st, nullptr, &origin_graph, nullptr,
                                              nullptr, nullptr) == CUDA_SUCCESS &&
            origin_graph == graph) {
          origin->capture_graph = rep.graph;
        }
      }
    }
  }
  return call.reply(rep);
}

// ---- graphs ----

OpResult op_graph_create(Call& call) {
  auto req = call.request<proto::GraphCreateReq>();
  Session& session = call.session;
  if (session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  if (!within_client_limit(session, ClientLimit::kGraphs))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  if (req.flags != 0) return call.done(CUDA_ERROR_INVALID_VALUE);
  CUgraph graph = nullptr;
  {
    GreenCurrent green(session);
    if (CUresult r = call.cu.cuGraphCreate(&graph, 0); r != CUDA_SUCCESS) return call.done(r);
  }
  std::uint64_t id = remember_graph(session, graph, req.ctx, true);
  if (id == 0) {
    call.cu.cuGraphDestroy(graph);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return call.reply(proto::GraphRep{id});
}

OpResult op_graph_destroy(Call& call) {
  auto req = call.request<proto::HandleReq>();
  const GraphObj* graph = call.session.objects.get<GraphObj>(req.handle);
  if (graph == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  if (!graph->owned) return call.done(CUDA_ERROR_INVALID_VALUE);  // a capture still builds it
  // Captured into (cuStreamBeginCaptureToGraph): the driver adds nodes to it until the end.
  if (!call.session.objects
           .ids_where<StreamObj>([&](const StreamObj& s) {
             return s.capture_origin && s.capture_graph == req.handle;
           })
           .empty()) {
    return call.done(CUDA_ERROR_ILLEGAL_STATE);
  }
  // No GPU work uses a graph (executable graphs are copies): destroyed now.
  forget_graph(call.session, req.handle);
  return call.done();
}

OpResult op_graph_instantiate(Call& call) {
  auto req = call.request<proto::GraphInstantiateReq>();
  Session& session = call.session;
  const GraphObj* graph = session.objects.get<GraphObj>(req.graph);
  if (graph == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  // Device-launch graphs would hand the client's kernels a way to launch work the server never
  // sees; uploads are done here with the stream the client named.
  constexpr std::uint64_t kAllowed = CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY |
                                     CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
  if ((req.flags & ~kAllowed) != 0) return call.done(CUDA_ERROR_NOT_SUPPORTED);
  if (!within_client_limit(session, ClientLimit::kGraphs))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  StreamObj* upload = nullptr;
  if ((req.flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0) {
    CUresult error = CUDA_SUCCESS;
    upload = use_stream(call, req.upload_stream, true, &error);
    if (upload == nullptr) return call.done(error);
  }
  CUgraphExec exec = nullptr;
  {
    GreenCurrent green(session);
    if (CUresult r = call.cu.cuGraphInstantiateWithFlags(
            &exec, graph->graph, req.flags & ~std::uint64_t{CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD});
        r != CUDA_SUCCESS) {
      return call.done(r);
    }
  }
  if (upload != nullptr) {
    if (CUresult r = call.cu.cuGraphUpload(exec, upload->stream); r != CUDA_SUCCESS) {
      call.cu.cuGraphExecDestroy(exec);
      return call.done(r);
    }
  }
  std::uint64_t id = session.objects.insert(GraphExecObj{exec, graph->ctx});
  if (id == 0) {
    call.cu.cuGraphExecDestroy(exec);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return call.reply(proto::GraphInstantiateRep{id, CUDA_GRAPH_INSTANTIATE_SUCCESS, 0});
}

OpResult op_graph_exec_destroy(Call& call) {
  auto req = call.request<proto::HandleReq>();
  auto exec = call.session.objects.take<GraphExecObj>(req.handle);
  if (!exec) return call.done(CUDA_ERROR_INVALID_HANDLE);
  Retired bundle;
  bundle.graph_execs.push_back(exec->exec);
  return call.done(retire(call.session, std::move(bundle)));
}

OpResult op_graph_launch(Call& call) {
  auto req = call.request<proto::GraphLaunchReq>();
  const GraphExecObj* exec = call.session.objects.get<GraphExecObj>(req.exec);
  if (exec == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  CUgraphExec driver_exec = exec->exec;
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  if (call.op() == proto::Op::kGraphLaunch) open_busy_span(call.session, stream->stream);
  CUresult r = call.op() == proto::Op::kGraphUpload
                   ? call.cu.cuGraphUpload(driver_exec, stream->stream)
                   : call.cu.cuGraphLaunch(driver_exec, stream->stream);
  if (r == CUDA_SUCCESS && call.op() == proto::Op::kGraphLaunch) ++call.session.launches;
  return finish_on_stream(call, *stream, r);
}

OpResult op_graph_exec_update(Call& call) {
  auto req = call.request<proto::GraphExecUpdateReq>();
  const GraphExecObj* exec = call.session.objects.get<GraphExecObj>(req.exec);
  const GraphObj* graph = call.session.objects.get<GraphObj>(req.graph);
  if (exec == nullptr || graph == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  CUgraphExecUpdateResultInfo info{};
  CUresult r = call.cu.cuGraphExecUpdate_v2(exec->exec, graph->graph, &info);
  OpResult result =
      call.reply(proto::GraphExecUpdateRep{static_cast<std::uint32_t>(info.result), 0});
  result.status = r;
  return result;
}

namespace {

// A page of `nodes` from `first` as ids of nodes of `graph_id` (GraphGetNodesRep); `total` is
// what the reply says the list holds.
OpResult reply_node_page(Call& call, std::span<const CUgraphNode> nodes, std::size_t total,
                         std::uint64_t first, std::uint64_t graph_id) {
  proto::GraphGetNodesRep rep{};
  rep.total = total;
  if (first < nodes.size()) {
    const std::size_t count = std::min<std::size_t>(nodes.size() - first, proto::kNodesPerReply);
    for (std::size_t i = 0; i < count; ++i) {
      rep.nodes[i] = remember_node(call.session, nodes[first + i], graph_id);
      if (rep.nodes[i] == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
    }
    rep.count = count;
  }
  return call.reply(
      rep, offsetof(proto::GraphGetNodesRep, nodes) + rep.count * sizeof(proto::WireHandle));
}

// The capture `stream` is in and the id of its graph, or an error (not capturing: the
// driver's answer for the calls below).
CUresult capture_graph_id(Call& call, StreamObj& stream, CUgraph* graph, std::uint64_t* id) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (CUresult r = call.cu.cuStreamGetCaptureInfo_v3(stream.stream, &status, nullptr, graph,
                                                     nullptr, nullptr, nullptr);
      r != CUDA_SUCCESS) {
    return r;
  }
  if (status == CU_STREAM_CAPTURE_STATUS_INVALIDATED) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE || *graph == nullptr) {
    return CUDA_ERROR_ILLEGAL_STATE;
  }
  *id = remember_graph(call.session, *graph, stream.ctx, false);
  return *id == 0 ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

}  // namespace

OpResult op_stream_capture_dependencies(Call& call) {
  auto req = call.request<proto::StreamCaptureDepsReq>();
  Session& session = call.session;
  StreamObj* stream = session.objects.get<StreamObj>(req.stream);
  if (stream == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  CUgraph graph = nullptr;
  std::uint64_t graph_id = 0;
  if (CUresult r = capture_graph_id(call, *stream, &graph, &graph_id); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  const CUgraphNode* nodes = nullptr;
  std::size_t total = 0;
  CUstreamCaptureStatus status{};
  // The array is the driver's, valid until the next call on the stream: read at once.
  if (CUresult r = call.cu.cuStreamGetCaptureInfo_v3(stream->stream, &status, nullptr, nullptr,
                                                     &nodes, nullptr, &total);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return reply_node_page(call, std::span(nodes, nodes != nullptr ? total : 0), total, req.first,
                         graph_id);
}

OpResult op_stream_update_capture_dependencies(Call& call) {
  auto req = call.request<proto::StreamUpdateCaptureDepsReq>();
  Session& session = call.session;
  if (req.count > proto::kMaxNodeDependencies ||
      !call.exact(sizeof req, req.count * sizeof(proto::WireHandle))) {
    return call.malformed("sent capture dependencies that the record does not hold");
  }
  StreamObj* stream = session.objects.get<StreamObj>(req.stream);
  if (stream == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  if (req.flags != CU_STREAM_ADD_CAPTURE_DEPENDENCIES &&
      req.flags != CU_STREAM_SET_CAPTURE_DEPENDENCIES) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  CUgraph graph = nullptr;
  std::uint64_t graph_id = 0;
  if (CUresult r = capture_graph_id(call, *stream, &graph, &graph_id); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  std::vector<proto::WireHandle> ids(req.count);
  if (!ids.empty()) {
    std::memcpy(ids.data(),
                call.trailing(sizeof req, ids.size() * sizeof(proto::WireHandle)).data(),
                ids.size() * sizeof(proto::WireHandle));
  }
  std::vector<CUgraphNode> nodes;
  for (proto::WireHandle id : ids) {
    const GraphNodeObj* node = session.objects.get<GraphNodeObj>(id);
    // A node of another graph: the driver's answer for it.
    if (node == nullptr || node->graph != graph_id) return call.done(CUDA_ERROR_INVALID_VALUE);
    nodes.push_back(node->node);
  }
  return call.done(call.cu.cuStreamUpdateCaptureDependencies_v2(stream->stream, nodes.data(),
                                                                nullptr, nodes.size(), req.flags));
}

OpResult op_graph_get_nodes(Call& call) {
  auto req = call.request<proto::GraphGetNodesReq>();
  Session& session = call.session;
  const GraphObj* graph = session.objects.get<GraphObj>(req.graph);
  if (graph == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  std::size_t total = 0;
  if (CUresult r = call.cu.cuGraphGetNodes(graph->graph, nullptr, &total); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  std::vector<CUgraphNode> nodes;
  if (req.first < total) {
    nodes.resize(total);
    std::size_t n = total;
    if (CUresult r = call.cu.cuGraphGetNodes(graph->graph, nodes.data(), &n); r != CUDA_SUCCESS) {
      return call.done(r);
    }
    nodes.resize(std::min(n, total));
  }
  return reply_node_page(call, nodes, total, req.first, req.graph);
}

OpResult op_graph_get_edges(Call& call) {
  auto req = call.request<proto::GraphGetEdgesReq>();
  Session& session = call.session;
  const GraphObj* graph = session.objects.get<GraphObj>(req.graph);
  if (graph == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  std::size_t total = 0;
  if (CUresult r = call.cu.cuGraphGetEdges_v2(graph->graph, nullptr, nullptr, nullptr, &total);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  proto::GraphGetEdgesRep rep{};
  rep.total = total;
  if (req.first < total) {
    std::vector<CUgraphNode> from(total), to(total);
    std::vector<CUgraphEdgeData> data(total);
    std::size_t n = total;
    if (CUresult r =
            call.cu.cuGraphGetEdges_v2(graph->graph, from.data(), to.data(), data.data(), &n);
        r != CUDA_SUCCESS) {
      return call.done(r);
    }
    const std::size_t count =
        std::min<std::size_t>(n - std::min<std::size_t>(req.first, n), proto::kEdgesPerReply);
    for (std::size_t i = 0; i < count; ++i) {
      const std::size_t at = req.first + i;
      proto::WireEdge& edge = rep.edges[i];
      edge.from = remember_node(session, from[at], req.graph);
      edge.to = remember_node(session, to[at], req.graph);
      if (edge.from == 0 || edge.to == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
      edge.from_port = data[at].from_port;
      edge.to_port = data[at].to_port;
      edge.type = data[at].type;
    }
    rep.count = count;
  }
  return call.reply(rep,
                    offsetof(proto::GraphGetEdgesRep, edges) + rep.count * sizeof(proto::WireEdge));
}

// ---- explicit construction ----

namespace {

// A kernel node's parameters: the session's function or kernel, its arguments packed by the
// shim at the offsets of its parameter layout (copied into `args`, which `params` points into
// through `pointers`). A CUkernel runs in the client's green context.
CUresult kernel_node_params(Session& session, proto::WireHandle function,
                            std::span<const std::byte> packed, const std::uint32_t grid[3],
                            const std::uint32_t block[3], std::uint32_t shared_bytes,
                            std::byte* args, std::vector<void*>& pointers,
                            CUDA_KERNEL_NODE_PARAMS& params) {
  params = CUDA_KERNEL_NODE_PARAMS{};
  const ParamLayout* layout = nullptr;
  if (const FunctionObj* f = session.objects.get<FunctionObj>(function)) {
    params.func = f->function;
    layout = &f->layout;
  } else if (const KernelObj* k = session.objects.get<KernelObj>(function)) {
    params.kern = k->kernel;
    params.ctx = session.green.context;
    layout = &k->layout;
  } else {
    return CUDA_ERROR_INVALID_HANDLE;
  }
  // The shim packs every parameter by the layout it was given; a shorter block is a client
  // that did not, and would have the driver read past it.
  if (packed.size() < layout->bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!packed.empty()) std::memcpy(args, packed.data(), packed.size());
  // The driver takes a node's arguments as kernelParams only (kernel_params.hpp).
  params.kernelParams = point_at_params(*layout, args, pointers);
  params.gridDimX = grid[0];
  params.gridDimY = grid[1];
  params.gridDimZ = grid[2];
  params.blockDimX = block[0];
  params.blockDimY = block[1];
  params.blockDimZ = block[2];
  params.sharedMemBytes = shared_bytes;
  return CUDA_SUCCESS;
}

}  // namespace

OpResult op_graph_add_kernel_node(Call& call) {
  auto req = call.request<proto::GraphKernelNodeReq>();
  Session& session = call.session;
  if (req.args_bytes > proto::kMaxArgsBytes) return malformed_node(call);
  auto target = node_target(call, sizeof req, req.node, req.args_bytes);
  if (!target) return target.error();
  const std::vector<CUgraphNode>& deps = target->deps;
  GraphObj* graph = target->graph;
  alignas(16) std::byte args[proto::kMaxArgsBytes];
  std::vector<void*> pointers;
  CUDA_KERNEL_NODE_PARAMS params{};
  if (CUresult r = kernel_node_params(
          session, req.function, call.trailing(sizeof req + deps.size() * 8, req.args_bytes),
          req.grid, req.block, req.shared_bytes, args, pointers, params);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  CUgraphNode node = nullptr;
  GreenCurrent green(session);
  CUresult r =
      call.cu.cuGraphAddKernelNode_v2(&node, graph->graph, deps.data(), deps.size(), &params);
  return node_reply(call, req.node.graph, r, node);
}

// New parameters for a kernel node of an executable graph (XLA updates its command buffers so
// between runs). Made with the green context current, as the node was: the driver keeps a
// CUfunction's node in the context it was added in.
OpResult op_graph_exec_kernel_node_set_params(Call& call) {
  auto req = call.request<proto::GraphExecKernelNodeReq>();
  Session& session = call.session;
  if (req.args_bytes > proto::kMaxArgsBytes || !call.exact(sizeof req, req.args_bytes)) {
    return call.malformed("sent kernel node parameters whose arguments the record does not hold");
  }
  // exec 0: the graph's own node (cuGraphKernelNodeSetParams, ABI 1.21).
  const GraphExecObj* exec = nullptr;
  if (req.exec != 0) {
    exec = session.objects.get<GraphExecObj>(req.exec);
    if (exec == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  }
  const GraphNodeObj* node = session.objects.get<GraphNodeObj>(req.node);
  if (node == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  alignas(16) std::byte args[proto::kMaxArgsBytes];
  std::vector<void*> pointers;
  CUDA_KERNEL_NODE_PARAMS params{};
  if (CUresult r =
          kernel_node_params(session, req.function, call.trailing(sizeof req, req.args_bytes),
                             req.grid, req.block, req.shared_bytes, args, pointers, params);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  GreenCurrent green(session);
  if (exec == nullptr) return call.done(call.cu.cuGraphKernelNodeSetParams_v2(node->node, &params));
  return call.done(call.cu.cuGraphExecKernelNodeSetParams_v2(exec->exec, node->node, &params));
}

CUresult memset_node_params(Call& call, std::uint64_t dst, std::uint64_t pitch, std::uint64_t width,
                            std::uint64_t height, std::uint32_t value, std::uint32_t element_bytes,
                            CUDA_MEMSET_NODE_PARAMS& out) {
  const std::uint64_t element = element_bytes;
  if ((element != 1 && element != 2 && element != 4) || width == 0 || height == 0 ||
      width > std::numeric_limits<std::uint64_t>::max() / 8 / element) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  const std::uint64_t row = width * element;
  const std::uint64_t rows_pitch = height > 1 ? pitch : row;
  if (rows_pitch < row ||
      height - 1 > (std::numeric_limits<std::uint64_t>::max() - row) / rows_pitch ||
      !owns_memory(call, dst, (height - 1) * rows_pitch + row)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  out = CUDA_MEMSET_NODE_PARAMS{};
  out.dst = dst;
  out.pitch = rows_pitch;
  out.value = value;
  out.elementSize = element_bytes;
  out.width = width;
  out.height = height;
  return CUDA_SUCCESS;
}

OpResult op_graph_add_memset_node(Call& call) {
  auto req = call.request<proto::GraphMemsetNodeReq>();
  Session& session = call.session;
  auto target = node_target(call, sizeof req, req.node, 0);
  if (!target) return target.error();
  const std::vector<CUgraphNode>& deps = target->deps;
  GraphObj* graph = target->graph;
  CUDA_MEMSET_NODE_PARAMS params{};
  if (CUresult r = memset_node_params(call, req.dst, req.pitch, req.width, req.height, req.value,
                                      req.element_bytes, params);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  CUgraphNode node = nullptr;
  GreenCurrent green(session);
  CUresult r = call.cu.cuGraphAddMemsetNode(&node, graph->graph, deps.data(), deps.size(), &params,
                                            session.green.context);
  return node_reply(call, req.node.graph, r, node);
}

CUresult copy_node_params(Call& call, std::uint64_t dst, std::uint64_t src, std::uint64_t bytes,
                          CUDA_MEMCPY3D& out) {
  if (!owns_memory(call, dst, bytes) || !owns_memory(call, src, bytes)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  out = CUDA_MEMCPY3D{};
  out.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  out.srcDevice = src;
  out.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  out.dstDevice = dst;
  out.WidthInBytes = bytes;
  out.Height = 1;
  out.Depth = 1;
  return CUDA_SUCCESS;
}

OpResult op_graph_add_copy_node(Call& call) {
  auto req = call.request<proto::GraphCopyNodeReq>();
  Session& session = call.session;
  auto target = node_target(call, sizeof req, req.node, 0);
  if (!target) return target.error();
  const std::vector<CUgraphNode>& deps = target->deps;
  GraphObj* graph = target->graph;
  CUDA_MEMCPY3D params{};
  if (CUresult r = copy_node_params(call, req.dst, req.src, req.bytes, params); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  CUgraphNode node = nullptr;
  GreenCurrent green(session);
  CUresult r = call.cu.cuGraphAddMemcpyNode(&node, graph->graph, deps.data(), deps.size(), &params,
                                            session.green.context);
  return node_reply(call, req.node.graph, r, node);
}

OpResult op_graph_add_empty_node(Call& call) {
  auto req = call.request<proto::GraphAddNodeHeader>();
  auto target = node_target(call, sizeof req, req, 0);
  if (!target) return target.error();
  const std::vector<CUgraphNode>& deps = target->deps;
  GraphObj* graph = target->graph;
  CUgraphNode node = nullptr;
  CUresult r = call.cu.cuGraphAddEmptyNode(&node, graph->graph, deps.data(), deps.size());
  return node_reply(call, req.graph, r, node);
}

// ---- child graphs ----

namespace {

// A graph the client may name as a child: its own, and not one a capture still builds (the driver
// frees that one if the capture fails). Graphs embedded in child nodes qualify.
const GraphObj* child_graph(Session& session, proto::WireHandle id) {
  const GraphObj* graph = session.objects.get<GraphObj>(id);
  if (graph == nullptr || (!graph->owned && graph->embedded_in == 0)) return nullptr;
  return graph;
}

}  // namespace

// The driver clones the child into the node: the client may change or destroy it afterwards.
OpResult op_graph_add_child_graph_node(Call& call) {
  auto req = call.request<proto::GraphChildNodeReq>();
  auto target = node_target(call, sizeof req, req.node, 0);
  if (!target) return target.error();
  const GraphObj* child = child_graph(call.session, req.child);
  if (child == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  const std::vector<CUgraphNode>& deps = target->deps;
  CUgraphNode node = nullptr;
  CUresult r = call.cu.cuGraphAddChildGraphNode(&node, target->graph->graph, deps.data(),
                                                deps.size(), child->graph);
  return node_reply(call, req.node.graph, r, node);
}

// The graph embedded in a child graph node, as a graph id the client may query and build on.
// The node owns it: the id is never destroyed by the server (cuGraphDestroy of it is refused),
// and it is forgotten with the graph that holds the node.
OpResult op_graph_child_graph_node_get_graph(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  const GraphNodeObj* node = session.objects.get<GraphNodeObj>(req.handle);
  if (node == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  const std::uint64_t parent_id = node->graph;
  const GraphObj* parent = session.objects.get<GraphObj>(parent_id);
  if (parent == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  const std::uint64_t ctx = parent->ctx;
  CUgraph embedded = nullptr;
  if (CUresult r = call.cu.cuGraphChildGraphNodeGetGraph(node->node, &embedded);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  if (session.ids_by_driver_handle.contains(embedded)) {
    return call.reply(proto::GraphRep{session.ids_by_driver_handle.at(embedded)});
  }
  if (!within_client_limit(session, ClientLimit::kGraphs))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  std::uint64_t id =
      remember(session, embedded, GraphObj{embedded, ctx, false, parent_id, req.handle});
  if (id == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  return call.reply(proto::GraphRep{id});
}

OpResult op_graph_node_get_type(Call& call) {
  auto req = call.request<proto::HandleReq>();
  const GraphNodeObj* node = call.session.objects.get<GraphNodeObj>(req.handle);
  if (node == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  CUgraphNodeType type{};
  if (CUresult r = call.cu.cuGraphNodeGetType(node->node, &type); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.reply(proto::GraphNodeTypeRep{static_cast<std::uint32_t>(type), 0});
}

// XLA updates a nested command buffer so. The node must be a child graph node of the graph the
// executable graph was made from, and the child the same topology; the driver checks both.
OpResult op_graph_exec_child_graph_node_set_params(Call& call) {
  auto req = call.request<proto::GraphExecChildNodeReq>();
  Session& session = call.session;
  const GraphExecObj* exec = session.objects.get<GraphExecObj>(req.exec);
  if (exec == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  const GraphNodeObj* node = session.objects.get<GraphNodeObj>(req.node);
  const GraphObj* child = child_graph(session, req.child);
  if (node == nullptr || child == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  return call.done(
      call.cu.cuGraphExecChildGraphNodeSetParams(exec->exec, node->node, child->graph));
}

tl::expected<EdgeList, OpResult> edge_list(Call& call) {
  auto req = call.request<proto::GraphAddDependenciesReq>();
  Session& session = call.session;
  if (req.count > proto::kMaxNodeDependencies || !call.exact(sizeof req, req.count * 16)) {
    return tl::unexpected(call.malformed("sent graph dependencies that the record does not hold"));
  }
  EdgeList edges;
  edges.graph = session.objects.get<GraphObj>(req.graph);
  if (edges.graph == nullptr) return tl::unexpected(call.done(CUDA_ERROR_INVALID_HANDLE));
  std::vector<proto::WireHandle> ids(req.count * 2);
  if (!ids.empty()) {
    std::memcpy(ids.data(), call.trailing(sizeof req, ids.size() * 8).data(), ids.size() * 8);
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const GraphNodeObj* node = session.objects.get<GraphNodeObj>(ids[i]);
    if (node == nullptr || node->graph != req.graph) {
      return tl::unexpected(call.done(CUDA_ERROR_INVALID_VALUE));
    }
    (i % 2 == 0 ? edges.from : edges.to).push_back(node->node);
  }
  return edges;
}

OpResult op_graph_add_dependencies(Call& call) {
  auto edges = edge_list(call);
  if (!edges) return edges.error();
  return call.done(call.cu.cuGraphAddDependencies_v2(
      edges->graph->graph, edges->from.data(), edges->to.data(), nullptr, edges->from.size()));
}

}  // namespace mpsshim::server
