// Launch batching, property-based: random sequences of a client's work, each run against a
// server on the test driver with batching off and with batching on (eager_sightings 0 and 1),
// must leave every byte of every device buffer the same and get the same answer to every call
// (replies, the async error at each synchronize, host functions run in the same order per
// stream, captured graphs of the same size). The sequences mix launches of several functions
// (module functions and library kernels) and shapes on the legacy default stream, a blocking and
// a non-blocking stream, memsets, device-to-device copies, an event recorded on one stream and
// waited for on another, host functions, stream captures whose graphs are launched, launches the
// driver refuses in the middle of a batch, and synchronizes. The runs with batching on must
// have batched (the stats' batches=), and no batch may have fallen back to eager launches. One
// run also has the client suspended and resumed by the operator at random points, its memory
// parked and put back, with the same results.
//
// Every sequence is race-free by construction: the generator keeps a vector clock per stream
// (what work of each stream the stream's next work is ordered after: its own, waited-for events,
// the legacy stream's implicit joins with blocking streams, and what the client saw finish), and
// work that touches a buffer whose last user is not ordered before it gets an event wait or a
// synchronize first. So the results do not depend on how the test driver's stream threads
// interleave, and any difference is batching's.
//
// MPSSHIM_TEST_SEED=S replays a run (a failure prints its seed and the failing sequence);
// MPSSHIM_TEST_SEQUENCES=N runs N sequences instead of 200.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proto/futex.hpp"
#include "tests/server/harness.hpp"
#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {

using namespace batch;

namespace {

using proto::Op;

constexpr int kSequences = 200;
constexpr int kStepsPerSequence = 60;
constexpr int kWords = 64;      // 32-bit words per buffer
constexpr int kIntBuffers = 3;  // buffers 0..2 hold integers (fill_u32, increment_i32)
constexpr int kBuffers = 6;     // buffers 3..5 hold floats (vector_add, scale_add)
constexpr int kStreams = 3;     // the legacy default stream, a blocking and a non-blocking one
constexpr int kLegacy = 0;
constexpr int kBlocking = 1;
constexpr int kNonBlocking = 2;  // the one that captures
constexpr int kEvents = 2;
constexpr int kClientPid = 4123;  // default_hello's
constexpr int kMaxGraphs = 4;
const char* const kStreamNames[kStreams] = {"legacy", "blocking", "non-blocking"};

enum class Body { kFill, kIncrement, kVectorAdd, kScaleAdd };
struct FunctionSpec {
  const char* name;
  Body body;
  bool library;  // a library's CUkernel, else a module's CUfunction
};
constexpr std::array kFunctions{
    FunctionSpec{"fill_u32", Body::kFill, false},
    FunctionSpec{"fill_u32", Body::kFill, true},
    FunctionSpec{"increment_i32", Body::kIncrement, false},
    FunctionSpec{"increment_i32", Body::kIncrement, true},
    FunctionSpec{"vector_add", Body::kVectorAdd, false},
    FunctionSpec{"scale_add", Body::kScaleAdd, false},
    FunctionSpec{"scale_add", Body::kScaleAdd, true},
};
bool integer_body(Body b) {
  return b == Body::kFill || b == Body::kIncrement;
}

enum class Kind {
  kLaunch,
  kBadLaunch,
  kMemset,
  kCopy,
  kRecord,
  kWait,
  kHostFunc,
  kStreamSync,
  kCtxSync,
  kBeginCapture,
  kEndCapture,
  kGraphLaunch,
};
// How a refused launch is wrong: too many threads (in one dimension or only in all three
// together), too much dynamic shared memory, a function handle the client does not have.
enum class Bad { kThreads, kShared, kHandle };

struct Step {
  Kind kind = Kind::kLaunch;
  int stream = 0;
  int function = 0;  // kFunctions
  std::array<unsigned, 3> grid{1, 1, 1};
  std::array<unsigned, 3> block{32, 1, 1};
  std::uint32_t shared = 0;
  std::array<int, 3> buffers{};  // a launch's, in parameter order; a copy's: destination, source
  int offset = 0;                // in words; a copy's destination
  int source_offset = 0;         // a copy's
  int count = 0;                 // words
  std::uint32_t value = 0;       // fill_u32's and a memset's value, scale_add's alpha (bits)
  int event = 0;
  int graph = 0;  // which capture: kEndCapture makes it, kGraphLaunch launches it
  bool relaxed = false;
  Bad bad = Bad::kThreads;
};

std::string describe(const Step& s) {
  std::ostringstream out;
  const char* stream = kStreamNames[s.stream];
  auto shape = [&] {
    out << " grid " << s.grid[0] << "x" << s.grid[1] << "x" << s.grid[2] << " block " << s.block[0]
        << "x" << s.block[1] << "x" << s.block[2] << " shared " << s.shared;
  };
  auto launch = [&] {
    const FunctionSpec& f = kFunctions[static_cast<std::size_t>(s.function)];
    out << f.name << (f.library ? " (CUkernel)" : "") << " on " << stream << " buffers";
    const int used = f.body == Body::kVectorAdd ? 3 : f.body == Body::kScaleAdd ? 2 : 1;
    for (int i = 0; i < used; ++i) out << " " << s.buffers[static_cast<std::size_t>(i)];
    out << " +" << s.offset << " n " << s.count << " value " << s.value;
    shape();
  };
  switch (s.kind) {
    case Kind::kLaunch:
      out << "launch ";
      launch();
      break;
    case Kind::kBadLaunch:
      out << "refused launch ("
          << (s.bad == Bad::kThreads  ? "threads"
              : s.bad == Bad::kShared ? "shared"
                                      : "handle")
          << ") ";
      launch();
      break;
    case Kind::kMemset:
      out << "memset on " << stream << " buffer " << s.buffers[0] << " +" << s.offset << " n "
          << s.count << " value " << s.value;
      break;
    case Kind::kCopy:
      out << "copy on " << stream << " buffer " << s.buffers[1] << " +" << s.source_offset
          << " -> buffer " << s.buffers[0] << " +" << s.offset << " n " << s.count;
      break;
    case Kind::kRecord:
      out << "record event " << s.event << " on " << stream;
      break;
    case Kind::kWait:
      out << "wait for event " << s.event << " on " << stream;
      break;
    case Kind::kHostFunc:
      out << "host function on " << stream;
      break;
    case Kind::kStreamSync:
      out << "synchronize " << stream;
      break;
    case Kind::kCtxSync:
      out << "synchronize the context";
      break;
    case Kind::kBeginCapture:
      out << "begin capture on " << stream << (s.relaxed ? " (relaxed)" : " (global)");
      break;
    case Kind::kEndCapture:
      out << "end capture on " << stream << ": graph " << s.graph;
      break;
    case Kind::kGraphLaunch:
      out << "launch graph " << s.graph << " on " << stream;
      break;
  }
  return out.str();
}

std::string describe(const std::vector<Step>& steps) {
  std::ostringstream out;
  for (std::size_t i = 0; i < steps.size(); ++i) out << i << ": " << describe(steps[i]) << "\n";
  return out.str();
}

// ---- the generator: random steps, ordered so that no two streams race on a buffer ----

class Generator {
 public:
  explicit Generator(std::uint64_t seed) : rng_(seed) {}

  std::vector<Step> generate(int steps) {
    while (static_cast<int>(steps_.size()) < steps) {
      if (capturing_) {
        capture_step();
      } else {
        free_step();
      }
    }
    if (capturing_) end_capture();
    Step sync;
    sync.kind = Kind::kCtxSync;
    push(sync);
    return std::move(steps_);
  }

 private:
  using Clock = std::array<std::uint64_t, kStreams>;
  struct Access {
    int stream = -1;
    std::uint64_t at = 0;
  };

  int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }
  bool chance(int percent) { return pick(100) < percent; }
  static void merge(Clock& into, const Clock& from) {
    for (int i = 0; i < kStreams; ++i) into[i] = std::max(into[i], from[i]);
  }

  // What work on `s` issued now is ordered after: its own, what it waited for, what the client
  // saw finish, and the legacy stream's implicit joins with the blocking stream.
  Clock effective(int s) const {
    Clock c = clock_[s];
    merge(c, host_);
    if (s == kLegacy) merge(c, clock_[kBlocking]);
    if (s == kBlocking) merge(c, clock_[kLegacy]);
    return c;
  }
  // Work issued on `s` that touches `buffers`.
  void issue(int s, const std::set<int>& buffers = {}) {
    clock_[s] = effective(s);
    ++clock_[s][s];
    for (int b : buffers) last_[b] = Access{s, clock_[s][s]};
  }
  // The streams whose last use of one of `buffers` work on `s` would not be ordered after.
  std::set<int> unordered(int s, const std::set<int>& buffers) const {
    const Clock c = effective(s);
    std::set<int> out;
    for (int b : buffers) {
      const Access& a = last_[b];
      if (a.stream >= 0 && a.stream != s && c[a.stream] < a.at) out.insert(a.stream);
    }
    return out;
  }
  // Orders work on `s` after every earlier use of `buffers`: an event recorded on the other
  // stream and waited for on `s`, or a synchronize of the other stream. Outside a capture only.
  void order(int s, const std::set<int>& buffers) {
    for (int other : unordered(s, buffers)) {
      if (chance(60)) {
        record_wait(other, s);
      } else {
        stream_sync(other);
      }
    }
  }
  void record_wait(int from, int to) {
    Step record;
    record.kind = Kind::kRecord;
    record.stream = from;
    record.event = pick(kEvents);
    push(record);
    issue(from);
    Step wait = record;
    wait.kind = Kind::kWait;
    wait.stream = to;
    push(wait);
    merge(clock_[to], clock_[from]);
    issue(to);
  }
  void stream_sync(int s) {
    Step sync;
    sync.kind = Kind::kStreamSync;
    sync.stream = s;
    push(sync);
    merge(host_, clock_[s]);
    error_pending_ = false;
  }
  void ctx_sync() {
    Step sync;
    sync.kind = Kind::kCtxSync;
    push(sync);
    for (int s = 0; s < kStreams; ++s) host_[s] = clock_[s][s];
    error_pending_ = false;
  }
  void push(const Step& step) { steps_.push_back(step); }

  // A random piece of work on `s` (a launch, a memset or a copy) and the buffers it touches.
  Step random_launch(int s) {
    Step l;
    l.kind = Kind::kLaunch;
    l.stream = s;
    l.function = pick(static_cast<int>(kFunctions.size()));
    const Body body = kFunctions[static_cast<std::size_t>(l.function)].body;
    for (int& b : l.buffers)
      b = integer_body(body) ? pick(kIntBuffers) : kIntBuffers + pick(kBuffers - kIntBuffers);
    l.offset = pick(kWords);
    l.count = 1 + pick(kWords - l.offset);
    l.value =
        body == Body::kScaleAdd
            ? bits(std::array{0.5f, 1.0f, 2.0f, -1.0f, 0.25f}[static_cast<std::size_t>(pick(5))])
            : static_cast<std::uint32_t>(rng_());
    static constexpr std::array<std::array<unsigned, 3>, 4> kGrids{
        {{1, 1, 1}, {2, 1, 1}, {3, 1, 1}, {2, 2, 1}}};
    static constexpr std::array<std::array<unsigned, 3>, 7> kBlocks{
        {{32, 1, 1}, {64, 1, 1}, {128, 1, 1}, {256, 1, 1}, {1024, 1, 1}, {16, 16, 1}, {8, 8, 4}}};
    l.grid = kGrids[static_cast<std::size_t>(pick(kGrids.size()))];
    l.block = kBlocks[static_cast<std::size_t>(pick(kBlocks.size()))];
    l.shared = std::array<std::uint32_t, 4>{0, 0, 256, 4096}[static_cast<std::size_t>(pick(4))];
    return l;
  }
  static std::set<int> touched(const Step& l) {
    if (l.kind == Kind::kMemset) return {l.buffers[0]};
    if (l.kind == Kind::kCopy) return {l.buffers[0], l.buffers[1]};
    const Body body = kFunctions[static_cast<std::size_t>(l.function)].body;
    const int used = body == Body::kVectorAdd ? 3 : body == Body::kScaleAdd ? 2 : 1;
    return std::set<int>(l.buffers.begin(), l.buffers.begin() + used);
  }
  Step random_memset(int s) {
    Step m;
    m.kind = Kind::kMemset;
    m.stream = s;
    m.buffers[0] = pick(kBuffers);
    m.offset = pick(kWords);
    m.count = 1 + pick(kWords - m.offset);
    m.value =
        m.buffers[0] < kIntBuffers
            ? static_cast<std::uint32_t>(rng_())
            : bits(std::array{0.0f, 1.0f, 2.0f, 0.5f, 3.0f}[static_cast<std::size_t>(pick(5))]);
    return m;
  }
  Step random_copy(int s) {
    Step c;
    c.kind = Kind::kCopy;
    c.stream = s;
    const bool integers = chance(50);
    const int base = integers ? 0 : kIntBuffers;
    const int n = integers ? kIntBuffers : kBuffers - kIntBuffers;
    c.buffers[0] = base + pick(n);
    c.buffers[1] = base + (c.buffers[0] - base + 1 + pick(n - 1)) % n;  // another buffer
    c.offset = pick(kWords);
    c.source_offset = pick(kWords);
    c.count = 1 + pick(kWords - std::max(c.offset, c.source_offset));
    return c;
  }
  Step random_work(int s) {
    const int r = pick(100);
    if (r < 70) return random_launch(s);
    if (r < 85) return random_memset(s);
    return random_copy(s);
  }

  // Outside a capture: the work goes out after whatever orders it.
  void emit(const Step& work) {
    const std::set<int> buffers = touched(work);
    order(work.stream, buffers);
    push(work);
    issue(work.stream, buffers);
  }
  void bad_launch(int s) {
    Step l = random_launch(s);
    l.kind = Kind::kBadLaunch;
    l.bad = static_cast<Bad>(pick(3));
    if (l.bad == Bad::kThreads) {
      static constexpr std::array<std::array<unsigned, 3>, 3> kTooMany{
          {{2048, 1, 1}, {64, 32, 1}, {16, 16, 8}}};
      l.block = kTooMany[static_cast<std::size_t>(pick(kTooMany.size()))];
    } else if (l.bad == Bad::kShared) {
      l.shared = chance(50) ? 1u << 20 : 64u << 10;  // the functions allow 48 KiB
    }
    push(l);
    error_pending_ = true;  // the async error keeps the first: one per synchronize
  }

  void free_step() {
    const int r = pick(100);
    const int s = pick(kStreams);
    if (r < 36) {
      emit(random_launch(s));
    } else if (r < 48) {
      // A burst on one stream: the batches. Maybe a refused launch in the middle.
      const int n = 2 + pick(15);
      const int bad_at = !error_pending_ && chance(40) ? pick(n) : -1;
      for (int i = 0; i < n; ++i) {
        if (i == bad_at) bad_launch(s);
        // Mostly the same function, so that sequences repeat and graphs are reused.
        emit(random_launch(s));
      }
    } else if (r < 51) {
      if (!error_pending_) bad_launch(s);
    } else if (r < 59) {
      emit(random_memset(s));
    } else if (r < 66) {
      emit(random_copy(s));
    } else if (r < 72) {
      const int to = (s + 1 + pick(kStreams - 1)) % kStreams;
      record_wait(s, to);
    } else if (r < 76) {
      Step h;
      h.kind = Kind::kHostFunc;
      h.stream = s;
      push(h);
      issue(s);
    } else if (r < 84) {
      stream_sync(s);
    } else if (r < 86) {
      ctx_sync();
    } else if (r < 92) {
      if (graphs_.size() < static_cast<std::size_t>(kMaxGraphs)) begin_capture();
    } else if (!graphs_.empty()) {
      const int g = pick(static_cast<int>(graphs_.size()));
      order(s, graphs_[static_cast<std::size_t>(g)]);
      launch_graph(g, s);
    }
  }

  void begin_capture() {
    Step b;
    b.kind = Kind::kBeginCapture;
    b.stream = kNonBlocking;
    b.relaxed = chance(50);
    push(b);
    capturing_ = true;
    captured_.clear();
    outside_.clear();
  }
  // Inside a capture of the non-blocking stream: captured work on it (which runs when the graph
  // is launched there, right after the capture ends: it must be ordered after every earlier use
  // of its buffers now), or work on another stream that stays off the captured buffers (and
  // needs no ordering: no synchronize may happen while a capture is open).
  void capture_step() {
    const int r = pick(100);
    if (r < 70) {
      const int n = chance(30) ? 2 + pick(8) : 1;
      for (int i = 0; i < n; ++i) {
        const Step work = random_work(kNonBlocking);
        const std::set<int> buffers = touched(work);
        bool clear = unordered(kNonBlocking, buffers).empty();
        for (int b : buffers) clear = clear && !outside_.contains(b);
        if (!clear) continue;
        push(work);
        captured_.insert(buffers.begin(), buffers.end());
      }
    } else if (r < 88) {
      const int s = pick(2);  // the legacy or the blocking stream
      const Step work = random_work(s);
      const std::set<int> buffers = touched(work);
      bool clear = unordered(s, buffers).empty();
      for (int b : buffers) clear = clear && !captured_.contains(b);
      if (!clear) return;
      push(work);
      issue(s, buffers);
      outside_.insert(buffers.begin(), buffers.end());
    } else if (!captured_.empty() || chance(20)) {  // mostly graphs with work in them
      end_capture();
    }
  }
  void end_capture() {
    Step e;
    e.kind = Kind::kEndCapture;
    e.stream = kNonBlocking;
    e.graph = static_cast<int>(graphs_.size());
    push(e);
    capturing_ = false;
    graphs_.push_back(captured_);
    const int launches = 1 + pick(2);
    for (int i = 0; i < launches; ++i) launch_graph(e.graph, kNonBlocking);
  }
  void launch_graph(int g, int s) {
    const std::set<int>& buffers = graphs_[static_cast<std::size_t>(g)];
    order(s, buffers);  // nothing to do right after its capture (see capture_step)
    Step l;
    l.kind = Kind::kGraphLaunch;
    l.stream = s;
    l.graph = g;
    push(l);
    issue(s, buffers);
  }

  std::mt19937_64 rng_;
  std::vector<Step> steps_;
  std::array<Clock, kStreams> clock_{};
  Clock host_{};
  std::array<Access, kBuffers> last_{};
  bool capturing_ = false;
  bool error_pending_ = false;         // a refused launch since the last synchronize
  std::set<int> captured_;             // buffers the open capture's work touches
  std::set<int> outside_;              // buffers other streams' work touched during the capture
  std::vector<std::set<int>> graphs_;  // what each captured graph touches when launched
};

// ---- running a sequence ----

// The client's callback thread, as the shim's: answers every host function the server asks the
// client to run, and notes its id, in the order they came for each stream.
class Callbacks {
 public:
  explicit Callbacks(const TestClient& client)
      : view_(client.view()), thread_([this] { serve(); }) {}
  ~Callbacks() { stop(); }
  Callbacks(const Callbacks&) = delete;
  Callbacks& operator=(const Callbacks&) = delete;

  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::map<int, std::vector<std::uint64_t>> seen() {
    std::lock_guard lock(mutex_);
    return seen_;
  }

 private:
  void serve() {
    while (!stop_.load()) {
      bool any = false;
      for (std::uint32_t i = 0; i < view_.geometry.callback_cell_count; ++i) {
        proto::HostCallbackCell* cell = view_.callback_cell(i);
        const std::uint32_t ticket = cell->requested.load(std::memory_order_acquire);
        if (ticket == 0 || ticket == cell->done.load(std::memory_order_acquire)) continue;
        {
          std::lock_guard lock(mutex_);
          seen_[static_cast<int>(cell->callback_id >> 32)].push_back(cell->callback_id);
        }
        cell->done.store(ticket, std::memory_order_seq_cst);
        proto::futex_wake(&cell->done);
        any = true;
      }
      if (!any) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  proto::SegmentView view_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::map<int, std::vector<std::uint64_t>> seen_;
  std::thread thread_;
};

// What a run left and what it was told.
struct Outcome {
  std::vector<std::vector<std::uint32_t>> buffers;
  std::vector<std::string> answers;  // "step: what = result", in order
  std::map<int, std::vector<std::uint64_t>> callbacks;
  std::uint64_t launches = 0;  // kernels the server issued, batched or not
  Figures figures;
  int suspensions = 0;  // suspend/resume rounds that happened (run's suspend_seed)
};

std::uint64_t word_at(std::uint64_t buffer, int offset) {
  return buffer + 4u * static_cast<std::uint64_t>(offset);
}

// With `suspend_seed` not 0, the client is suspended and resumed by the operator before about one
// step in eight, chosen by that seed: with its one-way records still in the ring, its launches
// batched or not. A suspend refused (an open capture) changes nothing either.
Outcome run(Harness& h, const std::vector<Step>& steps, std::uint64_t suspend_seed = 0) {
  Fixture f(h);
  std::vector<proto::FunctionRep> functions;
  for (const FunctionSpec& spec : kFunctions) {
    functions.push_back(f.function(
        spec.name, spec.library ? proto::ImageKind::kLibrary : proto::ImageKind::kModule));
  }
  const std::array<std::uint64_t, kStreams> streams{f.ctx.default_stream, f.stream(0),
                                                    f.stream(CU_STREAM_NON_BLOCKING)};
  std::array<std::uint64_t, kEvents> events{};
  for (auto& e : events) e = f.event();
  std::array<std::uint64_t, kBuffers> buffers{};
  for (int b = 0; b < kBuffers; ++b) {
    buffers[b] = f.buffer(4 * kWords);
    f.memset(f.ctx.default_stream, buffers[b], b < kIntBuffers ? 0x01010101u * b : bits(1.0f),
             kWords);
  }
  REQUIRE(f.synchronize(f.ctx.default_stream) == CUDA_SUCCESS);
  const std::uint64_t launches_before = figures(f.h).launches;

  Outcome out;
  Callbacks callbacks(f.sut);
  std::vector<std::uint64_t> execs;
  auto note = [&](std::size_t i, const std::string& what, std::uint64_t result) {
    out.answers.push_back(std::to_string(i) + ": " + what + " = " + std::to_string(result));
  };
  auto synchronized = [&](std::size_t i, CUresult r) {
    note(i, "synchronize", r);
    note(i, "async error", f.async_error());
  };
  std::mt19937_64 suspend_points(suspend_seed);
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (suspend_seed != 0 && suspend_points() % 8 == 0) {
      int status = 0;
      const std::string suspended =
          h.server->control_command(fmt::format("suspend_client {}", kClientPid), status);
      INFO(suspended);
      if (status == 0) {
        REQUIRE(suspended.find("suspended;") != std::string::npos);
        status = 0;
        const std::string resumed =
            h.server->control_command(fmt::format("resume_client {}", kClientPid), status);
        INFO(resumed);
        REQUIRE(status == 0);
        ++out.suspensions;
      } else {
        REQUIRE(suspended.find("capturing") != std::string::npos);
      }
    }
    const Step& s = steps[i];
    const std::uint64_t stream = streams[static_cast<std::size_t>(s.stream)];
    switch (s.kind) {
      case Kind::kLaunch:
      case Kind::kBadLaunch: {
        proto::FunctionRep fn = functions[static_cast<std::size_t>(s.function)];
        if (s.kind == Kind::kBadLaunch && s.bad == Bad::kHandle) fn.function = 0xdead;
        const std::array<unsigned, 3> block = s.block;
        const std::uint32_t shared = s.shared;
        auto p = [&](int k) { return word_at(buffers[s.buffers[k]], s.offset); };
        switch (kFunctions[static_cast<std::size_t>(s.function)].body) {
          case Body::kFill:
            f.launch_shaped(fn, stream, s.grid, block, shared, p(0), s.value, s.count);
            break;
          case Body::kIncrement:
            f.launch_shaped(fn, stream, s.grid, block, shared, p(0), s.count);
            break;
          case Body::kVectorAdd:
            f.launch_shaped(fn, stream, s.grid, block, shared, p(0), p(1), p(2), s.count);
            break;
          case Body::kScaleAdd: {
            float alpha = 0;
            std::memcpy(&alpha, &s.value, sizeof alpha);
            f.launch_shaped(fn, stream, s.grid, block, shared, p(0), p(1), alpha, s.count);
            break;
          }
        }
        break;
      }
      case Kind::kMemset:
        f.memset(stream, word_at(buffers[s.buffers[0]], s.offset), s.value,
                 static_cast<std::uint64_t>(s.count));
        break;
      case Kind::kCopy:
        f.sut.send(Op::kCopyDtoD,
                   proto::CopyDtoDReq{stream, word_at(buffers[s.buffers[0]], s.offset),
                                      word_at(buffers[s.buffers[1]], s.source_offset),
                                      4u * static_cast<std::uint64_t>(s.count)});
        break;
      case Kind::kRecord:
        f.sut.send(Op::kEventRecord,
                   proto::EventRecordReq{events[static_cast<std::size_t>(s.event)], stream, 0, 0});
        break;
      case Kind::kWait:
        f.sut.send(
            Op::kStreamWaitEvent,
            proto::StreamWaitEventReq{stream, events[static_cast<std::size_t>(s.event)], 0, 0});
        break;
      case Kind::kHostFunc: {
        const std::uint64_t id = (static_cast<std::uint64_t>(s.stream) + 1) << 32 | (i + 1);
        f.sut.send(Op::kHostFunc,
                   proto::HostFuncReq{stream, id, proto::HostFuncKind::kLaunchHostFunc, 0});
        break;
      }
      case Kind::kStreamSync:
        synchronized(i, f.synchronize(stream));
        break;
      case Kind::kCtxSync:
        synchronized(i, f.sut.call(Op::kCtxSynchronize, proto::CtxReq{f.ctx.ctx}).result);
        break;
      case Kind::kBeginCapture:
        note(i, "begin capture",
             f.sut
                 .call(Op::kStreamBeginCapture,
                       proto::BeginCaptureReq{stream,
                                              s.relaxed ? CU_STREAM_CAPTURE_MODE_RELAXED
                                                        : CU_STREAM_CAPTURE_MODE_GLOBAL,
                                              0})
                 .result);
        break;
      case Kind::kEndCapture: {
        const Reply ended = f.sut.call(Op::kStreamEndCapture, proto::HandleReq{stream});
        note(i, "end capture", ended.result);
        const std::uint64_t graph = ended.as<proto::EndCaptureRep>().graph;
        std::uint64_t exec = 0;
        if (ended.result == CUDA_SUCCESS && graph != 0) {
          // Launches during a capture are captured one by one, never batched into one node.
          const Reply nodes = f.sut.call(Op::kGraphGetNodes, proto::GraphGetNodesReq{graph, 0});
          note(i, "graph nodes", nodes.result);
          note(i, "graph node count", nodes.as<proto::GraphGetNodesRep>().total);
          const Reply inst =
              f.sut.call(Op::kGraphInstantiate, proto::GraphInstantiateReq{graph, 0, 0});
          note(i, "instantiate", inst.result);
          if (inst.result == CUDA_SUCCESS) exec = inst.as<proto::GraphInstantiateRep>().exec;
        }
        execs.resize(std::max<std::size_t>(execs.size(), static_cast<std::size_t>(s.graph) + 1));
        execs[static_cast<std::size_t>(s.graph)] = exec;
        break;
      }
      case Kind::kGraphLaunch: {
        const std::uint64_t exec = execs.at(static_cast<std::size_t>(s.graph));
        note(i, "graph to launch", exec != 0);
        if (exec != 0) f.sut.send(Op::kGraphLaunch, proto::GraphLaunchReq{exec, stream});
        break;
      }
    }
  }
  for (int b = 0; b < kBuffers; ++b) out.buffers.push_back(f.read(buffers[b], kWords));
  note(steps.size(), "async error at the end", f.async_error());
  callbacks.stop();
  out.callbacks = callbacks.seen();
  out.figures = figures(f.h);
  out.launches = out.figures.launches - launches_before;
  return out;
}

std::uint64_t test_seed() {
  if (const char* s = std::getenv("MPSSHIM_TEST_SEED"); s != nullptr && *s != '\0') {
    return std::stoull(s, nullptr, 0);
  }
  std::random_device device;
  return (std::uint64_t{device()} << 32) | device();
}

// Sequence i's generator seed: the run's seed and i mixed (splitmix64), so that runs of nearby
// seeds do not share sequences.
std::uint64_t sequence_seed(std::uint64_t seed, int i) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (static_cast<std::uint64_t>(i) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int sequences() {
  if (const char* s = std::getenv("MPSSHIM_TEST_SEQUENCES"); s != nullptr && *s != '\0') {
    return std::max(1, std::stoi(s));
  }
  return kSequences;
}

// The first place two runs differ, for the failure message.
template <typename T>
std::string first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] != b[i]) {
      std::ostringstream out;
      out << "at " << i << ": " << a[i] << " vs " << b[i];
      return out.str();
    }
  }
  return a.size() == b.size()
             ? std::string("none")
             : "lengths " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
}

}  // namespace

TEST_CASE("random sequences of work end the same with launch batching on and off",
          "[server][launch_batch][property]") {
  const std::uint64_t seed = test_seed();
  const int count = sequences();
  CAPTURE(seed);
  INFO("replay with MPSSHIM_TEST_SEED=" << seed);
  std::vector<std::vector<Step>> all;
  for (int i = 0; i < count; ++i) {
    all.push_back(Generator(sequence_seed(seed, i)).generate(kStepsPerSequence));
  }

  struct Config {
    const char* name;
    ServerSettings settings;
    bool suspended = false;  // suspended and resumed at random points (run's suspend_seed)
  };
  const ServerSettings off = no_batching();
  const ServerSettings eager_first = batching(64, 1);  // min_launches 2
  const ServerSettings at_once = batching(64, 0);
  ServerSettings ramped = batching(64, 0);
  ramped.launch_batch.ramp_last = LaunchBatchSettings{}.ramp_last;  // the server's default
  const ServerSettings padded = padded_batching(64, 0);
  ServerSettings defaults;  // the server's own: padded graphs, minimum 8, the ramp
  const std::array<Config, 7> configs{
      Config{"batching off", off},
      Config{"batching on, eager_sightings 1", eager_first},
      Config{"batching on, eager_sightings 0", at_once},
      Config{"batching on, ramp after an idle stream", ramped},
      Config{"padded graphs, eager_sightings 0", padded},
      Config{"the server's default settings", defaults},
      Config{"the server's default settings, suspended and resumed at random points", defaults,
             true}};
  int suspensions = 0;

  // One server per configuration (a harness at a time: the log sink is the process's), each
  // sequence a session of its own, so every sequence starts with an empty graph cache.
  std::vector<Outcome> reference;
  std::uint64_t batches = 0, batched = 0;
  for (const Config& config : configs) {
    Harness h(test_driver(), config.settings);
    const int graphs_before = graph_objects();
    const unsigned long long toggles_before = node_toggles();
    for (int i = 0; i < count; ++i) {
      const std::vector<Step>& steps = all[static_cast<std::size_t>(i)];
      INFO(config.name << ", sequence " << i << " of the seed's:\n" << describe(steps));
      Outcome got = run(h, steps, config.suspended ? sequence_seed(~seed, i) | 1 : 0);
      suspensions += got.suspensions;
      if (&config == &configs[0]) {
        CHECK(got.figures.batches == 0);
        reference.push_back(std::move(got));
        continue;
      }
      const Outcome& want = reference[static_cast<std::size_t>(i)];
      batches += got.figures.batches;
      batched += got.figures.batched;
      INFO("answers: " << first_difference(want.answers, got.answers));
      REQUIRE(got.answers == want.answers);
      for (int b = 0; b < kBuffers; ++b) {
        INFO("buffer " << b << ": "
                       << first_difference(want.buffers[static_cast<std::size_t>(b)],
                                           got.buffers[static_cast<std::size_t>(b)]));
        REQUIRE(got.buffers[static_cast<std::size_t>(b)] ==
                want.buffers[static_cast<std::size_t>(b)]);
      }
      REQUIRE(got.callbacks == want.callbacks);
      REQUIRE(got.launches == want.launches);
    }
    // Every session's graphs died with it.
    CHECK(graph_objects() == graphs_before);
    // Padded graphs really ran with disabled nodes: batch lengths that are not powers of two
    // are most of what random sequences make.
    if (config.settings.launch_batch.graphs == LaunchBatchSettings::Graphs::kPadded &&
        config.settings.launch_batch.min_launches == 2) {
      INFO(config.name);
      CHECK(node_toggles() > toggles_before);
    }
    // No batch fell back to eager launches: the test driver takes every graph step the real
    // driver takes (a fallback leaves the results right, so only the log shows it).
    INFO(config.name);
    CHECK(h.count_logged("launches went out eagerly") == 0);
    CHECK(h.count_logged("no graph for a batch") == 0);
  }
  // Batching really happened: the comparison did not pass vacuously.
  INFO("batches " << batches << ", launches in them " << batched);
  CHECK(batches > 0);
  CHECK(batched >= 2 * batches);
  // Most sequences were suspended several times (the rest refused it during a capture).
  CHECK(suspensions >= count);
}

}  // namespace mpsshim::server::test
