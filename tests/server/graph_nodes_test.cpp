// Event, host and memory nodes and a graph's shape through the server, on the test driver: graph
// memory is counted against the client's limit and given back with its graph, another client's
// events, nodes and memory are refused, malformed records end only their session, and the
// session's end frees every graph and its memory.
#include <catch2/catch.hpp>

#include <span>
#include <vector>

#include "proto/ops_graph_nodes.hpp"
#include "proto/ops_link.hpp"
#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;
constexpr std::uint64_t kMiB = 1 << 20;

proto::ClientHello limited_hello(std::uint64_t limit) {
  auto hello = default_hello(4125, "python3");
  hello.device_memory_limit = limit;
  return hello;
}

struct Fixture : batch::Fixture {
  explicit Fixture(proto::ClientHello hello = default_hello())
      : batch::Fixture(test_driver(), batch::no_batching(), hello) {}

  std::uint64_t graph() {
    auto reply = sut.call(Op::kGraphCreate, proto::GraphCreateReq{ctx.ctx, 0, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::GraphRep>().handle;
  }
  Reply alloc_node(std::uint64_t graph, std::uint64_t bytes) {
    return sut.call(Op::kGraphAddMemAllocNode, proto::GraphMemAllocNodeReq{{graph, 0, 0}, bytes});
  }
  Reply free_node(std::uint64_t graph, std::uint64_t dptr) {
    return sut.call(Op::kGraphAddMemFreeNode, proto::GraphMemFreeNodeReq{{graph, 0, 0}, dptr});
  }
  Reply event_node(std::uint64_t graph, std::uint64_t event, proto::GraphEventNodeKind kind) {
    return sut.call(
        Op::kGraphAddEventNode,
        proto::GraphEventNodeReq{{graph, 0, 0}, event, static_cast<std::uint32_t>(kind), 0});
  }
  std::uint64_t free_bytes() {
    auto reply = sut.call_empty(Op::kMemGetInfo);
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::MemGetInfoRep>().free_bytes;
  }
};

TEST_CASE("graph memory counts against the client's limit until its graph is destroyed",
          "[server][graph][graph_nodes]") {
  Fixture f(limited_hello(16 * kMiB));
  const std::uint64_t g = f.graph();
  auto first = f.alloc_node(g, 10 * kMiB);
  REQUIRE(first.result == CUDA_SUCCESS);
  const std::uint64_t dptr = first.as<proto::GraphMemAllocRep>().dptr;
  CHECK(dptr != 0);
  CHECK(f.free_bytes() <= 6 * kMiB);
  CHECK(f.alloc_node(g, 8 * kMiB).result == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(f.h.logged("graph memory"));
  // Its free node frees it in the graph; the graph still holds it (its next launch allocates it).
  REQUIRE(f.free_node(g, dptr).result == CUDA_SUCCESS);
  CHECK(f.free_bytes() <= 6 * kMiB);
  REQUIRE(f.sut.call(Op::kGraphDestroy, proto::HandleReq{g}).result == CUDA_SUCCESS);
  CHECK(f.free_bytes() == 16 * kMiB);
  // Memory of the client's that is not graph memory is no free node's.
  const std::uint64_t plain = f.buffer(4096);
  CHECK(f.free_node(f.graph(), plain).result == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("graph memory counts against the client's cap on allocations",
          "[server][graph][graph_nodes]") {
  ServerSettings settings = batch::no_batching();
  settings.client_limits.set(ClientLimit::kAllocations, 2);
  batch::Fixture f(test_driver(), settings);
  auto reply = f.sut.call(Op::kGraphCreate, proto::GraphCreateReq{f.ctx.ctx, 0, 0});
  REQUIRE(reply.result == CUDA_SUCCESS);
  const std::uint64_t g = reply.as<proto::GraphRep>().handle;
  auto alloc = [&] {
    return f.sut.call(Op::kGraphAddMemAllocNode, proto::GraphMemAllocNodeReq{{g, 0, 0}, 4096})
        .result;
  };
  CHECK(f.buffer(4096) != 0);  // a cuMemAlloc and a graph block share the cap
  CHECK(alloc() == CUDA_SUCCESS);
  CHECK(alloc() == CUDA_ERROR_OUT_OF_MEMORY);
}

TEST_CASE("graph nodes refuse another client's events, nodes and memory, and malformed records",
          "[server][graph][graph_nodes]") {
  Fixture f;
  const std::uint64_t g = f.graph();
  const std::uint64_t mine = f.event();
  REQUIRE(f.event_node(g, mine, proto::GraphEventNodeKind::kRecord).result == CUDA_SUCCESS);

  TestClient other{f.h, default_hello(4126, "other")};
  const proto::CtxCreateRep other_ctx = other.create_context();
  auto created = other.call(Op::kGraphCreate, proto::GraphCreateReq{other_ctx.ctx, 0, 0});
  REQUIRE(created.result == CUDA_SUCCESS);
  const std::uint64_t others = created.as<proto::GraphRep>().handle;
  auto others_alloc =
      other.call(Op::kGraphAddMemAllocNode, proto::GraphMemAllocNodeReq{{others, 0, 0}, 4096});
  REQUIRE(others_alloc.result == CUDA_SUCCESS);
  const proto::GraphMemAllocRep theirs = others_alloc.as<proto::GraphMemAllocRep>();

  SECTION("ids and memory of this session only") {
    CHECK(other.call(Op::kGraphAddEventNode, proto::GraphEventNodeReq{{others, 0, 0}, mine, 0, 0})
              .result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(f.free_node(g, theirs.dptr).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(
        f.sut.call(Op::kGraphNodeFindInClone, proto::GraphFindInCloneReq{theirs.node, g}).result ==
        CUDA_ERROR_INVALID_VALUE);
    CHECK(f.sut.call(Op::kGraphDestroyNode, proto::HandleReq{theirs.node}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(f.sut.call(Op::kGraphClone, proto::HandleReq{others}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(f.sut
              .call(Op::kGraphNodeParams,
                    proto::GraphNodeParamsReq{
                        0, theirs.node, mine,
                        static_cast<std::uint32_t>(proto::GraphNodeParam::kEvent), 1})
              .result == CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("an event node of an unknown kind ends the session") {
    f.sut.send(Op::kGraphAddEventNode, proto::GraphEventNodeReq{{g, 0, 0}, mine, 7, 0}, 0);
    REQUIRE(f.h.pump_until([&] { return f.h.logged("event node of unknown kind 7"); }));
  }
  SECTION("a host node without a callback ends the session") {
    f.sut.send(Op::kGraphAddHostNode, proto::GraphHostNodeReq{{g, 0, 0}, 0}, 0);
    REQUIRE(f.h.pump_until([&] { return f.h.logged("host node without a callback id"); }));
  }
  // The other client was never disturbed.
  CHECK(other.call(Op::kGraphGetNodes, proto::GraphGetNodesReq{others, 0}).result == CUDA_SUCCESS);
  other.hang_up();
  f.sut.hang_up();
  REQUIRE(f.h.pump_until([&] { return f.h.server->session_count() == 0; }));
}

TEST_CASE("a session's end frees graphs with event, host and memory nodes and their clones",
          "[server][graph][graph_nodes]") {
  const int live_before = live_driver_objects();
  const int graphs_before = batch::graph_objects();
  {
    Fixture f;
    const std::uint64_t g = f.graph();
    const std::uint64_t ev = f.event();
    auto record = f.event_node(g, ev, proto::GraphEventNodeKind::kRecord);
    REQUIRE(record.result == CUDA_SUCCESS);
    auto clone = f.sut.call(Op::kGraphClone, proto::HandleReq{g});
    REQUIRE(clone.result == CUDA_SUCCESS);
    auto found = f.sut.call(Op::kGraphNodeFindInClone,
                            proto::GraphFindInCloneReq{record.as<proto::GraphRep>().handle,
                                                       clone.as<proto::GraphRep>().handle});
    REQUIRE(found.result == CUDA_SUCCESS);
    const std::uint64_t m = f.graph();
    auto alloc = f.alloc_node(m, kMiB);
    REQUIRE(alloc.result == CUDA_SUCCESS);
    REQUIRE(f.sut.call(Op::kGraphInstantiate, proto::GraphInstantiateReq{m, 0, 0}).result ==
            CUDA_SUCCESS);
    CHECK(batch::graph_objects() == graphs_before + 4);  // g, its clone, m, m's exec
  }
  CHECK(batch::graph_objects() == graphs_before);
  CHECK(live_driver_objects() == live_before);
}

TEST_CASE(
    "conditional nodes name only this graph's handles; batch operations only the client's "
    "memory; a link's options must be plain numbers the record holds",
    "[server][graph][control]") {
  Fixture f;
  const std::uint64_t g = f.graph();
  const std::uint64_t other = f.graph();
  auto handle_of = [&](std::uint64_t graph) {
    auto reply = f.sut.call(Op::kGraphConditionalHandleCreate,
                            proto::GraphConditionalHandleReq{graph, 1, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::GraphNodeValueRep>().value;
  };
  const std::uint64_t mine = handle_of(g);
  const std::uint64_t foreign = handle_of(other);
  auto conditional = [&](std::uint64_t handle, std::uint32_t size) {
    return f.sut.call(
        Op::kGraphAddConditionalNode,
        proto::GraphConditionalNodeReq{{g, 0, 0}, handle, CU_GRAPH_COND_TYPE_IF, size});
  };
  CHECK(conditional(foreign, 1).result == CUDA_ERROR_INVALID_VALUE);
  CHECK(conditional(mine, proto::kMaxConditionalBodies + 1).result == CUDA_ERROR_INVALID_VALUE);
  auto added = conditional(mine, 2);
  REQUIRE(added.result == CUDA_SUCCESS);
  const auto rep = added.as<proto::GraphConditionalRep>();
  REQUIRE(rep.size == 2);
  // The bodies are the node's: nodes go into them, the client may not destroy them.
  CHECK(f.sut.call(Op::kGraphAddEmptyNode, proto::GraphAddNodeHeader{rep.bodies[0], 0, 0}).result ==
        CUDA_SUCCESS);
  CHECK(f.sut.call(Op::kGraphDestroy, proto::HandleReq{rep.bodies[1]}).result ==
        CUDA_ERROR_INVALID_VALUE);
  // Destroying the node forgets its bodies.
  REQUIRE(f.sut.call(Op::kGraphDestroyNode, proto::HandleReq{rep.node}).result == CUDA_SUCCESS);
  CHECK(f.sut.call(Op::kGraphAddEmptyNode, proto::GraphAddNodeHeader{rep.bodies[0], 0, 0}).result ==
        CUDA_ERROR_INVALID_HANDLE);

  // A batch operation on memory that is not the client's.
  const std::uint64_t flag = f.buffer(4096);
  auto batch = [&](std::uint64_t address) {
    proto::StreamMemOpReq op{0, address, 7,
                             static_cast<std::uint32_t>(proto::StreamMemOpKind::kWrite32), 0};
    return f.sut.call(Op::kGraphAddBatchMemOpNode, proto::GraphBatchMemOpNodeReq{{g, 0, 0}, 1, 0},
                      std::as_bytes(std::span(&op, 1)));
  };
  CHECK(batch(flag).result == CUDA_SUCCESS);
  CHECK(batch(flag + (64u << 20)).result == CUDA_ERROR_INVALID_VALUE);

  SECTION("a link option naming memory is refused") {
    proto::WireJitOption option{CU_JIT_INFO_LOG_BUFFER, 0, 0x1000};
    CHECK(f.sut
              .call(Op::kLinkCreate, proto::LinkCreateReq{f.ctx.ctx, 0, 0, 1, 0},
                    std::as_bytes(std::span(&option, 1)))
              .result == CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("a link whose options the record does not hold ends the session") {
    f.sut.send(Op::kLinkCreate, proto::LinkCreateReq{f.ctx.ctx, 0, 0, 3, 0}, 0);
    REQUIRE(
        f.h.pump_until([&] { return f.h.logged("link whose options the record does not hold"); }));
  }
}

}  // namespace
}  // namespace mpsshim::server::test
