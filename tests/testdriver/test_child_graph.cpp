// Child graph nodes: the child is cloned into the node (later changes to it do not show), the
// embedded graph is the node's and replays in its place, and an executable graph's child node
// takes another graph of the same shape.
#include <vector>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

constexpr int kElements = 256;
constexpr unsigned kFill = 40;

CUgraphNode memset_node(Session& s, CUgraph graph, CUdeviceptr dst, unsigned value,
                        const CUgraphNode* deps = nullptr, std::size_t count = 0) {
  CUDA_MEMSET_NODE_PARAMS fill{};
  fill.dst = dst;
  fill.value = value;
  fill.elementSize = sizeof(int);
  fill.width = kElements;
  fill.height = 1;
  CUgraphNode node = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddMemsetNode(&node, graph, deps, count, &fill, s.green_ctx));
  return node;
}

// A child graph that captured `increment_i32` on `p` (the way XLA builds its command buffers).
CUgraph captured_increment(Session& s, CUdeviceptr p) {
  CUgraph child = nullptr;
  REQUIRE_CU(s.sut.cuStreamBeginCapture_v2(s.stream, CU_STREAM_CAPTURE_MODE_RELAXED));
  int n = kElements;
  void* args[] = {&p, &n};
  REQUIRE_CU(s.sut.cuLaunchKernel(s.function("increment_i32"), 1, 1, 1, 256, 1, 1, 0, s.stream,
                                  args, nullptr));
  REQUIRE_CU(s.sut.cuStreamEndCapture(s.stream, &child));
  return child;
}

std::size_t node_count(Session& s, CUgraph graph) {
  std::size_t n = 0;
  REQUIRE_CU(s.sut.cuGraphGetNodes(graph, nullptr, &n));
  return n;
}

TEST_CASE("a child graph node replays a clone of its child after its dependencies",
          "[graph][child_graph]") {
  Session s;
  const CUdeviceptr a = s.alloc(kElements * sizeof(int));
  CUgraph child = captured_increment(s, a);
  CUgraph parent = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&parent, 0));
  const CUgraphNode fill = memset_node(s, parent, a, kFill);
  CUgraphNode node = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddChildGraphNode(&node, parent, &fill, 1, child));
  CHECK_CU(s.sut.cuGraphAddChildGraphNode(&node, parent, nullptr, 0, parent),
           CUDA_ERROR_INVALID_VALUE);
  // Cloned: the child may change or go away.
  memset_node(s, child, a, 999);
  REQUIRE_CU(s.sut.cuGraphDestroy(child));

  CUgraph embedded = nullptr;
  REQUIRE_CU(s.sut.cuGraphChildGraphNodeGetGraph(node, &embedded));
  CHECK(embedded != child);
  CHECK(node_count(s, embedded) == 1);
  CUgraph again = nullptr;
  REQUIRE_CU(s.sut.cuGraphChildGraphNodeGetGraph(node, &again));
  CHECK(again == embedded);
  CHECK_CU(s.sut.cuGraphChildGraphNodeGetGraph(fill, &again), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuGraphDestroy(embedded), CUDA_ERROR_INVALID_HANDLE);  // the node's

  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, parent, 0));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));
  s.sync();
  CHECK(s.download<int>(a, kElements) == std::vector<int>(kElements, kFill + 1));
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  REQUIRE_CU(s.sut.cuGraphDestroy(parent));
  // The embedded graph went with its node's graph.
  std::size_t count = 0;
  CHECK_CU(s.sut.cuGraphGetNodes(embedded, nullptr, &count), CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("an executable graph's child node takes another child of the same shape",
          "[graph][child_graph]") {
  Session s;
  const CUdeviceptr a = s.alloc(kElements * sizeof(int));
  const CUdeviceptr b = s.alloc(kElements * sizeof(int));
  const CUdeviceptr c = s.alloc(kElements * sizeof(int));
  s.upload(a, std::vector<int>(kElements, 10));
  s.upload(b, std::vector<int>(kElements, 20));
  CUgraph child_a = captured_increment(s, a);
  CUgraph child_b = captured_increment(s, b);
  CUgraph parent = nullptr;
  REQUIRE_CU(s.sut.cuGraphCreate(&parent, 0));
  CUgraphNode node = nullptr;
  REQUIRE_CU(s.sut.cuGraphAddChildGraphNode(&node, parent, nullptr, 0, child_a));
  const CUgraphNode after = memset_node(s, parent, c, 7, &node, 1);
  CUgraphExec exec = nullptr;
  REQUIRE_CU(s.sut.cuGraphInstantiateWithFlags(&exec, parent, 0));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));  // a + 1, then c = 7
  REQUIRE_CU(s.sut.cuGraphExecChildGraphNodeSetParams(exec, node, child_b));
  REQUIRE_CU(s.sut.cuGraphLaunch(exec, s.stream));  // b + 1 instead
  s.sync();
  CHECK(s.download<int>(a, 1) == std::vector<int>{11});
  CHECK(s.download<int>(b, 1) == std::vector<int>{21});
  CHECK(s.download<int>(c, 1) == std::vector<int>{7});
  // Another shape, or a node that is no child graph node, is refused.
  CUgraph two = captured_increment(s, b);
  memset_node(s, two, b, 1);
  CHECK_CU(s.sut.cuGraphExecChildGraphNodeSetParams(exec, node, two), CUDA_ERROR_INVALID_VALUE);
  CHECK_CU(s.sut.cuGraphExecChildGraphNodeSetParams(exec, after, child_b),
           CUDA_ERROR_INVALID_VALUE);
  REQUIRE_CU(s.sut.cuGraphExecDestroy(exec));
  for (CUgraph g : {parent, child_a, child_b, two}) REQUIRE_CU(s.sut.cuGraphDestroy(g));
}

}  // namespace
}  // namespace mpsshim::testdriver::test
