// Stream capture and graphs through the server, on the test driver (real capture semantics): the
// server's own bookkeeping (legacy-stream joins, fences for deferred frees, completions) never
// lands in a capture, the capture rules hold, graphs replay, and graph objects die with the
// session.
#include <dlfcn.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "broker/server/driver/driver.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;
constexpr std::uint64_t kBytes = 4096;
constexpr std::uint32_t kPattern = 0x2a2a2a2a;
constexpr int kReplays = 10;

// The client is admitted, or the test stops with the server's log.
TestClient& admitted(Harness& h, TestClient& client) {
  std::string log;
  for (const std::string& line : h.logs) log += line + "\n";
  INFO("server log:\n" << log);
  REQUIRE(client.connected());
  return client;
}

struct Fixture {
  Harness h{test_driver(), ServerSettings{}};
  TestClient sut{h};
  proto::CtxCreateRep ctx = admitted(h, sut).create_context();

  // The session freed before the next fixture's: the test driver keeps its registrations.
  ~Fixture() {
    sut.hang_up();
    h.pump_until([&] { return h.logged("freed") || h.logged("nothing to free"); });
  }

  std::uint64_t stream(std::uint32_t flags) {
    auto reply = sut.call(Op::kStreamCreate, proto::StreamCreateReq{ctx.ctx, flags, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::StreamCreateRep>().stream;
  }
  std::uint64_t event() {
    auto reply =
        sut.call(Op::kEventCreate, proto::EventCreateReq{ctx.ctx, CU_EVENT_DISABLE_TIMING, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::EventCreateRep>().event;
  }
  void memset(std::uint64_t stream, std::uint64_t dst, std::uint32_t value) {
    sut.send(Op::kMemset, proto::MemsetReq{stream, dst, 0, kBytes / 4, 1, value, 4});
  }
  CUresult call(Op op, std::uint64_t handle) {
    return sut.call(op, proto::HandleReq{handle}).result;
  }
  proto::CaptureInfoRep info(std::uint64_t stream, CUresult expected = CUDA_SUCCESS) {
    auto reply = sut.call(Op::kStreamCaptureInfo, proto::HandleReq{stream});
    CHECK(reply.result == expected);
    return reply.as<proto::CaptureInfoRep>();
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

TEST_CASE("a capture with a fork, a free and legacy work around it replays on the driver",
          "[server][graph]") {
  Fixture f;
  const std::uint64_t a = f.sut.alloc(f.ctx.ctx, kBytes);
  const std::uint64_t b = f.sut.alloc(f.ctx.ctx, kBytes);
  const std::uint64_t doomed = f.sut.alloc(f.ctx.ctx, kBytes);
  const std::uint64_t origin = f.stream(0);  // blocking: ordered with the legacy stream
  const std::uint64_t side = f.stream(CU_STREAM_NON_BLOCKING);
  const std::uint64_t fork = f.event();
  const std::uint64_t join = f.event();

  f.memset(f.ctx.default_stream, a, 1);  // legacy work the capture must be ordered after
  REQUIRE(f.sut
              .call(Op::kStreamBeginCapture,
                    proto::BeginCaptureReq{origin, CU_STREAM_CAPTURE_MODE_GLOBAL, 0})
              .result == CUDA_SUCCESS);
  f.memset(origin, a, kPattern);
  f.sut.send(Op::kEventRecord, proto::EventRecordReq{fork, origin, 0, 0});
  f.sut.send(Op::kStreamWaitEvent, proto::StreamWaitEventReq{side, fork, 0, 0});
  f.sut.send(Op::kCopyDtoD, proto::CopyDtoDReq{side, b, a, kBytes});
  f.sut.send(Op::kEventRecord, proto::EventRecordReq{join, side, 0, 0});
  f.sut.send(Op::kStreamWaitEvent, proto::StreamWaitEventReq{origin, join, 0, 0});
  // A deferred free fences every stream: on the capturing ones it must not record.
  f.sut.send(Op::kMemFree, proto::MemFreeReq{doomed});

  const auto origin_info = f.info(origin);
  const auto side_info = f.info(side);
  CHECK(origin_info.status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK(side_info.status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK(side_info.id == origin_info.id);
  CHECK(origin_info.graph != 0);
  // The legacy stream would have to wait for the capturing blocking stream.
  f.info(f.ctx.default_stream, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  f.memset(f.ctx.default_stream, b, 3);
  f.h.pump();
  CHECK(f.sut.control()->async_error.exchange(0) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);

  auto ended = f.sut.call(Op::kStreamEndCapture, proto::HandleReq{origin});
  REQUIRE(ended.result == CUDA_SUCCESS);
  const std::uint64_t graph = ended.as<proto::EndCaptureRep>().graph;
  CHECK(graph == origin_info.graph);  // the id the client saw while capturing
  CHECK(f.info(side).status == CU_STREAM_CAPTURE_STATUS_NONE);
  CHECK(f.read(a, 1) == 1);  // nothing captured ran; the legacy memset did
  auto nodes = f.sut.call(Op::kGraphGetNodes, proto::GraphGetNodesReq{graph, 0});
  REQUIRE(nodes.result == CUDA_SUCCESS);
  CHECK(nodes.as<proto::GraphGetNodesRep>().total == 2);

  auto inst = f.sut.call(Op::kGraphInstantiate, proto::GraphInstantiateReq{graph, 0, 0});
  REQUIRE(inst.result == CUDA_SUCCESS);
  const std::uint64_t exec = inst.as<proto::GraphInstantiateRep>().exec;
  for (int i = 0; i < kReplays; ++i) {
    f.sut.send(Op::kGraphLaunch, proto::GraphLaunchReq{exec, origin});
  }
  CHECK(f.call(Op::kStreamSynchronize, origin) == CUDA_SUCCESS);
  CHECK(f.read(b, 2) == kPattern);
  CHECK(f.sut.control()->async_error.load() == 0);

  const int live = live_driver_objects();
  f.sut.send(Op::kGraphExecDestroy, proto::HandleReq{exec});
  f.sut.send(Op::kGraphDestroy, proto::HandleReq{graph});
  // At most: the deferred free's retired memory may go in the same pump.
  REQUIRE(f.h.pump_until([&] { return live_driver_objects() <= live - 2; }));
  CHECK(f.call(Op::kGraphLaunch, exec) != CUDA_SUCCESS);
}

TEST_CASE("what cannot be captured invalidates the capture instead of breaking the server",
          "[server][graph]") {
  Fixture f;
  const std::uint64_t a = f.sut.alloc(f.ctx.ctx, kBytes);
  const std::uint64_t s = f.stream(CU_STREAM_NON_BLOCKING);
  auto begin = [&] {
    REQUIRE(f.sut
                .call(Op::kStreamBeginCapture,
                      proto::BeginCaptureReq{s, CU_STREAM_CAPTURE_MODE_RELAXED, 0})
                .result == CUDA_SUCCESS);
  };
  auto end_invalidated = [&] {
    CHECK(f.info(s).status == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    auto ended = f.sut.call(Op::kStreamEndCapture, proto::HandleReq{s});
    CHECK(ended.result == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(f.info(s).status == CU_STREAM_CAPTURE_STATUS_NONE);
  };

  SECTION("a stream synchronize") {
    begin();
    CHECK(f.call(Op::kStreamSynchronize, s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_invalidated();
  }
  SECTION("a context synchronize") {
    begin();
    CHECK(f.call(Op::kCtxSynchronize, f.ctx.ctx) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_invalidated();
  }
  SECTION("a staged copy, whose chunk a graph must never hold") {
    begin();
    f.sut.send(
        Op::kCopyHtoD,
        proto::CopyHostReq{s, a, 4, proto::HostRef{2, 0, proto::HostKind::kStagingChunk, 5}});
    REQUIRE(
        f.h.pump_until([&] { return f.sut.view().chunk_state(2)->done_generation.load() == 5; }));
    CHECK(f.sut.view().chunk_state(2)->result.load() == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_invalidated();
  }
  SECTION("an answer owed once the work ran") {
    begin();
    f.sut.send(Op::kMemset, proto::MemsetReq{s, a, 0, 1, 1, 0, 4}, 0, {},
               proto::kFlagReplyWhenDone);
    auto reply = f.sut.reply(0);
    REQUIRE(reply);
    CHECK(reply->result == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    end_invalidated();
  }
  // The session goes on: the stream works again.
  f.memset(s, a, 9);
  CHECK(f.call(Op::kStreamSynchronize, s) == CUDA_SUCCESS);
  CHECK(f.read(a, 1) == 9);
  CHECK(f.h.fatal_code == -1);
}

TEST_CASE("explicit nodes, updates and a session end that frees every graph", "[server][graph]") {
  const int live_before = live_driver_objects();
  {
    Fixture f;
    const std::uint64_t a = f.sut.alloc(f.ctx.ctx, kBytes);
    const std::uint64_t b = f.sut.alloc(f.ctx.ctx, kBytes);
    auto created = f.sut.call(Op::kGraphCreate, proto::GraphCreateReq{f.ctx.ctx, 0, 0});
    REQUIRE(created.result == CUDA_SUCCESS);
    const std::uint64_t graph = created.as<proto::GraphRep>().handle;

    auto set = f.sut.call(Op::kGraphAddMemsetNode,
                          proto::GraphMemsetNodeReq{{graph, 0, 0}, a, 0, kBytes / 4, 1, 77, 4});
    REQUIRE(set.result == CUDA_SUCCESS);
    const proto::WireHandle memset_node = set.as<proto::GraphRep>().handle;
    auto copy = f.sut.call(Op::kGraphAddCopyNode, proto::GraphCopyNodeReq{{graph, 1, 0}, b, a, 4},
                           std::as_bytes(std::span(&memset_node, 1)));
    REQUIRE(copy.result == CUDA_SUCCESS);
    // Not the client's memory, a node of no graph, a record that lies about its dependencies.
    CHECK(f.sut
              .call(Op::kGraphAddMemsetNode,
                    proto::GraphMemsetNodeReq{{graph, 0, 0}, 64, 0, 1, 1, 0, 4})
              .result == CUDA_ERROR_INVALID_VALUE);
    const proto::WireHandle bogus = 12345;
    CHECK(f.sut
              .call(Op::kGraphAddEmptyNode, proto::GraphAddNodeHeader{graph, 1, 0},
                    std::as_bytes(std::span(&bogus, 1)))
              .result == CUDA_ERROR_INVALID_VALUE);

    auto inst = f.sut.call(Op::kGraphInstantiate, proto::GraphInstantiateReq{graph, 0, 0});
    REQUIRE(inst.result == CUDA_SUCCESS);
    const std::uint64_t exec = inst.as<proto::GraphInstantiateRep>().exec;
    f.sut.send(Op::kGraphLaunch, proto::GraphLaunchReq{exec, f.ctx.default_stream});
    CHECK(f.read(b, 1) == 77u);

    auto other = f.sut.call(Op::kGraphCreate, proto::GraphCreateReq{f.ctx.ctx, 0, 0});
    const std::uint64_t empty = other.as<proto::GraphRep>().handle;
    auto update = f.sut.call(Op::kGraphExecUpdate, proto::GraphExecUpdateReq{exec, empty});
    CHECK(update.result == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    CHECK(update.as<proto::GraphExecUpdateRep>().result ==
          CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED);
    f.sut.hang_up();  // graphs and the executable graph are left for the session's end
    REQUIRE(f.h.pump_until([&] { return f.h.logged("graphs"); }));
  }
  CHECK(live_driver_objects() == live_before);
}

}  // namespace
}  // namespace mpsshim::server::test
