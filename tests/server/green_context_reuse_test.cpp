// A green context the pool hands out again (green_context_pool.hpp) carries nothing of the
// session that had it, on the host-memory test driver: the departed session's streams, events,
// memory and queued work are gone, only the green context itself is left, and the next session
// of the same quota works in it.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "tests/server/harness.hpp"
#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {

using namespace batch;

namespace {

constexpr std::uint32_t kSleepMicroseconds = 200'000;  // still running when its client hangs up
constexpr std::uint64_t kWords = 64;

}  // namespace

TEST_CASE("a reused green context carries nothing of its last session", "[server][green_pool]") {
  test_driver();  // loaded, so that its object counts can be read
  const DriverObjects before = driver_objects();
  Harness h(test_driver(), ServerSettings{});
  {
    Fixture first(h);
    const auto sleep = first.function("sleep_kernel");
    const std::uint64_t stream = first.stream();
    first.event();
    first.buffer(4 * kWords);
    first.launch(sleep, stream, 1, 32, kSleepMicroseconds);
  }  // hangs up with the kernel queued; waits until the session is freed

  // Only its green context is left, kept for the next session.
  CHECK(driver_objects() == with_pooled(before, *h.server));
  REQUIRE(h.server->green_context_pool().idle == 1);

  Fixture next(h, default_hello(4124));
  const GreenContextPoolFigures pool = h.server->green_context_pool();
  CHECK(pool.reused == 1);
  CHECK(pool.created == 1);
  CHECK(pool.idle == 0);
  const std::uint64_t stream = next.stream();
  const std::uint64_t out = next.buffer(4 * kWords);
  next.memset(stream, out, 42, kWords);
  REQUIRE(next.synchronize(stream) == CUDA_SUCCESS);
  CHECK(next.read(out, kWords) == std::vector<std::uint32_t>(kWords, 42));
  CHECK(next.async_error() == CUDA_SUCCESS);
}

}  // namespace mpsshim::server::test
