// The server as mpsshim-server runs it: Server::run on a thread of its own (the coordinator)
// with four worker threads, on the test driver. 32 clients, each on a thread of its own, are
// admitted through the control socket and work at once (allocate, copy in, launch vector_add,
// copy back, check every element, free). While they are busy some clients end (goodbye,
// hang-up, hang-up with work in flight) and the operator terminates one; the accounting lists
// every client with the worker that serves it; the stop ends the busy ones and frees all.
#include <dlfcn.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "broker/server/driver/driver.hpp"
#include "common/log.hpp"
#include "proto/futex.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;

constexpr std::size_t kWorkers = 4;
constexpr int kClients = 32;
constexpr int kFirstPid = 7000;
constexpr std::uint32_t kElements = 2048;  // floats per buffer
constexpr std::uint64_t kBytes = kElements * sizeof(float);
constexpr int kFirstIterations = 5;  // by each client before anything ends, and again while
                                     // clients end
constexpr char kModuleText[] = "// threaded server test\n.version 8.0\n.target sm_90\n";

ServerSettings threaded_settings() {
  ServerSettings settings;
  settings.workers = kWorkers;
  // Small segments: 32 of them at once.
  settings.geometry.ring_capacity = 64 << 10;
  settings.geometry.slot_count = 8;
  settings.geometry.chunk_count = 4;
  settings.geometry.chunk_bytes = 64 << 10;
  return settings;
}

// How a client's thread ends.
enum class Ending {
  kNone,        // works until the stop of the server reaches it
  kGoodbye,     // says goodbye after an iteration
  kHangUp,      // closes its socket between iterations
  kHangUpBusy,  // closes its socket with copies and a launch in flight
  kTerminated,  // works until the operator terminates it
};

// One client and the thread that drives it. Everything but the atomics is written by the
// thread and read by the test after join().
class BusyClient {
 public:
  BusyClient(Harness& harness, int index, Ending ending)
      : harness_(harness), index_(index), ending_(ending) {}
  ~BusyClient() {
    finish();  // a test that failed half-way ends here with the clients still working
    if (thread_.joinable()) thread_.join();
  }

  void start() {
    thread_ = std::thread([this] { body(); });
  }
  void join() { thread_.join(); }
  void finish() { finish_.store(true); }

  int pid() const { return kFirstPid + index_; }
  Ending ending() const { return ending_; }
  bool ready() const { return ready_.load(); }
  bool over() const { return over_.load(); }
  int iterations() const { return iterations_.load(); }

  // After join().
  std::uint32_t client_id() const { return client_id_; }
  const std::string& error() const { return error_; }
  std::uint32_t fault() const { return fault_; }
  int mismatches() const { return mismatches_; }

 private:
  void body() {
    try {
      client_.emplace(harness_, default_hello(pid(), "threaded"));
      if (!client_->connected()) throw std::runtime_error("not admitted");
      client_id_ = client_->welcome().client_id;
      set_up();
      ready_.store(true);
      while (!finish_.load()) {
        iteration();
        iterations_.fetch_add(1);
      }
      end();
    } catch (const std::exception& e) {
      fault_ = client_ && client_->connected() ? client_->control()->fault.load() : 0;
      // A fault (terminated, server stopping) ends the work; anything else is an error.
      if (fault_ == 0) error_ = e.what();
    }
    over_.store(true);
  }

  Reply call_ok(Op op, std::span<const std::byte> request, const char* what) {
    client_->send_raw(static_cast<std::uint16_t>(op), request, 0);
    std::optional<Reply> reply = client_->reply(0);
    if (!reply) throw std::runtime_error(std::string(what) + ": no answer");
    if (reply->result != CUDA_SUCCESS) {
      throw std::runtime_error(std::string(what) + " failed: " + std::to_string(reply->result));
    }
    return *reply;
  }
  template <typename Req>
  Reply call_ok(Op op, const Req& req, const char* what) {
    return call_ok(op, std::as_bytes(std::span(&req, 1)), what);
  }

  void set_up() {
    auto ctx =
        call_ok(Op::kCtxCreate, proto::CtxCreateReq{0, 0}, "CtxCreate").as<proto::CtxCreateRep>();
    ctx_ = ctx.ctx;
    stream_ = call_ok(Op::kStreamCreate, proto::StreamCreateReq{ctx_, CU_STREAM_NON_BLOCKING, 0},
                      "StreamCreate")
                  .as<proto::StreamCreateRep>()
                  .stream;
    const auto* text = reinterpret_cast<const std::byte*>(kModuleText);
    client_->send_memfd(proto::MessageKind::kModuleImage, 1, sizeof kModuleText,
                        std::span(text, sizeof kModuleText));
    std::uint64_t module =
        call_ok(Op::kImageLoad,
                proto::ImageLoadReq{ctx_, sizeof kModuleText, 1, proto::ImageKind::kModule, 0, 0},
                "ImageLoad")
            .as<proto::ImageLoadRep>()
            .handle;
    const std::string name = "vector_add";
    std::vector<std::byte> lookup(sizeof(proto::NamedLookupReq) + name.size());
    proto::NamedLookupReq req{module, static_cast<std::uint32_t>(name.size()), 0};
    std::memcpy(lookup.data(), &req, sizeof req);
    std::memcpy(lookup.data() + sizeof req, name.data(), name.size());
    auto function =
        call_ok(Op::kModuleGetFunction, std::span<const std::byte>(lookup), "ModuleGetFunction")
            .as<proto::FunctionRep>();
    if (function.param_count != 4 || function.args_bytes != 28) {
      throw std::runtime_error("vector_add has an unexpected parameter layout");
    }
    function_ = function.function;
  }

  std::uint64_t alloc() {
    return call_ok(Op::kMemAlloc, proto::MemAllocReq{ctx_, kBytes}, "MemAlloc")
        .as<proto::MemAllocRep>()
        .dptr;
  }

  float* chunk(std::uint32_t i) { return reinterpret_cast<float*>(client_->view().chunk(i)); }

  // As the shim waits before it refills a chunk: until the server handed it back (it hands
  // chunks back as their copies complete, not necessarily in the order of the copies).
  void await_chunk(std::uint32_t i) {
    proto::ChunkState* state = client_->view().chunk_state(i);
    auto deadline = std::chrono::steady_clock::now() + harness_.threaded_timeout;
    for (;;) {
      const std::uint32_t seen = state->done_generation.load(std::memory_order_acquire);
      if (seen == generation_[i]) break;
      if (client_->control()->fault.load() != 0) throw std::runtime_error("faulted");
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error("a staging chunk was not handed back");
      }
      state->waiter.store(1, std::memory_order_seq_cst);
      if (state->done_generation.load(std::memory_order_seq_cst) == seen) {
        proto::futex_wait(&state->done_generation, seen, 10'000'000);
      }
    }
    state->waiter.store(0, std::memory_order_relaxed);
    if (state->result.load() != CUDA_SUCCESS) throw std::runtime_error("a staged copy failed");
  }

  // a + b -> c on the client's stream; the copy back answers slot 0 once it ran.
  void send_work(std::uint64_t a, std::uint64_t b, std::uint64_t c) {
    // A chunk is refilled only once the copy that last used it completed.
    for (std::uint32_t i = 0; i < 3; ++i) await_chunk(i);
    const float base = static_cast<float>(index_ * 100 + iterations());
    for (std::uint32_t k = 0; k < kElements; ++k) {
      chunk(0)[k] = base + static_cast<float>(k);
      chunk(1)[k] = static_cast<float>(2 * k);
      chunk(2)[k] = -1.0f;
    }
    auto staged = [&](std::uint32_t i) {
      return proto::HostRef{i, 0, proto::HostKind::kStagingChunk, ++generation_[i]};
    };
    client_->send(Op::kCopyHtoD, proto::CopyHostReq{stream_, a, kBytes, staged(0)});
    client_->send(Op::kCopyHtoD, proto::CopyHostReq{stream_, b, kBytes, staged(1)});
    proto::LaunchReq launch{};
    launch.function = function_;
    launch.stream = stream_;
    launch.grid[0] = kElements / 256;
    launch.grid[1] = launch.grid[2] = 1;
    launch.block[0] = 256;
    launch.block[1] = launch.block[2] = 1;
    launch.args_bytes = 28;
    std::byte args[28];
    const std::int32_t n = kElements;
    std::memcpy(args, &a, 8);
    std::memcpy(args + 8, &b, 8);
    std::memcpy(args + 16, &c, 8);
    std::memcpy(args + 24, &n, 4);
    client_->send(Op::kLaunchKernel, launch, proto::kNoReply, args);
    client_->send(Op::kCopyDtoH, proto::CopyHostReq{stream_, c, kBytes, staged(2)}, 0, {},
                  proto::kFlagReplyWhenDone);
  }

  void iteration() {
    const std::uint64_t a = alloc(), b = alloc(), c = alloc();
    send_work(a, b, c);
    std::optional<Reply> copied = client_->reply(0);
    if (!copied) throw std::runtime_error("the copy back was not answered");
    if (copied->result != CUDA_SUCCESS) {
      throw std::runtime_error("the copy back failed: " + std::to_string(copied->result));
    }
    // The copy back's chunk is handed back before its answer; the others as they complete.
    if (client_->view().chunk_state(2)->done_generation.load() != generation_[2]) {
      throw std::runtime_error("answered before the copy back's chunk was handed back");
    }
    for (std::uint32_t i = 0; i < 3; ++i) await_chunk(i);
    const float base = static_cast<float>(index_ * 100 + iterations());
    for (std::uint32_t k = 0; k < kElements; ++k) {
      if (chunk(2)[k] != base + static_cast<float>(3 * k)) ++mismatches_;
    }
    if (mismatches_ != 0) throw std::runtime_error("wrong results");
    for (std::uint64_t dptr : {a, b, c}) call_ok(Op::kMemFree, proto::MemFreeReq{dptr}, "MemFree");
  }

  void end() {
    switch (ending_) {
      case Ending::kGoodbye:
        call_ok(Op::kGoodbye, std::span<const std::byte>{}, "Goodbye");
        break;
      case Ending::kHangUp:
        client_->hang_up();
        break;
      case Ending::kHangUpBusy:
        // Three allocations, two copies, a launch and a copy back owed: the server runs
        // them to their end before it frees what the client owned.
        send_work(alloc(), alloc(), alloc());
        client_->hang_up();
        break;
      case Ending::kNone:
      case Ending::kTerminated:
        break;
    }
  }

  Harness& harness_;
  const int index_;
  const Ending ending_;
  std::optional<TestClient> client_;
  std::thread thread_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> finish_{false};
  std::atomic<bool> over_{false};
  std::atomic<int> iterations_{0};

  std::uint32_t client_id_ = 0;
  std::uint64_t ctx_ = 0;
  std::uint64_t stream_ = 0;
  std::uint64_t function_ = 0;
  std::uint32_t generation_[3] = {};
  std::string error_;
  std::uint32_t fault_ = 0;
  int mismatches_ = 0;
};

struct StatsLine {
  std::uint32_t client = 0;
  int pid = 0;
  std::size_t worker = 0;
  std::uint64_t records = 0;
};

// The value of `key=` in a line of blank-separated key=value fields; nullopt without it.
std::optional<std::uint64_t> field(const std::string& line, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(line, m, std::regex("(^| )" + key + "=([0-9]+)( |$)"))) {
    return std::nullopt;
  }
  return std::stoull(m[2]);
}

// One per line; a line without client=, pid= or worker= reads as pid 0 and fails the counts.
std::vector<StatsLine> parse_stats(const std::string& text) {
  std::vector<StatsLine> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    auto client = field(line, "client"), pid = field(line, "pid"), worker = field(line, "worker");
    if (!client || !pid || !worker) {
      lines.push_back(StatsLine{});
      continue;
    }
    lines.push_back(StatsLine{static_cast<std::uint32_t>(*client), static_cast<int>(*pid),
                              static_cast<std::size_t>(*worker),
                              field(line, "records").value_or(0)});
  }
  return lines;
}

// The pid -> worker placement the coordinator logged when it admitted each client.
std::map<int, std::size_t> placements(const Harness& h) {
  std::map<int, std::size_t> out;
  const std::regex admitted(
      "client [0-9]+ \\(pid ([0-9]+), threaded, uid 1000\\) connected: .* served by worker "
      "([0-9]+)$");
  for (const std::string& line : h.log_lines()) {
    std::smatch m;
    if (std::regex_search(line, m, admitted)) out[std::stoi(m[1])] = std::stoul(m[2]);
  }
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += line + "\n";
  return out;
}

TEST_CASE("a threaded server serves 32 busy clients on 4 workers and stops cleanly",
          "[server][threaded]") {
  Harness h(test_driver(), threaded_settings());
  set_log_level(LogLevel::kInfo);  // no per-call debug lines from 32 busy clients
  const int live_before = live_driver_objects();
  h.start_threaded();

  // Clients 0-8 end while the rest work: three of each way, then the operator's terminate.
  auto ending_of = [](int i) {
    if (i < 3) return Ending::kGoodbye;
    if (i < 6) return Ending::kHangUp;
    if (i < 8) return Ending::kHangUpBusy;
    if (i == 8) return Ending::kTerminated;
    return Ending::kNone;
  };
  std::vector<std::unique_ptr<BusyClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<BusyClient>(h, i, ending_of(i)));
  }
  for (auto& c : clients) c->start();
  auto report = [&] {
    std::string text;
    for (const auto& c : clients) {
      text += fmt::format(
          "client pid {}: {} iterations{}\n", c->pid(), c->iterations(),
          c->over() ? fmt::format(", over (fault {}, error \"{}\")", c->fault(), c->error()) : "");
    }
    return text + "server log:\n" + joined(h.log_lines());
  };
  // Each must work a few iterations with all the others at once; one that fails is over early.
  auto all_did = [&](const std::vector<BusyClient*>& which, const std::vector<int>& at_least) {
    return h.pump_until([&] {
      for (std::size_t i = 0; i < which.size(); ++i) {
        if (which[i]->over() || which[i]->iterations() < at_least[i]) return which[i]->over();
      }
      return true;
    });
  };
  std::vector<BusyClient*> everyone;
  for (auto& c : clients) everyone.push_back(c.get());
  {
    const bool worked = all_did(everyone, std::vector<int>(kClients, kFirstIterations));
    INFO(report());
    REQUIRE(worked);
    for (auto& c : clients) REQUIRE(!c->over());
  }

  // ---- the accounting lists all 32, each with the worker the coordinator placed it on ----
  std::map<int, std::size_t> placed = placements(h);
  std::optional<Harness::Answer> stats =
      h.operator_request(proto::MessageKind::kServerStatsQuery, "stats");
  REQUIRE(stats);
  CHECK(stats->kind == proto::MessageKind::kServerStats);
  const std::string& stats_text = stats->text;
  {
    INFO("stats:\n" << stats_text << report());
    REQUIRE(placed.size() == kClients);
    std::vector<StatsLine> lines = parse_stats(stats_text);
    REQUIRE(lines.size() == kClients);
    std::set<int> pids;
    std::vector<int> per_worker(kWorkers);
    for (const StatsLine& line : lines) {
      INFO("pid " << line.pid);
      pids.insert(line.pid);
      REQUIRE(placed.count(line.pid) == 1);
      CHECK(line.worker == placed[line.pid]);
      REQUIRE(line.worker < kWorkers);
      ++per_worker[line.worker];
      CHECK(line.records >= kFirstIterations * 10);  // 10 records an iteration
    }
    CHECK(pids.size() == kClients);
    CHECK(*pids.begin() == kFirstPid);
    CHECK(*pids.rbegin() == kFirstPid + kClients - 1);
    // Admitted one after another, each to the least-loaded worker: eight each.
    for (int n : per_worker) CHECK(n == kClients / static_cast<int>(kWorkers));
  }

  // ---- clients end while the others work ----
  std::vector<BusyClient*> survivors;
  std::vector<int> progress;
  for (auto& c : clients) {
    if (c->ending() == Ending::kNone) {
      survivors.push_back(c.get());
      progress.push_back(c->iterations() + kFirstIterations);
    }
  }
  for (auto& c : clients) {
    if (c->ending() != Ending::kNone && c->ending() != Ending::kTerminated) c->finish();
  }
  for (auto& c : clients) {
    if (c->ending() == Ending::kNone || c->ending() == Ending::kTerminated) continue;
    c->join();
    INFO("pid " << c->pid() << ": " << c->error() << "\n" << report());
    CHECK(c->error().empty());
    CHECK(c->fault() == 0);
  }
  {
    const bool freed = h.pump_until([&] { return h.server->session_count() == kClients - 8; });
    INFO(report());
    REQUIRE(freed);
  }
  for (auto& c : clients) {
    const std::string who = fmt::format("client {} (pid {}, threaded) ", c->client_id(), c->pid());
    INFO(who << "\n" << report());
    switch (c->ending()) {
      case Ending::kGoodbye:
        CHECK(h.count_logged(who + "said goodbye; freed") == 1);
        break;
      case Ending::kHangUp:
      case Ending::kHangUpBusy:
        CHECK(h.count_logged(who + "disconnected; freed") == 1);
        break;
      default:
        CHECK(h.count_logged(who) == 0);  // nothing said about those still there
        break;
    }
  }

  // ---- the operator terminates a client in the middle of its work ----
  BusyClient& doomed = *clients[8];
  REQUIRE(!doomed.over());
  std::optional<Harness::Answer> terminated =
      h.operator_request(proto::MessageKind::kServerTerminateClient, std::to_string(doomed.pid()));
  REQUIRE(terminated);
  const std::string& terminate_text = terminated->text;
  INFO("terminate_client: " << terminate_text);
  CHECK(terminated->status == 0);
  CHECK(terminate_text ==
        fmt::format("terminated client {} (pid {}, threaded)", doomed.client_id(), doomed.pid()));
  doomed.join();
  {
    INFO(report());
    CHECK(doomed.error().empty());
    CHECK(doomed.fault() == CUDA_ERROR_MPS_CLIENT_TERMINATED);
    CHECK(doomed.mismatches() == 0);
    REQUIRE(h.pump_until([&] { return h.server->session_count() == kClients - 9; }));
    CHECK(h.count_logged(fmt::format("client {} (pid {}, threaded): session over (was terminated "
                                     "by the operator); freed",
                                     doomed.client_id(), doomed.pid())) == 1);
  }

  // The others kept working all along.
  {
    const bool worked = all_did(survivors, progress);
    INFO(report());
    REQUIRE(worked);
    for (BusyClient* c : survivors) REQUIRE(!c->over());
  }
  std::optional<Harness::Answer> ps = h.operator_request(proto::MessageKind::kServerStatsQuery, "");
  REQUIRE(ps);
  const std::string& ps_text = ps->text;
  {
    INFO("ps:\n" << ps_text);
    std::vector<StatsLine> lines = parse_stats(ps_text);
    CHECK(lines.size() == survivors.size());
    std::set<int> listed;
    for (const StatsLine& line : lines) {
      listed.insert(line.pid);
      CHECK(line.worker == placed[line.pid]);
    }
    std::set<int> expected;
    for (BusyClient* c : survivors) expected.insert(c->pid());
    CHECK(listed == expected);
    CHECK(ps_text.find("state=draining") == std::string::npos);
  }

  // ---- a clean stop while 23 clients are busy ----
  CHECK(h.stop_threaded() == 0);
  CHECK(h.server->session_count() == 0);
  for (BusyClient* c : survivors) {
    c->join();
    INFO("pid " << c->pid() << ": " << c->error() << "\n" << report());
    CHECK(c->error().empty());
    CHECK(c->mismatches() == 0);
    CHECK(c->fault() == CUDA_ERROR_MPS_CONNECTION_FAILED);
    CHECK(h.count_logged(fmt::format("client {} (pid {}, threaded): session over (was "
                                     "disconnected: the server is shutting down); freed",
                                     c->client_id(), c->pid())) == 1);
  }
  CHECK(h.count_logged("freed") == kClients);
  CHECK(h.count_logged("did not answer") == 0);
  CHECK(live_driver_objects() == live_before);
}

}  // namespace
}  // namespace mpsshim::server::test
