// The parameters of kernel, memset and memcpy nodes (their queries and new parameters) and the
// generic setters cuGraphNodeSetParams / cuGraphExecNodeSetParams, which go
// to the setter of the node's type. Queries are answered from what the shim kept when it built
// or changed the node (graph_objects.hpp); a node made by a stream capture is asked of the server
// for its type only (query_params).
#include <cuda.h>

#include <mutex>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/graph_objects.hpp"
#include "proto/ops_graph_nodes.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

namespace {

// The kernel node's launch as kept, with kernelParams pointing into the node's own copy of its
// arguments (valid while the node lives, as the driver's are).
CUresult kernel_params(CUgraphNode hnode, const char* call, CUDA_KERNEL_NODE_PARAMS& out) {
  NodeParams known;
  if (CUresult rc = query_params(hnode, CU_GRAPH_NODE_TYPE_KERNEL, call, known);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  GraphNodeObject* node = node_of(hnode);
  std::lock_guard lock(node->graph->mutex);
  const NodeParams& p = node->params;
  node->arg_pointers.clear();
  for (std::uint32_t offset : p.arg_offsets) {
    node->arg_pointers.push_back(const_cast<std::byte*>(p.args.data()) + offset);
  }
  out = CUDA_KERNEL_NODE_PARAMS{};
  out.func = p.func;
  out.kern = p.kern;
  out.gridDimX = p.grid[0];
  out.gridDimY = p.grid[1];
  out.gridDimZ = p.grid[2];
  out.blockDimX = p.block[0];
  out.blockDimY = p.block[1];
  out.blockDimZ = p.block[2];
  out.sharedMemBytes = p.shared_bytes;
  out.kernelParams = node->arg_pointers.empty() ? nullptr : node->arg_pointers.data();
  return CUDA_SUCCESS;
}

// CUDA_KERNEL_NODE_PARAMS (v2) and the generic form's v3, which adds a context.
template <typename Params>
CUresult set_kernel(CUgraphExec exec, CUgraphNode node, const Params* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
  const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  return kernel_node_set_params(exec, node, p->func, p->kern, grid, block, p->sharedMemBytes,
                                p->kernelParams, p->extra);
}

// New memset parameters for a node of a graph (exec null) or an executable graph; a graph's node
// remembers them.
CUresult set_memset(CUgraphExec hexec, CUgraphNode hnode, const CUDA_MEMSET_NODE_PARAMS* p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return hexec != nullptr ? CUDA_ERROR_INVALID_VALUE : dead_or_null(hnode);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::WireHandle exec_wire = 0;
  if (CUresult rc = exec_wire_of(hexec, exec_wire); rc != CUDA_SUCCESS) return rc;
  proto::GraphMemsetNodeSetReq request{exec_wire, node->wire, p->dst,   p->pitch,
                                       p->width,  p->height,  p->value, p->elementSize};
  if (CUresult rc = node->graph->ctx->session->call(proto::Op::kGraphMemsetNodeSetParams, &request,
                                                    sizeof request, {}, nullptr, 0);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (hexec == nullptr) {
    std::lock_guard lock(node->graph->mutex);
    node->params.known = true;
    node->params.type = CU_GRAPH_NODE_TYPE_MEMSET;
    node->params.memset = *p;
  }
  return CUDA_SUCCESS;
}

// New memcpy parameters: the shape an explicitly built memcpy node may have under the shim, a
// one-dimensional device-to-device copy (graph.cpp, cuGraphAddMemcpyNode).
CUresult set_memcpy(CUgraphExec hexec, CUgraphNode hnode, const CUDA_MEMCPY3D* p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  GraphNodeObject* node = node_of(hnode);
  if (node == nullptr) return hexec != nullptr ? CUDA_ERROR_INVALID_VALUE : dead_or_null(hnode);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto device_side = [](CUmemorytype type, CUdeviceptr address) {
    return type == CU_MEMORYTYPE_DEVICE ||
           (type == CU_MEMORYTYPE_UNIFIED && address_book().find_device(address, nullptr));
  };
  if (!device_side(p->srcMemoryType, p->srcDevice) ||
      !device_side(p->dstMemoryType, p->dstDevice) || p->Height > 1 || p->Depth > 1 ||
      p->srcY != 0 || p->srcZ != 0 || p->dstY != 0 || p->dstZ != 0) {
    log_once("cuGraphMemcpyNodeSetParams.shape", LogLevel::kWarn,
             "cuGraph(Exec)MemcpyNodeSetParams: only one-dimensional device-to-device copies are "
             "supported by mpsshim in explicitly built graphs");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  proto::WireHandle exec_wire = 0;
  if (CUresult rc = exec_wire_of(hexec, exec_wire); rc != CUDA_SUCCESS) return rc;
  proto::GraphCopyNodeSetReq request{exec_wire, node->wire, p->dstDevice + p->dstXInBytes,
                                     p->srcDevice + p->srcXInBytes, p->WidthInBytes};
  if (CUresult rc = node->graph->ctx->session->call(proto::Op::kGraphCopyNodeSetParams, &request,
                                                    sizeof request, {}, nullptr, 0);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (hexec == nullptr) {
    std::lock_guard lock(node->graph->mutex);
    node->params.known = true;
    node->params.type = CU_GRAPH_NODE_TYPE_MEMCPY;
    node->params.memcpy = *p;
  }
  return CUDA_SUCCESS;
}

CUDA_MEMSET_NODE_PARAMS memset_v1(const CUDA_MEMSET_NODE_PARAMS_v2& m) {
  CUDA_MEMSET_NODE_PARAMS v1{};
  v1.dst = m.dst;
  v1.pitch = m.pitch;
  v1.value = m.value;
  v1.elementSize = m.elementSize;
  v1.width = m.width;
  v1.height = m.height;
  return v1;
}

CUresult refuse_type(const char* call, CUgraphNodeType type) {
  log_once(call, LogLevel::kWarn, "{}: node type {} is not supported by mpsshim", call,
           static_cast<int>(type));
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode node,
                                                              CUDA_KERNEL_NODE_PARAMS* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return kernel_params(node, "cuGraphKernelNodeGetParams", *out);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphKernelNodeGetParams(CUgraphNode node,
                                                           CUDA_KERNEL_NODE_PARAMS_v1* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_KERNEL_NODE_PARAMS p{};
  if (CUresult rc = kernel_params(node, "cuGraphKernelNodeGetParams", p); rc != CUDA_SUCCESS) {
    return rc;
  }
  // The first form has no CUkernel: a node built from one names it as its function.
  *out = CUDA_KERNEL_NODE_PARAMS_v1{};
  out->func = p.func != nullptr ? p.func : reinterpret_cast<CUfunction>(p.kern);
  out->gridDimX = p.gridDimX;
  out->gridDimY = p.gridDimY;
  out->gridDimZ = p.gridDimZ;
  out->blockDimX = p.blockDimX;
  out->blockDimY = p.blockDimY;
  out->blockDimZ = p.blockDimZ;
  out->sharedMemBytes = p.sharedMemBytes;
  out->kernelParams = p.kernelParams;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphKernelNodeSetParams_v2(CUgraphNode node,
                                                              const CUDA_KERNEL_NODE_PARAMS* p) {
  return set_kernel(nullptr, node, p);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphKernelNodeSetParams(CUgraphNode node,
                                                           const CUDA_KERNEL_NODE_PARAMS_v1* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const unsigned grid[3] = {p->gridDimX, p->gridDimY, p->gridDimZ};
  const unsigned block[3] = {p->blockDimX, p->blockDimY, p->blockDimZ};
  return kernel_node_set_params(nullptr, node, p->func, nullptr, grid, block, p->sharedMemBytes,
                                p->kernelParams, p->extra);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphMemsetNodeGetParams(CUgraphNode node,
                                                           CUDA_MEMSET_NODE_PARAMS* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeParams known;
  if (CUresult rc =
          query_params(node, CU_GRAPH_NODE_TYPE_MEMSET, "cuGraphMemsetNodeGetParams", known);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *out = known.memset;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphMemsetNodeSetParams(CUgraphNode node,
                                                           const CUDA_MEMSET_NODE_PARAMS* p) {
  return set_memset(nullptr, node, p);
}

// The context names the one the node was made in; the server issues it with the client's green
// context, as it made the node.
MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecMemsetNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                               const CUDA_MEMSET_NODE_PARAMS* p,
                                                               CUcontext) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return set_memset(exec, node, p);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphMemcpyNodeSetParams(CUgraphNode node,
                                                           const CUDA_MEMCPY3D* p) {
  return set_memcpy(nullptr, node, p);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecMemcpyNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                               const CUDA_MEMCPY3D* p, CUcontext) {
  if (exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return set_memcpy(exec, node, p);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphMemcpyNodeGetParams(CUgraphNode node, CUDA_MEMCPY3D* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  NodeParams known;
  if (CUresult rc =
          query_params(node, CU_GRAPH_NODE_TYPE_MEMCPY, "cuGraphMemcpyNodeGetParams", known);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *out = known.memcpy;
  return CUDA_SUCCESS;
}

// The generic setters: each node type to its own setter. The types whose own setter mpsshim does
// not serve are refused with a log line.
MPSSHIM_EXPORT CUresult CUDAAPI cuGraphNodeSetParams(CUgraphNode node, CUgraphNodeParams* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      return set_kernel(nullptr, node, &p->kernel);
    case CU_GRAPH_NODE_TYPE_HOST: {
      const CUDA_HOST_NODE_PARAMS host{p->host.fn, p->host.userData};
      return cuGraphHostNodeSetParams(node, &host);
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const CUDA_MEMSET_NODE_PARAMS v1 = memset_v1(p->memset);
      return set_memset(nullptr, node, &v1);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      return set_memcpy(nullptr, node, &p->memcpy.copyParams);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      return cuGraphEventRecordNodeSetEvent(node, p->eventRecord.event);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      return cuGraphEventWaitNodeSetEvent(node, p->eventWait.event);
    default:
      return refuse_type("cuGraphNodeSetParams", p->type);
  }
}

MPSSHIM_EXPORT CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                         CUgraphNodeParams* p) {
  if (p == nullptr || exec == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (p->type) {
    case CU_GRAPH_NODE_TYPE_KERNEL:
      return set_kernel(exec, node, &p->kernel);
    case CU_GRAPH_NODE_TYPE_HOST: {
      const CUDA_HOST_NODE_PARAMS host{p->host.fn, p->host.userData};
      return cuGraphExecHostNodeSetParams(exec, node, &host);
    }
    case CU_GRAPH_NODE_TYPE_MEMSET: {
      const CUDA_MEMSET_NODE_PARAMS v1 = memset_v1(p->memset);
      return set_memset(exec, node, &v1);
    }
    case CU_GRAPH_NODE_TYPE_MEMCPY:
      return set_memcpy(exec, node, &p->memcpy.copyParams);
    case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      return cuGraphExecEventRecordNodeSetEvent(exec, node, p->eventRecord.event);
    case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      return cuGraphExecEventWaitNodeSetEvent(exec, node, p->eventWait.event);
    case CU_GRAPH_NODE_TYPE_GRAPH:
      return cuGraphExecChildGraphNodeSetParams(exec, node, p->graph.graph);
    default:
      return refuse_type("cuGraphExecNodeSetParams", p->type);
  }
}
