// Graph nodes beyond kernels, memsets and copies in the test driver, held to what the real driver
// was measured to do (H200, driver 580; graph_nodes.cpp says what): event nodes bound at launch,
// host nodes at every replay, graph memory and what a graph holding it may not do, and the
// calls that change a graph's shape.
#include <dlfcn.h>

#include <atomic>
#include <vector>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

constexpr int kElements = 256;

// An entry point the server's table does not list, straight from the test driver.
template <typename Fn>
Fn entry_point(const char* name) {
  void* symbol = ::dlsym(driver().handle, name);
  REQUIRE(symbol != nullptr);
  return reinterpret_cast<Fn>(symbol);
}

CUgraphNode memset_node(Session& s, CUgraph graph, CUdeviceptr dst, unsigned value,
                        std::vector<CUgraphNode> deps = {}) {
  CUDA_MEMSET_NODE_PARAMS fill{};
  fill.dst = dst;
  fill.value = value;
  fill.elementSize = sizeof(int);
  fill.width = kElements;
  fill.height = 1;
  CUgraphNode node = nullptr;
  REQUIRE_CU(
      s.sut.cuGraphAddMemsetNode(&node, graph, deps.data(), deps.size(), &fill, s.green_ctx));
  return node;
}

std::atomic<int> g_calls{0};
std::atomic<int> g_other_calls{0};
std::atomic<bool> g_open{false};
void CUDA_CB count(void*) {
  ++g_calls;
}
void CUDA_CB count_other(void*) {
  ++g_other_calls;
}
void CUDA_CB gate(void*) {
  while (!g_open.load()) {
  }
}

TEST_CASE("an event record node is pending from its graph's launch; a wait node waits for it",
          "[graph][graph_nodes]") {
  Session s;
  const CUdeviceptr a = s.alloc(kElements * sizeof(int));
  const CUdeviceptr b = s.alloc(kElements * sizeof(int));
  CUevent ev = s.event(CU_EVENT_DISABLE_TIMING);
  CUgraph producer = nullptr, consumer = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&producer, 0));
  REQUIRE_CU(s.sut.cuGraphCreate(&consumer, 0));
  const CUgraphNode fill = memset_node(s, producer, a, 9);
  CUgraphNode record = nullptr, wait = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddEventRecordNode(&record, producer, &fill, 1, ev));
  CHECK_CU(s.sut.cuGraphAddEventRecordNode(&record, producer, nullptr, 0, nullptr),
           CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphAddEventWaitNode(&wait, consumer, nullptr, 0, ev));
  CUDA_MEMCPY3D copy{};
  copy.srcMemoryType = copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.srcDevice = a;
  copy.dstDevice = b;
  copy.WidthInBytes = kElements * sizeof(int);
  copy.Height = copy.Depth = 1;
  CUgraphNode copied = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddMemcpyNode(&copied, consumer, &wait, 1, &copy, s.green_ctx));

  auto get_record =
      entry_point<CUresult(CUDAAPI*)(CUgraphNode, CUevent*)>("cuGraphEventRecordNodeGetEvent");
  CUevent got = nullptr;
  REQUIRE_CU(get_record(record, &got));
  CHECK(got == ev);
  CHECK_CU(get_record(wait, &got), CUDA_ERROR_INVALID_VALUE);

  CUgraphExec px = nullptr, cx = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&px, producer, 0));
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&cx, consumer, 0));
  CUstream other = nullptr;
  REQUIRE_CU(s.sut.cuGreenCtxStreamCreate(&other, s.green, CU_STREAM_NON_BLOCKING, 0));
  g_open = false;
  REQUIRE_CU(s.sut.cuLaunchHostFunc(s.stream, gate, nullptr));
  REQUIRE_CU(s.sut.cuGraphLaunch(px, s.stream));
  CHECK_CU(s.sut.cuEventQuery(ev), CUDA_ERROR_NOT_READY);
  REQUIRE_CU(s.sut.cuGraphLaunch(cx, other));
  CHECK_CU(s.sut.cuStreamQuery(other), CUDA_ERROR_NOT_READY);
  g_open = true;
  REQUIRE_CU(s.sut.cuStreamSynchronize(other));
  CHECK(s.download<int>(b, kElements) == std::vector<int>(kElements, 9));
  CHECK_CU(s.sut.cuEventQuery(ev), CUDA_SUCCESS);
  s.sync();
  REQUIRE_CU(s.sut.cuStreamDestroy_v2(other));
  REQUIRE_CU(s.sut.cuGraphExecDestroy(px));
  REQUIRE_CU(s.sut.cuGraphExecDestroy(cx));
  REQUIRE_CU(s.sut.cuGraphDestroy(producer));
  REQUIRE_CU(s.sut.cuGraphDestroy(consumer));
}

TEST_CASE("a host node runs at every replay; an executable graph's copy changes apart",
          "[graph][graph_nodes]") {
  Session s;
  g_calls = 0;
  g_other_calls = 0;
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));
  CUDA_HOST_NODE_PARAMS host{count, nullptr};
  CUgraphNode node = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddHostNode(&node, graph, nullptr, 0, &host));
  CUDA_HOST_NODE_PARAMS no_fn{nullptr, nullptr};
  CUgraphNode refused = nullptr;
  CHECK_CU(s.sut.cuGraphAddHostNode(&refused, graph, nullptr, 0, &no_fn), CUDA_ERROR_INVALID_VALUE);
  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(g_calls == 3);
  CUDA_HOST_NODE_PARAMS other{count_other, nullptr};
  REQUIRE_CU(s.sut.cuGraphHostNodeSetParams(node, &other));  // not the executable graph's
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(g_calls == 4);
  CHECK(g_other_calls == 0);
  REQUIRE_CU(s.sut.cuGraphExecHostNodeSetParams(exec, node, &other));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(g_other_calls == 1);
  CHECK_CU(s.sut.cuGraphNodeSetEnabled(exec, node, 0), CUDA_ERROR_INVALID_VALUE);  // measured
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
}

TEST_CASE(
    "graph memory keeps its address; a graph holding it may not be cloned, changed or "
    "instantiated twice",
    "[graph][graph_nodes]") {
  Session s;
  const CUdeviceptr out = s.alloc(kElements * sizeof(int));
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS p{};
  p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.poolProps.location = {CU_MEM_LOCATION_TYPE_DEVICE, static_cast<int>(s.device)};
  p.bytesize = kElements * sizeof(int);
  CUgraphNode alloc = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddMemAllocNode(&alloc, graph, nullptr, 0, &p));
  REQUIRE(p.dptr != 0);
  const CUgraphNode fill = memset_node(s, graph, p.dptr, 5, {alloc});
  CUDA_MEMCPY3D copy{};
  copy.srcMemoryType = copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.srcDevice = p.dptr;
  copy.dstDevice = out;
  copy.WidthInBytes = kElements * sizeof(int);
  copy.Height = copy.Depth = 1;
  CUgraphNode copied = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddMemcpyNode(&copied, graph, &fill, 1, &copy, s.green_ctx));
  // A free of memory that is not graph memory (measured); then the graph's own.
  CUgraphNode freed = nullptr;
  CHECK_CU(s.sut.cuGraphAddMemFreeNode(&freed, graph, nullptr, 0, out), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphAddMemFreeNode(&freed, graph, &copied, 1, p.dptr));
  CHECK_CU(s.sut.cuGraphAddMemFreeNode(&freed, graph, &copied, 1, p.dptr),
           CUDA_ERROR_INVALID_VALUE);  // freed once at most

  CUgraph clone = nullptr;
  CHECK_CU(s.sut.cuGraphClone(&clone, graph), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_CU(s.sut.cuGraphDestroyNode(copied), CUDA_ERROR_NOT_SUPPORTED);
  CHECK_CU(s.sut.cuGraphRemoveDependencies_v2(graph, &fill, &copied, nullptr, 1),
           CUDA_ERROR_NOT_SUPPORTED);
  CUgraphExec exec = nullptr, second = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, graph, 0));
  CHECK_CU(s.sut.cuGraphInstantiateWithFlags(&second, graph, 0), CUDA_ERROR_NOT_SUPPORTED);
  for (int i = 0; i < 2; ++i) REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(s.download<int>(out, kElements) == std::vector<int>(kElements, 5));
  cuuint64_t used = 0;
  REQUIRE_CU(
      s.sut.cuDeviceGetGraphMemAttribute(s.device, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used));
  CHECK(used >= p.bytesize);
  cuuint64_t five = 5;
  CHECK_CU(s.sut.cuDeviceSetGraphMemAttribute(s.device, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &five),
           CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
  REQUIRE_CU(
      s.sut.cuDeviceGetGraphMemAttribute(s.device, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used));
  CHECK(used == 0);  // released with the graph and its executable graph
}

TEST_CASE("graph memory a graph does not free must be freed before its next launch",
          "[graph][graph_nodes]") {
  Session s;
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS p{};
  p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.poolProps.location = {CU_MEM_LOCATION_TYPE_DEVICE, static_cast<int>(s.device)};
  p.bytesize = 4096;
  CUgraphNode alloc = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddMemAllocNode(&alloc, graph, nullptr, 0, &p));
  CUDA_MEM_ALLOC_NODE_PARAMS zero = p;
  zero.bytesize = 0;
  CHECK_CU(s.sut.cuGraphAddMemAllocNode(&alloc, graph, nullptr, 0, &zero),
           CUDA_ERROR_INVALID_VALUE);
  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, graph, 0));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  CHECK_CU(s.sut.cuGraphLaunch(exec, s.stream), CUDA_ERROR_INVALID_VALUE);  // measured
  REQUIRE_CU(s.sut.cuMemFreeAsync(p.dptr, s.stream));
  CHECK_CU(s.sut.cuMemFreeAsync(p.dptr, s.stream), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  REQUIRE_CU(s.sut.cuMemFree_v2(p.dptr));
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
}

TEST_CASE("a node destroyed, an edge removed, a clone and its nodes", "[graph][graph_nodes]") {
  Session s;
  g_calls = 0;
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));
  CUDA_HOST_NODE_PARAMS host{count, nullptr};
  CUgraphNode first = nullptr, second = nullptr, third = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddHostNode(&first, graph, nullptr, 0, &host));
  REQUIRE_CU(s.sut.cuGraphAddHostNode(&second, graph, &first, 1, &host));
  REQUIRE_CU(s.sut.cuGraphAddHostNode(&third, graph, &second, 1, &host));
  CHECK_CU(s.sut.cuGraphRemoveDependencies_v2(graph, &second, &first, nullptr, 1),
           CUDA_ERROR_INVALID_VALUE);  // no such edge (measured)
  REQUIRE_CU(s.sut.cuGraphRemoveDependencies_v2(graph, &first, &second, nullptr, 1));
  REQUIRE_CU(s.sut.cuGraphDestroyNode(third));
  std::size_t nodes = 0, edges = 0;
  REQUIRE_CU(s.sut.cuGraphGetNodes(graph, nullptr, &nodes));
  REQUIRE_CU(s.sut.cuGraphGetEdges_v2(graph, nullptr, nullptr, nullptr, &edges));
  CHECK(nodes == 2);
  CHECK(edges == 0);

  CUgraph clone = nullptr;
  REQUIRE_CU(s.sut.cuGraphClone(&clone, graph));
  CUgraphNode in_clone = nullptr;
  REQUIRE_CU(s.sut.cuGraphNodeFindInClone(&in_clone, first, clone));
  CHECK(in_clone != first);
  CHECK_CU(s.sut.cuGraphNodeFindInClone(&in_clone, in_clone, graph), CUDA_ERROR_INVALID_VALUE);
  CUDA_HOST_NODE_PARAMS other{count_other, nullptr};
  REQUIRE_CU(s.sut.cuGraphHostNodeSetParams(in_clone, &other));
  auto get_host = entry_point<CUresult(CUDAAPI*)(CUgraphNode, CUDA_HOST_NODE_PARAMS*)>(
      "cuGraphHostNodeGetParams");
  CUDA_HOST_NODE_PARAMS got{};
  REQUIRE_CU(get_host(first, &got));
  CHECK(got.fn == count);  // the original's is its own
  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, clone, 0));
  g_other_calls = 0;
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(g_calls == 1);
  CHECK(g_other_calls == 1);
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(clone));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
}

TEST_CASE("a kernel node's own new parameters reach later instantiations only",
          "[graph][graph_nodes]") {
  Session s;
  const CUdeviceptr a = s.alloc(kElements * sizeof(int));
  const CUdeviceptr b = s.alloc(kElements * sizeof(int));
  s.upload(a, std::vector<int>(kElements, 10));
  s.upload(b, std::vector<int>(kElements, 20));
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));
  int n = kElements;
  CUdeviceptr target = a;
  void* args[] = {&target, &n};
  CUDA_KERNEL_NODE_PARAMS k{};
  k.func = s.function("increment_i32");
  k.gridDimX = k.gridDimY = k.gridDimZ = 1;
  k.blockDimX = 256;
  k.blockDimY = k.blockDimZ = 1;
  k.kernelParams = args;
  CUgraphNode node = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddKernelNode_v2(&node, graph, nullptr, 0, &k));
  CUgraphExec before = nullptr, after = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&before, graph, 0));
  target = b;
  REQUIRE_CU(s.sut.cuGraphKernelNodeSetParams_v2(node, &k));
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&after, graph, 0));
  REQUIRE_CU(s.sut.cuGraphLaunch(before, s.stream));
  REQUIRE_CU(s.sut.cuGraphLaunch(after, s.stream));
  s.sync();
  CHECK(s.download<int>(a, kElements) == std::vector<int>(kElements, 11));
  CHECK(s.download<int>(b, kElements) == std::vector<int>(kElements, 21));
  const CUgraphNode fill = memset_node(s, graph, a, 1);
  CHECK_CU(s.sut.cuGraphKernelNodeSetParams_v2(fill, &k), CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphExecDestroy(before));
  REQUIRE_CU(s.sut.cuGraphExecDestroy(after));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
}

TEST_CASE("memset and memcpy nodes take new parameters in the graph and in an executable graph",
          "[graph][graph_nodes]") {
  Session s;
  const CUdeviceptr a = s.alloc(kElements * sizeof(int));
  const CUdeviceptr b = s.alloc(kElements * sizeof(int));
  const CUdeviceptr c = s.alloc(kElements * sizeof(int));
  CUgraph graph = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&graph, 0));
  const CUgraphNode fill = memset_node(s, graph, a, 3);
  CUDA_MEMCPY3D copy{};
  copy.srcMemoryType = copy.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  copy.srcDevice = a;
  copy.dstDevice = b;
  copy.WidthInBytes = kElements * sizeof(int);
  copy.Height = copy.Depth = 1;
  CUgraphNode copied = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddMemcpyNode(&copied, graph, &fill, 1, &copy, s.green_ctx));
  CUgraphExec before = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&before, graph, 0));
  // The graph's nodes: fill 4, copy into c; the executable graph made before keeps 3 into b.
  CUDA_MEMSET_NODE_PARAMS four{};
  four.dst = a;
  four.value = 4;
  four.elementSize = sizeof(int);
  four.width = kElements;
  four.height = 1;
  REQUIRE_CU(s.sut.cuGraphMemsetNodeSetParams(fill, &four));
  CUDA_MEMCPY3D to_c = copy;
  to_c.dstDevice = c;
  REQUIRE_CU(s.sut.cuGraphMemcpyNodeSetParams(copied, &to_c));
  CHECK_CU(s.sut.cuGraphMemsetNodeSetParams(copied, &four), CUDA_ERROR_INVALID_VALUE);
  CUgraphExec after = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&after, graph, 0));
  REQUIRE_CU(s.sut.cuGraphLaunch(before, s.stream));
  s.sync();
  CHECK(s.download<int>(b, kElements) == std::vector<int>(kElements, 3));
  REQUIRE_CU(s.sut.cuGraphLaunch(after, s.stream));
  s.sync();
  CHECK(s.download<int>(c, kElements) == std::vector<int>(kElements, 4));
  // The executable graph made before: fill 5, copy into c.
  CUDA_MEMSET_NODE_PARAMS five = four;
  five.value = 5;
  REQUIRE_CU(s.sut.cuGraphExecMemsetNodeSetParams(before, fill, &five, s.green_ctx));
  REQUIRE_CU(s.sut.cuGraphExecMemcpyNodeSetParams(before, copied, &to_c, s.green_ctx));
  CHECK_CU(s.sut.cuGraphExecMemcpyNodeSetParams(before, fill, &to_c, s.green_ctx),
           CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphLaunch(before, s.stream));
  s.sync();
  CHECK(s.download<int>(c, kElements) == std::vector<int>(kElements, 5));
  CHECK(s.download<int>(b, kElements) == std::vector<int>(kElements, 3));
  REQUIRE_CU(s.sut.cuGraphExecDestroy(before));
  REQUIRE_CU(s.sut.cuGraphExecDestroy(after));
  REQUIRE_CU(s.sut.cuGraphDestroy(graph));
}

}  // namespace
}  // namespace mpsshim::testdriver::test
