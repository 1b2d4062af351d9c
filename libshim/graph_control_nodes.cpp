// Conditional nodes, batch memory operation nodes and kernel node attributes
// (proto/ops_graph_nodes.hpp; docs/graphs.md).
//
// A conditional handle is the server driver's own value: the client's kernels set it with
// cudaGraphSetConditional. A conditional node's body graphs are graph objects owned by the node,
// as a child graph node's embedded graph is (cuGraphDestroy of one is refused; they die with the
// node's graph). Batch memory operations are checked as a stream's are (stream_mem.hpp); the
// shim keeps them, so cuGraphBatchMemOpNodeGetParams needs no round trip.
#include <cstring>
#include <mutex>
#include <vector>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/graph_objects.hpp"
#include "libshim/stream_mem.hpp"
#include "proto/ops_graph_nodes.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

namespace {

// The wire form of a node's operations; the context's session must be the graph's.
CUresult wire_mem_ops(GraphObject* graph, const CUDA_BATCH_MEM_OP_NODE_PARAMS* p,
                      std::vector<std::byte>& out) {
  if (p == nullptr || p->count == 0 || p->count > proto::kMaxBatchMemOps ||
      p->paramArray == nullptr || p->flags != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  for (unsigned i = 0; i < p->count; ++i) {
    proto::StreamMemOpReq op{};
    if (CUresult rc = wire_mem_op(graph->ctx, p->paramArray[i], op); rc != CUDA_SUCCESS) return rc;
    const auto* bytes = reinterpret_cast<const std::byte*>(&op);
    out.insert(out.end(), bytes, bytes + sizeof op);
  }
  return CUDA_SUCCESS;
}

NodeParams mem_op_params(const CUDA_BATCH_MEM_OP_NODE_PARAMS* p) {
  NodeParams params;
  params.type = CU_GRAPH_NODE_TYPE_BATCH_MEM_OP;
  params.mem_ops.assign(p->paramArray, p->paramArray + p->count);
  params.mem_ops_ctx = p->ctx;
  params.mem_ops_flags = p->flags;
  return params;
}

CUresult set_mem_ops(CUgraphExec hexec, CUgraphNode hnode, const CUDA_BATCH_MEM_OP_NODE_PARAMS* p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return dead_or_null(hnode);
  proto::WireHandle exec_wire = 0;
  if (CUresult rc = exec_wire_of(hexec, exec_wire); rc != CUDA_SUCCESS) return rc;
  std::vector<std::byte> ops;
  if (CUresult rc = wire_mem_ops(node->graph, p, ops); rc != CUDA_SUCCESS) return rc;
  proto::GraphBatchMemOpSetReq request{exec_wire, node->wire, p->count, p->flags};
  if (CUresult rc = node->graph->ctx->session->call(proto::Op::kGraphBatchMemOpNodeSetParams,
                                                    &request, sizeof request, ops, nullptr, 0);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (hexec == nullptr) {
    std::lock_guard lock(node->graph->mutex);
    node->params = mem_op_params(p);
    node->params.known = true;
  }
  return CUDA_SUCCESS;
}

CUresult kernel_attribute(CUgraphNode hnode, CUgraphNode hsource,
                          proto::KernelNodeAttributeMode mode, CUkernelNodeAttrID id,
                          const CUkernelNodeAttrValue* in, CUkernelNodeAttrValue* out) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return dead_or_null(hnode);
  proto::GraphKernelNodeAttributeReq request{};
  request.node = node->wire;
  request.mode = static_cast<std::uint32_t>(mode);
  request.attribute.id = static_cast<std::uint32_t>(id);
  static_assert(sizeof *in == sizeof request.attribute.value);
  if (in != nullptr) std::memcpy(request.attribute.value, in, sizeof *in);
  GraphNodeObject* source = nullptr;
  if (mode == proto::KernelNodeAttributeMode::kCopy) {
    source = node_of(hsource);
    if (source == nullptr || source->graph->ctx->session != node->graph->ctx->session) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    request.source = source->wire;
  }
  Session* session = node->graph->ctx->session;
  if (mode == proto::KernelNodeAttributeMode::kGet) {
    proto::WireLaunchAttribute reply{};
    if (CUresult rc = session->call(proto::Op::kGraphKernelNodeAttribute, &request, sizeof request,
                                    {}, &reply, sizeof reply);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    std::memcpy(out, reply.value, sizeof *out);
    if (id == CU_LAUNCH_ATTRIBUTE_PRIORITY) {  // the client's own, not the server's biased one
      std::lock_guard lock(node->graph->mutex);
      out->priority = node->params.priority;
    }
    return CUDA_SUCCESS;
  }
  if (CUresult rc = session->call(proto::Op::kGraphKernelNodeAttribute, &request, sizeof request,
                                  {}, nullptr, 0);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  int priority = 0;
  if (source != nullptr) {
    std::lock_guard lock(source->graph->mutex);
    priority = source->params.priority;
  } else if (id == CU_LAUNCH_ATTRIBUTE_PRIORITY) {
    priority = in->priority;
  } else {
    return CUDA_SUCCESS;
  }
  std::lock_guard lock(node->graph->mutex);
  node->params.priority = priority;
  return CUDA_SUCCESS;
}

}  // namespace

namespace mpsshim::shim {

CUresult add_conditional_node(CUgraphNode* out, CUgraph hgraph, const CUgraphNode* deps,
                              std::size_t count, CUDA_CONDITIONAL_NODE_PARAMS& p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (p.size == 0 || p.size > proto::kMaxConditionalBodies) return CUDA_ERROR_INVALID_VALUE;
  if (p.ctx != nullptr && object_of<Context>(p.ctx) != graph->ctx) return CUDA_ERROR_INVALID_VALUE;
  proto::GraphConditionalNodeReq request{};
  request.handle = p.handle;
  request.type = static_cast<std::uint32_t>(p.type);
  request.size = p.size;
  NodeParams params;
  params.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  proto::GraphConditionalRep reply{};
  if (CUresult rc = add_node(out, hgraph, deps, count, proto::Op::kGraphAddConditionalNode, request,
                             params, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  auto* node = reinterpret_cast<GraphNodeObject*>(*out);
  std::vector<CUgraph> bodies;
  for (std::uint32_t i = 0; i < reply.size && i < p.size; ++i) {
    GraphObject* body = graph_for(graph->ctx, reply.bodies[i]);
    {
      std::lock_guard lock(graph->mutex);
      body->owner = graph;
      graph->embedded.push_back(body);
    }
    bodies.push_back(reinterpret_cast<CUgraph>(body));
  }
  std::lock_guard lock(graph->mutex);
  node->bodies = std::move(bodies);
  p.phGraph_out = node->bodies.data();
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::shim

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphConditionalHandleCreate(CUgraphConditionalHandle* out,
                                                               CUgraph hgraph, CUcontext hctx,
                                                               unsigned int default_value,
                                                               unsigned int flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (out == nullptr || (flags & ~unsigned{CU_GRAPH_COND_ASSIGN_DEFAULT}) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (hctx != nullptr && object_of<Context>(hctx) != graph->ctx) return CUDA_ERROR_INVALID_VALUE;
  proto::GraphNodeValueRep reply{};
  if (CUresult rc = graph->ctx->session->call(
          proto::Op::kGraphConditionalHandleCreate,
          proto::GraphConditionalHandleReq{graph->wire, default_value, flags}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *out = reply.value;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphAddBatchMemOpNode(CUgraphNode* out, CUgraph hgraph,
                                                         const CUgraphNode* deps, size_t count,
                                                         const CUDA_BATCH_MEM_OP_NODE_PARAMS* p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphObject* graph = graph_of(hgraph);
  if (graph == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::vector<std::byte> ops;
  if (CUresult rc = wire_mem_ops(graph, p, ops); rc != CUDA_SUCCESS) return rc;
  proto::GraphBatchMemOpNodeReq request{};
  request.op_count = p->count;
  request.flags = p->flags;
  return add_node(out, hgraph, deps, count, proto::Op::kGraphAddBatchMemOpNode, request,
                  mem_op_params(p), static_cast<proto::GraphRep*>(nullptr), ops);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphBatchMemOpNodeGetParams(CUgraphNode hnode,
                                                               CUDA_BATCH_MEM_OP_NODE_PARAMS* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeParams params;
  if (CUresult rc = query_params(hnode, CU_GRAPH_NODE_TYPE_BATCH_MEM_OP,
                                 "cuGraphBatchMemOpNodeGetParams", params);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  // The array is the node's own copy: valid until its parameters change, as the driver's.
  GraphNodeObject* node = node_of(hnode);
  std::lock_guard lock(node->graph->mutex);
  out->ctx = node->params.mem_ops_ctx;
  out->count = static_cast<unsigned>(node->params.mem_ops.size());
  out->paramArray = node->params.mem_ops.data();
  out->flags = node->params.mem_ops_flags;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI
cuGraphBatchMemOpNodeSetParams(CUgraphNode hnode, const CUDA_BATCH_MEM_OP_NODE_PARAMS* p) {
  return set_mem_ops(nullptr, hnode, p);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecBatchMemOpNodeSetParams(
    CUgraphExec hexec, CUgraphNode hnode, const CUDA_BATCH_MEM_OP_NODE_PARAMS* p) {
  if (hexec == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return set_mem_ops(hexec, hnode, p);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphKernelNodeGetAttribute(CUgraphNode hnode,
                                                              CUkernelNodeAttrID id,
                                                              CUkernelNodeAttrValue* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return kernel_attribute(hnode, nullptr, proto::KernelNodeAttributeMode::kGet, id, nullptr, out);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphKernelNodeSetAttribute(CUgraphNode hnode,
                                                              CUkernelNodeAttrID id,
                                                              const CUkernelNodeAttrValue* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return kernel_attribute(hnode, nullptr, proto::KernelNodeAttributeMode::kSet, id, value, nullptr);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphKernelNodeCopyAttributes(CUgraphNode dst, CUgraphNode src) {
  return kernel_attribute(dst, src, proto::KernelNodeAttributeMode::kCopy,
                          CU_LAUNCH_ATTRIBUTE_IGNORE, nullptr, nullptr);
}
