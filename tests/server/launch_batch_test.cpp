// Launch batching (broker/server/launch/launch_batch.hpp): consecutive launches of a session for
// one stream go out as one launch of a cached executable graph. On the test driver, whose graphs
// really run their nodes in order with the parameters last set, the results must be those of
// eager launches; on the fake driver, a failing graph step must fall back to eager launches.
#include <catch2/catch.hpp>

#include <cstring>
#include <set>
#include <vector>

#include "tests/server/harness.hpp"
#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {

using namespace batch;

namespace {

using proto::Op;

constexpr int kWords = 16;

// fill_u32(p + i, 100 i, 1) then increment_i32(p, n), for every i: word i ends at
// 100 i + (kWords - i), which only the launch order gives. Two functions, 2 * kWords launches.
// (Functions are looked up before: a lookup is a record between launches.)
void append_and_count(Fixture& f, std::uint64_t stream, std::uint64_t words,
                      const proto::FunctionRep& fill, const proto::FunctionRep& increment) {
  for (int i = 0; i < kWords; ++i) {
    f.launch(fill, stream, 1, 32, words + 4u * i, static_cast<std::uint32_t>(100 * i), 1);
    f.launch(increment, stream, 2, 64, words, kWords);
  }
}
std::vector<std::uint32_t> appended_and_counted() {
  std::vector<std::uint32_t> out;
  for (int i = 0; i < kWords; ++i) out.push_back(static_cast<std::uint32_t>(100 * i + kWords - i));
  return out;
}

// n launches of fill_u32 on `stream`, the i-th writing value(i) into word i of `out`, then a
// synchronize and the words checked. `grid` changes the launches' shape, not what they write.
template <typename Value>
void fill_words(Fixture& f, const proto::FunctionRep& fill, std::uint64_t stream, std::uint64_t out,
                int n, Value value, std::array<unsigned, 3> grid = {1, 1, 1}) {
  std::vector<std::uint32_t> expected;
  for (int i = 0; i < n; ++i) {
    f.launch_shaped(fill, stream, grid, {32, 1, 1}, 0, out + 4u * static_cast<unsigned>(i),
                    static_cast<std::uint32_t>(value(i)), 1);
    expected.push_back(static_cast<std::uint32_t>(value(i)));
  }
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);
  CHECK(f.read(out, static_cast<std::size_t>(n)) == expected);
}

// Fibonacci with vector_add on aliased buffers: a += b, then b += a, `pairs` times, from a = b =
// 1: any two launches swapped give other numbers.
void fibonacci(Fixture& f, std::uint64_t stream, std::uint64_t a, std::uint64_t b, int pairs,
               const proto::FunctionRep& add) {
  for (int i = 0; i < pairs; ++i) {
    f.launch(add, stream, 1, 32, a, b, a, 4);
    f.launch(add, stream, 1, 32, a, b, b, 4);
  }
}

// What one run of the mixed sequence below leaves in device memory, and what came back.
struct RunResult {
  std::vector<std::uint32_t> words;
  std::vector<float> fib;
  CUresult async_error = CUDA_SUCCESS;
  Figures figures;
  unsigned long long instantiations = 0;
};

RunResult run_mixed(ServerSettings settings, int rounds) {
  Fixture f(test_driver(), settings);
  const unsigned long long instantiated_before = instantiations();
  const std::uint64_t s = f.stream();
  const std::uint64_t words = f.buffer(4 * kWords);
  const std::uint64_t fib = f.buffer(2 * 4 * 4);
  const auto fill = f.function("fill_u32");
  const auto increment = f.function("increment_i32");
  const auto add = f.function("vector_add");
  RunResult result;
  for (int round = 0; round < rounds; ++round) {
    f.memset(s, words, 0, kWords);
    f.memset(s, fib, bits(1.0f), 8);
    append_and_count(f, s, words, fill, increment);
    fibonacci(f, s, fib, fib + 16, 5, add);
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
    CHECK(f.read(words, kWords) == appended_and_counted());
  }
  result.words = f.read(words, kWords);
  result.fib = f.read<float>(fib, 8);
  result.async_error = f.async_error();
  result.figures = figures(f.h);
  result.instantiations = instantiations() - instantiated_before;
  return result;
}

}  // namespace

TEST_CASE("batched launches leave device memory exactly as eager launches do",
          "[server][launch_batch]") {
  constexpr int kRounds = 4;
  const RunResult eager = run_mixed(no_batching(), kRounds);
  const RunResult exact = run_mixed(exact_batching(), kRounds);
  const RunResult runs = run_mixed(batching(), kRounds);
  const RunResult padded = run_mixed(padded_batching(), kRounds);
  ServerSettings ramp_settings = batching();
  ramp_settings.launch_batch.ramp_last = 32;
  const RunResult ramped = run_mixed(ramp_settings, kRounds);

  CHECK(eager.words == appended_and_counted());
  // a, b after five pairs from 1, 1: (2, 3), (5, 8), (13, 21), (34, 55), (89, 144).
  CHECK(eager.fib == std::vector<float>{89, 89, 89, 89, 144, 144, 144, 144});
  for (const RunResult* batched : {&exact, &runs, &padded, &ramped}) {
    CHECK(batched->words == eager.words);
    CHECK(batched->fib == eager.fib);
    CHECK(batched->async_error == CUDA_SUCCESS);
  }
  CHECK(eager.async_error == CUDA_SUCCESS);

  const std::uint64_t per_round = 2 * kWords + 10;
  CHECK(eager.figures.batches == 0);
  CHECK(eager.figures.launches == kRounds * per_round);
  CHECK(eager.instantiations == 0);
  // Each round's launches wait in the ring behind two memsets and end at the synchronize: one
  // batch. The first round is the sequence's first sighting (eager); the second builds its
  // graph, the others reuse it.
  CHECK(exact.figures.launches == kRounds * per_round);
  CHECK(exact.figures.batches == kRounds - 1);
  CHECK(exact.figures.batched == (kRounds - 1) * per_round);
  CHECK(exact.instantiations == 1);
  // In power-of-two runs the 42 launches are 32 + 8 + 2: three graphs, three graph launches.
  CHECK(runs.figures.launches == kRounds * per_round);
  CHECK(runs.figures.batches == 3 * (kRounds - 1));
  CHECK(runs.figures.batched == (kRounds - 1) * per_round);
  CHECK(runs.instantiations == 3);
  // Padded, the 42 launches are one launch of a 64-node graph whose last 22 nodes are disabled.
  CHECK(padded.figures.launches == kRounds * per_round);
  CHECK(padded.figures.batches == kRounds - 1);
  CHECK(padded.figures.batched == (kRounds - 1) * per_round);
  CHECK(padded.instantiations == 1);
  CHECK(ramped.figures.launches == kRounds * per_round);
}

TEST_CASE("a batch goes out as one graph launch whose nodes all got this batch's parameters",
          "[server][launch_batch]") {
  Fixture f(test_driver(), batching(64, 0));
  const auto fill = f.function("fill_u32");
  const std::uint64_t s = f.stream();
  const std::uint64_t out = f.buffer(4 * kWords);
  const unsigned long long updates_before = node_updates();
  // The same sequence of functions with other arguments each time: the cached graph runs them.
  for (std::uint32_t round = 1; round <= 3; ++round) {
    fill_words(f, fill, s, out, kWords,
               [&](int i) { return round * 1000 + static_cast<std::uint32_t>(i); });
  }
  CHECK(figures(f.h).batches == 3);
  CHECK(node_updates() - updates_before == 3 * kWords);
  CHECK(f.async_error() == CUDA_SUCCESS);
}

TEST_CASE("a node that already holds a launch's function, shape and arguments is not updated",
          "[server][launch_batch]") {
  Fixture f(test_driver(), batching(64, 0));
  const auto fill = f.function("fill_u32");
  const std::uint64_t s = f.stream();
  const std::uint64_t out = f.buffer(4 * kWords);
  // After a memset that clears the words: only the graph's nodes, kept or updated, put the
  // values back.
  auto burst = [&](auto value, std::array<unsigned, 3> grid = {1, 1, 1}) {
    f.memset(s, out, 0, kWords);
    fill_words(f, fill, s, out, kWords, value, grid);
  };
  auto same = [](int i) { return 7u * static_cast<std::uint32_t>(i); };
  auto fifth_changed = [&](int i) { return i == 5 ? 999u : same(i); };
  const unsigned long long before = node_updates();
  auto updates = [&] { return node_updates() - before; };

  burst(same);
  CHECK(updates() == kWords);  // a new graph: every node is set
  burst(same);
  burst(same);
  CHECK(updates() == kWords);
  burst(fifth_changed);
  CHECK(updates() == kWords + 1);
  burst(same);  // the fifth node is set back
  CHECK(updates() == kWords + 2);
  burst(same, {2, 1, 1});  // another grid: every node
  CHECK(updates() == 2 * kWords + 2);
  CHECK(figures(f.h).batches == 6);

  // A function's attribute may change what a node took from it: every node is set again.
  auto set =
      f.sut.call(Op::kFuncSetAttribute,
                 proto::AttributeReq{fill.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     1024, 0, 0});
  REQUIRE(set.result == CUDA_SUCCESS);
  burst(same, {2, 1, 1});
  CHECK(updates() == 3 * kWords + 2);
  CHECK(f.async_error() == CUDA_SUCCESS);
  CHECK(figures(f.h).batches == 7);
}

TEST_CASE("the padded graphs of the shortest and the longest batch are built at the first launch",
          "[server][launch_batch]") {
  for (const bool prepare : {true, false}) {
    INFO("prepare " << prepare);
    ServerSettings settings = padded_batching(64, 1);
    settings.launch_batch.min_launches = 8;
    settings.launch_batch.prepare_graphs = prepare;
    Fixture f(test_driver(), settings);
    const unsigned long long before = instantiations();
    const auto fill = f.function("fill_u32");
    const std::uint64_t s = f.stream();
    const std::uint64_t out = f.buffer(4 * 64);
    auto burst = [&](int n, std::uint32_t base) {
      fill_words(f, fill, s, out, n, [&](int i) { return base + static_cast<std::uint32_t>(i); });
    };
    burst(1, 10);  // goes out alone; then the 8- and the 64-node graphs are built
    CHECK(instantiations() - before == (prepare ? 2 : 0));
    burst(40, 100);  // first sight of its key: the 64-node graph if prepared, else eagerly
    burst(8, 200);
    CHECK(figures(f.h).batches == (prepare ? 2 : 0));
    burst(20, 300);  // a 32-node graph is never prepared: eagerly at first sight
    CHECK(figures(f.h).batches == (prepare ? 2 : 0));
    CHECK(instantiations() - before == (prepare ? 2 : 0));
    CHECK(f.async_error() == CUDA_SUCCESS);
  }
}

TEST_CASE("a memset, an event record or another stream between launches splits the batch in order",
          "[server][launch_batch]") {
  Fixture f(test_driver(), batching(64, 0));
  const auto add = f.function("scale_add");  // y = alpha * x + y
  const auto copy = f.function("vector_add");
  const std::uint64_t s = f.stream();
  const std::uint64_t other = f.stream();
  const std::uint64_t y = f.buffer(16);
  const std::uint64_t ones = f.buffer(16);
  const std::uint64_t zeros = f.buffer(16);
  const std::uint64_t snapshot = f.buffer(16);
  const std::uint64_t z = f.buffer(16);
  f.memset(s, ones, bits(1.0f), 4);
  f.memset(s, zeros, 0, 4);
  f.memset(s, z, 0, 4);
  f.memset(s, y, bits(7.0f), 4);
  REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
  const std::uint64_t reached = f.event();
  const std::uint64_t copied = f.event();

  SECTION("a memset") {
    for (int i = 0; i < 5; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);  // 12
    f.memset(s, y, bits(100.0f), 4);
    for (int i = 0; i < 3; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);  // 103
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
    CHECK(f.read<float>(y, 4) == std::vector<float>(4, 103.0f));
    CHECK(figures(f.h).batches == 2);
  }
  SECTION("an event record another stream waits for") {
    for (int i = 0; i < 5; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);  // 12
    f.sut.send(Op::kEventRecord, proto::EventRecordReq{reached, s, 0, 0});
    f.sut.send(Op::kStreamWaitEvent, proto::StreamWaitEventReq{other, reached, 0, 0});
    f.launch(copy, other, 1, 32, y, zeros, snapshot, 4);  // what y held at the record
    f.sut.send(Op::kEventRecord, proto::EventRecordReq{copied, other, 0, 0});
    f.sut.send(Op::kStreamWaitEvent, proto::StreamWaitEventReq{s, copied, 0, 0});
    for (int i = 0; i < 3; ++i) f.launch(add, s, 1, 32, y, ones, 10.0f, 4);  // 42
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
    CHECK(f.read<float>(snapshot, 4) == std::vector<float>(4, 12.0f));
    CHECK(f.read<float>(y, 4) == std::vector<float>(4, 42.0f));
    CHECK(figures(f.h).batches == 2);  // the lone copy on the other stream went out eagerly
  }
  SECTION("launches on another stream") {
    for (int i = 0; i < 4; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);      // 11
    for (int i = 0; i < 3; ++i) f.launch(add, other, 1, 32, z, ones, 2.0f, 4);  // 6
    for (int i = 0; i < 2; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);      // 13
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
    REQUIRE(f.synchronize(other) == CUDA_SUCCESS);
    CHECK(f.read<float>(y, 4) == std::vector<float>(4, 13.0f));
    CHECK(f.read<float>(z, 4) == std::vector<float>(4, 6.0f));
    auto fig = figures(f.h);
    CHECK(fig.batches == 3);
    CHECK(fig.batched == 8);  // 4, 2 (+ 1 eagerly), 2
  }
  CHECK(f.async_error() == CUDA_SUCCESS);
}

TEST_CASE("batches on the legacy default stream and a blocking stream keep the legacy order",
          "[server][launch_batch]") {
  Fixture f(test_driver(), batching(64, 0));
  const auto add = f.function("scale_add");
  const auto copy = f.function("vector_add");
  const std::uint64_t legacy = f.ctx.default_stream;
  const std::uint64_t blocking = f.stream(0);
  const std::uint64_t b = f.buffer(16);
  const std::uint64_t c = f.buffer(16);
  const std::uint64_t ones = f.buffer(16);
  const std::uint64_t zeros = f.buffer(16);
  f.memset(legacy, ones, bits(1.0f), 4);
  f.memset(legacy, zeros, 0, 4);
  f.memset(legacy, b, 0, 4);
  for (int i = 0; i < 4; ++i) f.launch(add, blocking, 1, 32, b, ones, 1.0f, 4);  // b = 4
  // The legacy stream waits for the blocking stream's batch, then copies and adds.
  f.launch(copy, legacy, 1, 32, b, zeros, c, 4);
  for (int i = 0; i < 3; ++i) f.launch(add, legacy, 1, 32, c, ones, 1.0f, 4);  // c = 7
  // The blocking stream waits for the legacy stream's batch.
  f.launch(copy, blocking, 1, 32, c, zeros, b, 4);
  f.launch(add, blocking, 1, 32, b, ones, 100.0f, 4);  // b = 107
  REQUIRE(f.synchronize(blocking) == CUDA_SUCCESS);
  CHECK(f.read<float>(c, 4) == std::vector<float>(4, 7.0f));
  CHECK(f.read<float>(b, 4) == std::vector<float>(4, 107.0f));
  CHECK(figures(f.h).batches == 3);
  CHECK(f.async_error() == CUDA_SUCCESS);
}

TEST_CASE("a launch the driver refuses fails as it does eagerly; the others of its batch run",
          "[server][launch_batch]") {
  auto run = [](ServerSettings settings) {
    Fixture f(test_driver(), settings);
    const auto add = f.function("scale_add");
    const std::uint64_t s = f.stream();
    const std::uint64_t y = f.buffer(16);
    const std::uint64_t ones = f.buffer(16);
    f.memset(s, ones, bits(1.0f), 4);
    f.memset(s, y, 0, 4);
    std::vector<CUresult> errors;
    auto round = [&](auto bad) {
      for (int i = 0; i < 3; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);
      bad();
      for (int i = 0; i < 3; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);
      REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
      errors.push_back(f.async_error());
    };
    // Too many threads, too much dynamic shared memory, a function the client does not have.
    for (int repeat = 0; repeat < 2; ++repeat) {
      round([&] { f.launch_shaped(add, s, {1, 1, 1}, {2048, 1, 1}, 0, y, ones, 1.0f, 4); });
      round([&] { f.launch_shaped(add, s, {1, 1, 1}, {32, 1, 1}, 1 << 20, y, ones, 1.0f, 4); });
      round([&] {
        proto::FunctionRep bogus = add;
        bogus.function = 0xdead;
        f.launch(bogus, s, 1, 32, y, ones, 1.0f, 4);
      });
    }
    struct Out {
      std::vector<CUresult> errors;
      std::vector<float> y;
      Figures figures;
    };
    return Out{errors, f.read<float>(y, 4), figures(f.h)};
  };
  const auto eager = run(no_batching());
  const auto batched = run(batching(64, 0));
  CHECK(eager.errors == std::vector<CUresult>{CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE,
                                              CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE,
                                              CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_INVALID_HANDLE});
  CHECK(batched.errors == eager.errors);
  CHECK(eager.y == std::vector<float>(4, 36.0f));
  CHECK(batched.y == eager.y);
  CHECK(batched.figures.launches == eager.figures.launches);
  CHECK(batched.figures.batches == 12);  // three before and three after each refused launch
}

TEST_CASE("a lone launch goes out eagerly, without a graph", "[server][launch_batch]") {
  Fixture f(test_driver(), batching(64, 0));
  const auto add = f.function("scale_add");
  const std::uint64_t s = f.stream();
  const std::uint64_t y = f.buffer(16);
  const std::uint64_t ones = f.buffer(16);
  f.memset(s, ones, bits(1.0f), 4);
  f.memset(s, y, 0, 4);
  REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
  const unsigned long long before = instantiations();
  const int graphs = graph_objects();
  for (int i = 0; i < 5; ++i) {
    f.launch(add, s, 1, 32, y, ones, 1.0f, 4);
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
  }
  CHECK(f.read<float>(y, 4) == std::vector<float>(4, 5.0f));
  CHECK(instantiations() == before);
  CHECK(graph_objects() == graphs);
  const Figures fig = figures(f.h);
  CHECK(fig.batches == 0);
  CHECK(fig.launches == 5);
}

TEST_CASE("the graph cache reuses graphs, stays within its bounds and dies with the session",
          "[server][launch_batch]") {
  const int live_before = live_driver_objects();
  const DriverObjects objects_before = driver_objects();
  {
    ServerSettings settings = exact_batching(64, 0);
    settings.launch_batch.cache_graphs = 2;
    Fixture f(test_driver(), settings);
    const auto add = f.function("scale_add");
    const std::uint64_t s = f.stream();
    const std::uint64_t y = f.buffer(16);
    const std::uint64_t ones = f.buffer(16);
    f.memset(s, ones, bits(1.0f), 4);
    f.memset(s, y, 0, 4);
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
    const int graphs_idle = graph_objects();
    const unsigned long long before = instantiations();
    float expected = 0;
    auto batch_of = [&](int n) {
      for (int i = 0; i < n; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);
      expected += static_cast<float>(n);
      REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
      // A graph and its executable graph per cached entry, never more than two entries.
      CHECK(graph_objects() <= graphs_idle + 4);
    };
    // Node counts are part of the key: 2 and 3 are two graphs, used again and again.
    for (int i = 0; i < 4; ++i) {
      batch_of(2);
      batch_of(3);
    }
    CHECK(instantiations() - before == 2);
    CHECK(graph_objects() == graphs_idle + 4);
    // A third size evicts the least recently used (2); 2 then needs a new graph.
    batch_of(4);
    batch_of(3);
    batch_of(2);
    CHECK(instantiations() - before == 4);
    CHECK(f.read<float>(y, 4) == std::vector<float>(4, expected));
    CHECK(figures(f.h).batches == 11);
    CHECK(graph_objects() == graphs_idle + 4);

    f.sut.hang_up();  // the cached graphs are left for the session's end
    REQUIRE(f.h.pump_until([&] { return f.h.logged("freed"); }));
    CHECK(f.h.logged("29 launches went out in 11 graph launches"));
    // All but its green context, which the server keeps for the next session.
    CHECK(driver_objects() == with_pooled(objects_before, *f.h.server));
  }
  CHECK(live_driver_objects() == live_before);
}

TEST_CASE("the graph cache holds no more nodes than its bound", "[server][launch_batch]") {
  ServerSettings settings = exact_batching(64, 0);
  settings.launch_batch.cache_nodes = 5;
  Fixture f(test_driver(), settings);
  const auto add = f.function("scale_add");
  const std::uint64_t s = f.stream();
  const std::uint64_t y = f.buffer(16);
  const std::uint64_t ones = f.buffer(16);
  f.memset(s, ones, bits(1.0f), 4);
  f.memset(s, y, 0, 4);
  REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
  const unsigned long long before = instantiations();
  Session* session = f.h.server->find_session(f.sut.welcome().client_id);
  REQUIRE(session != nullptr);
  for (int n : {3, 3, 4, 4, 3, 6}) {
    for (int i = 0; i < n; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
    CHECK(session->launch_batch.cached_graphs() <= 1);
  }
  // 3, (3 again), 4 evicts 3, (4 again), 3 evicts 4; 6 nodes never fit: eagerly.
  CHECK(instantiations() - before == 3);
  CHECK(f.read<float>(y, 4) == std::vector<float>(4, 23.0f));
  CHECK(figures(f.h).batches == 5);
}

TEST_CASE("under an SM quota batched kernels stay in the client's green context",
          "[server][launch_batch]") {
  proto::ClientHello hello = default_hello();
  hello.active_thread_percentage = 25;
  Fixture f(test_driver(), batching(64, 0), hello);
  const unsigned granted = f.sut.welcome().sm_count;
  const unsigned device = f.h.gpu.snapshot.sm_count;
  REQUIRE(granted < device);
  const std::uint64_t s = f.stream();
  const std::uint64_t ids = f.buffer(4 * device);
  auto distinct_sms = [&](const proto::FunctionRep& smid) {
    f.memset(s, ids, 0xffffffffu, device);
    for (int i = 0; i < 4; ++i) f.launch(smid, s, device, 32, ids);
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
    auto seen = f.read(ids, device);
    return std::set<std::uint32_t>(seen.begin(), seen.end()).size();
  };
  // A library's CUkernel: batched, its nodes name the green context.
  CHECK(distinct_sms(f.function("record_smid", proto::ImageKind::kLibrary)) == granted);
  CHECK(figures(f.h).batches == 1);
  // A module's CUfunction would run in its own (the primary) context as a graph node: eagerly.
  CHECK(distinct_sms(f.function("record_smid")) == granted);
  CHECK(figures(f.h).batches == 1);
  CHECK(f.async_error() == CUDA_SUCCESS);
}

TEST_CASE("launches during a stream capture are captured one by one, not batched",
          "[server][launch_batch]") {
  Fixture f(test_driver(), batching(64, 0));
  const auto add = f.function("scale_add");
  const std::uint64_t s = f.stream();
  const std::uint64_t y = f.buffer(16);
  const std::uint64_t ones = f.buffer(16);
  f.memset(s, ones, bits(1.0f), 4);
  f.memset(s, y, 0, 4);
  REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
  REQUIRE(f.sut
              .call(Op::kStreamBeginCapture,
                    proto::BeginCaptureReq{s, CU_STREAM_CAPTURE_MODE_RELAXED, 0})
              .result == CUDA_SUCCESS);
  for (int i = 0; i < 5; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);
  auto ended = f.sut.call(Op::kStreamEndCapture, proto::HandleReq{s});
  REQUIRE(ended.result == CUDA_SUCCESS);
  const std::uint64_t graph = ended.as<proto::EndCaptureRep>().graph;
  auto nodes = f.sut.call(Op::kGraphGetNodes, proto::GraphGetNodesReq{graph, 0});
  CHECK(nodes.as<proto::GraphGetNodesRep>().total == 5);
  auto inst = f.sut.call(Op::kGraphInstantiate, proto::GraphInstantiateReq{graph, 0, 0});
  REQUIRE(inst.result == CUDA_SUCCESS);
  // The client's own graph launches are never batched into: launches around them still are.
  const std::uint64_t exec = inst.as<proto::GraphInstantiateRep>().exec;
  for (int i = 0; i < 2; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);
  f.sut.send(Op::kGraphLaunch, proto::GraphLaunchReq{exec, s});
  for (int i = 0; i < 2; ++i) f.launch(add, s, 1, 32, y, ones, 1.0f, 4);
  REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
  CHECK(f.read<float>(y, 4) == std::vector<float>(4, 9.0f));
  CHECK(figures(f.h).batches == 2);
  CHECK(f.async_error() == CUDA_SUCCESS);
}

// ---- the fake driver: failures of the graph path ----

namespace {

struct FakeFixture {
  explicit FakeFixture(ServerSettings settings = batching(64, 0)) : h(settings), sut(h) {
    REQUIRE(sut.connected());
    ctx = sut.create_context();
    std::vector<std::byte> image = fatbin();
    sut.send_memfd(proto::MessageKind::kModuleImage, 1, image.size(), image);
    auto module = sut.call(Op::kImageLoad, proto::ImageLoadReq{ctx.ctx, image.size(), 1,
                                                               proto::ImageKind::kModule, 0, 0});
    REQUIRE(module.result == CUDA_SUCCESS);
    const std::string name = "f";
    std::vector<std::byte> bytes(name.size());
    std::memcpy(bytes.data(), name.data(), name.size());
    auto function =
        sut.call(Op::kModuleGetFunction,
                 proto::NamedLookupReq{module.as<proto::ImageLoadRep>().handle, 1, 0}, bytes);
    REQUIRE(function.result == CUDA_SUCCESS);
    fn = function.as<proto::FunctionRep>().function;
  }
  // `n` launches on the default stream, each with its index as its 24 argument bytes' first.
  void launches(int n) {
    for (int i = 0; i < n; ++i) {
      std::vector<std::byte> args(24);
      args[0] = static_cast<std::byte>(i);
      proto::LaunchReq req{};
      req.function = fn;
      req.stream = ctx.default_stream;
      req.grid[0] = req.grid[1] = req.grid[2] = 1;
      req.block[0] = 32;
      req.block[1] = req.block[2] = 1;
      req.args_bytes = 24;
      sut.send(Op::kLaunchKernel, req, proto::kNoReply, args);
    }
    h.pump();
  }

  Harness h;
  TestClient sut;
  proto::CtxCreateRep ctx{};
  std::uint64_t fn = 0;
};

}  // namespace

TEST_CASE("a batch whose graph cannot be instantiated goes out eagerly, once each",
          "[server][launch_batch]") {
  FakeFixture f(exact_batching(64, 0));
  fake_gpu().graph_instantiate_result = CUDA_ERROR_OUT_OF_MEMORY;
  f.launches(5);
  CHECK(fake_gpu().launches == 5);
  CHECK(fake_gpu().graph_launches == 0);
  CHECK(fake_gpu().graphs_live == 0);  // the half-made graph was destroyed
  CHECK(fake_gpu().last_launch_args[0] == std::byte{4});
  CHECK(f.sut.control()->async_error.load() == 0);
  // The sequence is not tried again: the same batch goes out eagerly at once.
  fake_gpu().graph_instantiate_result = CUDA_SUCCESS;
  f.launches(5);
  CHECK(fake_gpu().launches == 10);
  CHECK(fake_gpu().graph_instantiations == 0);
  CHECK(f.h.server->stats_text().find("launches=10 ") != std::string::npos);
  // Another sequence (of another length) gets its graph.
  f.launches(6);
  CHECK(fake_gpu().graph_instantiations == 1);
  CHECK(fake_gpu().graph_launches == 1);
  CHECK(fake_gpu().launches == 16);
  CHECK(fake_gpu().last_launch_args[0] == std::byte{5});
  CHECK(f.h.server->stats_text(true).find(" batches=1 batched=6 ") != std::string::npos);
}

TEST_CASE("a failed node update or graph launch falls back to eager launches, none lost or doubled",
          "[server][launch_batch]") {
  FakeFixture f(exact_batching(64, 0));
  bool update_fails = false;
  SECTION("node update") {
    fake_gpu().graph_node_update_result = CUDA_ERROR_INVALID_VALUE;
    update_fails = true;
  }
  SECTION("graph launch") {
    fake_gpu().graph_launch_result = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  }
  f.launches(7);
  CHECK(fake_gpu().graph_instantiations == 1);
  CHECK(fake_gpu().graph_launches == 0);
  CHECK(fake_gpu().launches == 7);
  CHECK(fake_gpu().last_launch_args[0] == std::byte{6});
  CHECK(f.sut.control()->async_error.load() == 0);
  CHECK(f.h.server->stats_text().find("launches=7 ") != std::string::npos);
  if (update_fails) {
    // The graph stays for other functions; the function its node would not take goes out
    // eagerly from now on, without trying the graph again.
    CHECK(fake_gpu().graph_execs_live == 1);
    fake_gpu().graph_node_update_result = CUDA_SUCCESS;
    const auto updates = fake_gpu().graph_node_updates;
    f.launches(7);
    CHECK(fake_gpu().graph_node_updates == updates);
    CHECK(fake_gpu().graph_launches == 0);
    CHECK(fake_gpu().launches == 14);
    CHECK(fake_gpu().last_launch_args[0] == std::byte{6});
  } else {
    CHECK(fake_gpu().graph_execs_live == 0);  // not trusted again
    CHECK(fake_gpu().graphs_live == 0);
  }
}

TEST_CASE("an eager launch's error in a fallen-back batch is reported as without batching",
          "[server][launch_batch]") {
  FakeFixture f;
  fake_gpu().graph_launch_result = CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
  fake_gpu().launch_result = CUDA_ERROR_INVALID_VALUE;
  f.launches(3);
  CHECK(fake_gpu().launches == 3);
  CHECK(f.sut.control()->async_error.exchange(0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(f.h.server->stats_text().find("launches=0 ") != std::string::npos);
}

TEST_CASE("batching off: every launch goes out on its own", "[server][launch_batch]") {
  FakeFixture f(batching(1));
  f.launches(9);
  CHECK(fake_gpu().launches == 9);
  CHECK(fake_gpu().graph_launches == 0);
  CHECK(fake_gpu().graph_instantiations == 0);
}

TEST_CASE("a batch goes out in power-of-two runs whose graphs serve later batches of any length",
          "[server][launch_batch]") {
  FakeFixture f(batching(64, 0));
  f.launches(7);  // 4 + 2 + 1
  CHECK(fake_gpu().launches == 7);
  CHECK(fake_gpu().graph_launches == 2);
  CHECK(fake_gpu().graph_instantiations == 2);
  CHECK(fake_gpu().last_launch_args[0] == std::byte{6});  // the last launch, eagerly
  f.launches(6);                                          // 4 + 2: both graphs again
  CHECK(fake_gpu().graph_instantiations == 2);
  CHECK(fake_gpu().graph_launches == 4);
  CHECK(fake_gpu().last_launch_args[0] == std::byte{5});
  f.launches(63);  // 32 + 16 + 8 + 4 + 2 + 1: three new graphs
  CHECK(fake_gpu().graph_instantiations == 5);
  CHECK(fake_gpu().graph_launches == 9);
  CHECK(fake_gpu().launches == 76);
  CHECK(f.h.server->stats_text(true).find(" batches=9 batched=74 ") != std::string::npos);
  CHECK(f.sut.control()->async_error.load() == 0);
}

TEST_CASE("a padded batch is one graph launch; only the nodes whose state changes are toggled",
          "[server][launch_batch]") {
  FakeFixture f(padded_batching(64, 0));
  f.launches(5);  // an 8-node graph, nodes 5 to 7 disabled
  CHECK(fake_gpu().graph_instantiations == 1);
  CHECK(fake_gpu().graph_launches == 1);
  CHECK(fake_gpu().launches == 5);                        // the disabled nodes ran nothing
  CHECK(fake_gpu().last_launch_args[0] == std::byte{4});  // the batch's last launch ran last
  CHECK(fake_gpu().graph_node_toggles == 3);
  f.launches(7);  // the same graph: nodes 5 and 6 enabled again
  CHECK(fake_gpu().graph_instantiations == 1);
  CHECK(fake_gpu().graph_launches == 2);
  CHECK(fake_gpu().launches == 12);
  CHECK(fake_gpu().last_launch_args[0] == std::byte{6});
  CHECK(fake_gpu().graph_node_toggles == 5);
  f.launches(8);  // and node 7
  CHECK(fake_gpu().graph_node_toggles == 6);
  CHECK(fake_gpu().launches == 20);
  f.launches(3);  // a 4-node graph, its last node disabled
  CHECK(fake_gpu().graph_instantiations == 2);
  CHECK(fake_gpu().graph_node_toggles == 7);
  CHECK(fake_gpu().launches == 23);
  CHECK(fake_gpu().last_launch_args[0] == std::byte{2});
  f.launches(33);  // 64 nodes, 31 disabled
  CHECK(fake_gpu().graph_instantiations == 3);
  CHECK(fake_gpu().graph_launches == 5);
  CHECK(fake_gpu().launches == 56);
  CHECK(fake_gpu().last_launch_args[0] == std::byte{32});
  CHECK(f.h.server->stats_text(true).find(" batches=5 batched=56 ") != std::string::npos);
  CHECK(f.sut.control()->async_error.load() == 0);
}

TEST_CASE("a padded batch whose nodes cannot be disabled goes out eagerly, none lost or doubled",
          "[server][launch_batch]") {
  FakeFixture f(padded_batching(64, 0));
  fake_gpu().graph_enable_result = CUDA_ERROR_NOT_SUPPORTED;
  f.launches(6);
  CHECK(fake_gpu().graph_instantiations == 1);
  CHECK(fake_gpu().graph_launches == 0);
  CHECK(fake_gpu().launches == 6);
  CHECK(fake_gpu().last_launch_args[0] == std::byte{5});
  CHECK(fake_gpu().graph_execs_live == 0);  // the graph is not trusted again
  CHECK(fake_gpu().graphs_live == 0);
  CHECK(f.sut.control()->async_error.load() == 0);
  // Nor is its key: the same shape goes out eagerly at once, without a new graph.
  fake_gpu().graph_enable_result = CUDA_SUCCESS;
  f.launches(7);
  CHECK(fake_gpu().graph_instantiations == 1);
  CHECK(fake_gpu().launches == 13);
  CHECK(fake_gpu().last_launch_args[0] == std::byte{6});
  // A full batch of that length needs no node disabled, but has the same key: eagerly too.
  f.launches(8);
  CHECK(fake_gpu().graph_launches == 0);
  CHECK(fake_gpu().launches == 21);
  CHECK(f.h.server->stats_text().find("launches=21 ") != std::string::npos);
}

TEST_CASE("a batch never grows past its maximum", "[server][launch_batch]") {
  FakeFixture f(batching(4, 0));
  f.launches(10);  // 4 + 4 (one graph, twice) + 2 (another)
  CHECK(fake_gpu().launches == 10);
  CHECK(fake_gpu().graph_launches == 3);
  CHECK(fake_gpu().graph_instantiations == 2);
  CHECK(f.h.server->stats_text(true).find(" batches=3 batched=10 ") != std::string::npos);
}

TEST_CASE(
    "after an idle stream the first launch goes out alone and the batches grow from the minimum",
    "[server][launch_batch]") {
  // Exact lengths: each batch is one graph launch of its own length, so the batches' count
  // shows where the batch was cut.
  ServerSettings settings = exact_batching(64, 0);
  settings.launch_batch.ramp_last = 32;
  Fixture f(test_driver(), settings);
  const auto fill = f.function("fill_u32");
  const std::uint64_t s = f.stream();
  constexpr int kBurst = 63;
  const std::uint64_t out = f.buffer(4 * kBurst);
  // `kBurst` launches writing base + i, all waiting in the ring before the server drains it.
  auto burst = [&](std::uint32_t base) {
    for (int i = 0; i < kBurst; ++i) {
      f.launch(fill, s, 1, 32, out + 4u * i, base + static_cast<std::uint32_t>(i), 1);
    }
  };
  auto expect_words = [&](std::uint32_t base) {
    std::vector<std::uint32_t> expected;
    for (int i = 0; i < kBurst; ++i) expected.push_back(base + static_cast<std::uint32_t>(i));
    CHECK(f.read(out, kBurst) == expected);
  };

  // A new stream is idle: 1 eagerly, then 2, 4, 8, 16, 32 (the minimum is 2 here).
  burst(100);
  REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
  expect_words(100);
  Figures fig = figures(f.h);
  CHECK(fig.batches == 5);
  CHECK(fig.batched == 62);
  CHECK(fig.launches == 63);

  // Synchronized, so idle again: the same ramp. Then, with the stream still busy (nothing
  // synchronized), one batch of the whole burst.
  burst(200);
  f.h.pump();
  burst(300);
  REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
  expect_words(300);
  fig = figures(f.h);
  CHECK(fig.batches == 5 + 5 + 1);
  CHECK(fig.batched == 62 + 62 + 63);
  CHECK(fig.launches == 3 * 63);
  CHECK(f.async_error() == CUDA_SUCCESS);
}

TEST_CASE("the ramp stops at its largest step; without it, or crowded, a burst is one batch",
          "[server][launch_batch]") {
  // 63 launches queued on an idle stream, in batches of exact lengths: how many batches.
  auto batches_of_burst = [](ServerSettings settings) {
    Fixture f(test_driver(), settings);
    const auto fill = f.function("fill_u32");
    const std::uint64_t s = f.stream();
    const std::uint64_t out = f.buffer(4 * 63);
    for (int i = 0; i < 63; ++i) f.launch(fill, s, 1, 32, out + 4u * i, 7u, 1);
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
    CHECK(f.read(out, 63) == std::vector<std::uint32_t>(63, 7u));
    const Figures fig = figures(f.h);
    CHECK(fig.launches == 63);
    return std::pair{fig.batches, fig.batched};
  };
  ServerSettings settings = exact_batching(64, 0);
  settings.launch_batch.ramp_last = 0;
  CHECK(batches_of_burst(settings) == std::pair<std::uint64_t, std::uint64_t>{1, 63});
  settings.launch_batch.ramp_last = 4;  // 1 eagerly, 2, 4, then the other 56 at once
  CHECK(batches_of_burst(settings) == std::pair<std::uint64_t, std::uint64_t>{3, 62});
  settings.launch_batch.ramp_last = 1;  // 1 eagerly, then the other 62 at once
  CHECK(batches_of_burst(settings) == std::pair<std::uint64_t, std::uint64_t>{1, 62});
  // A crowded server (more clients than it lets spin; here every client) has no ramp.
  settings.launch_batch.ramp_last = 32;
  settings.spin_clients = 0;
  CHECK(batches_of_burst(settings) == std::pair<std::uint64_t, std::uint64_t>{1, 63});
}

TEST_CASE(
    "an attribute change reads the function's limits again and keeps the graphs; an unload "
    "drops them",
    "[server][launch_batch]") {
  Fixture f(test_driver(), batching(64, 0));
  const int objects_before = graph_objects();
  const unsigned long long instantiated_before = instantiations();
  const auto fill = f.function("fill_u32");
  const std::uint64_t s = f.stream();
  const std::uint64_t out = f.buffer(4 * kWords);
  // kWords launches writing base + i; `expect` is the base the words must hold afterwards.
  auto burst = [&](std::uint32_t base, std::uint32_t shared, std::uint32_t expect) {
    for (int i = 0; i < kWords; ++i) {
      f.launch_shaped(fill, s, {1, 1, 1}, {32, 1, 1}, shared, out + 4u * i,
                      base + static_cast<std::uint32_t>(i), 1);
    }
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
    std::vector<std::uint32_t> expected;
    for (int i = 0; i < kWords; ++i) expected.push_back(expect + static_cast<std::uint32_t>(i));
    CHECK(f.read(out, kWords) == expected);
  };
  constexpr std::uint32_t kBigShared = 64 * 1024;  // over the default 48 KiB limit
  burst(100, 0, 100);
  CHECK(figures(f.h).batches == 1);
  CHECK(instantiations() - instantiated_before == 1);
  // Over the function's limit: each goes out eagerly and the driver refuses it, as without
  // batching.
  burst(200, kBigShared, 100);
  CHECK(figures(f.h).batches == 1);
  CHECK(f.async_error() == CUDA_ERROR_INVALID_VALUE);

  auto set =
      f.sut.call(Op::kFuncSetAttribute,
                 proto::AttributeReq{fill.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     static_cast<std::int32_t>(kBigShared), 0, 0});
  REQUIRE(set.result == CUDA_SUCCESS);
  // The new limit counts at once, and the graph made before serves the batch.
  burst(300, kBigShared, 300);
  CHECK(figures(f.h).batches == 2);
  CHECK(instantiations() - instantiated_before == 1);
  CHECK(graph_objects() > objects_before);

  // A module unload drops every graph of the session.
  auto unload = f.sut.call(Op::kModuleUnload, proto::HandleReq{f.module});
  REQUIRE(unload.result == CUDA_SUCCESS);
  CHECK(graph_objects() == objects_before);
  CHECK(f.async_error() == CUDA_SUCCESS);
}

TEST_CASE("a client that asks for no batching (MPSSHIM_LAUNCH_BATCHING=off) gets eager launches",
          "[server][launch_batch]") {
  auto run = [](bool batching_off) {
    proto::ClientHello hello = default_hello();
    if (batching_off) hello.flags |= proto::kHelloNoLaunchBatching;
    Fixture f(test_driver(), batching(64, 0), hello);
    const auto fill = f.function("fill_u32");
    const std::uint64_t s = f.stream();
    const std::uint64_t out = f.buffer(4 * kWords);
    for (int i = 0; i < kWords; ++i) {
      f.launch(fill, s, 1, 32, out + 4u * i, 7u + static_cast<std::uint32_t>(i), 1);
    }
    REQUIRE(f.synchronize(s) == CUDA_SUCCESS);
    std::vector<std::uint32_t> expected;
    for (int i = 0; i < kWords; ++i) expected.push_back(7u + static_cast<std::uint32_t>(i));
    CHECK(f.read(out, kWords) == expected);
    return figures(f.h);
  };
  const Figures off = run(true);
  CHECK(off.batches == 0);
  CHECK(off.launches == kWords);
  const Figures on = run(false);  // the same client without the flag: batched
  CHECK(on.batches == 1);
  CHECK(on.batched == kWords);
}

}  // namespace mpsshim::server::test
