// Stream capture records work instead of running it; graphs replay it; the capture rules of the
// real driver (no synchronization, no pageable copies, forks must be joined) hold.
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

constexpr int kElements = 1024;
constexpr unsigned kFillValue = 7;
constexpr int kReplays = 50;

void launch_increment(Session& s, CUstream stream, CUdeviceptr p, int n) {
  CUfunction inc = s.function("increment_i32");
  void* args[] = {&p, &n};
  REQUIRE_CU(s.sut.cuLaunchKernel(inc, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr));
}

CUstream second_stream(Session& s) {
  CUstream stream = nullptr;
  REQUIRE_CU(s.sut.cuGreenCtxStreamCreate(&stream, s.green, CU_STREAM_NON_BLOCKING, 0));
  return stream;
}

CUstreamCaptureStatus status_of(Session& s, CUstream stream) {
  CUstreamCaptureStatus status{};
  REQUIRE_CU(s.sut.cuStreamIsCapturing(stream, &status));
  return status;
}

std::size_t node_count(Session& s, CUgraph graph) {
  std::size_t n = 0;
  REQUIRE_CU(s.sut.cuGraphGetNodes(graph, nullptr, &n));
  return n;
}

TEST_CASE("a captured fork and join replays many times; capture itself runs nothing", "[graph]") {
  Session s;
  const CUstream side = second_stream(s);
  const CUevent fork = s.event(CU_EVENT_DISABLE_TIMING);
  const CUevent join = s.event(CU_EVENT_DISABLE_TIMING);
  const CUdeviceptr a = s.alloc(kElements * sizeof(int));
  const CUdeviceptr b = s.alloc(kElements * sizeof(int));
  s.upload(a, std::vector<int>(kElements, 100));
  s.upload(b, std::vector<int>(kElements, 200));

  REQUIRE_CU(s.sut.cuStreamBeginCapture_v2(s.stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(status_of(s, s.stream) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK(status_of(s, side) == CU_STREAM_CAPTURE_STATUS_NONE);
  launch_increment(s, s.stream, a, kElements);
  REQUIRE_CU(s.sut.cuEventRecordWithFlags(fork, s.stream, 0));
  REQUIRE_CU(s.sut.cuStreamWaitEvent(side, fork, 0));
  CHECK(status_of(s, side) == CU_STREAM_CAPTURE_STATUS_ACTIVE);  // joined through the event
  launch_increment(s, side, b, kElements);
  REQUIRE_CU(s.sut.cuMemsetD32Async(b + 4, kFillValue, 1, side));
  REQUIRE_CU(s.sut.cuEventRecordWithFlags(join, side, 0));
  REQUIRE_CU(s.sut.cuStreamWaitEvent(s.stream, join, 0));
  REQUIRE_CU(s.sut.cuMemcpyDtoDAsync_v2(a + 8, b + 4, sizeof(int), s.stream));
  CUstreamCaptureStatus status{};
  cuuint64_t id = 0;
  std::size_t deps = 0;
  REQUIRE_CU(
      s.sut.cuStreamGetCaptureInfo_v3(s.stream, &status, &id, nullptr, nullptr, nullptr, &deps));
  CHECK(id != 0);
  CHECK(deps == 1);
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuStreamEndCapture(s.stream, &graph));
  REQUIRE(graph != nullptr);
  CHECK(status_of(s, side) == CU_STREAM_CAPTURE_STATUS_NONE);

  s.sync();
  CHECK(s.download<int>(a, 1)[0] == 100);  // nothing ran while capturing
  CHECK(node_count(s, graph) == 4);        // kernel, kernel, memset, memcpy

  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, graph, 0));
  for (int i = 0; i < kReplays; ++i) REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  const std::vector<int> ha = s.download<int>(a, 4);
  const std::vector<int> hb = s.download<int>(b, 4);
  CHECK(ha[0] == 100 + kReplays);
  CHECK(ha[2] == static_cast<int>(kFillValue));  // the copy ran after the join
  CHECK(hb[0] == 200 + kReplays);
  CHECK(hb[1] == static_cast<int>(kFillValue));

  const int live = driver().live_objects();
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
  CHECK(driver().live_objects() == live - 2);
  REQUIRE_CU(s.sut.cuStreamDestroy_v2(side));
}

TEST_CASE("synchronizing or copying pageable memory in a capture invalidates it", "[graph]") {
  Session s;
  const CUdeviceptr p = s.alloc(kElements * sizeof(int));
  std::vector<int> pageable(kElements, 1);
  CUgraph graph = reinterpret_cast<CUgraph>(&pageable);

  SECTION("stream synchronize") {
    REQUIRE_CU(s.sut.cuStreamBeginCapture_v2(s.stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK_CU(s.sut.cuStreamSynchronize(s.stream), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  SECTION("stream query") {
    REQUIRE_CU(s.sut.cuStreamBeginCapture_v2(s.stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK_CU(s.sut.cuStreamQuery(s.stream), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  SECTION("a pageable host-to-device copy") {
    REQUIRE_CU(s.sut.cuStreamBeginCapture_v2(s.stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK_CU(s.sut.cuMemcpyHtoDAsync_v2(p, pageable.data(), sizeof(int), s.stream),
             CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  SECTION("a pageable device-to-host copy") {
    REQUIRE_CU(s.sut.cuStreamBeginCapture_v2(s.stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    CHECK_CU(s.sut.cuMemcpyDtoHAsync_v2(pageable.data(), p, sizeof(int), s.stream),
             CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  CHECK(status_of(s, s.stream) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CHECK_CU(s.sut.cuStreamEndCapture(s.stream, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK(graph == nullptr);
  CHECK(status_of(s, s.stream) == CU_STREAM_CAPTURE_STATUS_NONE);
  REQUIRE_CU(s.sut.cuStreamSynchronize(s.stream));  // usable again
}

TEST_CASE("capture rules: unjoined forks, foreign events, the wrong stream, twice", "[graph]") {
  Session s;
  const CUstream side = second_stream(s);
  const CUevent fork = s.event(CU_EVENT_DISABLE_TIMING);
  const CUevent outside = s.event(CU_EVENT_DISABLE_TIMING);
  const CUdeviceptr p = s.alloc(kElements * sizeof(int));
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuEventRecordWithFlags(outside, side, 0));

  REQUIRE_CU(s.sut.cuStreamBeginCapture_v2(s.stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK_CU(s.sut.cuStreamBeginCapture_v2(s.stream, CU_STREAM_CAPTURE_MODE_GLOBAL),
           CUDA_ERROR_ILLEGAL_STATE);
  REQUIRE_CU(s.sut.cuEventRecordWithFlags(fork, s.stream, 0));
  REQUIRE_CU(s.sut.cuStreamWaitEvent(side, fork, 0));
  launch_increment(s, side, p, kElements);
  CHECK_CU(s.sut.cuEventQuery(fork), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CHECK_CU(s.sut.cuStreamEndCapture(side, &graph), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
  CHECK_CU(s.sut.cuStreamEndCapture(s.stream, &graph), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
  CHECK(status_of(s, side) == CU_STREAM_CAPTURE_STATUS_NONE);

  REQUIRE_CU(s.sut.cuStreamBeginCapture_v2(s.stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK_CU(s.sut.cuStreamWaitEvent(s.stream, outside, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  CHECK_CU(s.sut.cuStreamEndCapture(s.stream, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CHECK_CU(s.sut.cuStreamBeginCapture_v2(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL),
           CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  REQUIRE_CU(s.sut.cuStreamDestroy_v2(side));
}

TEST_CASE("an executable graph takes a re-captured graph of the same shape", "[graph]") {
  Session s;
  const CUdeviceptr first = s.alloc(kElements * sizeof(int));
  const CUdeviceptr second = s.alloc(kElements * sizeof(int));
  s.upload(first, std::vector<int>(kElements, 0));
  s.upload(second, std::vector<int>(kElements, 0));
  auto capture = [&](CUdeviceptr target, int kernels) {
    CUgraph g = nullptr;
    REQUIRE_CU(s.sut.cuStreamBeginCapture_v2(s.stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    for (int i = 0; i < kernels; ++i) launch_increment(s, s.stream, target, kElements);
    REQUIRE_CU(s.sut.cuStreamEndCapture(s.stream, &g));
    return g;
  };
  CUgraph original = capture(first, 1);
  CUgraph retargeted = capture(second, 1);
  CUgraph longer = capture(second, 2);
  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, original, 0));

  CUgraphExecUpdateResultInfo info{};
  REQUIRE_CU(s.sut.cuGraphExecUpdate_v2(exec, retargeted, &info));
  CHECK(info.result == CU_GRAPH_EXEC_UPDATE_SUCCESS);
  CHECK_CU(s.sut.cuGraphExecUpdate_v2(exec, longer, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
  CHECK(info.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(s.download<int>(first, 1)[0] == 0);
  CHECK(s.download<int>(second, 1)[0] == 1);
  for (CUgraph g : {original, retargeted, longer}) REQUIRE_CU(s.sut.cuGraphDestroy(g));
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
}

TEST_CASE("explicitly built graphs run their nodes in dependency order", "[graph]") {
  Session s;
  const CUdeviceptr src = s.alloc(kElements * sizeof(int));
  const CUdeviceptr dst = s.alloc(kElements * sizeof(int));
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));

  CUgraphNode memset = nullptr, kernel = nullptr, copy = nullptr, empty = nullptr;
  CUDA_MEMSET_NODE_PARAMS fill{};
  fill.dst = src;
  fill.value = kFillValue;
  fill.elementSize = sizeof(int);
  fill.width = kElements;
  fill.height = 1;
  REQUIRE_CU(s.sut.cuGraphAddMemsetNode(&memset, graph, nullptr, 0, &fill, s.green_ctx));
  CUdeviceptr p = src;
  int n = kElements;
  void* args[] = {&p, &n};
  CUDA_KERNEL_NODE_PARAMS kp{};
  kp.func = s.function("increment_i32");
  kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = 32;
  kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = args;
  REQUIRE_CU(s.sut.cuGraphAddKernelNode_v2(&kernel, graph, &memset, 1, &kp));
  CUDA_MEMCPY3D cp{};
  cp.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  cp.srcDevice = src;
  cp.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  cp.dstDevice = dst;
  cp.WidthInBytes = kElements * sizeof(int);
  cp.Height = cp.Depth = 1;
  REQUIRE_CU(s.sut.cuGraphAddMemcpyNode(&copy, graph, nullptr, 0, &cp, s.green_ctx));
  REQUIRE_CU(s.sut.cuGraphAddEmptyNode(&empty, graph, nullptr, 0));
  REQUIRE_CU(s.sut.cuGraphAddDependencies_v2(graph, &kernel, &empty, nullptr, 1));
  REQUIRE_CU(s.sut.cuGraphAddDependencies_v2(graph, &empty, &copy, nullptr, 1));
  CHECK_CU(s.sut.cuGraphAddDependencies_v2(graph, &empty, &copy, nullptr, 1),
           CUDA_ERROR_INVALID_VALUE);
  CHECK(node_count(s, graph) == 4);

  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, graph, 0));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(s.download<int>(dst, kElements) == std::vector<int>(kElements, kFillValue + 1));
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
}

// fill_u32(p, value, n) as a kernel node: `kernel` a CUkernel (node context `ctx`), else a
// CUfunction; the arguments as kernelParams.
CUDA_KERNEL_NODE_PARAMS fill_node(CUfunction f, bool kernel, CUcontext ctx, void** args) {
  CUDA_KERNEL_NODE_PARAMS kp{};
  if (kernel) {
    kp.kern = reinterpret_cast<CUkernel>(f);
    kp.ctx = ctx;
  } else {
    kp.func = f;
  }
  kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
  kp.blockDimX = 32;
  kp.blockDimY = kp.blockDimZ = 1;
  kp.kernelParams = args;
  return kp;
}

TEST_CASE("a kernel node takes kernelParams only: `extra` is refused when added and when updated",
          "[graph]") {
  // As the real driver (H100, driver 580, tools/probes/graph_node_args.cpp).
  Session s;
  const CUdeviceptr p = s.alloc(kElements * sizeof(unsigned));
  s.upload(p, std::vector<unsigned>(kElements, 0));
  const CUfunction fill = s.function("fill_u32");
  CUdeviceptr dst = p;
  unsigned value = 1;
  int n = kElements;
  void* args[] = {&dst, &value, &n};
  struct {
    CUdeviceptr p;
    unsigned value;
    int n;
  } packed{p, 5, kElements};  // fill_u32's layout: 0 (8 bytes), 8 (4), 12 (4)
  std::size_t size = sizeof packed;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));

  CUDA_KERNEL_NODE_PARAMS kp = fill_node(fill, false, nullptr, nullptr);
  kp.extra = extra;
  CUgraphNode node = nullptr;
  CHECK_CU(s.sut.cuGraphAddKernelNode_v2(&node, graph, nullptr, 0, &kp), CUDA_ERROR_INVALID_VALUE);
  CHECK(node_count(s, graph) == 0);
  kp = fill_node(fill, false, nullptr, args);
  REQUIRE_CU(s.sut.cuGraphAddKernelNode_v2(&node, graph, nullptr, 0, &kp));
  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, graph, 0));

  // A refused update leaves the node as it was.
  kp = fill_node(fill, false, nullptr, nullptr);
  kp.extra = extra;
  CHECK_CU(s.sut.cuGraphExecKernelNodeSetParams_v2(exec, node, &kp), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(s.download<unsigned>(p, kElements) == std::vector<unsigned>(kElements, 1));
  value = 9;
  kp = fill_node(fill, false, nullptr, args);
  REQUIRE_CU(s.sut.cuGraphExecKernelNodeSetParams_v2(exec, node, &kp));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(s.download<unsigned>(p, kElements) == std::vector<unsigned>(kElements, 9));

  // A launch with `extra` on a capturing stream is still captured (the server launches that way).
  CUgraph captured = nullptr;
  REQUIRE_CU(s.sut.cuStreamBeginCapture_v2(s.stream, CU_STREAM_CAPTURE_MODE_RELAXED));
  REQUIRE_CU(s.sut.cuLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, s.stream, nullptr, extra));
  REQUIRE_CU(s.sut.cuStreamEndCapture(s.stream, &captured));
  CHECK(node_count(s, captured) == 1);
  CUgraphExec captured_exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&captured_exec, captured, 0));
  REQUIRE_CU(s.sut.cuGraphLaunch(captured_exec, s.stream));
  s.sync();
  CHECK(s.download<unsigned>(p, kElements) == std::vector<unsigned>(kElements, 5));

  REQUIRE_CU(s.sut.cuGraphExecDestroy(captured_exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(captured));
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
}

CUgraphNode memset_node(Session& s, CUgraph graph, CUdeviceptr dst, unsigned value) {
  CUDA_MEMSET_NODE_PARAMS p{};
  p.dst = dst;
  p.value = value;
  p.elementSize = sizeof(unsigned);
  p.width = kElements;
  p.height = 1;
  CUgraphNode node = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddMemsetNode(&node, graph, nullptr, 0, &p, s.ctx));
  return node;
}

// (from, to) of every edge of the graph.
std::vector<std::pair<CUgraphNode, CUgraphNode>> edges_of(Session& s, CUgraph graph) {
  std::size_t n = 0;
  REQUIRE_CU(s.sut.cuGraphGetEdges_v2(graph, nullptr, nullptr, nullptr, &n));
  std::vector<CUgraphNode> from(n), to(n);
  REQUIRE_CU(s.sut.cuGraphGetEdges_v2(graph, from.data(), to.data(), nullptr, &n));
  std::vector<std::pair<CUgraphNode, CUgraphNode>> edges;
  for (std::size_t i = 0; i < n; ++i) edges.emplace_back(from[i], to[i]);
  return edges;
}

TEST_CASE("a disabled kernel node runs nothing until enabled, then with its latest parameters",
          "[graph]") {
  Session s;
  const CUdeviceptr p = s.alloc(kElements * sizeof(unsigned));
  s.upload(p, std::vector<unsigned>(kElements, 0));
  const CUfunction fill = s.function("fill_u32");
  // A chain of three fills of the same words: 1, 2, 3. The last one to run decides.
  CUdeviceptr dst = p;
  int n = kElements;
  unsigned values[3] = {1, 2, 3};
  void* args[3][3] = {{&dst, &values[0], &n}, {&dst, &values[1], &n}, {&dst, &values[2], &n}};
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));
  CUgraphNode nodes[3] = {};
  for (int i = 0; i < 3; ++i) {
    CUDA_KERNEL_NODE_PARAMS kp = fill_node(fill, false, nullptr, args[i]);
    REQUIRE_CU(s.sut.cuGraphAddKernelNode_v2(&nodes[i], graph, i == 0 ? nullptr : &nodes[i - 1],
                                             i == 0 ? 0 : 1, &kp));
  }
  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, graph, 0));
  auto launch_and_read = [&] {
    REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
    s.sync();
    return s.download<unsigned>(p, kElements)[0];
  };
  CHECK(launch_and_read() == 3);

  REQUIRE_CU(s.sut.cuGraphNodeSetEnabled(exec, nodes[2], 0));
  CHECK(launch_and_read() == 2);
  // An update of a disabled node waits for it to be enabled.
  values[2] = 7;
  CUDA_KERNEL_NODE_PARAMS kp = fill_node(fill, false, nullptr, args[2]);
  REQUIRE_CU(s.sut.cuGraphExecKernelNodeSetParams_v2(exec, nodes[2], &kp));
  CHECK(launch_and_read() == 2);
  REQUIRE_CU(s.sut.cuGraphNodeSetEnabled(exec, nodes[2], 1));
  CHECK(launch_and_read() == 7);
  // Two disabled at the chain's end, then the middle one alone: its dependents still run.
  REQUIRE_CU(s.sut.cuGraphNodeSetEnabled(exec, nodes[1], 0));
  REQUIRE_CU(s.sut.cuGraphNodeSetEnabled(exec, nodes[2], 0));
  CHECK(launch_and_read() == 1);
  REQUIRE_CU(s.sut.cuGraphNodeSetEnabled(exec, nodes[2], 1));
  REQUIRE_CU(s.sut.cuGraphNodeSetEnabled(exec, nodes[2], 1));  // enabling twice is harmless
  CHECK(launch_and_read() == 7);
  // A node of no executable graph is refused.
  CHECK_CU(s.sut.cuGraphNodeSetEnabled(exec, reinterpret_cast<CUgraphNode>(&n), 0),
           CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
}

TEST_CASE("a capture into an existing graph adds its work after the nodes named, into that graph",
          "[graph]") {
  Session s;
  const CUdeviceptr a = s.alloc(kElements * sizeof(unsigned));
  const CUdeviceptr b = s.alloc(kElements * sizeof(unsigned));
  s.upload(a, std::vector<unsigned>(kElements, 0));
  s.upload(b, std::vector<unsigned>(kElements, 0));
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));
  const CUgraphNode set_a = memset_node(s, graph, a, 10);
  const CUgraphNode set_b = memset_node(s, graph, b, 20);

  REQUIRE_CU(s.sut.cuStreamBeginCaptureToGraph(s.stream, graph, &set_a, nullptr, 1,
                                               CU_STREAM_CAPTURE_MODE_GLOBAL));
  CHECK(status_of(s, s.stream) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CUgraph capturing_into = nullptr;
  CUstreamCaptureStatus status{};
  REQUIRE_CU(s.sut.cuStreamGetCaptureInfo_v3(s.stream, &status, nullptr, &capturing_into, nullptr,
                                             nullptr, nullptr));
  CHECK(capturing_into == graph);
  CHECK_CU(s.sut.cuStreamBeginCaptureToGraph(s.stream, graph, nullptr, nullptr, 0,
                                             CU_STREAM_CAPTURE_MODE_GLOBAL),
           CUDA_ERROR_ILLEGAL_STATE);
  launch_increment(s, s.stream, a, kElements);
  launch_increment(s, s.stream, a, kElements);
  CUgraph ended = nullptr;
  REQUIRE_CU(s.sut.cuStreamEndCapture(s.stream, &ended));
  CHECK(ended == graph);
  CHECK(s.download<unsigned>(a, kElements) == std::vector<unsigned>(kElements, 0));  // nothing ran

  // set_a -> first increment -> second increment; set_b stays on its own.
  REQUIRE(node_count(s, graph) == 4);
  std::vector<CUgraphNode> nodes(4);
  std::size_t n = nodes.size();
  REQUIRE_CU(s.sut.cuGraphGetNodes(graph, nodes.data(), &n));
  const std::vector<std::pair<CUgraphNode, CUgraphNode>> expected{{set_a, nodes[2]},
                                                                  {nodes[2], nodes[3]}};
  CHECK(edges_of(s, graph) == expected);
  CHECK(nodes[1] == set_b);

  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, graph, 0));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(s.download<unsigned>(a, kElements) == std::vector<unsigned>(kElements, 12));
  CHECK(s.download<unsigned>(b, kElements) == std::vector<unsigned>(kElements, 20));
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
}

TEST_CASE("a capture into a graph is refused a node of another graph and non-default edges",
          "[graph]") {
  Session s;
  CUgraph graph = nullptr, other = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));
  REQUIRE_CU(s.sut.cuGraphCreate(&other, 0));
  const CUdeviceptr p = s.alloc(kElements * sizeof(unsigned));
  const CUgraphNode mine = memset_node(s, graph, p, 1);
  const CUgraphNode foreign = memset_node(s, other, p, 2);
  CHECK_CU(s.sut.cuStreamBeginCaptureToGraph(s.stream, graph, &foreign, nullptr, 1,
                                             CU_STREAM_CAPTURE_MODE_GLOBAL),
           CUDA_ERROR_INVALID_VALUE);
  CUgraphEdgeData programmatic{};
  programmatic.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
  CHECK_CU(s.sut.cuStreamBeginCaptureToGraph(s.stream, graph, &mine, &programmatic, 1,
                                             CU_STREAM_CAPTURE_MODE_GLOBAL),
           CUDA_ERROR_NOT_SUPPORTED);
  CHECK_CU(s.sut.cuStreamBeginCaptureToGraph(s.stream, nullptr, nullptr, nullptr, 0,
                                             CU_STREAM_CAPTURE_MODE_GLOBAL),
           CUDA_ERROR_INVALID_VALUE);
  CHECK(status_of(s, s.stream) == CU_STREAM_CAPTURE_STATUS_NONE);
  REQUIRE_CU(s.sut.cuGraphDestroy(other));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
}

TEST_CASE("a CUfunction's node is updated only with the context current that it was added with",
          "[graph]") {
  // As the real driver (H100, driver 580, tools/probes/graph_node_args.cpp): a CUfunction's node
  // belongs to the context current when it was added, and an update with another one current
  // would move it. A CUkernel's node names its context, so any context may be current.
  Session s;
  const CUdeviceptr p = s.alloc(kElements * sizeof(unsigned));
  const CUdeviceptr q = s.alloc(kElements * sizeof(unsigned));
  s.upload(p, std::vector<unsigned>(kElements, 0));
  s.upload(q, std::vector<unsigned>(kElements, 0));
  static constexpr char kImage[] = "any bytes: the test driver finds kernels by name";
  CUlibrary lib = nullptr;
  REQUIRE_CU(s.sut.cuLibraryLoadData(&lib, kImage, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel = nullptr;
  REQUIRE_CU(s.sut.cuLibraryGetKernel(&kernel, lib, "fill_u32"));
  const CUfunction fill = s.function("fill_u32");
  const auto k = reinterpret_cast<CUfunction>(kernel);
  CUdeviceptr pf = p, pk = q;
  unsigned vf = 1, vk = 1;
  int n = kElements;
  void* fargs[] = {&pf, &vf, &n};
  void* kargs[] = {&pk, &vk, &n};

  // Built with the green context current, as the server builds a batch's graph.
  REQUIRE_CU(s.sut.cuCtxSetCurrent(s.green_ctx));
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));
  CUgraphNode fnode = nullptr, knode = nullptr;
  CUDA_KERNEL_NODE_PARAMS kp = fill_node(fill, false, nullptr, fargs);
  REQUIRE_CU(s.sut.cuGraphAddKernelNode_v2(&fnode, graph, nullptr, 0, &kp));
  kp = fill_node(k, true, s.green_ctx, kargs);
  REQUIRE_CU(s.sut.cuGraphAddKernelNode_v2(&knode, graph, &fnode, 1, &kp));
  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, graph, 0));

  // The primary context current (a server worker's usual one).
  REQUIRE_CU(s.sut.cuCtxSetCurrent(s.ctx));
  vf = 2;
  kp = fill_node(fill, false, nullptr, fargs);
  CHECK_CU(s.sut.cuGraphExecKernelNodeSetParams_v2(exec, fnode, &kp), CUDA_ERROR_INVALID_VALUE);
  vk = 3;
  kp = fill_node(k, true, s.green_ctx, kargs);
  CHECK_CU(s.sut.cuGraphExecKernelNodeSetParams_v2(exec, knode, &kp), CUDA_SUCCESS);
  vk = 30;
  kp = fill_node(k, true, s.ctx, kargs);  // the CUkernel's node moved to another context
  CHECK_CU(s.sut.cuGraphExecKernelNodeSetParams_v2(exec, knode, &kp), CUDA_ERROR_INVALID_VALUE);
  kp = fill_node(k, true, nullptr, kargs);  // NULL: the current one, the primary context
  CHECK_CU(s.sut.cuGraphExecKernelNodeSetParams_v2(exec, knode, &kp), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(s.download<unsigned>(p, kElements) == std::vector<unsigned>(kElements, 1));
  CHECK(s.download<unsigned>(q, kElements) == std::vector<unsigned>(kElements, 3));

  // With the green context current again, the CUfunction's node takes the update.
  REQUIRE_CU(s.sut.cuCtxSetCurrent(s.green_ctx));
  vf = 4;
  kp = fill_node(fill, false, nullptr, fargs);
  const CUresult again = s.sut.cuGraphExecKernelNodeSetParams_v2(exec, fnode, &kp);
  REQUIRE_CU(s.sut.cuCtxSetCurrent(s.ctx));
  CHECK_CU(again, CUDA_SUCCESS);
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(s.download<unsigned>(p, kElements) == std::vector<unsigned>(kElements, 4));

  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
  REQUIRE_CU(s.sut.cuLibraryUnload(lib));
}

}  // namespace
}  // namespace mpsshim::testdriver::test
