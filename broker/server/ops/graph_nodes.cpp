// Graph nodes beyond kernels, memsets and copies (proto/ops_graph_nodes.hpp): event record and
// wait nodes, host nodes, memory allocation and free nodes; their setters and memset and memcpy
// nodes' new parameters; enabling a node of an executable graph; destroying a node, removing
// edges, cloning a graph. Each checks that what the client names is its own (ids of its
// session) and hands the driver's answer back: the driver says what a graph with memory nodes
// may not do (measured on an H200, driver 580: clone, a second instantiation, destroying a node
// or an edge are CUDA_ERROR_NOT_SUPPORTED).
#include <cstring>
#include <memory>
#include <vector>

#include "broker/server/ops/graph_targets.hpp"
#include "broker/server/ops/ops.hpp"
#include "broker/server/session/graph_memory.hpp"
#include "broker/server/session/host_callbacks.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/retire.hpp"
#include "common/log.hpp"
#include "proto/ops_graph_nodes.hpp"

namespace mpsshim::server {
namespace {

// The client's own event, as a node may name it: an interprocess event has no single driver
// event (it moves on with each record), so a node cannot hold one.
EventObj* node_event(Call& call, proto::WireHandle id, CUresult* error) {
  EventObj* event = call.session.objects.get<EventObj>(id);
  if (event == nullptr) {
    *error = CUDA_ERROR_INVALID_HANDLE;
    return nullptr;
  }
  if (event->ipc) {
    log_warn("{}: an interprocess event in a graph's event node is not supported by mpsshim",
             call.session.who());
    *error = CUDA_ERROR_NOT_SUPPORTED;
    return nullptr;
  }
  event->in_graph = true;
  return event;
}

// A server host function that has the client run `callback_id` at every replay: kept until the
// session ends (a graph, or an executable graph made from it, may run it again and again).
tl::expected<CUDA_HOST_NODE_PARAMS, CUresult> host_params(Session& session,
                                                          std::uint64_t callback_id) {
  if (!session.callbacks) return tl::unexpected(CUDA_ERROR_NOT_SUPPORTED);
  if (!within_client_limit(session, ClientLimit::kHostFunctions,
                           held_of(session, ClientLimit::kHostFunctions))) {
    return tl::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  }
  auto host_call = std::make_unique<HostCallbackChannel::Call>();
  host_call->channel = session.callbacks;
  host_call->callback_id = callback_id;
  host_call->one_shot = false;
  CUDA_HOST_NODE_PARAMS params{run_host_function, host_call.get()};
  session.callbacks->keep(std::move(host_call));
  return params;
}

const GraphNodeObj* client_node(Call& call, proto::WireHandle id) {
  return call.session.objects.get<GraphNodeObj>(id);
}

}  // namespace

tl::expected<NodeInExec, CUresult> node_in_exec(Call& call, proto::WireHandle exec_id,
                                                proto::WireHandle node_id) {
  NodeInExec found;
  found.node = client_node(call, node_id);
  if (found.node == nullptr) return tl::unexpected(CUDA_ERROR_INVALID_VALUE);
  if (exec_id != 0) {
    found.exec = call.session.objects.get<GraphExecObj>(exec_id);
    if (found.exec == nullptr) return tl::unexpected(CUDA_ERROR_INVALID_HANDLE);
  }
  return found;
}

OpResult op_graph_add_event_node(Call& call) {
  auto req = call.request<proto::GraphEventNodeReq>();
  auto target = node_target(call, sizeof req, req.node, 0);
  if (!target) return target.error();
  if (req.kind > static_cast<std::uint32_t>(proto::GraphEventNodeKind::kWait)) {
    return call.malformed(fmt::format("sent an event node of unknown kind {}", req.kind));
  }
  CUresult error = CUDA_SUCCESS;
  EventObj* event = node_event(call, req.event, &error);
  if (event == nullptr) return call.done(error);
  const std::vector<CUgraphNode>& deps = target->deps;
  CUgraphNode node = nullptr;
  CUresult r = req.kind == static_cast<std::uint32_t>(proto::GraphEventNodeKind::kRecord)
                   ? call.cu.cuGraphAddEventRecordNode(&node, target->graph->graph, deps.data(),
                                                       deps.size(), event->event)
                   : call.cu.cuGraphAddEventWaitNode(&node, target->graph->graph, deps.data(),
                                                     deps.size(), event->event);
  return node_reply(call, req.node.graph, r, node);
}

OpResult op_graph_add_host_node(Call& call) {
  auto req = call.request<proto::GraphHostNodeReq>();
  auto target = node_target(call, sizeof req, req.node, 0);
  if (!target) return target.error();
  if (req.callback_id == 0) return call.malformed("sent a host node without a callback id");
  auto params = host_params(call.session, req.callback_id);
  if (!params) return call.done(params.error());
  const std::vector<CUgraphNode>& deps = target->deps;
  CUgraphNode node = nullptr;
  CUresult r =
      call.cu.cuGraphAddHostNode(&node, target->graph->graph, deps.data(), deps.size(), &*params);
  return node_reply(call, req.node.graph, r, node);
}

// Graph memory is the driver's, placed by it (as for cudaMallocAsync in a capture,
// ops/memory_pool.cpp); session/graph_memory.hpp says how it is counted.
OpResult op_graph_add_mem_alloc_node(Call& call) {
  auto req = call.request<proto::GraphMemAllocNodeReq>();
  Session& session = call.session;
  auto target = node_target(call, sizeof req, req.node, 0);
  if (!target) return target.error();
  if (req.bytes == 0) return call.done(CUDA_ERROR_INVALID_VALUE);
  if (!within_client_limit(session, ClientLimit::kAllocations))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  auto held = session.charge.reserve(req.bytes);
  if (!held) return refuse_over_limit(call, req.bytes, "graph memory", held.error());
  CUDA_MEM_ALLOC_NODE_PARAMS params{};
  params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  params.poolProps.location.id = static_cast<int>(session.gpu().device);
  params.bytesize = static_cast<std::size_t>(req.bytes);
  const std::vector<CUgraphNode>& deps = target->deps;
  CUgraphNode node = nullptr;
  if (CUresult r = call.cu.cuGraphAddMemAllocNode(&node, target->graph->graph, deps.data(),
                                                  deps.size(), &params);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  if (!session.memory.add(DeviceRange{params.dptr, req.bytes, RangeKind::kGraph, req.node.graph})) {
    return call.done(CUDA_ERROR_INVALID_VALUE);  // the driver placed it over memory we know
  }
  const std::uint64_t id = remember_node(session, node, req.node.graph);
  if (id == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  held->keep();
  return call.reply(proto::GraphMemAllocRep{id, params.dptr});
}

OpResult op_graph_add_mem_free_node(Call& call) {
  auto req = call.request<proto::GraphMemFreeNodeReq>();
  Session& session = call.session;
  auto target = node_target(call, sizeof req, req.node, 0);
  if (!target) return target.error();
  const DeviceRange* range = session.memory.find(req.dptr);
  // The client's graph memory only: the driver refuses anything else (measured: cuMemAlloc'ed
  // memory is CUDA_ERROR_INVALID_VALUE), and must never be handed another client's address.
  if (range == nullptr || range->base != req.dptr || !is_graph_memory(*range)) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  const std::vector<CUgraphNode>& deps = target->deps;
  CUgraphNode node = nullptr;
  CUresult r = call.cu.cuGraphAddMemFreeNode(&node, target->graph->graph, deps.data(), deps.size(),
                                             req.dptr);
  return node_reply(call, req.node.graph, r, node);
}

OpResult op_graph_node_params(Call& call) {
  auto req = call.request<proto::GraphNodeParamsReq>();
  Session& session = call.session;
  auto target = node_in_exec(call, req.exec, req.node);
  if (!target) return call.done(target.error());
  const GraphNodeObj* node = target->node;
  const GraphExecObj* exec = target->exec;
  switch (static_cast<proto::GraphNodeParam>(req.param)) {
    case proto::GraphNodeParam::kEvent: {
      if (req.set == 0) break;
      CUresult error = CUDA_SUCCESS;
      EventObj* event = node_event(call, req.value, &error);
      if (event == nullptr) return call.done(error);
      CUgraphNodeType type{};
      if (CUresult r = call.cu.cuGraphNodeGetType(node->node, &type); r != CUDA_SUCCESS) {
        return call.done(r);
      }
      const bool wait = type == CU_GRAPH_NODE_TYPE_WAIT_EVENT;
      if (!wait && type != CU_GRAPH_NODE_TYPE_EVENT_RECORD) {
        return call.done(CUDA_ERROR_INVALID_VALUE);  // as the driver answers
      }
      CUresult r = exec == nullptr
                       ? (wait ? call.cu.cuGraphEventWaitNodeSetEvent(node->node, event->event)
                               : call.cu.cuGraphEventRecordNodeSetEvent(node->node, event->event))
                       : (wait ? call.cu.cuGraphExecEventWaitNodeSetEvent(exec->exec, node->node,
                                                                          event->event)
                               : call.cu.cuGraphExecEventRecordNodeSetEvent(exec->exec, node->node,
                                                                            event->event));
      return call.done(r);
    }
    case proto::GraphNodeParam::kHostCallback: {
      if (req.set == 0) break;
      if (req.value == 0) return call.malformed("sent a host node without a callback id");
      CUgraphNodeType type{};
      if (CUresult r = call.cu.cuGraphNodeGetType(node->node, &type); r != CUDA_SUCCESS) {
        return call.done(r);
      }
      if (type != CU_GRAPH_NODE_TYPE_HOST) return call.done(CUDA_ERROR_INVALID_VALUE);
      auto params = host_params(session, req.value);
      if (!params) return call.done(params.error());
      return call.done(
          exec == nullptr ? call.cu.cuGraphHostNodeSetParams(node->node, &*params)
                          : call.cu.cuGraphExecHostNodeSetParams(exec->exec, node->node, &*params));
    }
    case proto::GraphNodeParam::kEnabled: {
      if (exec == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
      if (req.set != 0) {
        return call.done(
            call.cu.cuGraphNodeSetEnabled(exec->exec, node->node, req.value != 0 ? 1 : 0));
      }
      unsigned enabled = 0;
      if (CUresult r = call.cu.cuGraphNodeGetEnabled(exec->exec, node->node, &enabled);
          r != CUDA_SUCCESS) {
        return call.done(r);
      }
      return call.reply(proto::GraphNodeValueRep{enabled});
    }
  }
  return call.malformed(fmt::format("sent a graph node parameter request it cannot be ({} {})",
                                    req.param, req.set != 0 ? "set" : "get"));
}

// The node leaves its graph; a child graph node takes its embedded graph (and that graph's ids)
// with it.
OpResult op_graph_destroy_node(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  const GraphNodeObj* node = client_node(call, req.handle);
  if (node == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  const CUgraphNode driver_node = node->node;
  CUgraph embedded = nullptr;
  CUgraphNodeType type{};
  if (call.cu.cuGraphNodeGetType(driver_node, &type) == CUDA_SUCCESS &&
      type == CU_GRAPH_NODE_TYPE_GRAPH) {
    call.cu.cuGraphChildGraphNodeGetGraph(driver_node, &embedded);
  }
  if (CUresult r = call.cu.cuGraphDestroyNode(driver_node); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  if (embedded != nullptr) {
    if (auto it = session.ids_by_driver_handle.find(embedded);
        it != session.ids_by_driver_handle.end()) {
      forget_graph(session, it->second);  // not owned: the driver freed it with the node
    }
  }
  // A conditional node's bodies (and a child's, where its id was asked for) went with it too.
  for (std::uint64_t id : session.objects.ids_where<GraphObj>(
           [&](const GraphObj& g) { return g.embedded_node == req.handle; })) {
    forget_graph(session, id);
  }
  session.ids_by_driver_handle.erase(driver_node);
  session.objects.take<GraphNodeObj>(req.handle);
  return call.done();
}

OpResult op_graph_remove_dependencies(Call& call) {
  auto edges = edge_list(call);
  if (!edges) return edges.error();
  return call.done(call.cu.cuGraphRemoveDependencies_v2(
      edges->graph->graph, edges->from.data(), edges->to.data(), nullptr, edges->from.size()));
}

OpResult op_graph_clone(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  const GraphObj* graph = session.objects.get<GraphObj>(req.handle);
  if (graph == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  if (!within_client_limit(session, ClientLimit::kGraphs))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  const std::uint64_t ctx = graph->ctx;
  CUgraph clone = nullptr;
  if (CUresult r = call.cu.cuGraphClone(&clone, graph->graph); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  const std::uint64_t id = remember_graph(session, clone, ctx, true);
  if (id == 0) {
    call.cu.cuGraphDestroy(clone);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return call.reply(proto::GraphRep{id});
}

OpResult op_graph_node_find_in_clone(Call& call) {
  auto req = call.request<proto::GraphFindInCloneReq>();
  Session& session = call.session;
  const GraphNodeObj* node = client_node(call, req.node);
  const GraphObj* clone = session.objects.get<GraphObj>(req.clone);
  if (node == nullptr || clone == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  CUgraphNode found = nullptr;
  CUresult r = call.cu.cuGraphNodeFindInClone(&found, node->node, clone->graph);
  return node_reply(call, req.clone, r, found);
}

// New parameters for a memset or memcpy node: the graph's own node (exec 0), or an executable
// graph's; checked as when the node is added, issued with the client's green context as the
// node was made.
OpResult op_graph_memset_node_set_params(Call& call) {
  auto req = call.request<proto::GraphMemsetNodeSetReq>();
  Session& session = call.session;
  auto target = node_in_exec(call, req.exec, req.node);
  if (!target) return call.done(target.error());
  const GraphNodeObj* node = target->node;
  const GraphExecObj* exec = target->exec;
  CUDA_MEMSET_NODE_PARAMS params{};
  if (CUresult r = memset_node_params(call, req.dst, req.pitch, req.width, req.height, req.value,
                                      req.element_bytes, params);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  GreenCurrent green(session);
  return call.done(exec == nullptr ? call.cu.cuGraphMemsetNodeSetParams(node->node, &params)
                                   : call.cu.cuGraphExecMemsetNodeSetParams(
                                         exec->exec, node->node, &params, session.green.context));
}

OpResult op_graph_copy_node_set_params(Call& call) {
  auto req = call.request<proto::GraphCopyNodeSetReq>();
  Session& session = call.session;
  auto target = node_in_exec(call, req.exec, req.node);
  if (!target) return call.done(target.error());
  const GraphNodeObj* node = target->node;
  const GraphExecObj* exec = target->exec;
  CUDA_MEMCPY3D params{};
  if (CUresult r = copy_node_params(call, req.dst, req.src, req.bytes, params); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  GreenCurrent green(session);
  return call.done(exec == nullptr ? call.cu.cuGraphMemcpyNodeSetParams(node->node, &params)
                                   : call.cu.cuGraphExecMemcpyNodeSetParams(
                                         exec->exec, node->node, &params, session.green.context));
}

OpResult op_device_graph_mem(Call& call) {
  auto req = call.request<proto::DeviceGraphMemReq>();
  const CUdevice device = call.session.gpu().device;
  switch (static_cast<proto::DeviceGraphMemMode>(req.mode)) {
    case proto::DeviceGraphMemMode::kTrim:
      return call.done(call.cu.cuDeviceGraphMemTrim(device));
    case proto::DeviceGraphMemMode::kGet: {
      cuuint64_t value = 0;
      if (CUresult r = call.cu.cuDeviceGetGraphMemAttribute(
              device, static_cast<CUgraphMem_attribute>(req.attribute), &value);
          r != CUDA_SUCCESS) {
        return call.done(r);
      }
      return call.reply(proto::GraphNodeValueRep{value});
    }
    case proto::DeviceGraphMemMode::kSet: {
      cuuint64_t value = req.value;
      return call.done(call.cu.cuDeviceSetGraphMemAttribute(
          device, static_cast<CUgraphMem_attribute>(req.attribute), &value));
    }
  }
  return call.malformed(fmt::format("sent a graph memory request of unknown mode {}", req.mode));
}

}  // namespace mpsshim::server
