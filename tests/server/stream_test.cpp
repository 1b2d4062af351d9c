// Streams, events, handles, legacy default-stream ordering, answers from completions.
#include <catch2/catch.hpp>

#include <chrono>

#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;
constexpr std::uint64_t kMiB = 1 << 20;

std::uint64_t create_stream(TestClient& client, std::uint64_t ctx, std::uint32_t flags,
                            int priority = 0) {
  auto reply = client.call(Op::kStreamCreate, proto::StreamCreateReq{ctx, flags, priority});
  REQUIRE(reply.result == CUDA_SUCCESS);
  return reply.as<proto::StreamCreateRep>().stream;
}

void memset_on(TestClient& client, std::uint64_t stream, std::uint64_t dptr) {
  client.send(Op::kMemset, proto::MemsetReq{stream, dptr, 0, 16, 1, 0, 1});
}

TEST_CASE("a handle of the wrong kind, a stale one and another client's are refused",
          "[server][streams]") {
  Harness h;
  TestClient sut(h, default_hello(1));
  TestClient other(h, default_hello(2));
  auto ctx = sut.create_context();
  auto other_ctx = other.create_context();
  std::uint64_t stream = create_stream(sut, ctx.ctx, CU_STREAM_NON_BLOCKING);
  auto query = [&](std::uint64_t id) {
    return sut.call(Op::kStreamQuery, proto::HandleReq{id}).result;
  };

  CHECK(query(stream) == CUDA_SUCCESS);
  CHECK(query(ctx.ctx) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(query(other_ctx.default_stream) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(query(0) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(sut.call(Op::kStreamDestroy, proto::HandleReq{stream}).result == CUDA_SUCCESS);
  CHECK(query(stream) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(sut.call(Op::kStreamDestroy, proto::HandleReq{ctx.default_stream}).result ==
        CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("every stream is a non-blocking green-context stream with a biased priority",
          "[server][streams]") {
  Harness h;
  auto hello = default_hello();
  hello.priority = 1;
  TestClient sut(h, hello);
  auto ctx = sut.create_context();

  create_stream(sut, ctx.ctx, 0, -5);
  CHECK(fake_gpu().last_stream_priority == -4);
  create_stream(sut, ctx.ctx, CU_STREAM_NON_BLOCKING, 0);
  CHECK(fake_gpu().last_stream_priority == 0);  // clamped to the least priority
}

TEST_CASE("blocking streams order with the context's default stream", "[server][streams]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, kMiB);
  std::uint64_t blocking = create_stream(sut, ctx.ctx, 0);
  std::uint64_t non_blocking = create_stream(sut, ctx.ctx, CU_STREAM_NON_BLOCKING);
  auto waits_after = [&](std::uint64_t stream) {
    int before = fake_gpu().stream_waits;
    memset_on(sut, stream, dptr);
    h.pump();
    return fake_gpu().stream_waits - before;
  };

  CHECK(waits_after(ctx.default_stream) == 0);  // nothing to wait for yet
  CHECK(waits_after(blocking) == 1);            // waits for the default stream's memset
  CHECK(waits_after(blocking) == 0);            // already joined
  CHECK(waits_after(non_blocking) == 0);        // orders with nothing
  CHECK(waits_after(ctx.default_stream) == 1);  // waits for the blocking stream's work
  CHECK(waits_after(ctx.default_stream) == 0);
  CHECK(sut.control()->async_error.load() == 0);
}

TEST_CASE("synchronizing calls are answered when the GPU work completes", "[server][streams]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  memset_on(sut, ctx.default_stream, sut.alloc(ctx.ctx, kMiB));
  fake_gpu().busy = true;

  sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
  sut.send(Op::kCtxSynchronize, proto::CtxReq{ctx.ctx}, 1);
  h.pump();
  CHECK_FALSE(sut.slot_ready(0));
  CHECK_FALSE(sut.slot_ready(1));

  fake_gpu().busy = false;
  auto stream_done = sut.reply(0);
  auto ctx_done = sut.reply(1);
  REQUIRE(stream_done);
  REQUIRE(ctx_done);
  CHECK(stream_done->result == CUDA_SUCCESS);
  CHECK(ctx_done->result == CUDA_SUCCESS);
}

TEST_CASE("the server keeps serving while a client waits on its GPU work", "[server][streams]") {
  Harness h;
  TestClient waiter(h, default_hello(1));
  TestClient other(h, default_hello(2));
  auto ctx = waiter.create_context();
  memset_on(waiter, ctx.default_stream, waiter.alloc(ctx.ctx, kMiB));
  fake_gpu().busy = true;

  waiter.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
  CHECK(other.call_empty(Op::kPing).result == CUDA_SUCCESS);
  CHECK_FALSE(waiter.slot_ready(0));

  fake_gpu().busy = false;
  auto reply = waiter.reply(0);
  REQUIRE(reply);
  CHECK(reply->result == CUDA_SUCCESS);
}

TEST_CASE("kFlagReplyWhenDone answers a one-way call once its stream ran it", "[server][streams]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, kMiB);
  fake_gpu().busy = true;

  sut.send(Op::kMemset, proto::MemsetReq{ctx.default_stream, dptr, 0, 16, 1, 0, 1}, 0, {},
           proto::kFlagReplyWhenDone);
  sut.send(Op::kMemset, proto::MemsetReq{ctx.default_stream, dptr, 0, 16, 1, 0, 1}, 1);
  h.pump();
  CHECK_FALSE(sut.slot_ready(0));
  CHECK(sut.slot_ready(1));  // without the flag: answered when issued

  fake_gpu().busy = false;
  CHECK(sut.reply(0).has_value());
}

TEST_CASE("events record, wait, query, synchronize and time", "[server][streams]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  auto create_event = [&](std::uint32_t flags) {
    auto reply = sut.call(Op::kEventCreate, proto::EventCreateReq{ctx.ctx, flags, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::EventCreateRep>().event;
  };
  std::uint64_t start = create_event(0);
  std::uint64_t end = create_event(0);
  std::uint64_t other_stream = create_stream(sut, ctx.ctx, CU_STREAM_NON_BLOCKING);

  sut.send(Op::kEventRecord, proto::EventRecordReq{start, ctx.default_stream, 0, 0});
  sut.send(Op::kStreamWaitEvent, proto::StreamWaitEventReq{other_stream, start, 0, 0});
  sut.send(Op::kEventRecord, proto::EventRecordReq{end, other_stream, 0, 0});
  CHECK(sut.call(Op::kEventQuery, proto::HandleReq{end}).result == CUDA_SUCCESS);
  CHECK(sut.call(Op::kEventSynchronize, proto::HandleReq{end}).result == CUDA_SUCCESS);
  auto elapsed = sut.call(Op::kEventElapsedTime, proto::ElapsedReq{start, end});
  CHECK(elapsed.as<proto::ElapsedRep>().milliseconds == 1.5f);
  CHECK(sut.control()->async_error.load() == 0);

  // An interprocess event must not time (docs/ipc.md shares it with other clients).
  CHECK(
      sut.call(Op::kEventCreate, proto::EventCreateReq{ctx.ctx, CU_EVENT_INTERPROCESS, 0}).result ==
      CUDA_ERROR_INVALID_VALUE);
  CHECK(sut.call(Op::kEventCreate,
                 proto::EventCreateReq{ctx.ctx, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING, 0})
            .result == CUDA_SUCCESS);
  CHECK(sut.call(Op::kEventQuery, proto::HandleReq{other_stream}).result ==
        CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("an event destroyed while someone waits on it goes when the wait ends",
          "[server][streams]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  auto event = sut.call(Op::kEventCreate, proto::EventCreateReq{ctx.ctx, 0, 0})
                   .as<proto::EventCreateRep>()
                   .event;
  fake_gpu().busy = true;
  const int events_before = fake_gpu().events_live;

  sut.send(Op::kEventSynchronize, proto::HandleReq{event}, 0);
  sut.send(Op::kEventDestroy, proto::HandleReq{event}, 1);
  REQUIRE(sut.reply(1));
  CHECK(fake_gpu().events_live == events_before);

  fake_gpu().busy = false;
  REQUIRE(sut.reply(0));
  CHECK(fake_gpu().events_live == events_before - 1);
}

TEST_CASE("CtxDestroy frees what was made in the context", "[server][streams]") {
  Harness h;
  TestClient sut(h);
  auto keep = sut.create_context();
  auto gone = sut.create_context();
  std::uint64_t kept = sut.alloc(keep.ctx, kMiB);
  std::uint64_t freed = sut.alloc(gone.ctx, kMiB);
  create_stream(sut, gone.ctx, 0);
  const int streams_before = fake_gpu().streams_live;

  CHECK(sut.call(Op::kCtxDestroy, proto::CtxReq{gone.ctx}).result == CUDA_SUCCESS);

  CHECK(h.pump_until([&] { return fake_gpu().allocations.count(freed) == 0; }));
  CHECK(fake_gpu().allocations.count(kept) == 1);
  CHECK(fake_gpu().streams_live == streams_before - 2);
  CHECK(sut.call(Op::kStreamQuery, proto::HandleReq{gone.default_stream}).result ==
        CUDA_ERROR_INVALID_HANDLE);
  CHECK(sut.call(Op::kMemAlloc, proto::MemAllocReq{gone.ctx, 16}).result ==
        CUDA_ERROR_INVALID_CONTEXT);
  CHECK(sut.call(Op::kStreamQuery, proto::HandleReq{keep.default_stream}).result == CUDA_SUCCESS);
}

TEST_CASE("a synchronize after queued work waits on a word the GPU writes, not on the driver",
          "[server][streams][host_fences]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, kMiB);
  memset_on(sut, ctx.default_stream, dptr);
  fake_gpu().busy = true;
  const int queries = fake_gpu().stream_queries;
  const int writes = fake_gpu().value_writes;

  sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
  h.pump();
  CHECK_FALSE(sut.slot_ready(0));
  CHECK(fake_gpu().value_writes == writes + 1);  // the fence
  CHECK(fake_gpu().stream_queries == queries);   // work was queued: no idle check
  const int event_queries = fake_gpu().event_queries;

  finish_fake_work();
  REQUIRE(h.pump_until([&] { return sut.slot_ready(0); }));
  CHECK(sut.view().slot(0)->result == CUDA_SUCCESS);
  CHECK(fake_gpu().event_queries == event_queries);  // the word told, not the event

  // Nothing queued since: the stream is known idle, the next synchronize answers at once.
  sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 1);
  sut.send(Op::kCtxSynchronize, proto::CtxReq{ctx.ctx}, 2);
  REQUIRE(h.pump_until([&] { return sut.slot_ready(1) && sut.slot_ready(2); }));
  CHECK(fake_gpu().value_writes == writes + 1);
  CHECK(fake_gpu().stream_queries == queries);
  CHECK(fake_gpu().event_queries == event_queries);

  // New work makes it unknown again.
  memset_on(sut, ctx.default_stream, dptr);
  sut.send(Op::kCtxSynchronize, proto::CtxReq{ctx.ctx}, 3);
  REQUIRE(h.pump_until([&] { return sut.slot_ready(3); }));
  CHECK(fake_gpu().value_writes == writes + 2);
}

TEST_CASE("a synchronize behind much work gets a host fence unless the server is crowded",
          "[server][streams][host_fences]") {
  for (bool crowded : {false, true}) {
    INFO((crowded ? "crowded" : "not crowded"));
    ServerSettings settings;
    if (crowded) settings.spin_clients = 0;  // one client is more than the server lets spin
    Harness h(settings);
    TestClient sut(h);
    auto ctx = sut.create_context();
    std::uint64_t dptr = sut.alloc(ctx.ctx, kMiB);
    // More operations than a crowded server fences.
    for (std::uint64_t i = 0; i <= kCrowdedFenceMaxQueued; ++i) {
      memset_on(sut, ctx.default_stream, dptr);
    }
    const int writes = fake_gpu().value_writes;
    sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
    REQUIRE(h.pump_until([&] { return sut.slot_ready(0); }));
    CHECK(sut.view().slot(0)->result == CUDA_SUCCESS);
    CHECK(fake_gpu().value_writes == writes + (crowded ? 0 : 1));
    // Behind little work, a crowded server fences too.
    memset_on(sut, ctx.default_stream, dptr);
    sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 1);
    REQUIRE(h.pump_until([&] { return sut.slot_ready(1); }));
    CHECK(fake_gpu().value_writes == writes + (crowded ? 1 : 2));
  }
}

TEST_CASE("a stream the client found idle with a query is known idle", "[server][streams]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  memset_on(sut, ctx.default_stream, sut.alloc(ctx.ctx, kMiB));
  CHECK(sut.call(Op::kStreamQuery, proto::HandleReq{ctx.default_stream}).result == CUDA_SUCCESS);
  const int writes = fake_gpu().value_writes;
  sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
  REQUIRE(h.pump_until([&] { return sut.slot_ready(0); }));
  CHECK(fake_gpu().value_writes == writes);
}

TEST_CASE("a query right after a synchronize finds the stream idle behind the server's fence",
          "[server][streams][host_fences]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  memset_on(sut, ctx.default_stream, sut.alloc(ctx.ctx, kMiB));
  sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
  REQUIRE(h.pump_until([&] { return sut.slot_ready(0); }));
  REQUIRE(sut.reply(0)->result == CUDA_SUCCESS);
  // The server's fence (the event after the host-fence word) may still be queued on the GPU:
  // the driver says not ready, the client's work is done.
  fake_gpu().busy = true;
  CHECK(sut.call(Op::kStreamQuery, proto::HandleReq{ctx.default_stream}).result == CUDA_SUCCESS);
  // The client's own new work is not done while the GPU is busy.
  memset_on(sut, ctx.default_stream, sut.alloc(ctx.ctx, kMiB));
  CHECK(sut.call(Op::kStreamQuery, proto::HandleReq{ctx.default_stream}).result ==
        CUDA_ERROR_NOT_READY);
  finish_fake_work();
  CHECK(sut.call(Op::kStreamQuery, proto::HandleReq{ctx.default_stream}).result == CUDA_SUCCESS);
}

TEST_CASE("with host fences off, completions poll events", "[server][streams][host_fences]") {
  ServerSettings settings;
  settings.host_fences = false;
  Harness h(settings);
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, kMiB);
  memset_on(sut, ctx.default_stream, dptr);
  const int writes = fake_gpu().value_writes;
  const int event_queries = fake_gpu().event_queries;

  sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
  REQUIRE(h.pump_until([&] { return sut.slot_ready(0); }));
  CHECK(fake_gpu().value_writes == writes);
  CHECK(fake_gpu().event_queries > event_queries);
}

TEST_CASE("a completion without a host fence asks its event at most every event_poll",
          "[server][streams][host_fences]") {
  using std::chrono::microseconds;
  for (microseconds poll : {microseconds(0), microseconds(3'600'000'000LL)}) {
    INFO("event_poll " << poll.count() << " us");
    ServerSettings settings;
    settings.host_fences = false;
    settings.event_poll = poll;
    Harness h(settings);
    TestClient sut(h);
    auto ctx = sut.create_context();
    memset_on(sut, ctx.default_stream, sut.alloc(ctx.ctx, kMiB));
    fake_gpu().busy = true;
    sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
    const int before = fake_gpu().event_queries;
    h.pump(20);
    const int asked = fake_gpu().event_queries - before;
    finish_fake_work();
    if (poll.count() == 0) {
      CHECK(asked >= 10);  // every pass
      REQUIRE(h.pump_until([&] { return sut.slot_ready(0); }));
    } else {
      CHECK(asked <= 1);  // once, then not before the hour is over
      h.pump(5);
      CHECK_FALSE(sut.slot_ready(0));
      // Asked again once the interval is over: here, at once.
      Session* session = h.server->find_session(sut.welcome().client_id);
      REQUIRE(session != nullptr);
      session->fences.event_poll = microseconds(0);
      REQUIRE(h.pump_until([&] { return sut.slot_ready(0); }));
    }
    CHECK(sut.view().slot(0)->result == CUDA_SUCCESS);
  }
}

TEST_CASE("a long synchronize's fault checks grow apart", "[server][streams][host_fences]") {
  static_assert(fault_check_after(0) == kFaultCheckInterval);
  static_assert(fault_check_after(1) == 2 * kFaultCheckInterval);
  static_assert(fault_check_after(30) == kFaultCheckMaxInterval);
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  memset_on(sut, ctx.default_stream, sut.alloc(ctx.ctx, kMiB));
  fake_gpu().busy = true;  // the fence's word stays unwritten: only the event's queries tell
  sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
  h.pump();
  const int before = fake_gpu().event_queries;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(40)) h.pump();
  const int asked = fake_gpu().event_queries - before;
  // Every 200 us that would be ~200 queries; growing apart up to 3.2 ms, 14 at most (at 0.2,
  // 0.6, 1.4, 3.0, 6.2, then every 3.2 ms), and the first ones surely came.
  CHECK(asked >= 2);
  CHECK(asked <= 14);
  finish_fake_work();
  REQUIRE(h.pump_until([&] { return sut.slot_ready(0); }));
  CHECK(sut.view().slot(0)->result == CUDA_SUCCESS);
}

TEST_CASE("a fence whose write never lands still learns of the fault from its event",
          "[server][streams][host_fences]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t dptr = sut.alloc(ctx.ctx, kMiB);
  memset_on(sut, ctx.default_stream, dptr);
  fake_gpu().busy = true;
  sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
  h.pump();
  fake_gpu().work_result = CUDA_ERROR_ILLEGAL_ADDRESS;  // the write is lost with the work
  finish_fake_work();

  REQUIRE(h.pump_until([&] { return h.fatal_code != -1; }));
  CHECK(sut.slot_ready(0));
  CHECK(sut.view().slot(0)->result == CUDA_ERROR_ILLEGAL_ADDRESS);
}

}  // namespace
}  // namespace mpsshim::server::test
