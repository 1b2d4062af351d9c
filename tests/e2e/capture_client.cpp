// Capture into an existing graph (cuStreamBeginCaptureToGraph, what XLA's command buffers use)
// through the whole path: run under LD_PRELOAD=libmpsshim.so against mpsshimd and the test
// driver by tests/e2e/capture_test.cpp. Each mode prints one PASS or FAIL line.
#include <cuda.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "client_check.hpp"

namespace {

constexpr char kModuleImage[] = "// mpsshim e2e capture module\n.version 8.0\n.target sm_90\n";
constexpr int kElements = 4096;
constexpr unsigned kSetA = 77;
constexpr unsigned kSetB = 5;
constexpr unsigned kFillC = 3;

struct Setup {
  CUcontext ctx{};
  CUmodule module{};
  CUstream stream{};
};

Setup setup() {
  Setup s;
  CUdevice device{};
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&s.ctx, device));
  CHECK(cuCtxSetCurrent(s.ctx));
  CHECK(cuModuleLoadData(&s.module, kModuleImage));
  CHECK(cuStreamCreate(&s.stream, CU_STREAM_NON_BLOCKING));
  return s;
}

CUgraphNode memset_node(CUgraph graph, CUdeviceptr dst, unsigned value, CUcontext ctx) {
  CUDA_MEMSET_NODE_PARAMS p{};
  p.dst = dst;
  p.value = value;
  p.elementSize = sizeof(unsigned);
  p.width = kElements;
  p.height = 1;
  CUgraphNode node = nullptr;
  CHECK(cuGraphAddMemsetNode(&node, graph, nullptr, 0, &p, ctx));
  return node;
}

bool all_equal(CUdeviceptr p, unsigned expected) {
  std::vector<unsigned> host(kElements);
  CHECK(cuMemcpyDtoH(host.data(), p, host.size() * sizeof(unsigned)));
  for (unsigned v : host) {
    if (v != expected) {
      std::printf("FAIL found %u where %u was expected\n", v, expected);
      return false;
    }
  }
  return true;
}

// A graph with two memset nodes; a capture into it after the first adds an increment kernel and
// a memset; the same handle comes back, the topology is the one asked for, the launch computes.
// Then the per-thread variant from cuGetProcAddress captures into an empty graph.
int into_graph() {
  Setup s = setup();
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  CUdeviceptr a{}, b{}, c{};
  const std::size_t bytes = kElements * sizeof(unsigned);
  CHECK(cuMemAlloc(&a, bytes));
  CHECK(cuMemAlloc(&b, bytes));
  CHECK(cuMemAlloc(&c, bytes));
  CHECK(cuMemsetD32(a, 0, kElements));
  CHECK(cuMemsetD32(b, 0, kElements));
  CHECK(cuMemsetD32(c, 0, kElements));
  // Those memsets may run late on the legacy stream, which a non-blocking stream does not wait for.
  CHECK(cuCtxSynchronize());

  CUgraph graph = nullptr;
  CHECK(cuGraphCreate(&graph, 0));
  const CUgraphNode set_a = memset_node(graph, a, kSetA, s.ctx);
  const CUgraphNode set_b = memset_node(graph, b, kSetB, s.ctx);
  CHECK(cuStreamBeginCaptureToGraph(s.stream, graph, &set_a, nullptr, 1,
                                    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CUstreamCaptureStatus status{};
  CUgraph capturing_into = nullptr;
  std::size_t dependencies = 0;
  CHECK(cuStreamGetCaptureInfo_v3(s.stream, &status, nullptr, &capturing_into, nullptr, nullptr,
                                  &dependencies));
  if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE || capturing_into != graph || dependencies != 1) {
    return fail("cuStreamGetCaptureInfo_v3 does not show the capture into the graph");
  }
  int n = kElements;
  void* args[] = {&a, &n};
  CHECK(cuLaunchKernel(increment, (kElements + 255) / 256, 1, 1, 256, 1, 1, 0, s.stream, args,
                       nullptr));
  CHECK(cuMemsetD32Async(c, kFillC, kElements, s.stream));
  CUgraph ended = nullptr;
  CHECK(cuStreamEndCapture(s.stream, &ended));
  if (ended != graph) return fail("cuStreamEndCapture returned another graph");

  std::size_t count = 0;
  CHECK(cuGraphGetNodes(graph, nullptr, &count));
  if (count != 4) return fail("the graph does not hold 4 nodes");
  std::vector<CUgraphNode> nodes(count);
  CHECK(cuGraphGetNodes(graph, nodes.data(), &count));
  if (nodes[0] != set_a || nodes[1] != set_b) return fail("the graph's first nodes changed");
  std::size_t edge_count = 0;
  CHECK(cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &edge_count));
  std::vector<CUgraphNode> from(edge_count), to(edge_count);
  std::vector<CUgraphEdgeData> data(edge_count);
  CHECK(cuGraphGetEdges_v2(graph, from.data(), to.data(), data.data(), &edge_count));
  const std::vector<std::pair<CUgraphNode, CUgraphNode>> expected{{set_a, nodes[2]},
                                                                  {nodes[2], nodes[3]}};
  std::vector<std::pair<CUgraphNode, CUgraphNode>> edges;
  for (std::size_t i = 0; i < edge_count; ++i) edges.emplace_back(from[i], to[i]);
  if (edges != expected) return fail("the edges are not set_a -> kernel -> memset");
  const CUgraphEdgeData none{};
  for (const CUgraphEdgeData& e : data) {
    if (std::memcmp(&e, &none, sizeof e) != 0) return fail("an edge is not a default one");
  }
  // Node types come from the driver: two memsets, the captured kernel, the captured memset.
  const CUgraphNodeType want[] = {CU_GRAPH_NODE_TYPE_MEMSET, CU_GRAPH_NODE_TYPE_MEMSET,
                                  CU_GRAPH_NODE_TYPE_KERNEL, CU_GRAPH_NODE_TYPE_MEMSET};
  for (std::size_t i = 0; i < 4; ++i) {
    CUgraphNodeType type{};
    CHECK(cuGraphNodeGetType(nodes[i], &type));
    if (type != want[i]) return fail("a node's type is not what was added or captured");
  }
  // The topology queries the shim answers from nodes and edges (XLA walks graphs with them).
  std::size_t root_count = 0;
  CHECK(cuGraphGetRootNodes(graph, nullptr, &root_count));
  std::vector<CUgraphNode> roots(3, nodes[3]);  // one more than there are: it comes back NULL
  root_count = roots.size();
  CHECK(cuGraphGetRootNodes(graph, roots.data(), &root_count));
  if (root_count != 2 || roots[0] != set_a || roots[1] != set_b || roots[2] != nullptr) {
    return fail("the root nodes are not set_a and set_b");
  }
  CUgraphNode neighbour = nullptr;
  std::size_t one = 1;
  CHECK(cuGraphNodeGetDependencies(nodes[2], &neighbour, nullptr, &one));
  if (one != 1 || neighbour != set_a) return fail("the kernel does not depend on set_a alone");
  one = 1;
  CHECK(cuGraphNodeGetDependentNodes(nodes[2], &neighbour, nullptr, &one));
  if (one != 1 || neighbour != nodes[3]) return fail("the memset is not the kernel's dependent");
  std::size_t none_count = 5;
  CHECK(cuGraphNodeGetDependencies(set_b, nullptr, nullptr, &none_count));
  if (none_count != 0) return fail("set_b has dependencies");

  CUgraphExec exec = nullptr;
  CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
  CHECK(cuGraphLaunch(exec, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (!all_equal(a, kSetA + 1) || !all_equal(b, kSetB) || !all_equal(c, kFillC)) return 1;

  // cuGetProcAddress hands out the per-thread variant; it captures into an empty graph.
  using BeginToGraph = CUresult(CUDAAPI*)(CUstream, CUgraph, const CUgraphNode*,
                                          const CUgraphEdgeData*, size_t, CUstreamCaptureMode);
  void* entry = nullptr;
  CUdriverProcAddressQueryResult found{};
  CHECK(cuGetProcAddress_v2("cuStreamBeginCaptureToGraph", &entry, 12030,
                            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &found));
  if (entry == nullptr || found != CU_GET_PROC_ADDRESS_SUCCESS) {
    return fail("cuGetProcAddress does not resolve cuStreamBeginCaptureToGraph");
  }
  CUgraph empty = nullptr;
  CHECK(cuGraphCreate(&empty, 0));
  CHECK(reinterpret_cast<BeginToGraph>(entry)(s.stream, empty, nullptr, nullptr, 0,
                                              CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(cuMemsetD32Async(b, kFillC, kElements, s.stream));
  CHECK(cuStreamEndCapture(s.stream, &ended));
  if (ended != empty) return fail("the per-thread variant's capture returned another graph");
  CUgraphExec empty_exec = nullptr;
  CHECK(cuGraphInstantiateWithFlags(&empty_exec, empty, 0));
  CHECK(cuGraphLaunch(empty_exec, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (!all_equal(b, kFillC)) return 1;

  // The generic cuGraphAddNode (XLA adds kernel nodes so): a memset, then the kernel after it.
  CUgraph generic = nullptr;
  CHECK(cuGraphCreate(&generic, 0));
  CUgraphNodeParams set{};
  set.type = CU_GRAPH_NODE_TYPE_MEMSET;
  set.memset.dst = c;
  set.memset.value = kSetB;
  set.memset.elementSize = sizeof(unsigned);
  set.memset.width = kElements;
  set.memset.height = 1;
  set.memset.ctx = s.ctx;
  CUgraphNode set_c = nullptr;
  CHECK(cuGraphAddNode_v2(&set_c, generic, nullptr, nullptr, 0, &set));
  CUgraphNodeParams kernel{};
  kernel.type = CU_GRAPH_NODE_TYPE_KERNEL;
  kernel.kernel.func = increment;
  kernel.kernel.gridDimX = (kElements + 255) / 256;
  kernel.kernel.gridDimY = kernel.kernel.gridDimZ = 1;
  kernel.kernel.blockDimX = 256;
  kernel.kernel.blockDimY = kernel.kernel.blockDimZ = 1;
  void* c_args[] = {&c, &n};
  kernel.kernel.kernelParams = c_args;
  CUgraphNode bump = nullptr;
  CHECK(cuGraphAddNode_v2(&bump, generic, &set_c, nullptr, 1, &kernel));
  // A programmatic edge (XLA's) is kept as a full dependency: the second increment runs after
  // the first.
  CUgraphEdgeData programmatic{};
  programmatic.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
  programmatic.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
  CUgraphNode bump_again = nullptr;
  CHECK(cuGraphAddNode_v2(&bump_again, generic, &bump, &programmatic, 1, &kernel));
  // cuGraphAddDependencies with a programmatic edge: also a full dependency.
  CUgraphNode bump_third = nullptr;
  CHECK(cuGraphAddNode_v2(&bump_third, generic, nullptr, nullptr, 0, &kernel));
  CHECK(cuGraphAddDependencies_v2(generic, &bump_again, &bump_third, &programmatic, 1));
  CUgraphNodeType bump_type{};
  CHECK(cuGraphNodeGetType(bump, &bump_type));
  if (bump_type != CU_GRAPH_NODE_TYPE_KERNEL) return fail("cuGraphAddNode made no kernel node");
  CUgraphNodeParams unsupported{};
  unsupported.type = CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL;  // needs the client's own semaphores
  CUgraphNode refused = nullptr;
  if (cuGraphAddNode_v2(&refused, generic, nullptr, nullptr, 0, &unsupported) !=
      CUDA_ERROR_NOT_SUPPORTED) {
    return fail("an external semaphore node through cuGraphAddNode was not refused");
  }
  CUgraphExec generic_exec = nullptr;
  CHECK(cuGraphInstantiateWithFlags(&generic_exec, generic, 0));
  CHECK(cuGraphLaunch(generic_exec, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (!all_equal(c, kSetB + 3)) return fail("the generic graph computed something else");
  CHECK(cuGraphExecDestroy(generic_exec));
  CHECK(cuGraphDestroy(generic));

  CHECK(cuGraphExecDestroy(empty_exec));
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(empty));
  CHECK(cuGraphDestroy(graph));
  std::printf("PASS into_graph nodes=%zu edges=%zu\n", count, edge_count);
  return 0;
}

// XLA's command buffer: kernels captured into a graph, instantiated once, then pointed at other
// buffers with cuGraphExecKernelNodeSetParams between launches.
int update() {
  Setup s = setup();
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  const std::size_t bytes = kElements * sizeof(unsigned);
  CUdeviceptr a{}, b{};
  CHECK(cuMemAlloc(&a, bytes));
  CHECK(cuMemAlloc(&b, bytes));
  CHECK(cuMemsetD32(a, kSetA, kElements));
  CHECK(cuMemsetD32(b, kSetB, kElements));
  CHECK(cuCtxSynchronize());

  CUgraph graph = nullptr;
  CHECK(cuGraphCreate(&graph, 0));
  CHECK(cuStreamBeginCaptureToGraph(s.stream, graph, nullptr, nullptr, 0,
                                    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  int n = kElements;
  void* on_a[] = {&a, &n};
  CHECK(cuLaunchKernel(increment, (kElements + 255) / 256, 1, 1, 256, 1, 1, 0, s.stream, on_a,
                       nullptr));
  CUgraph ended = nullptr;
  CHECK(cuStreamEndCapture(s.stream, &ended));
  CUgraphNode captured = nullptr;
  std::size_t count = 1;
  CHECK(cuGraphGetNodes(graph, &captured, &count));
  CUgraphExec exec = nullptr;
  CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
  CHECK(cuGraphLaunch(exec, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (!all_equal(a, kSetA + 1)) return 1;

  // The same node on b, twice.
  CUDA_KERNEL_NODE_PARAMS p{};
  p.func = increment;
  p.gridDimX = (kElements + 255) / 256;
  p.gridDimY = p.gridDimZ = 1;
  p.blockDimX = 256;
  p.blockDimY = p.blockDimZ = 1;
  void* on_b[] = {&b, &n};
  p.kernelParams = on_b;
  CHECK(cuGraphExecKernelNodeSetParams(exec, captured, &p));
  CHECK(cuGraphLaunch(exec, s.stream));
  CHECK(cuGraphLaunch(exec, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (!all_equal(a, kSetA + 1) || !all_equal(b, kSetB + 2)) return 1;

  // A node of a graph the executable graph was not made from, and a destroyed executable graph.
  CUgraph other = nullptr;
  CHECK(cuGraphCreate(&other, 0));
  const CUgraphNode foreign = memset_node(other, a, kFillC, s.ctx);
  EXPECT(cuGraphExecKernelNodeSetParams(exec, foreign, &p), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGraphExecDestroy(exec));
  EXPECT(cuGraphExecKernelNodeSetParams(exec, captured, &p), CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuGraphDestroy(other));
  CHECK(cuGraphDestroy(graph));
  std::printf("PASS update\n");
  return 0;
}

// What a capture into a graph refuses, and that the stream still works after each refusal.
int errors() {
  Setup s = setup();
  CUstream other{};
  CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUdeviceptr p{};
  CHECK(cuMemAlloc(&p, kElements * sizeof(unsigned)));
  CUgraph graph = nullptr, second = nullptr, gone = nullptr;
  CHECK(cuGraphCreate(&graph, 0));
  CHECK(cuGraphCreate(&second, 0));
  CHECK(cuGraphCreate(&gone, 0));
  CHECK(cuGraphDestroy(gone));
  const CUgraphNode mine = memset_node(graph, p, kSetA, s.ctx);
  const CUgraphNode foreign = memset_node(second, p, kSetB, s.ctx);
  const auto mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

  EXPECT(cuStreamBeginCaptureToGraph(s.stream, gone, nullptr, nullptr, 0, mode),
         CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuStreamBeginCaptureToGraph(s.stream, graph, &foreign, nullptr, 1, mode),
         CUDA_ERROR_INVALID_VALUE);
  CUgraphEdgeData reserved_port{};
  reserved_port.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
  reserved_port.to_port = 1;  // reserved: must be 0
  EXPECT(cuStreamBeginCaptureToGraph(s.stream, graph, &mine, &reserved_port, 1, mode),
         CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuStreamBeginCaptureToGraph(s.stream, graph, &mine, nullptr, 1,
                                     static_cast<CUstreamCaptureMode>(7)),
         CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuStreamBeginCaptureToGraph(CU_STREAM_LEGACY, graph, nullptr, nullptr, 0, mode),
         CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUstreamCaptureStatus status{};
  CHECK(cuStreamIsCapturing(s.stream, &status));
  if (status != CU_STREAM_CAPTURE_STATUS_NONE) return fail("a refused capture left one open");

  const CUgraphEdgeData zero{};  // default edge data is accepted
  CHECK(cuStreamBeginCaptureToGraph(s.stream, graph, &mine, &zero, 1, mode));
  EXPECT(cuStreamBeginCaptureToGraph(s.stream, second, nullptr, nullptr, 0, mode),
         CUDA_ERROR_ILLEGAL_STATE);
  CUgraph ended = nullptr;
  EXPECT(cuStreamEndCapture(other, &ended), CUDA_ERROR_ILLEGAL_STATE);
  CHECK(cuMemsetD32Async(p, kFillC, kElements, s.stream));
  CHECK(cuStreamEndCapture(s.stream, &ended));
  if (ended != graph) return fail("the capture ended with another graph");
  std::size_t count = 0;
  CHECK(cuGraphGetNodes(graph, nullptr, &count));
  if (count != 2) return fail("the graph does not hold its node and the captured one");

  // An invalidated capture leaves the graph to the client.
  CHECK(cuStreamBeginCaptureToGraph(s.stream, second, nullptr, nullptr, 0,
                                    CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT(cuStreamSynchronize(s.stream), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT(cuStreamEndCapture(s.stream, &ended), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(cuGraphGetNodes(second, nullptr, &count));
  CHECK(cuMemsetD32Async(p, kSetB, kElements, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (!all_equal(p, kSetB)) return 1;
  CHECK(cuGraphDestroy(second));
  CHECK(cuGraphDestroy(graph));
  std::printf("PASS errors\n");
  return 0;
}

// Begins a capture into a graph and exits without ending it: the server ends the capture and
// frees the graph with the session.
int abandon() {
  Setup s = setup();
  CUdeviceptr p{};
  CHECK(cuMemAlloc(&p, kElements * sizeof(unsigned)));
  CUgraph graph = nullptr;
  CHECK(cuGraphCreate(&graph, 0));
  const CUgraphNode set = memset_node(graph, p, kSetA, s.ctx);
  CHECK(cuStreamBeginCaptureToGraph(s.stream, graph, &set, nullptr, 1,
                                    CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK(cuMemsetD32Async(p, kSetB, kElements, s.stream));
  std::printf("PASS abandon\n");
  std::fflush(stdout);
  std::_Exit(0);
}

// A kernel captured into one graph, nested as a child graph node of another (as XLA nests its
// command buffers; JAX reaches cuGraphAddChildGraphNode through cuGetProcAddress): the child is
// cloned, the embedded graph can be queried but not destroyed, the launch computes, and the
// executable graph's child node takes another child.
CUgraph captured_increment(CUstream stream, CUfunction increment, CUdeviceptr p) {
  CUgraph graph = nullptr;
  CHECK(cuStreamBeginCapture_v2(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
  int n = kElements;
  void* args[] = {&p, &n};
  CHECK(cuLaunchKernel(increment, (kElements + 255) / 256, 1, 1, 256, 1, 1, 0, stream, args,
                       nullptr));
  CHECK(cuStreamEndCapture(stream, &graph));
  return graph;
}

int child() {
  Setup s = setup();
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  CUdeviceptr a{}, b{};
  CHECK(cuMemAlloc(&a, kElements * sizeof(unsigned)));
  CHECK(cuMemAlloc(&b, kElements * sizeof(unsigned)));
  CHECK(cuMemsetD32(b, kSetB, kElements));
  CHECK(cuCtxSynchronize());
  CUgraph inner = captured_increment(s.stream, increment, a);
  CUgraph outer = nullptr;
  CHECK(cuGraphCreate(&outer, 0));
  const CUgraphNode set_a = memset_node(outer, a, kSetA, s.ctx);

  using AddChild = CUresult(CUDAAPI*)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t, CUgraph);
  void* entry = nullptr;
  CUdriverProcAddressQueryResult found{};
  CHECK(cuGetProcAddress_v2("cuGraphAddChildGraphNode", &entry, 12030, CU_GET_PROC_ADDRESS_DEFAULT,
                            &found));
  if (entry == nullptr || found != CU_GET_PROC_ADDRESS_SUCCESS) {
    return fail("cuGetProcAddress does not resolve cuGraphAddChildGraphNode");
  }
  CUgraphNode node = nullptr;
  CHECK(reinterpret_cast<AddChild>(entry)(&node, outer, &set_a, 1, inner));
  CHECK(cuGraphDestroy(inner));  // cloned into the node

  CUgraph embedded = nullptr;
  CHECK(cuGraphChildGraphNodeGetGraph(node, &embedded));
  std::size_t count = 0;
  CHECK(cuGraphGetNodes(embedded, nullptr, &count));
  if (count != 1) return fail("the embedded graph does not hold the captured kernel");
  std::size_t roots = 0;
  CHECK(cuGraphGetRootNodes(embedded, nullptr, &roots));
  if (roots != 1) return fail("the embedded graph's kernel is not its root");
  EXPECT(cuGraphDestroy(embedded), CUDA_ERROR_INVALID_VALUE);  // the node's
  EXPECT(cuGraphChildGraphNodeGetGraph(set_a, &embedded), CUDA_ERROR_INVALID_VALUE);

  CUgraphExec exec = nullptr;
  CHECK(cuGraphInstantiateWithFlags(&exec, outer, 0));
  CHECK(cuGraphLaunch(exec, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (!all_equal(a, kSetA + 1)) return 1;

  CUgraph other = captured_increment(s.stream, increment, b);
  CHECK(cuGraphExecChildGraphNodeSetParams(exec, node, other));
  CHECK(cuGraphLaunch(exec, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (!all_equal(a, kSetA) || !all_equal(b, kSetB + 1)) return 1;

  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(outer));
  // The embedded graph went with the graph that held its node.
  EXPECT(cuGraphGetNodes(embedded, nullptr, &count), CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuGraphDestroy(other));
  std::printf("PASS child\n");
  return 0;
}

}  // namespace

// What NCCL does to put its own work into a capture: ask the capture's dependency nodes, add a
// node after them by hand, make it the capture's new dependency, capture on. a = 77 (captured),
// then b = a + 1 (a kernel node added by hand after the memset), then c = 3 captured after it;
// with ADD, a second hand-made node joins the dependencies instead of replacing them.
int capture_deps() {
  Setup s = setup();
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  CUdeviceptr a{}, c{};
  const std::size_t bytes = kElements * sizeof(unsigned);
  CHECK(cuMemAlloc(&a, bytes));
  CHECK(cuMemAlloc(&c, bytes));
  CHECK(cuMemsetD32(a, 0, kElements));
  CHECK(cuMemsetD32(c, 0, kElements));
  CHECK(cuCtxSynchronize());

  // Not capturing: the update is refused as natively.
  CUgraphNode none = nullptr;
  if (cuStreamUpdateCaptureDependencies(s.stream, &none, nullptr, 0,
                                        CU_STREAM_SET_CAPTURE_DEPENDENCIES) !=
      CUDA_ERROR_ILLEGAL_STATE) {
    return fail("an update outside a capture is not CUDA_ERROR_ILLEGAL_STATE");
  }
  CHECK(cuStreamBeginCapture(s.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  CHECK(cuMemsetD32Async(a, kSetA, kElements, s.stream));
  CUstreamCaptureStatus status{};
  CUgraph graph = nullptr;
  const CUgraphNode* deps = nullptr;
  const CUgraphEdgeData* edge_data = nullptr;
  std::size_t count = 0;
  CHECK(cuStreamGetCaptureInfo_v3(s.stream, &status, nullptr, &graph, &deps, &edge_data, &count));
  if (status != CU_STREAM_CAPTURE_STATUS_ACTIVE || graph == nullptr || count != 1 ||
      deps == nullptr || edge_data == nullptr) {
    return fail("cuStreamGetCaptureInfo_v3 does not show the memset as the one dependency");
  }
  const CUgraphEdgeData default_edge{};
  if (std::memcmp(&edge_data[0], &default_edge, sizeof default_edge) != 0) {
    return fail("the dependency's edge data is not the default");
  }
  const CUgraphNode captured_memset = deps[0];

  // A kernel node by hand after it: a += 1.
  int n = kElements;
  void* args[] = {&a, &n};
  CUDA_KERNEL_NODE_PARAMS kp{};
  kp.func = increment;
  kp.gridDimX = (kElements + 255) / 256;
  kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = 256;
  kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = args;
  CUgraphNode by_hand = nullptr;
  CHECK(cuGraphAddKernelNode(&by_hand, graph, &captured_memset, 1, &kp));
  CHECK(cuStreamUpdateCaptureDependencies(s.stream, &by_hand, nullptr, 1,
                                          CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  CHECK(cuStreamGetCaptureInfo_v3(s.stream, &status, nullptr, nullptr, &deps, nullptr, &count));
  if (count != 1 || deps[0] != by_hand) return fail("SET did not make the hand-made node the one");

  // ADD, through the CUDA 11.3 forms (no edge data) a runtime of that age asks for.
  using UpdateV1 = CUresult (*)(CUstream, CUgraphNode*, size_t, unsigned int);
  using InfoV2 = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*,
                              const CUgraphNode**, size_t*);
  void* update_fn = nullptr;
  void* info_fn = nullptr;
  CHECK(cuGetProcAddress("cuStreamUpdateCaptureDependencies", &update_fn, 11030,
                         CU_GET_PROC_ADDRESS_DEFAULT, nullptr));
  CHECK(cuGetProcAddress("cuStreamGetCaptureInfo", &info_fn, 11030, CU_GET_PROC_ADDRESS_DEFAULT,
                         nullptr));
  auto update_v1 = reinterpret_cast<UpdateV1>(update_fn);
  auto info_v2 = reinterpret_cast<InfoV2>(info_fn);
  CUgraphNode joined = nullptr;
  CHECK(cuGraphAddEmptyNode(&joined, graph, &captured_memset, 1));
  CHECK(update_v1(s.stream, &joined, 1, CU_STREAM_ADD_CAPTURE_DEPENDENCIES));
  CHECK(info_v2(s.stream, &status, nullptr, nullptr, &deps, &count));
  if (count != 2 ||
      !((deps[0] == by_hand && deps[1] == joined) || (deps[0] == joined && deps[1] == by_hand))) {
    return fail("ADD did not join the empty node to the dependencies");
  }
  // A node of another graph is refused.
  CUgraph other = nullptr;
  CHECK(cuGraphCreate(&other, 0));
  CUgraphNode foreign = nullptr;
  CHECK(cuGraphAddEmptyNode(&foreign, other, nullptr, 0));
  if (update_v1(s.stream, &foreign, 1, CU_STREAM_ADD_CAPTURE_DEPENDENCIES) !=
      CUDA_ERROR_INVALID_VALUE) {
    return fail("a foreign node was accepted as a capture dependency");
  }
  CHECK(cuGraphDestroy(other));

  CHECK(cuMemsetD32Async(c, kFillC, kElements, s.stream));
  CUgraph ended = nullptr;
  CHECK(cuStreamEndCapture(s.stream, &ended));
  if (ended != graph) return fail("cuStreamEndCapture returned another graph");
  // The captured memset of c depends on both hand-made nodes.
  std::size_t edge_count = 0;
  CHECK(cuGraphGetEdges(graph, nullptr, nullptr, nullptr, &edge_count));
  std::vector<CUgraphNode> from(edge_count), to(edge_count);
  CHECK(cuGraphGetEdges(graph, from.data(), to.data(), nullptr, &edge_count));
  int into_last = 0;
  for (std::size_t i = 0; i < edge_count; ++i) {
    if ((from[i] == by_hand || from[i] == joined) && to[i] != by_hand && to[i] != joined) {
      ++into_last;
    }
  }
  if (edge_count != 4 || into_last != 2) {
    return fail("the captured memset does not follow both hand-made nodes");
  }
  CUgraphExec exec = nullptr;
  CHECK(cuGraphInstantiate(&exec, graph, 0));
  CHECK(cuGraphLaunch(exec, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (!all_equal(a, kSetA + 1) || !all_equal(c, kFillC)) return 1;
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(graph));
  std::printf("PASS capture_deps\n");
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "capture_deps") return capture_deps();
  if (mode == "into_graph") return into_graph();
  if (mode == "errors") return errors();
  if (mode == "abandon") return abandon();
  if (mode == "update") return update();
  if (mode == "child") return child();
  std::printf("FAIL unknown mode '%s' (into_graph, update, errors, abandon, child)\n",
              mode.c_str());
  return 2;
}
