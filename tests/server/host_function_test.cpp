// Host functions: the server's host function on the real stream has the client run its
// callback and holds the stream until the client reports it done; session end releases it.
#include <catch2/catch.hpp>

#include <atomic>
#include <memory>
#include <thread>

#include "broker/server/session/host_callbacks.hpp"
#include "broker/server/session/session.hpp"
#include "proto/futex.hpp"
#include "tests/server/fake_async.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using namespace std::chrono_literals;
using proto::Op;

constexpr std::uint64_t kCallbackId = 0x1234'5678'9abcull;

// A request the server published and the client has not answered, as the shim's callback
// thread finds it; nullptr after two seconds.
proto::HostCallbackCell* wait_request(const TestClient& client, std::uint32_t* ticket) {
  const proto::SegmentView& view = client.view();
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (std::chrono::steady_clock::now() < deadline) {
    for (std::uint32_t i = 0; i < view.geometry.callback_cell_count; ++i) {
      proto::HostCallbackCell* cell = view.callback_cell(i);
      std::uint32_t requested = cell->requested.load(std::memory_order_acquire);
      if (requested != 0 && requested != cell->done.load(std::memory_order_acquire)) {
        *ticket = requested;
        return cell;
      }
    }
    std::this_thread::sleep_for(1ms);
  }
  return nullptr;
}

void answer(proto::HostCallbackCell* cell, std::uint32_t ticket) {
  cell->done.store(ticket, std::memory_order_seq_cst);
  proto::futex_wake(&cell->done);
}

// The driver's callback thread running the server's host function.
class DriverCallbackThread {
 public:
  explicit DriverCallbackThread(FakeAsync::HostWork work, CUresult status = CUDA_SUCCESS)
      : thread_([this, work, status] {
          work.run(status);
          returned_ = true;
        }) {}
  ~DriverCallbackThread() { thread_.join(); }
  bool returned() const { return returned_; }
  bool returns_within(std::chrono::milliseconds limit) const {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!returned_ && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(1ms);
    return returned_;
  }

 private:
  std::atomic<bool> returned_{false};
  std::thread thread_;
};

proto::HostFuncReq host_func(std::uint64_t stream,
                             proto::HostFuncKind kind = proto::HostFuncKind::kLaunchHostFunc) {
  return proto::HostFuncReq{stream, kCallbackId, kind, 0};
}

TEST_CASE("a host function holds its stream until the client reports its callback done",
          "[server][hostfn]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  sut.send(Op::kHostFunc, host_func(ctx.default_stream));
  REQUIRE(h.pump_until([] { return fake_async().host_work.size() == 1; }));

  DriverCallbackThread driver(fake_async().host_work[0]);
  std::uint32_t ticket = 0;
  proto::HostCallbackCell* cell = wait_request(sut, &ticket);
  REQUIRE(cell != nullptr);
  CHECK(cell->callback_id == kCallbackId);
  CHECK(cell->flags == 0);  // one-shot: not captured
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(driver.returned());

  answer(cell, ticket);

  CHECK(driver.returns_within(2000ms));
}

TEST_CASE("a stream callback tells the client the stream's status", "[server][hostfn]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  sut.send(Op::kHostFunc, host_func(ctx.default_stream, proto::HostFuncKind::kStreamAddCallback));
  REQUIRE(h.pump_until([] { return fake_async().host_work.size() == 1; }));

  DriverCallbackThread driver(fake_async().host_work[0], CUDA_ERROR_ILLEGAL_ADDRESS);
  std::uint32_t ticket = 0;
  proto::HostCallbackCell* cell = wait_request(sut, &ticket);
  REQUIRE(cell != nullptr);

  CHECK(cell->status == CUDA_ERROR_ILLEGAL_ADDRESS);
  answer(cell, ticket);
  CHECK(driver.returns_within(2000ms));
}

TEST_CASE("a client that goes away releases its waiting host functions at once, and later ones",
          "[server][hostfn]") {
  Harness h;
  auto sut = std::make_unique<TestClient>(h);
  auto ctx = sut->create_context();
  sut->send(Op::kHostFunc, host_func(ctx.default_stream));
  sut->send(Op::kHostFunc, host_func(ctx.default_stream));
  REQUIRE(h.pump_until([] { return fake_async().host_work.size() == 2; }));
  auto first = std::make_unique<DriverCallbackThread>(fake_async().host_work[0]);
  std::uint32_t ticket = 0;
  REQUIRE(wait_request(*sut, &ticket) != nullptr);

  sut->hang_up();
  REQUIRE(h.pump_until([&] { return first->returned(); }));
  REQUIRE(h.pump_until([&] { return h.server->session_count() == 0; }));
  sut.reset();  // the client's mapping is gone too

  // The driver may still run a host function of the freed session: it must not wait or crash.
  DriverCallbackThread late(fake_async().host_work[1]);
  CHECK(late.returns_within(500ms));
}

TEST_CASE("a captured host function stays valid for every replay", "[server][hostfn]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  fake_async().capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  sut.send(Op::kHostFunc, host_func(ctx.default_stream));
  REQUIRE(h.pump_until([] { return fake_async().host_work.size() == 1; }));

  for (int replay = 0; replay < 3; ++replay) {
    DriverCallbackThread driver(fake_async().host_work[0]);
    std::uint32_t ticket = 0;
    proto::HostCallbackCell* cell = wait_request(sut, &ticket);
    REQUIRE(cell != nullptr);
    CHECK(cell->callback_id == kCallbackId);
    CHECK((cell->flags & proto::kCallbackKeep) != 0);
    answer(cell, ticket);
    CHECK(driver.returns_within(2000ms));
  }

  // The kept call and its channel hold each other until the session is freed (drop_kept): a
  // server destroyed with the session still open would leak both (LeakSanitizer), so the test
  // frees it as the server does after a hang-up, and the channel is gone with it.
  const std::weak_ptr<HostCallbackChannel> channel =
      h.server->find_session(sut.welcome().client_id)->callbacks;
  REQUIRE_FALSE(channel.expired());
  sut.hang_up();
  REQUIRE(h.pump_until([&] { return h.server->session_count() == 0; }));
  CHECK(channel.expired());
}

TEST_CASE("a host function on a stream the client does not own fails at the next sync",
          "[server][hostfn]") {
  Harness h;
  TestClient sut(h);
  sut.create_context();

  sut.send(Op::kHostFunc, host_func(0x4242));
  h.pump();

  CHECK(sut.control()->async_error.load() == CUDA_ERROR_INVALID_HANDLE);
  CHECK(fake_async().host_work.empty());
}

TEST_CASE("a host function record of unknown kind or without an id ends the session",
          "[server][hostfn]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  TestClient other(h, default_hello(77, "other"));
  auto other_ctx = other.create_context();

  sut.send(Op::kHostFunc, proto::HostFuncReq{ctx.default_stream, kCallbackId,
                                             static_cast<proto::HostFuncKind>(9), 0});
  other.send(Op::kHostFunc, proto::HostFuncReq{other_ctx.default_stream, 0,
                                               proto::HostFuncKind::kLaunchHostFunc, 0});

  CHECK(h.pump_until([&] { return h.server->session_count() == 0; }));
  CHECK(h.logged("sent a host function of unknown kind 9"));
  CHECK(h.logged("sent a host function without a callback id"));
}

}  // namespace
}  // namespace mpsshim::server::test
