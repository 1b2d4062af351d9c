// Conditional nodes, batch memory operation nodes and kernel node attributes
// (proto/ops_graph_nodes.hpp; docs/graphs.md).
//
// A conditional handle is the driver's value, made for one graph in the client's green context
// (the one its kernel, memset and memcpy nodes belong to: the driver requires the handle, the node
// and every node of its bodies to share one); kernels set it with cudaGraphSetConditional, so the
// client holds the value itself, and a conditional node may name only a handle this session made
// for the node's graph. The node's body graphs are the driver's, owned by the node: the client gets
// ids for them to build on, never to destroy, and they are forgotten with the node or its graph.
//
// A batch memory operation node's operations are checked as a stream's are (ops/stream_mem.cpp):
// each address must be memory the client holds.
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "broker/server/ops/graph_targets.hpp"
#include "broker/server/ops/launch_attributes.hpp"
#include "broker/server/ops/ops.hpp"
#include "broker/server/ops/stream_mem_op.hpp"
#include "broker/server/session/limit_check.hpp"
#include "common/log.hpp"
#include "proto/ops_graph_nodes.hpp"

namespace mpsshim::server {
namespace {

// The operations after a request of `request_bytes` (and `skip` bytes of dependency ids), in the
// driver's form; CUDA_ERROR_INVALID_VALUE for one the client may not name.
tl::expected<std::vector<CUstreamBatchMemOpParams>, CUresult> mem_ops(Call& call,
                                                                      std::size_t offset,
                                                                      std::uint32_t count) {
  std::vector<CUstreamBatchMemOpParams> out;
  out.reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    proto::StreamMemOpReq op;
    std::memcpy(&op, call.trailing(offset + std::size_t{i} * sizeof op, sizeof op).data(),
                sizeof op);
    auto p = driver_mem_op(call, op);
    if (!p) return tl::unexpected(CUDA_ERROR_INVALID_VALUE);
    out.push_back(*p);
  }
  return out;
}

}  // namespace

OpResult op_graph_conditional_handle_create(Call& call) {
  auto req = call.request<proto::GraphConditionalHandleReq>();
  GraphObj* graph = call.session.objects.get<GraphObj>(req.graph);
  if (graph == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  CUgraphConditionalHandle handle = 0;
  GreenCurrent green(call.session);
  if (CUresult r = call.cu.cuGraphConditionalHandleCreate(
          &handle, graph->graph, call.session.green.context, req.default_value, req.flags);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  graph->conditionals.push_back(handle);
  return call.reply(proto::GraphNodeValueRep{handle});
}

OpResult op_graph_add_conditional_node(Call& call) {
  auto req = call.request<proto::GraphConditionalNodeReq>();
  auto target = node_target(call, sizeof req, req.node, 0);
  if (!target) return target.error();
  Session& session = call.session;
  const std::vector<CUgraphConditionalHandle>& mine = target->graph->conditionals;
  if (std::find(mine.begin(), mine.end(), req.handle) == mine.end()) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (req.size == 0 || req.size > proto::kMaxConditionalBodies) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (!within_client_limit(session, ClientLimit::kGraphs, held_of(session, ClientLimit::kGraphs),
                           req.size)) {
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  CUgraphNodeParams params{};
  params.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  params.conditional.handle = req.handle;
  params.conditional.type = static_cast<CUgraphConditionalNodeType>(req.type);
  params.conditional.size = req.size;
  params.conditional.ctx = session.green.context;
  const std::uint64_t graph_id = req.node.graph;
  const std::uint64_t ctx = target->graph->ctx;
  const std::vector<CUgraphNode>& deps = target->deps;
  CUgraphNode node = nullptr;
  GreenCurrent green(session);
  if (CUresult r = call.cu.cuGraphAddNode_v2(&node, target->graph->graph, deps.data(), nullptr,
                                             deps.size(), &params);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  proto::GraphConditionalRep rep{};
  rep.node = remember_node(session, node, graph_id);
  rep.size = req.size;
  if (rep.node == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  // The driver points phGraph_out at its own array of the bodies, which lives with the node.
  const CUgraph* bodies = params.conditional.phGraph_out;
  if (bodies == nullptr) return call.done(CUDA_ERROR_UNKNOWN);
  for (std::uint32_t i = 0; i < req.size; ++i) {
    rep.bodies[i] = remember_graph(session, bodies[i], ctx, false);
    GraphObj* body = session.objects.get<GraphObj>(rep.bodies[i]);
    if (body == nullptr) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
    body->embedded_in = graph_id;
    body->embedded_node = rep.node;
  }
  return call.reply(rep, offsetof(proto::GraphConditionalRep, bodies) +
                             std::size_t{req.size} * sizeof(proto::WireHandle));
}

OpResult op_graph_add_batch_mem_op_node(Call& call) {
  auto req = call.request<proto::GraphBatchMemOpNodeReq>();
  if (req.op_count == 0 || req.op_count > proto::kMaxBatchMemOps) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  const std::uint64_t op_bytes = std::uint64_t{req.op_count} * sizeof(proto::StreamMemOpReq);
  auto target = node_target(call, sizeof req, req.node, op_bytes);
  if (!target) return target.error();
  const std::size_t ops_at =
      sizeof req + std::size_t{req.node.dependency_count} * sizeof(proto::WireHandle);
  auto ops = mem_ops(call, ops_at, req.op_count);
  if (!ops) return call.done(ops.error());
  CUDA_BATCH_MEM_OP_NODE_PARAMS params{};
  params.ctx = call.session.green.context;
  params.count = req.op_count;
  params.paramArray = ops->data();
  params.flags = req.flags;
  const std::vector<CUgraphNode>& deps = target->deps;
  CUgraphNode node = nullptr;
  GreenCurrent green(call.session);
  CUresult r = call.cu.cuGraphAddBatchMemOpNode(&node, target->graph->graph, deps.data(),
                                                deps.size(), &params);
  return node_reply(call, req.node.graph, r, node);
}

OpResult op_graph_batch_mem_op_node_set_params(Call& call) {
  auto req = call.request<proto::GraphBatchMemOpSetReq>();
  if (req.op_count == 0 || req.op_count > proto::kMaxBatchMemOps) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (!call.exact(sizeof req, std::uint64_t{req.op_count} * sizeof(proto::StreamMemOpReq))) {
    return call.malformed("sent a batch memory operation node whose operations it does not hold");
  }
  auto found = node_in_exec(call, req.exec, req.node);
  if (!found) return call.done(found.error());
  auto ops = mem_ops(call, sizeof req, req.op_count);
  if (!ops) return call.done(ops.error());
  CUDA_BATCH_MEM_OP_NODE_PARAMS params{};
  params.ctx = call.session.green.context;
  params.count = req.op_count;
  params.paramArray = ops->data();
  params.flags = req.flags;
  GreenCurrent green(call.session);
  if (found->exec == nullptr) {
    return call.done(call.cu.cuGraphBatchMemOpNodeSetParams(found->node->node, &params));
  }
  return call.done(
      call.cu.cuGraphExecBatchMemOpNodeSetParams(found->exec->exec, found->node->node, &params));
}

// The attributes a kernel node keeps are a launch's (launch_attributes.hpp): a set is checked as
// a launch's is. The shim answers a get of the priority itself (the driver holds the biased one).
OpResult op_graph_kernel_node_attribute(Call& call) {
  auto req = call.request<proto::GraphKernelNodeAttributeReq>();
  const GraphNodeObj* node = call.session.objects.get<GraphNodeObj>(req.node);
  if (node == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  switch (static_cast<proto::KernelNodeAttributeMode>(req.mode)) {
    case proto::KernelNodeAttributeMode::kGet: {
      CUkernelNodeAttrValue value{};
      const auto id = static_cast<CUkernelNodeAttrID>(req.attribute.id);
      if (CUresult r = call.cu.cuGraphKernelNodeGetAttribute(node->node, id, &value);
          r != CUDA_SUCCESS) {
        return call.done(r);
      }
      return call.reply(wire_attribute(req.attribute.id, value));
    }
    case proto::KernelNodeAttributeMode::kSet: {
      CUlaunchAttribute checked{};
      if (CUresult r = convert_launch_attributes(
              call.session, std::as_bytes(std::span(&req.attribute, 1)), 1, &checked);
          r != CUDA_SUCCESS) {
        return call.done(r);
      }
      return call.done(call.cu.cuGraphKernelNodeSetAttribute(
          node->node, static_cast<CUkernelNodeAttrID>(checked.id), &checked.value));
    }
    case proto::KernelNodeAttributeMode::kCopy: {
      const GraphNodeObj* source = call.session.objects.get<GraphNodeObj>(req.source);
      if (source == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
      return call.done(call.cu.cuGraphKernelNodeCopyAttributes(node->node, source->node));
    }
  }
  return call.malformed(fmt::format("sent a kernel node attribute call of mode {}", req.mode));
}

}  // namespace mpsshim::server
