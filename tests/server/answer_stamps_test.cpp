// Diagnostic stamps in answers (broker/server/base/answer_stamps.hpp), on the test driver: with
// them on, a synchronize's slot carries when the worker took the last launch and issued it, took
// the synchronize, knew its answer and wrote it, in that order and within the test's own clock
// reads; with them off, the slot's stamps stay 0.
#include <catch2/catch.hpp>

#include "broker/server/base/answer_stamps.hpp"
#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {
namespace {

using batch::Fixture;

TEST_CASE("with answer stamps on, a synchronize's answer carries the server's times in order",
          "[server][stamps]") {
  struct Restore {
    ~Restore() { set_answer_stamps_for_testing(false); }
  } restore;
  for (bool on : {true, false}) {
    INFO("stamps " << (on ? "on" : "off"));
    set_answer_stamps_for_testing(on);
    Harness h(test_driver(), ServerSettings{});
    Fixture f(h, default_hello(7100, "stamped"));
    auto fill = f.function("fill_u32");
    const std::uint64_t stream = f.stream();
    constexpr int kWords = 1024;
    const std::uint64_t x = f.buffer(kWords * 4);
    const std::uint64_t before = SessionStats::now_ns();
    f.launch(fill, stream, 4, 256, x, 7u, kWords);
    REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);
    const std::uint64_t after = SessionStats::now_ns();
    const proto::ResponseSlot& slot = *f.sut.view().slot(0);
    if (!on) {
      CHECK(slot.stamp_taken_ns == 0);
      CHECK(slot.stamp_known_ns == 0);
      CHECK(slot.stamp_answered_ns == 0);
      CHECK(slot.stamp_launch_taken_ns == 0);
      CHECK(slot.stamp_launch_issued_ns == 0);
      continue;
    }
    CHECK(before <= slot.stamp_launch_taken_ns);
    CHECK(slot.stamp_launch_taken_ns <= slot.stamp_launch_issued_ns);
    CHECK(slot.stamp_launch_issued_ns <= slot.stamp_taken_ns);
    CHECK(slot.stamp_taken_ns <= slot.stamp_known_ns);
    CHECK(slot.stamp_known_ns <= slot.stamp_answered_ns);
    CHECK(slot.stamp_answered_ns <= after);
    for (int w : f.read<int>(x, kWords)) REQUIRE(w == 7);
  }
}

}  // namespace
}  // namespace mpsshim::server::test
