// Stream capture and graphs in the test driver. A capturing stream records each piece of work as
// a node of the capture's graph (after the stream's current dependencies) instead of running it;
// an instantiated graph replays its nodes in a topological order as one item of the launch
// stream. Concurrency inside a graph is not modelled: results are what any valid order gives.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace mpsshim::testdriver {

struct Stream;

using Work = std::shared_ptr<const std::function<void()>>;

struct Graph;

struct GraphNode {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  Work work;                      // null for an empty node
  std::vector<CUgraphNode> deps;  // nodes of the same graph
  CUcontext context = nullptr;    // a kernel node: the context whose SMs it runs on
  // A child graph node: the graph embedded in it (a clone of the one it was made from), which
  // replays in its place. The node owns it; State::embedded_graphs makes its handle work.
  std::shared_ptr<Graph> child;
};

struct Graph {
  int device = 0;
  std::vector<std::unique_ptr<GraphNode>> nodes;
  CUgraph handle() { return reinterpret_cast<CUgraph>(this); }
};

// What an executable graph was made from: node types and dependencies by node index, for
// cuGraphExecUpdate's topology check.
struct GraphShape {
  std::vector<CUgraphNodeType> types;
  std::vector<std::vector<std::size_t>> deps;
  bool operator==(const GraphShape&) const = default;
};

// A kernel node of an executable graph, for cuGraphExecKernelNodeSetParams: its index in the
// graph, where its work sits in the replay order, and the context it runs in (an update may not
// move it to another). A disabled node (cuGraphNodeSetEnabled) has no work in the replay order
// and keeps it in `disabled_work`, which updates change, until it is enabled again.
struct ExecKernel {
  std::size_t node = 0;
  std::size_t position = 0;
  CUcontext context = nullptr;
  bool enabled = true;
  Work disabled_work;
};

// A child graph node of an executable graph, for cuGraphExecChildGraphNodeSetParams: its index in
// the graph, where its embedded graph's work sits in the replay order (count items from
// position), and the embedded graph's shape, which new parameters must keep.
struct ExecChild {
  std::size_t node = 0;
  std::size_t position = 0;
  std::size_t count = 0;
  GraphShape shape;
};

struct GraphExec {
  int device = 0;
  GraphShape shape;
  std::map<CUgraphNode, ExecChild> children;  // by the node's handle in the graph it came from
  // A launch keeps the order it was given: an update replaces the vector when a launch still
  // holds it, so queued launches run with the parameters they were launched with.
  std::shared_ptr<const std::vector<Work>> order;
  std::map<CUgraphNode, ExecKernel> kernels;  // by the node's handle in the graph it came from
};

struct Capture {
  std::uint64_t id = 0;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  bool invalidated = false;
  // The graph the nodes go to: a new one, or the caller's for cuStreamBeginCaptureToGraph
  // (`into_existing`), which cuStreamEndCapture hands back instead of adding a graph.
  std::shared_ptr<Graph> graph;
  bool into_existing = false;
  Stream* origin = nullptr;
  std::vector<Stream*> streams;  // the origin and every stream that joined
};

// An event last recorded in a capture: a stream that waits on it joins the capture after `nodes`.
struct CapturedRecord {
  std::weak_ptr<Capture> capture;
  std::vector<CUgraphNode> nodes;
};

inline GraphNode* node_of(CUgraphNode handle) {
  return reinterpret_cast<GraphNode*>(handle);
}
inline CUgraphNode handle_of(GraphNode* node) {
  return reinterpret_cast<CUgraphNode>(node);
}

}  // namespace mpsshim::testdriver
