// Launch batching and a client that dies: its session ends (the client hangs up without a
// goodbye, as a killed process does) while launches of its batches wait, queued on the GPU as a
// graph launch or still in its ring. The server frees it as any other session: its graph cache is
// destroyed, and the test driver holds no graph, executable graph or other object more than
// before the client came.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>

#include "tests/server/harness.hpp"
#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {

using namespace batch;

namespace {

constexpr int kBatch = 8;                    // a power of two: one graph launch
constexpr int kSleepMicroseconds = 300'000;  // the slow kernel at the head of each batch
constexpr auto kSleep = std::chrono::microseconds(kSleepMicroseconds);

// A batch on `stream`: a slow kernel, then fills of out[0..kBatch - 1).
void send_batch(Fixture& f, const proto::FunctionRep& sleep, const proto::FunctionRep& fill,
                std::uint64_t stream, std::uint64_t out, std::uint32_t value) {
  f.launch(sleep, stream, 1, 32, kSleepMicroseconds);
  for (int i = 0; i < kBatch - 1; ++i) f.launch(fill, stream, 1, 32, out + 4u * i, value, 1);
}

}  // namespace

TEST_CASE("a client that dies while its batched launches wait leaves no graph behind",
          "[server][launch_batch]") {
  test_driver();  // loaded, so that its object counts can be read
  const int live_before = live_driver_objects();
  const DriverObjects objects_before = driver_objects();
  const int graphs_before = graph_objects();
  {
    Fixture f(test_driver(), batching(64, 0));
    const auto sleep = f.function("sleep_kernel");
    const auto fill = f.function("fill_u32");
    const std::uint64_t s = f.stream();
    const std::uint64_t out = f.buffer(4 * kBatch);
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
    const int graphs_idle = graph_objects();

    SECTION("a graph launch queued behind a slow kernel and a batch in the ring") {
      send_batch(f, sleep, fill, s, out, 1);
      const auto sent = std::chrono::steady_clock::now();
      REQUIRE(f.h.pump_until([&] { return figures(f.h).batches == 1; }));
      CHECK(graph_objects() == graphs_idle + 2);  // the cached graph and its executable graph
      send_batch(f, sleep, fill, s, out, 2);      // waits in the ring
      f.sut.hang_up();
      // Still queued when the client went: the slow kernel had not finished.
      REQUIRE(std::chrono::steady_clock::now() - sent < kSleep);
    }
    SECTION("a batch whose graph was reused, queued twice") {
      send_batch(f, sleep, fill, s, out, 1);
      REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
      send_batch(f, sleep, fill, s, out, 2);
      const auto sent = std::chrono::steady_clock::now();
      REQUIRE(f.h.pump_until([&] { return figures(f.h).batches == 2; }));
      send_batch(f, sleep, fill, s, out, 3);
      REQUIRE(f.h.pump_until([&] { return figures(f.h).batches == 3; }));
      CHECK(graph_objects() == graphs_idle + 2);  // one graph, launched three times
      f.sut.hang_up();
      REQUIRE(std::chrono::steady_clock::now() - sent < kSleep);
    }
    SECTION("launches only in the ring") {
      send_batch(f, sleep, fill, s, out, 1);
      f.sut.hang_up();
    }
    // The session drains (its queued work runs to its end), then is freed.
    REQUIRE(f.h.pump_until([&] { return f.h.server->session_count() == 0; }));
    CHECK(f.h.logged("freed"));
    CHECK(graph_objects() == graphs_before);
    // All but its green context, which the server keeps for the next session.
    CHECK(driver_objects() == with_pooled(objects_before, *f.h.server));
  }
  CHECK(graph_objects() == graphs_before);
  CHECK(live_driver_objects() == live_before);
}

}  // namespace mpsshim::server::test
