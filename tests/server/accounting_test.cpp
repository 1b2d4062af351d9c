// Per-client accounting on the test driver (broker/server/accounting/client_usage.hpp,
// busy_time.hpp): the `ps` line's launch and byte counts are exact, device memory's peak outlives a
// free, and the GPU busy time comes from the test driver's timing events around the client's work:
// at least the sleep_kernel durations it launched, at most the wall time the work took.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>

#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {
namespace {

using batch::field;
using batch::Fixture;
using proto::Op;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kBuffer = 1 << 20;
constexpr std::uint64_t kPinned = 8192;
constexpr int kSleeps = 5;
constexpr int kSleepUs = 20'000;

std::uint64_t ps_field(Harness& h, const std::string& key) {
  return field(h.server->stats_text(false), key);
}

TEST_CASE("ps counts launches and bytes copied each way exactly", "[server][accounting]") {
  Fixture f(test_driver());
  const std::uint64_t a = f.buffer(kBuffer);
  const std::uint64_t b = f.buffer(kBuffer);
  const std::uint32_t copy_bytes = 300'000;

  // Host to device through staging chunk 0, device to device, device to host through chunk 1.
  std::memset(f.sut.view().chunk(0), 0x5a, copy_bytes);
  f.sut.send(Op::kCopyHtoD,
             proto::CopyHostReq{f.ctx.default_stream, a, copy_bytes,
                                proto::HostRef{0, 0, proto::HostKind::kStagingChunk, 1}});
  REQUIRE(f.h.pump_until([&] { return f.sut.view().chunk_state(0)->done_generation == 1; }));
  REQUIRE(f.sut.call(Op::kCopyDtoD, proto::CopyDtoDReq{f.ctx.default_stream, b, a, copy_bytes / 2})
              .result == CUDA_SUCCESS);
  const auto back = f.read<std::uint8_t>(b, copy_bytes / 4);
  CHECK(back[0] == 0x5a);
  CHECK(back[copy_bytes / 4 - 1] == 0x5a);
  // A pinned region: its bytes count while the client holds it, and copies from it are host
  // to device. The copy is cuMemcpyHtoD's, answered once it ran (as the shim sends it): the
  // kernels below read `a` on a non-blocking stream, which orders with nothing on the default
  // stream, so an answer on enqueue (cuMemcpyHtoDAsync's) would leave the copy racing them.
  std::vector<std::byte> content(kPinned, std::byte{0x11});
  f.sut.send_memfd(proto::MessageKind::kHostMemory, 77, kPinned, content);
  auto region = f.sut.call(Op::kHostRegister, proto::HostRegisterReq{0, kPinned, 77, 0});
  REQUIRE(region.result == CUDA_SUCCESS);
  f.sut.send(Op::kCopyHtoD,
             proto::CopyHostReq{f.ctx.default_stream, a, kPinned,
                                proto::HostRef{region.as<proto::HostRegisterRep>().region, 0,
                                               proto::HostKind::kPinnedRegion, 0}},
             0, {}, proto::kFlagReplyWhenDone);
  const auto pinned_copy = f.sut.reply(0);
  REQUIRE(pinned_copy);
  REQUIRE(pinned_copy->result == CUDA_SUCCESS);
  CHECK(ps_field(f.h, "pinned") == kPinned);
  // Launches, batched or not.
  auto add = f.function("vector_add");
  const std::uint64_t stream = f.stream();
  constexpr int kLaunches = 37;
  for (int i = 0; i < kLaunches; ++i) f.launch(add, stream, 4, 256, a, a, b, 1024);
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);
  // Memory: the peak outlives a free.
  REQUIRE(f.sut.call(Op::kMemFree, proto::MemFreeReq{b}).result == CUDA_SUCCESS);
  REQUIRE(f.sut
              .call(Op::kHostUnregister,
                    proto::HostUnregisterReq{region.as<proto::HostRegisterRep>().region})
              .result == CUDA_SUCCESS);

  CHECK(ps_field(f.h, "launches") == kLaunches);
  CHECK(ps_field(f.h, "h2d_bytes") == copy_bytes + kPinned);
  CHECK(ps_field(f.h, "d2d_bytes") == copy_bytes / 2);
  CHECK(ps_field(f.h, "d2h_bytes") == copy_bytes / 4);
  CHECK(ps_field(f.h, "mem_used") == kBuffer);
  CHECK(ps_field(f.h, "mem_peak") == 2 * kBuffer);
  CHECK(ps_field(f.h, "pinned") == 0);
  CHECK(ps_field(f.h, "sm_percentage") == 100);
  CHECK(ps_field(f.h, "priority") == 0);
}

// GPU busy time costs the launch path, so servers measure it only with --busy-time on.
ServerSettings busy_time_on() {
  ServerSettings settings;
  settings.busy_time = true;
  return settings;
}

TEST_CASE("without --busy-time on, busy time is not measured and says so", "[server][accounting]") {
  Fixture f(test_driver());
  auto sleeper = f.function("sleep_kernel");
  const std::uint64_t stream = f.stream();
  f.launch(sleeper, stream, 1, 1, kSleepUs);
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);
  const std::string line = f.h.server->stats_text(false);
  CHECK(line.find("busy_us=-") != std::string::npos);
  CHECK(line.find("launches=1 ") != std::string::npos);
}

TEST_CASE("busy time is the GPU time of the client's kernels, measured by events",
          "[server][accounting]") {
  Fixture f(test_driver(), busy_time_on());
  auto sleeper = f.function("sleep_kernel");
  const std::uint64_t stream = f.stream();
  CHECK(ps_field(f.h, "busy_us") == 0);

  const auto started = Clock::now();
  for (int i = 0; i < kSleeps; ++i) f.launch(sleeper, stream, 1, 1, kSleepUs);
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);
  const auto wall_us =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started).count();

  // The kernels slept kSleeps * kSleepUs on the test driver's stream; the spans cover them and
  // lie within the time from the first launch to the synchronize's answer.
  const std::uint64_t busy_us = ps_field(f.h, "busy_us");
  CHECK(busy_us >= std::uint64_t{kSleeps} * kSleepUs);
  CHECK(busy_us <= static_cast<std::uint64_t>(wall_us));

  // Idle time between the client's calls is not busy time.
  const auto idle_from = Clock::now();
  while (Clock::now() - idle_from < std::chrono::milliseconds(50)) f.h.pump(1);
  f.launch(sleeper, stream, 1, 1, kSleepUs);
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);
  const std::uint64_t after = ps_field(f.h, "busy_us");
  CHECK(after >= busy_us + kSleepUs);
  CHECK(after < busy_us + kSleepUs + 40'000);  // the 50 ms of idle are not in it
}

TEST_CASE("two streams' busy time adds up; a stream that waits is not busy",
          "[server][accounting]") {
  Fixture f(test_driver(), busy_time_on());
  auto sleeper = f.function("sleep_kernel");
  const std::uint64_t first = f.stream();
  const std::uint64_t second = f.stream();
  const std::uint64_t event = f.event();

  // `second` runs a short kernel, then waits for `first`'s kernel before running its own: the
  // wait is not its work, though its span was open when the wait came.
  constexpr int kLongSleepUs = 50'000;  // counted with the wait it would be 3 of them, not 2
  constexpr int kShortSleepUs = 1'000;
  f.launch(sleeper, second, 1, 1, kShortSleepUs);
  f.launch(sleeper, first, 1, 1, kLongSleepUs);
  f.sut.send(Op::kEventRecord, proto::EventRecordReq{event, first, 0, 0});
  f.sut.send(Op::kStreamWaitEvent, proto::StreamWaitEventReq{second, event, 0, 0});
  f.launch(sleeper, second, 1, 1, kLongSleepUs);
  REQUIRE(f.synchronize(second) == CUDA_SUCCESS);
  REQUIRE(f.synchronize(first) == CUDA_SUCCESS);

  const std::uint64_t busy_us = ps_field(f.h, "busy_us");
  CHECK(busy_us >= 2 * kLongSleepUs + kShortSleepUs);
  CHECK(busy_us < 5 * kLongSleepUs / 2);
}

}  // namespace
}  // namespace mpsshim::server::test
