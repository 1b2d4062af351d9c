// Child graph nodes through the server, on the test driver: a captured kernel nested in another
// graph computes when the outer graph is launched, the embedded graph is handed out as an id the
// client may query but not destroy, an executable graph's child node takes another child, another
// client's ids are refused, and the session's end frees every graph.
#include <catch2/catch.hpp>

#include <span>
#include <vector>

#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {
namespace {

using batch::bits;
using proto::Op;
constexpr std::uint64_t kWords = 16;

struct Fixture : batch::Fixture {
  Fixture() : batch::Fixture(test_driver(), batch::no_batching()) {}

  // A graph that captured y += x (scale_add, alpha 1) on stream `s`.
  std::uint64_t captured_add(std::uint64_t s, std::uint64_t y, std::uint64_t x) {
    REQUIRE(sut.call(Op::kStreamBeginCapture,
                     proto::BeginCaptureReq{s, CU_STREAM_CAPTURE_MODE_RELAXED, 0})
                .result == CUDA_SUCCESS);
    launch(add, s, 1, 32, y, x, 1.0f, static_cast<int>(kWords));
    auto ended = sut.call(Op::kStreamEndCapture, proto::HandleReq{s});
    REQUIRE(ended.result == CUDA_SUCCESS);
    return ended.as<proto::EndCaptureRep>().graph;
  }
  std::uint64_t graph() {
    auto reply = sut.call(Op::kGraphCreate, proto::GraphCreateReq{ctx.ctx, 0, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::GraphRep>().handle;
  }
  proto::WireHandle memset_node(std::uint64_t graph, std::uint64_t dst, std::uint32_t value) {
    auto reply = sut.call(Op::kGraphAddMemsetNode,
                          proto::GraphMemsetNodeReq{{graph, 0, 0}, dst, 0, kWords, 1, value, 4});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::GraphRep>().handle;
  }
  Reply child_node(std::uint64_t graph, std::uint64_t child,
                   const std::vector<proto::WireHandle>& deps = {}) {
    return sut.call(
        Op::kGraphAddChildGraphNode,
        proto::GraphChildNodeReq{{graph, static_cast<std::uint32_t>(deps.size()), 0}, child},
        std::as_bytes(std::span(deps)));
  }
  Reply embedded(proto::WireHandle node) {
    return sut.call(Op::kGraphChildGraphNodeGetGraph, proto::HandleReq{node});
  }
  std::uint64_t instantiate(std::uint64_t graph) {
    auto inst = sut.call(Op::kGraphInstantiate, proto::GraphInstantiateReq{graph, 0, 0});
    REQUIRE(inst.result == CUDA_SUCCESS);
    return inst.as<proto::GraphInstantiateRep>().exec;
  }
  std::uint64_t node_total(std::uint64_t graph) {
    auto reply = sut.call(Op::kGraphGetNodes, proto::GraphGetNodesReq{graph, ~std::uint64_t{0}});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::GraphGetNodesRep>().total;
  }

  proto::FunctionRep add = function("scale_add");
};

TEST_CASE("a captured kernel in a child graph node computes when the outer graph is launched",
          "[server][graph][child_graph]") {
  Fixture f;
  const std::uint64_t s = f.stream();
  const std::uint64_t y = f.buffer(kWords * 4);
  const std::uint64_t z = f.buffer(kWords * 4);
  const std::uint64_t ones = f.buffer(kWords * 4);
  f.memset(s, ones, bits(1.0f), kWords);
  f.memset(s, z, bits(10.0f), kWords);
  REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
  const std::uint64_t child = f.captured_add(s, y, ones);
  const std::uint64_t other_child = f.captured_add(s, z, ones);

  const std::uint64_t outer = f.graph();
  const proto::WireHandle fill = f.memset_node(outer, y, bits(2.0f));
  auto added = f.child_node(outer, child, {fill});
  REQUIRE(added.result == CUDA_SUCCESS);
  const proto::WireHandle node = added.as<proto::GraphRep>().handle;
  // The driver cloned the child: destroying it leaves the node whole.
  f.sut.send(Op::kGraphDestroy, proto::HandleReq{child});

  auto inner = f.embedded(node);
  REQUIRE(inner.result == CUDA_SUCCESS);
  const std::uint64_t inner_id = inner.as<proto::GraphRep>().handle;
  CHECK(inner_id != child);
  CHECK(f.embedded(node).as<proto::GraphRep>().handle == inner_id);  // the same id again
  CHECK(f.node_total(inner_id) == 1);
  CHECK(f.embedded(fill).result == CUDA_ERROR_INVALID_VALUE);  // not a child graph node
  // The node owns it: destroying it is refused (one-way: the session's async error).
  f.sut.send(Op::kGraphDestroy, proto::HandleReq{inner_id});
  f.h.pump();
  CHECK(f.async_error() == CUDA_ERROR_INVALID_VALUE);
  CHECK(f.node_total(inner_id) == 1);

  const std::uint64_t exec = f.instantiate(outer);
  f.sut.send(Op::kGraphLaunch, proto::GraphLaunchReq{exec, s});
  REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
  CHECK(f.read<float>(y, kWords) == std::vector<float>(kWords, 3.0f));

  // The executable graph's child node takes another child of the same shape.
  REQUIRE(f.sut
              .call(Op::kGraphExecChildGraphNodeSetParams,
                    proto::GraphExecChildNodeReq{exec, node, other_child})
              .result == CUDA_SUCCESS);
  CHECK(f.sut
            .call(Op::kGraphExecChildGraphNodeSetParams,
                  proto::GraphExecChildNodeReq{exec, fill, other_child})
            .result == CUDA_ERROR_INVALID_VALUE);
  f.sut.send(Op::kGraphLaunch, proto::GraphLaunchReq{exec, s});
  REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
  CHECK(f.read<float>(z, kWords) == std::vector<float>(kWords, 11.0f));
  CHECK(f.read<float>(y, kWords) == std::vector<float>(kWords, 2.0f));  // refilled, not added

  // The embedded graph's id goes with the graph that holds the node.
  f.sut.send(Op::kGraphDestroy, proto::HandleReq{outer});
  CHECK(f.sut.call(Op::kGraphGetNodes, proto::GraphGetNodesReq{inner_id, 0}).result ==
        CUDA_ERROR_INVALID_HANDLE);
  CHECK(f.async_error() == CUDA_SUCCESS);
}

TEST_CASE("child graph nodes refuse another client's graphs and nodes, and malformed records",
          "[server][graph][child_graph]") {
  Fixture f;
  const std::uint64_t s = f.stream();
  const std::uint64_t y = f.buffer(kWords * 4);
  const std::uint64_t mine = f.captured_add(s, y, y);
  const std::uint64_t outer = f.graph();
  const proto::WireHandle node = f.child_node(outer, mine).as<proto::GraphRep>().handle;
  const std::uint64_t exec = f.instantiate(outer);

  TestClient other{f.h, default_hello(4124, "other")};
  const proto::CtxCreateRep other_ctx = other.create_context();
  auto created = other.call(Op::kGraphCreate, proto::GraphCreateReq{other_ctx.ctx, 0, 0});
  REQUIRE(created.result == CUDA_SUCCESS);
  const std::uint64_t others = created.as<proto::GraphRep>().handle;
  auto others_node = other.call(Op::kGraphAddEmptyNode, proto::GraphAddNodeHeader{others, 0, 0});
  REQUIRE(others_node.result == CUDA_SUCCESS);

  SECTION("ids of this session only") {
    // The other client's ids name nothing here (ids are salted per client).
    CHECK(f.child_node(outer, others).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(f.child_node(others, mine).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(f.embedded(others_node.as<proto::GraphRep>().handle).result == CUDA_ERROR_INVALID_VALUE);
    // And the other client cannot reach this one's.
    CHECK(other.call(Op::kGraphAddChildGraphNode, proto::GraphChildNodeReq{{others, 0, 0}, mine})
              .result == CUDA_ERROR_INVALID_VALUE);
    CHECK(other.call(Op::kGraphChildGraphNodeGetGraph, proto::HandleReq{node}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(other
              .call(Op::kGraphExecChildGraphNodeSetParams,
                    proto::GraphExecChildNodeReq{exec, node, others})
              .result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(f.sut
              .call(Op::kGraphExecChildGraphNodeSetParams,
                    proto::GraphExecChildNodeReq{exec, node, others})
              .result == CUDA_ERROR_INVALID_VALUE);
    // A dependency that is a node of another graph.
    const std::uint64_t second = f.graph();
    const proto::WireHandle foreign = f.child_node(second, mine).as<proto::GraphRep>().handle;
    CHECK(f.child_node(outer, mine, {foreign}).result == CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("a record whose dependency list is shorter than it says ends the session") {
    f.sut.send(Op::kGraphAddChildGraphNode, proto::GraphChildNodeReq{{outer, 2, 0}, mine}, 0);
    REQUIRE(f.h.pump_until([&] { return f.h.logged("dependency list"); }));
  }
  // The other client was never disturbed.
  CHECK(other.call(Op::kGraphGetNodes, proto::GraphGetNodesReq{others, 0}).result == CUDA_SUCCESS);
  // Both sessions freed before the next test's: the test driver keeps their registrations.
  other.hang_up();
  f.sut.hang_up();
  REQUIRE(f.h.pump_until([&] { return f.h.server->session_count() == 0; }));
}

TEST_CASE("a session's end frees its graphs with child nodes and their embedded graphs",
          "[server][graph][child_graph]") {
  const int live_before = live_driver_objects();
  const int graphs_before = batch::graph_objects();
  {
    Fixture f;
    const std::uint64_t s = f.stream();
    const std::uint64_t y = f.buffer(kWords * 4);
    const std::uint64_t child = f.captured_add(s, y, y);
    const std::uint64_t middle = f.graph();
    const proto::WireHandle inner_node = f.child_node(middle, child).as<proto::GraphRep>().handle;
    const std::uint64_t outer = f.graph();
    const proto::WireHandle node = f.child_node(outer, middle).as<proto::GraphRep>().handle;
    // Ids of embedded graphs, two deep, then the session ends holding them all.
    auto inner = f.embedded(node);
    REQUIRE(inner.result == CUDA_SUCCESS);
    CHECK(f.node_total(inner.as<proto::GraphRep>().handle) == 1);
    REQUIRE(f.embedded(inner_node).result == CUDA_SUCCESS);
    f.instantiate(outer);
    CHECK(batch::graph_objects() == graphs_before + 4);  // child, middle, outer, the exec
  }
  CHECK(batch::graph_objects() == graphs_before);
  CHECK(live_driver_objects() == live_before);
}

}  // namespace
}  // namespace mpsshim::server::test
