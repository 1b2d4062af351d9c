// Capture into an existing graph (cuStreamBeginCaptureToGraph) through the server, on the test
// driver: the captured work becomes nodes of the client's own graph after the nodes it named, the
// end of the capture hands back the same graph id, the graph computes when launched, and the
// graph is never lost to a failed capture nor left half-captured at the session's end.
#include <catch2/catch.hpp>

#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;
constexpr std::uint64_t kBytes = 4096;
constexpr std::uint32_t kSetA = 77;
constexpr std::uint32_t kSetB = 5;
constexpr std::uint32_t kCaptured = 9;

using Edge = std::pair<proto::WireHandle, proto::WireHandle>;

struct Fixture {
  Harness h{test_driver(), ServerSettings{}};
  TestClient sut{h};
  proto::CtxCreateRep ctx = sut.create_context();

  int clients = 1;  // sessions this fixture's harness admitted (a test may add one)

  // Every session freed before the next fixture's: the test driver keeps its registrations.
  ~Fixture() {
    sut.hang_up();
    h.pump_until([&] {
      return h.count_logged("freed") + h.count_logged("nothing to free") >=
             static_cast<std::size_t>(clients);
    });
  }

  std::uint64_t stream() {
    auto reply =
        sut.call(Op::kStreamCreate, proto::StreamCreateReq{ctx.ctx, CU_STREAM_NON_BLOCKING, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::StreamCreateRep>().stream;
  }
  std::uint64_t graph() {
    auto reply = sut.call(Op::kGraphCreate, proto::GraphCreateReq{ctx.ctx, 0, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::GraphRep>().handle;
  }
  proto::WireHandle memset_node(std::uint64_t graph, std::uint64_t dst, std::uint32_t value) {
    auto reply =
        sut.call(Op::kGraphAddMemsetNode,
                 proto::GraphMemsetNodeReq{{graph, 0, 0}, dst, 0, kBytes / 4, 1, value, 4});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::GraphRep>().handle;
  }
  CUresult begin(std::uint64_t stream, std::uint64_t graph,
                 const std::vector<proto::WireHandle>& deps) {
    return sut
        .call(Op::kStreamBeginCaptureToGraph,
              proto::BeginCaptureToGraphReq{stream, graph, CU_STREAM_CAPTURE_MODE_GLOBAL,
                                            static_cast<std::uint32_t>(deps.size())},
              std::as_bytes(std::span(deps)))
        .result;
  }
  Reply end(std::uint64_t stream) {
    return sut.call(Op::kStreamEndCapture, proto::HandleReq{stream});
  }
  std::vector<Edge> edges(std::uint64_t graph) {
    auto reply = sut.call(Op::kGraphGetEdges, proto::GraphGetEdgesReq{graph, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    const auto rep = reply.as<proto::GraphGetEdgesRep>();
    REQUIRE(rep.count == rep.total);
    std::vector<Edge> out;
    for (std::uint64_t i = 0; i < rep.count; ++i) {
      CHECK(rep.edges[i].type == CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
      out.emplace_back(rep.edges[i].from, rep.edges[i].to);
    }
    return out;
  }
  std::vector<proto::WireHandle> nodes(std::uint64_t graph) {
    auto reply = sut.call(Op::kGraphGetNodes, proto::GraphGetNodesReq{graph, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    const auto rep = reply.as<proto::GraphGetNodesRep>();
    return {rep.nodes, rep.nodes + rep.count};
  }
  // Instantiates and launches the graph, then waits for it.
  void run(std::uint64_t graph, std::uint64_t stream) {
    auto inst = sut.call(Op::kGraphInstantiate, proto::GraphInstantiateReq{graph, 0, 0});
    REQUIRE(inst.result == CUDA_SUCCESS);
    sut.send(Op::kGraphLaunch,
             proto::GraphLaunchReq{inst.as<proto::GraphInstantiateRep>().exec, stream});
    REQUIRE(sut.call(Op::kStreamSynchronize, proto::HandleReq{stream}).result == CUDA_SUCCESS);
  }
  // The first word at dptr, through a staged copy on the default stream.
  std::uint32_t read(std::uint64_t dptr, std::uint32_t generation) {
    sut.send(Op::kCopyDtoH,
             proto::CopyHostReq{ctx.default_stream, dptr, 4,
                                proto::HostRef{1, 0, proto::HostKind::kStagingChunk, generation}});
    REQUIRE(h.pump_until(
        [&] { return sut.view().chunk_state(1)->done_generation.load() == generation; }));
    std::uint32_t value = 0;
    std::memcpy(&value, sut.view().chunk(1), sizeof value);
    return value;
  }
};

TEST_CASE("a capture into an empty graph fills that graph and hands back its id",
          "[server][graph][capture_to_graph]") {
  Fixture f;
  const std::uint64_t a = f.sut.alloc(f.ctx.ctx, kBytes);
  const std::uint64_t s = f.stream();
  const std::uint64_t graph = f.graph();

  REQUIRE(f.begin(s, graph, {}) == CUDA_SUCCESS);
  auto info = f.sut.call(Op::kStreamCaptureInfo, proto::HandleReq{s});
  REQUIRE(info.result == CUDA_SUCCESS);
  CHECK(info.as<proto::CaptureInfoRep>().status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK(info.as<proto::CaptureInfoRep>().graph == graph);
  f.sut.send(Op::kMemset, proto::MemsetReq{s, a, 0, kBytes / 4, 1, kCaptured, 4});
  auto ended = f.end(s);
  REQUIRE(ended.result == CUDA_SUCCESS);
  CHECK(ended.as<proto::EndCaptureRep>().graph == graph);
  CHECK(f.nodes(graph).size() == 1);
  CHECK(f.edges(graph).empty());
  CHECK(f.read(a, 1) == 0);  // captured, not run

  f.run(graph, s);
  CHECK(f.read(a, 2) == kCaptured);
  CHECK(f.sut.control()->async_error.load() == 0);
}

TEST_CASE("a capture into a graph with nodes goes after the dependencies named, and only those",
          "[server][graph][capture_to_graph]") {
  Fixture f;
  const std::uint64_t a = f.sut.alloc(f.ctx.ctx, kBytes);
  const std::uint64_t b = f.sut.alloc(f.ctx.ctx, kBytes);
  const std::uint64_t c = f.sut.alloc(f.ctx.ctx, kBytes);
  const std::uint64_t s = f.stream();
  const std::uint64_t graph = f.graph();
  const proto::WireHandle set_a = f.memset_node(graph, a, kSetA);
  const proto::WireHandle set_b = f.memset_node(graph, b, kSetB);

  REQUIRE(f.begin(s, graph, {set_a}) == CUDA_SUCCESS);
  f.sut.send(Op::kCopyDtoD, proto::CopyDtoDReq{s, c, a, kBytes});  // needs set_a before it
  f.sut.send(Op::kMemset, proto::MemsetReq{s, a, 0, kBytes / 4, 1, kCaptured, 4});
  auto ended = f.end(s);
  REQUIRE(ended.result == CUDA_SUCCESS);
  CHECK(ended.as<proto::EndCaptureRep>().graph == graph);

  // set_a -> copy -> memset; set_b stands alone.
  const std::vector<proto::WireHandle> nodes = f.nodes(graph);
  REQUIRE(nodes.size() == 4);
  CHECK(nodes[0] == set_a);
  CHECK(nodes[1] == set_b);
  const std::vector<Edge> expected{{set_a, nodes[2]}, {nodes[2], nodes[3]}};
  CHECK(f.edges(graph) == expected);

  f.run(graph, s);
  CHECK(f.read(c, 1) == kSetA);      // the copy ran after set_a
  CHECK(f.read(a, 2) == kCaptured);  // and the captured memset after the copy
  CHECK(f.read(b, 3) == kSetB);
  CHECK(f.sut.control()->async_error.load() == 0);
}

TEST_CASE("a capture into a graph is refused what is not the client's or not allowed",
          "[server][graph][capture_to_graph]") {
  Fixture f;
  const std::uint64_t s = f.stream();
  const std::uint64_t other_stream = f.stream();
  const std::uint64_t graph = f.graph();
  const std::uint64_t second_graph = f.graph();
  const proto::WireHandle foreign_node =
      f.memset_node(second_graph, f.sut.alloc(f.ctx.ctx, kBytes), kSetA);
  TestClient other{f.h, default_hello(4124, "other")};
  ++f.clients;
  const proto::CtxCreateRep other_ctx = other.create_context();
  auto other_graph = other.call(Op::kGraphCreate, proto::GraphCreateReq{other_ctx.ctx, 0, 0});
  REQUIRE(other_graph.result == CUDA_SUCCESS);
  const std::uint64_t others = other_graph.as<proto::GraphRep>().handle;

  SECTION("a graph id that names nothing") {
    CHECK(f.begin(s, 12345, {}) == CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("another client's graph id") {
    CHECK(f.begin(s, others, {}) == CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("a dependency that is a node of another graph") {
    CHECK(f.begin(s, graph, {foreign_node}) == CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("the legacy default stream") {
    CHECK(f.begin(f.ctx.default_stream, graph, {}) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  SECTION("a capture already active on the stream, and the graph destroyed meanwhile") {
    REQUIRE(f.begin(s, graph, {}) == CUDA_SUCCESS);
    CHECK(f.begin(s, second_graph, {}) == CUDA_ERROR_ILLEGAL_STATE);
    // One-way: the refusal is the session's async error; the graph stays.
    f.sut.send(Op::kGraphDestroy, proto::HandleReq{graph});
    f.h.pump();
    CHECK(f.sut.control()->async_error.exchange(0) == CUDA_ERROR_ILLEGAL_STATE);
    CHECK(f.end(s).as<proto::EndCaptureRep>().graph == graph);
  }
  SECTION("ending on a stream that is not capturing") {
    REQUIRE(f.begin(s, graph, {}) == CUDA_SUCCESS);
    CHECK(f.end(other_stream).result == CUDA_ERROR_ILLEGAL_STATE);
    auto ended = f.end(s);
    CHECK(ended.result == CUDA_SUCCESS);
    CHECK(ended.as<proto::EndCaptureRep>().graph == graph);
  }
  SECTION("an invalidated capture leaves the client its graph") {
    REQUIRE(f.begin(s, graph, {}) == CUDA_SUCCESS);
    CHECK(f.sut.call(Op::kStreamSynchronize, proto::HandleReq{s}).result ==
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(f.end(s).result == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(f.sut.call(Op::kGraphGetNodes, proto::GraphGetNodesReq{graph, 0}).result == CUDA_SUCCESS);
  }
  SECTION("a record whose dependency list is shorter than it says ends the session") {
    const proto::WireHandle one = foreign_node;
    f.sut.send(Op::kStreamBeginCaptureToGraph,
               proto::BeginCaptureToGraphReq{s, graph, CU_STREAM_CAPTURE_MODE_GLOBAL, 2}, 0,
               std::as_bytes(std::span(&one, 1)));
    REQUIRE(f.h.pump_until([&] { return f.h.logged("dependency list"); }));
  }
  SECTION("kernel node parameters whose arguments the record does not hold end the session") {
    f.sut.send(Op::kGraphExecKernelNodeSetParams,
               proto::GraphExecKernelNodeReq{1, 2, 3, {1, 1, 1}, {1, 1, 1}, 0, 64}, 0);
    REQUIRE(f.h.pump_until([&] { return f.h.logged("arguments the record does not hold"); }));
  }
  // The other client was never disturbed.
  CHECK(other.call(Op::kGraphGetNodes, proto::GraphGetNodesReq{others, 0}).result == CUDA_SUCCESS);
}

TEST_CASE("a session that ends while capturing into its graph frees the graph and the capture",
          "[server][graph][capture_to_graph]") {
  const int live_before = live_driver_objects();
  {
    Fixture f;
    const std::uint64_t a = f.sut.alloc(f.ctx.ctx, kBytes);
    const std::uint64_t s = f.stream();
    const std::uint64_t plain = f.stream();
    const std::uint64_t graph = f.graph();
    const proto::WireHandle set_a = f.memset_node(graph, a, kSetA);
    REQUIRE(f.begin(s, graph, {set_a}) == CUDA_SUCCESS);
    f.sut.send(Op::kMemset, proto::MemsetReq{s, a, 0, kBytes / 4, 1, kCaptured, 4});
    // And an ordinary capture beside it, whose graph the client saw.
    REQUIRE(f.sut
                .call(Op::kStreamBeginCapture,
                      proto::BeginCaptureReq{plain, CU_STREAM_CAPTURE_MODE_RELAXED, 0})
                .result == CUDA_SUCCESS);
    f.sut.send(Op::kMemset, proto::MemsetReq{plain, a, 0, kBytes / 4, 1, kSetB, 4});
    REQUIRE(f.sut.call(Op::kStreamCaptureInfo, proto::HandleReq{plain}).result == CUDA_SUCCESS);
    f.sut.hang_up();
    REQUIRE(f.h.pump_until([&] { return f.h.logged("freed"); }));
    CHECK(f.h.logged("1 graph"));  // the client's; the ordinary capture's went with its end
  }
  CHECK(live_driver_objects() == live_before);
}

}  // namespace
}  // namespace mpsshim::server::test
