// Stream capture and graphs in the test driver. A capturing stream records each piece of work as
// a node of the capture's graph (after the stream's current dependencies) instead of running it;
// an instantiated graph replays its nodes in a topological order as one item of the launch
// stream. Concurrency inside a graph is not modelled: results are what any valid order gives.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace mpsshim::testdriver {

struct Stream;
struct State;
class Event;

using Work = std::shared_ptr<const std::function<void()>>;

struct Graph;

// A conditional handle (cuGraphConditionalHandleCreate): the value a conditional node reads,
// set by kernels (cudaGraphSetConditional, the `countdown` kernel here) and, with
// CU_GRAPH_COND_ASSIGN_DEFAULT, to its default at every launch of its graph. The handle value is
// the cell's address; graph_control_nodes.cpp keeps the live ones.
struct ConditionalCell {
  std::atomic<unsigned> value{0};
  unsigned default_value = 0;
  bool assign_default = false;
};

struct GraphNode {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  Work work;                      // null for an empty node
  std::vector<CUgraphNode> deps;  // nodes of the same graph
  CUcontext context = nullptr;    // a kernel node: the context whose SMs it runs on
  // A child graph node: the graph embedded in it (a clone of the one it was made from), which
  // replays in its place. The node owns it; State::embedded_graphs makes its handle work.
  std::shared_ptr<Graph> child;
  // An event record or wait node: its event. Its work is a placeholder that each launch binds to
  // the event as it stands then (GraphExec::events).
  std::shared_ptr<Event> event;
  // A host node's function (its work calls it).
  CUDA_HOST_NODE_PARAMS host{};
  // A memory allocation node: its block (bytes at address); a free node: the block it frees.
  CUdeviceptr memory = 0;
  std::size_t memory_bytes = 0;
  // In a clone (cuGraphClone, and the graph a child node embeds): the node it was copied from.
  CUgraphNode cloned_from = nullptr;
  // A conditional node: its handle's cell, its kind and its body graphs (owned by the node;
  // State::embedded_graphs makes their handles work).
  std::shared_ptr<ConditionalCell> condition;
  CUgraphConditionalNodeType condition_type = CU_GRAPH_COND_TYPE_IF;
  std::vector<std::shared_ptr<Graph>> bodies;
  // A kernel node's launch attributes (cuGraphKernelNodeSetAttribute), by id.
  std::map<int, CUkernelNodeAttrValue> attributes;
  // A batch memory operation node's operations as given.
  std::vector<CUstreamBatchMemOpParams> mem_ops;
};

// The blocks of a graph's memory allocation nodes, held by the graph and by its executable
// graph; released (after the device drained) when the last of them is destroyed.
struct GraphMemory {
  std::vector<CUdeviceptr> blocks;
};

struct GraphExec;

struct Graph {
  int device = 0;
  std::vector<std::unique_ptr<GraphNode>> nodes;
  // Set by its first memory allocation or free node. Such a graph may not be cloned, changed by
  // destroying nodes or edges, or instantiated twice at once (cuda.h; the driver answers
  // CUDA_ERROR_NOT_SUPPORTED, measured on an H200 with driver 580).
  std::shared_ptr<GraphMemory> memory;
  bool has_memory_nodes = false;
  std::weak_ptr<GraphExec> instance;  // its one executable graph, while it has memory nodes
  // Conditional handles made for it; a graph with conditional nodes (or inside one) may not be
  // cloned or embedded as a child, and has one executable graph at a time (cuda.h).
  std::vector<std::shared_ptr<ConditionalCell>> conditionals;
  bool has_conditional_nodes = false;
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

// An event node of an executable graph: where its placeholder sits in the replay order, its
// event (cuGraphExecEvent*NodeSetEvent changes it) and whether it waits or records.
struct ExecEvent {
  CUgraphNode node = nullptr;
  std::size_t position = 0;
  std::shared_ptr<Event> event;
  bool wait = false;
};

struct GraphExec {
  int device = 0;
  GraphShape shape;
  std::map<CUgraphNode, ExecChild> children;  // by the node's handle in the graph it came from
  // A launch keeps the order it was given: an update replaces the vector when a launch still
  // holds it, so queued launches run with the parameters they were launched with.
  std::shared_ptr<const std::vector<Work>> order;
  std::map<CUgraphNode, ExecKernel> kernels;  // by the node's handle in the graph it came from
  // Its nodes' handles in the graph it was instantiated from, by node index; and every node
  // with work, by that handle: where the work sits.
  std::vector<CUgraphNode> handles;
  std::map<CUgraphNode, std::size_t> positions;
  std::vector<ExecEvent> events;  // in replay order
  // Graph memory: the blocks (kept alive with the graph's), and those the graph allocates but
  // does not free, which must be free again before it is launched again.
  std::shared_ptr<GraphMemory> memory;
  std::vector<CUdeviceptr> unfreed;
  std::vector<CUdeviceptr> foreign_frees;  // other graphs' blocks its free nodes free
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

// graph.cpp, shared with graph_nodes.cpp (all with State::mutex held).
std::shared_ptr<Graph> find_graph(State& s, CUgraph handle);
CUresult check_deps(const Graph& g, const CUgraphNode* deps, std::size_t count);
CUresult add_node(State& s, CUgraphNode* out, CUgraph hgraph, const CUgraphNode* deps,
                  std::size_t count, CUgraphNodeType type, std::function<void()> work);
bool node_alive(State& s, CUgraphNode handle);
// A deep copy of `g`, registered as an embedded graph; each node knows the one it copies.
std::shared_ptr<Graph> clone_graph(State& s, const Graph& g);
// The graph holding a live node (nullptr if none).
Graph* graph_holding(State& s, CUgraphNode handle);
// Replaces the work at `position` of an executable graph's order (copy on write: a queued launch
// holds the order it was given).
void replace_exec_work(GraphExec& exec, std::size_t position,
                       std::shared_ptr<const std::function<void()>> work);
// The order a launch of `exec` runs: its event nodes bound to their events as they stand now;
// nullptr and *error when graph memory it allocates is still allocated.
std::shared_ptr<const std::vector<std::shared_ptr<const std::function<void()>>>> launch_order(
    State& s, GraphExec& exec, CUresult* error);
// New work for a node of `type`: the graph's own (for graphs instantiated afterwards), or an
// executable graph's copy (queued launches keep theirs).
CUresult set_node_work(State& s, CUgraphNode hnode, CUgraphNodeType type,
                       std::function<void()> work);
CUresult set_exec_work(State& s, CUgraphExec hexec, CUgraphNode hnode, CUgraphNodeType type,
                       std::function<void()> work);
// Graph memory blocks: a graph memory free (in a free node's replay, cuMemFree, cuMemFreeAsync)
// and the release of blocks no graph or executable graph holds any more (drains the device).
bool free_graph_block(State& s, CUdeviceptr block);  // false: not allocated now
void release_graph_memory(State& s, std::shared_ptr<GraphMemory> memory);

inline GraphNode* node_of(CUgraphNode handle) {
  return reinterpret_cast<GraphNode*>(handle);
}
inline CUgraphNode handle_of(GraphNode* node) {
  return reinterpret_cast<CUgraphNode>(node);
}

}  // namespace mpsshim::testdriver
