// Priorities that protect latency (broker/server/scheduling/priority_gate.hpp), on the test driver,
// whose streams run concurrently on threads of their own: a below-normal client's later records are
// held back while a normal client's kernel runs, until the below-normal client's own earlier
// work finished; never longer than the hold bound; not at all without normal work in flight or
// with the gate off. What shows the hold is an order on the device, not a timing: the
// below-normal client queues a 100 ms kernel and a flag after it on stream A, then on stream B
// a kernel that copies the flag. Issued at once (no hold), B runs while A still sleeps and
// copies 0; held, B is issued only after A's work finished and copies 1.
#include <catch2/catch.hpp>

#include <mutex>
#include <thread>
#include <vector>

#include "broker/server/ops/ops.hpp"
#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {
namespace {

using batch::bits;
using batch::Fixture;

constexpr int kNormalPid = 5001;
constexpr int kBelowNormalPid = 5002;
constexpr int kRunAhead = 2;  // records per held pass: the sleeper and the flag on stream A

ServerSettings gate_settings(bool enabled, std::chrono::microseconds max_hold) {
  ServerSettings settings;
  settings.priority.enabled = enabled;
  settings.priority.max_hold = max_hold;
  settings.priority.run_ahead = kRunAhead;
  return settings;
}

proto::ClientHello below_normal_hello() {
  proto::ClientHello hello = default_hello(kBelowNormalPid, "batch_job");
  hello.priority = 1;  // CUDA_MPS_CLIENT_PRIORITY=1
  return hello;
}

// The two clients on one server, with their kernels; hung up before the fixtures go.
struct TwoClients {
  explicit TwoClients(ServerSettings settings)
      : h(test_driver(), settings),
        normal(h, default_hello(kNormalPid, "latency_service")),
        low(h, below_normal_hello()) {}
  ~TwoClients() {
    low.sut.hang_up();
    normal.sut.hang_up();
  }
  int busy_normal() { return h.server->priority_board().busy_normal(); }
  const PriorityState& low_state() {
    return h.server->find_session(low.sut.welcome().client_id)->priority;
  }

  // The normal client starts a kernel of `us` microseconds and counts as busy.
  void normal_runs_for(int us) {
    auto sleeper = normal.function("sleep_kernel");
    normal_stream = normal.stream();
    normal.launch(sleeper, normal_stream, 1, 1, us);
    REQUIRE(h.pump_until([&] { return busy_normal() == 1; }));
  }

  // The order probe of the file comment; the value stream B copied.
  float probe(int sleep_us) {
    auto sleeper = low.function("sleep_kernel");
    auto fill = low.function("fill_u32");
    auto scale_add = low.function("scale_add");
    const std::uint64_t a = low.stream();
    const std::uint64_t b = low.stream();
    const std::uint64_t flag = low.buffer(4);
    const std::uint64_t copy = low.buffer(4);
    low.memset(low.ctx.default_stream, flag, 0, 1);
    low.memset(low.ctx.default_stream, copy, 0, 1);
    REQUIRE(low.synchronize(low.ctx.default_stream) == CUDA_SUCCESS);

    low.launch(sleeper, a, 1, 1, sleep_us);
    low.launch(fill, a, 1, 1, flag, bits(1.0f), 1);
    low.launch(scale_add, b, 1, 1, copy, flag, 1.0f, 1);  // copy = flag + 0
    REQUIRE(low.synchronize(b) == CUDA_SUCCESS);
    copied = low.read<float>(copy, 1).at(0);
    normal_busy_when_answered = busy_normal();
    // Whatever the order, every result is right in the end.
    REQUIRE(low.synchronize(a) == CUDA_SUCCESS);
    CHECK(low.read<float>(flag, 1).at(0) == 1.0f);
    return copied;
  }

  Harness h;
  Fixture normal;
  Fixture low;
  std::uint64_t normal_stream = 0;
  float copied = -1;
  int normal_busy_when_answered = -1;
};

TEST_CASE("a below-normal client is held back while a normal client's kernel runs",
          "[server][priority]") {
  TwoClients sut(gate_settings(true, std::chrono::seconds(10)));
  sut.normal_runs_for(600'000);

  CHECK(sut.probe(100'000) == 1.0f);  // stream B was issued after stream A's work finished

  CHECK(sut.normal_busy_when_answered == 1);  // ... while the normal client's kernel still ran
  CHECK(sut.low_state().holds > 0);
  CHECK(sut.low_state().held_us >= 50'000);  // most of A's 100 ms kernel
  REQUIRE(sut.normal.synchronize(sut.normal_stream) == CUDA_SUCCESS);
  CHECK(sut.h.pump_until([&] { return sut.busy_normal() == 0; }));
}

TEST_CASE("a normal client's work that its synchronize covers gets no fence of its own",
          "[server][priority]") {
  TwoClients sut(gate_settings(true, std::chrono::seconds(10)));
  auto sleeper = sut.normal.function("sleep_kernel");
  const std::uint64_t stream = sut.normal.stream();
  const PriorityState& normal =
      sut.h.server->find_session(sut.normal.sut.welcome().client_id)->priority;
  const std::uint64_t before = normal.fenced;

  // A launch on its own: fenced, so the below-normal client knows when it ran.
  sut.normal.launch(sleeper, stream, 1, 1, 20'000);
  REQUIRE(sut.h.pump_until([&] { return normal.fenced == before + 1; }));
  CHECK(sut.busy_normal() == 1);
  REQUIRE(sut.normal.synchronize(stream) == CUDA_SUCCESS);

  // A launch and its synchronize drained in one pass: the synchronize's completion covers the
  // launch, and the client stays busy until it fires.
  sut.normal.launch(sleeper, stream, 1, 1, 20'000);
  REQUIRE(sut.normal.synchronize(stream) == CUDA_SUCCESS);
  CHECK(normal.fenced == before + 1);

  // Work after the synchronize in the same pass is fenced again.
  sut.normal.launch(sleeper, stream, 1, 1, 1'000);
  sut.normal.sut.send(proto::Op::kStreamSynchronize, proto::HandleReq{stream}, 1);
  sut.normal.launch(sleeper, stream, 1, 1, 200'000);
  REQUIRE(sut.h.pump_until([&] { return normal.fenced == before + 2; }));
  CHECK(sut.busy_normal() == 1);
  REQUIRE(sut.normal.sut.reply(1).value().result == CUDA_SUCCESS);
  REQUIRE(sut.normal.synchronize(stream) == CUDA_SUCCESS);
  CHECK(sut.h.pump_until([&] { return sut.busy_normal() == 0; }));
}

TEST_CASE("a hold never lasts longer than its bound", "[server][priority]") {
  TwoClients sut(gate_settings(true, std::chrono::milliseconds(20)));
  sut.normal_runs_for(800'000);

  // A's kernel sleeps 400 ms; the hold ends after 20 ms, so B is issued while A still sleeps.
  CHECK(sut.probe(400'000) == 0.0f);
  CHECK(sut.normal_busy_when_answered == 1);
  CHECK(sut.low_state().holds > 0);
  REQUIRE(sut.normal.synchronize(sut.normal_stream) == CUDA_SUCCESS);
}

// A held client learns that its earlier work finished from its fences: words the GPU writes
// into host memory, read on every pass, or events, which cost a driver call each and are asked
// about at most every fence_poll: with --host-fences off, and while the server is crowded (more
// clients than spin_clients), where a word's write costs more driver CPU than an event's record.
TEST_CASE(
    "a held client's event fences are asked about no more often than fence_poll; its "
    "host-fence words are read on every pass",
    "[server][priority]") {
  struct Case {
    bool host_fences;
    bool crowded;
    std::chrono::microseconds poll;
    bool released_at_fence;
  };
  const std::chrono::microseconds hour(3'600'000'000LL);
  for (Case c :
       {Case{false, false, std::chrono::microseconds(50), true}, Case{false, false, hour, false},
        Case{true, false, hour, true}, Case{true, true, hour, false}}) {
    INFO("host fences " << c.host_fences << ", crowded " << c.crowded << ", fence_poll "
                        << c.poll.count() << " us");
    ServerSettings settings = gate_settings(true, std::chrono::milliseconds(400));
    settings.host_fences = c.host_fences;
    settings.priority.fence_poll = c.poll;
    // The two clients crowd it when one may spin; not when both may (the default, half the
    // CPUs, depends on the machine).
    settings.spin_clients = c.crowded ? 1 : 2;
    TwoClients sut(settings);
    sut.normal_runs_for(2'000'000);
    // Stream A's 20 ms kernel finishes long before the hold's bound; only its fence shows it.
    // The held record is a kernel on stream B that touches nothing of A's: a release by the
    // bound (the event fence asked once an hour) is no synchronization with A's work, so they
    // must share no memory.
    auto sleeper = sut.low.function("sleep_kernel");
    const std::uint64_t a = sut.low.stream();
    const std::uint64_t b = sut.low.stream();
    sut.low.launch(sleeper, a, 1, 1, 20'000);
    sut.low.launch(sleeper, a, 1, 1, 1);  // the pass's run-ahead of 2 ends here
    sut.low.launch(sleeper, b, 1, 1, 1);  // held until A's work is seen done, or the bound
    REQUIRE(sut.low.synchronize(b) == CUDA_SUCCESS);
    CHECK(sut.low_state().holds > 0);
    CHECK(sut.low_state().fenced > 0);
    // Which ended the hold, counted by the gate (not timed: a loaded machine stretches both).
    if (c.released_at_fence) {
      CHECK(sut.low_state().released_by_bound == 0);
    } else {
      CHECK(sut.low_state().released_by_bound > 0);  // asked once, then held to the bound
    }
    REQUIRE(sut.normal.synchronize(sut.normal_stream) == CUDA_SUCCESS);
  }
}

TEST_CASE("without normal work in flight nothing is held", "[server][priority]") {
  TwoClients sut(gate_settings(true, std::chrono::seconds(10)));
  REQUIRE(sut.h.pump_until([&] { return sut.busy_normal() == 0; }));  // its setup's linger

  CHECK(sut.probe(100'000) == 0.0f);
  CHECK(sut.low_state().holds == 0);
}

TEST_CASE("with priority scheduling off nothing is held", "[server][priority]") {
  TwoClients sut(gate_settings(false, std::chrono::seconds(10)));
  auto sleeper = sut.normal.function("sleep_kernel");
  const std::uint64_t stream = sut.normal.stream();
  sut.normal.launch(sleeper, stream, 1, 1, 600'000);
  sut.h.pump(8);

  CHECK(sut.busy_normal() == 0);  // nobody counts
  CHECK(sut.probe(100'000) == 0.0f);
  CHECK(sut.low_state().holds == 0);
  REQUIRE(sut.normal.synchronize(stream) == CUDA_SUCCESS);
}

TEST_CASE("a normal client's streams outrank a below-normal client's", "[server][priority]") {
  for (bool enabled : {true, false}) {
    TwoClients sut(gate_settings(enabled, std::chrono::seconds(10)));
    Session* normal = sut.h.server->find_session(sut.normal.sut.welcome().client_id);
    Session* low = sut.h.server->find_session(sut.low.sut.welcome().client_id);
    REQUIRE(normal != nullptr);
    REQUIRE(low != nullptr);
    const proto::DeviceSnapshot& snap = sut.h.gpu.snapshot;
    const int least = std::max(snap.stream_priority_least, snap.stream_priority_greatest);
    // Lower numbers are higher priorities; both ask for the default (the least).
    INFO("priority scheduling " << (enabled ? "on" : "off"));
    CHECK(effective_priority(*low, 0) == least);
    CHECK(effective_priority(*normal, 0) == (enabled ? least - 1 : least));
  }
}

TEST_CASE("on worker threads, held-back clients still finish and every result is right",
          "[server][priority][threaded]") {
  constexpr int kNormalRounds = 200;
  constexpr int kLowRounds = 50;
  constexpr int kLowLaunches = 8;
  constexpr int kWords = 1024;
  ServerSettings settings = gate_settings(true, std::chrono::milliseconds(2));
  settings.workers = 2;
  Harness h(test_driver(), settings);
  h.start_threaded();
  std::vector<int> counts;
  {
    // One normal client launching and synchronizing in a loop (it keeps the gate closed), two
    // below-normal ones launching bursts; each counts its kernels in its own buffer.
    Fixture normal(h, default_hello(kNormalPid, "latency_service"));
    Fixture low_a(h, below_normal_hello());
    Fixture low_b(h, below_normal_hello());
    // Catch2's assertions are not thread-safe: everything that asserts (setup, launch records,
    // reads) runs on this thread or under `asserting`; the threads only send and synchronize.
    struct Job {
      Fixture& f;
      int rounds;
      int launches;
      proto::FunctionRep increment;
      std::uint64_t stream;
      std::uint64_t buffer;
    };
    auto prepare = [&](Fixture& f, int rounds, int launches) {
      Job job{f, rounds, launches, f.function("increment_i32"), f.stream(), f.buffer(kWords * 4)};
      f.memset(job.stream, job.buffer, 0, kWords);
      return job;
    };
    std::mutex asserting;
    auto work = [&](Job& job) {
      for (int r = 0; r < job.rounds; ++r) {
        for (int l = 0; l < job.launches; ++l) {
          std::lock_guard lock(asserting);
          job.f.launch(job.increment, job.stream, 4, 256, job.buffer, kWords);
        }
        if (job.f.synchronize(job.stream) != CUDA_SUCCESS) return false;
      }
      return true;
    };
    auto count = [&](Job& job) {
      for (int w : job.f.read<int>(job.buffer, kWords)) {
        if (w != job.rounds * job.launches) return w;
      }
      return job.rounds * job.launches;
    };
    Job normal_job = prepare(normal, kNormalRounds, 1);
    Job a_job = prepare(low_a, kLowRounds, kLowLaunches);
    Job b_job = prepare(low_b, kLowRounds, kLowLaunches);
    bool a_ok = false, b_ok = false;
    std::thread ta([&] { a_ok = work(a_job); });
    std::thread tb([&] { b_ok = work(b_job); });
    const bool normal_ok = work(normal_job);
    ta.join();
    tb.join();
    CHECK(normal_ok);
    CHECK(a_ok);
    CHECK(b_ok);
    const int normal_count = count(normal_job), a_count = count(a_job), b_count = count(b_job);
    counts = {normal_count, a_count, b_count};
    normal.sut.hang_up();
    low_a.sut.hang_up();
    low_b.sut.hang_up();
  }
  CHECK(counts ==
        std::vector<int>{kNormalRounds, kLowRounds * kLowLaunches, kLowRounds * kLowLaunches});
  CHECK(h.stop_threaded() == 0);
  CHECK(h.server->priority_board().busy_normal() == 0);
  CHECK(h.server->priority_board().below_normal_sessions() == 0);
}

}  // namespace
}  // namespace mpsshim::server::test
