// What the graph op handlers (ops/graph.cpp, ops/graph_nodes.cpp) share: ids for the driver's
// graphs and nodes, and the common part of every kGraphAdd*Node record.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <vector>

#include <tl/expected.hpp>

#include "broker/server/ops/call.hpp"

namespace mpsshim::server {

// The node's id in the session (the one it has, or a new one), a node of graph `graph_id`.
std::uint64_t remember_node(Session& session, CUgraphNode node, std::uint64_t graph_id);

// A graph's id (the one it has, or a new one). A graph a capture builds is not the client's
// (owned = false) until the capture ends; a clone or a created graph is.
std::uint64_t remember_graph(Session& session, CUgraph graph, std::uint64_t ctx, bool owned);

// The shared part of a kGraphAdd*Node record: the graph it names and the dependency ids it must
// hold after the request struct (plus `extra` bytes of the node kind's own); or the answer that
// ends the call (a malformed record, an unknown graph or node).
struct NodeTarget {
  GraphObj* graph = nullptr;
  std::vector<CUgraphNode> deps;
};
tl::expected<NodeTarget, OpResult> node_target(Call& call, std::size_t request_bytes,
                                               const proto::GraphAddNodeHeader& h,
                                               std::uint64_t extra);

// The answer to an add: the driver's error, or the new node's id (GraphRep).
OpResult node_reply(Call& call, std::uint64_t graph_id, CUresult r, CUgraphNode node);

OpResult malformed_node(Call& call);

// A node of the client's and, unless `exec_id` is 0, one of its executable graphs: the answer to
// a name that is not the client's is CUDA_ERROR_INVALID_VALUE for the node and
// CUDA_ERROR_INVALID_HANDLE for the executable graph, as the driver's (ops/graph_nodes.cpp).
struct NodeInExec {
  const GraphNodeObj* node = nullptr;
  const GraphExecObj* exec = nullptr;  // null: the graph's own node
};
tl::expected<NodeInExec, CUresult> node_in_exec(Call& call, proto::WireHandle exec_id,
                                                proto::WireHandle node_id);

// The (from, to) node pairs after a GraphAddDependenciesReq (kGraphAddDependencies,
// kGraphRemoveDependencies): nodes of the graph it names, as driver nodes; or the answer that ends
// the call.
struct EdgeList {
  const GraphObj* graph = nullptr;
  std::vector<CUgraphNode> from, to;
};
tl::expected<EdgeList, OpResult> edge_list(Call& call);

// A memset node's or memcpy node's parameters (ops/graph.cpp): the driver's form of what the
// record states, or CUDA_ERROR_INVALID_VALUE for a shape the driver refuses or memory that is not
// the client's (a one-dimensional device-to-device copy for memcpy nodes).
CUresult memset_node_params(Call& call, std::uint64_t dst, std::uint64_t pitch, std::uint64_t width,
                            std::uint64_t height, std::uint32_t value, std::uint32_t element_bytes,
                            CUDA_MEMSET_NODE_PARAMS& out);
CUresult copy_node_params(Call& call, std::uint64_t dst, std::uint64_t src, std::uint64_t bytes,
                          CUDA_MEMCPY3D& out);

}  // namespace mpsshim::server
