// A client's end (goodbye, hang-up) frees everything it owned; a sticky GPU fault ends all.
#include <catch2/catch.hpp>

#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;
constexpr std::uint64_t kMiB = 1 << 20;

struct Owned {
  std::uint64_t ctx;
  std::uint64_t dptr;
};

// A context, an allocation, a blocking stream, an event, a module and a pinned region.
Owned make_things(TestClient& client) {
  auto ctx = client.create_context();
  Owned owned{ctx.ctx, client.alloc(ctx.ctx, kMiB + kMiB / 2)};
  client.call(Op::kStreamCreate, proto::StreamCreateReq{ctx.ctx, 0, 0});
  client.call(Op::kEventCreate, proto::EventCreateReq{ctx.ctx, 0, 0});
  std::vector<std::byte> ptx(64, std::byte{'a'});
  ptx.back() = std::byte{0};
  client.send_memfd(proto::MessageKind::kModuleImage, 1, ptx.size(), ptx);
  REQUIRE(client
              .call(Op::kImageLoad,
                    proto::ImageLoadReq{ctx.ctx, ptx.size(), 1, proto::ImageKind::kModule, 0, 0})
              .result == CUDA_SUCCESS);
  client.send_memfd(proto::MessageKind::kHostMemory, 2, 4096);
  REQUIRE(client.call(Op::kHostRegister, proto::HostRegisterReq{0, 4096, 2, 0}).result ==
          CUDA_SUCCESS);
  // Some work so that the event pool and a join event exist too.
  client.call(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream});
  return owned;
}

// Everything but the session's green context is destroyed; that one is kept for the next
// session (green_context_pool.hpp), and is the only one alive.
void check_nothing_left(const Harness& h) {
  const FakeGpu& gpu = fake_gpu();
  CHECK(gpu.allocations.empty());
  CHECK(gpu.host_registrations.empty());
  CHECK(gpu.streams_live == 0);
  CHECK(gpu.events_live == 0);
  CHECK(gpu.modules_live == 0);
  CHECK(h.server->green_context_pool().idle == 1);
  CHECK(gpu.green_live == 1);
}

TEST_CASE("a client that hangs up has everything freed", "[server][lifecycle]") {
  Harness h;
  TestClient sut(h);
  make_things(sut);

  sut.hang_up();

  REQUIRE(h.pump_until([&] { return h.server->session_count() == 0; }));
  check_nothing_left(h);
  CHECK(
      h.logged("client 1 (pid 4123, vector_add) disconnected; freed 1 allocation (1.5 MiB), 1 "
               "module, 2 streams, 1 event, 1 pinned host region"));
}

TEST_CASE("Goodbye ends the session in order", "[server][lifecycle]") {
  Harness h;
  TestClient sut(h);
  make_things(sut);

  CHECK(sut.call_empty(Op::kGoodbye).result == CUDA_SUCCESS);

  REQUIRE(h.pump_until([&] { return h.server->session_count() == 0; }));
  check_nothing_left(h);
  CHECK(sut.control()->fault.load() == 0);
  CHECK(h.logged("said goodbye; freed"));
}

TEST_CASE("a departed client's queued work finishes before its memory is freed",
          "[server][lifecycle]") {
  Harness h;
  TestClient gone(h, default_hello(1));
  TestClient staying(h, default_hello(2));
  Owned owned = make_things(gone);
  fake_gpu().busy = true;

  gone.hang_up();
  h.pump();
  CHECK(h.server->stats_text().find("state=draining") != std::string::npos);
  CHECK(fake_gpu().allocations.count(owned.dptr) == 1);
  CHECK(staying.call_empty(Op::kPing).result == CUDA_SUCCESS);  // the loop is not blocked

  fake_gpu().busy = false;
  CHECK(h.pump_until([&] { return h.server->session_count() == 1; }));
  CHECK(fake_gpu().allocations.count(owned.dptr) == 0);
  // The staying client's and the departed one's, kept for the next session.
  CHECK(fake_gpu().green_live == 2);
  CHECK(h.server->green_context_pool().idle == 1);
}

TEST_CASE("a sticky fault is told to every client, then the server exits 70",
          "[server][lifecycle]") {
  Harness h;
  TestClient culprit(h, default_hello(1, "bad_kernel"));
  TestClient bystander(h, default_hello(2, "innocent"));
  auto ctx = culprit.create_context();
  auto other_ctx = bystander.create_context();
  // Work on both (a synchronize of a stream known idle is answered at once).
  culprit.send(Op::kMemset,
               proto::MemsetReq{ctx.default_stream, culprit.alloc(ctx.ctx, 4096), 0, 16, 1, 0, 1});
  bystander.send(Op::kMemset,
                 proto::MemsetReq{other_ctx.default_stream, bystander.alloc(other_ctx.ctx, 4096), 0,
                                  16, 1, 0, 1});
  fake_gpu().busy = true;
  bystander.send(Op::kStreamSynchronize, proto::HandleReq{other_ctx.default_stream}, 3);
  culprit.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
  h.pump();

  fake_gpu().busy = false;
  fake_gpu().work_result = CUDA_ERROR_ILLEGAL_ADDRESS;
  REQUIRE(h.pump_until([&] { return h.fatal_code != -1; }));

  CHECK(h.fatal_code == kExitGpuFault);
  CHECK(culprit.control()->fault.load() == CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(bystander.control()->fault.load() == CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(culprit.slot_ready(0));
  CHECK(bystander.slot_ready(3));
  CHECK(bystander.view().slot(3)->result == CUDA_ERROR_ILLEGAL_ADDRESS);
  CHECK(h.logged("GPU fault"));
  CHECK(h.server->do_work() == 0);  // nothing more runs after a fault
  // Both are told whose work returned it first: either synchronize may come back with it
  // first (the workers' order), and both clients must name the same one, with its program.
  const Server::FaultCulprit& named = h.server->fault_culprit();
  REQUIRE((named.pid == 1 || named.pid == 2));
  const std::string program = named.pid == 1 ? "bad_kernel" : "innocent";
  CHECK(named.program == program);
  for (TestClient* client : {&culprit, &bystander}) {
    CHECK(client->control()->fault_pid == static_cast<std::uint32_t>(named.pid));
    CHECK(std::string(client->control()->fault_program) == program);
  }
  CHECK(named.op == "StreamSynchronize");
  CHECK(named.clients == 2);
}

TEST_CASE("a sticky error returned by a call faults the server too", "[server][lifecycle]") {
  Harness h;
  // A program name with a newline and an escape sequence: it reaches other clients' logs.
  TestClient sut(h, default_hello(4123, "bad\njob\x1b[31m"));
  auto ctx = sut.create_context();
  fake_gpu().work_result = CUDA_ERROR_LAUNCH_FAILED;

  sut.send(Op::kStreamQuery, proto::HandleReq{ctx.default_stream}, 0);

  REQUIRE(h.pump_until([&] { return h.fatal_code != -1; }));
  CHECK(sut.view().slot(0)->result == CUDA_ERROR_LAUNCH_FAILED);
  CHECK(sut.control()->fault.load() == CUDA_ERROR_LAUNCH_FAILED);
  CHECK(sut.control()->fault_pid == 4123);
  CHECK(std::string(sut.control()->fault_program) == "bad?job?[31m");
}

}  // namespace
}  // namespace mpsshim::server::test
