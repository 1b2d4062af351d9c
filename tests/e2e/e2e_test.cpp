// The whole path on the CPU: LD_PRELOAD=libmpsshim.so client -> mpsshimd -> mpsshim-server ->
// host-memory test driver, with real processes, sockets and shared memory.
#include <signal.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "harness.hpp"
#include "require_pass.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

std::string client() {
  return artefact("E2E_CLIENT");
}

unsigned long long field(const std::string& text, const std::string& key) {
  std::smatch m;
  std::regex re(key + "=([0-9]+)");
  if (!std::regex_search(text, m, re)) return ~0ull;
  return std::stoull(m[1]);
}

}  // namespace

TEST_CASE("a driver-API client runs through the daemon and the test driver", "[e2e]") {
  Daemon daemon;
  Outcome o = run_client(daemon, {client(), "basic", "100000"});
  require_pass(o, daemon);
}

namespace {

// MPSSHIM_TRACE_ANSWERS's lines (libshim/answer_trace.hpp), by column name.
std::vector<std::map<std::string, unsigned long long>> read_answer_trace(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> names;
  std::vector<std::map<std::string, unsigned long long>> rows;
  while (std::getline(in, line)) {
    std::vector<std::string> cells;
    std::stringstream cut(line);
    for (std::string cell; std::getline(cut, cell, ',');) cells.push_back(cell);
    if (names.empty()) {
      names = cells;
      continue;
    }
    REQUIRE(cells.size() == names.size());
    std::map<std::string, unsigned long long> row;
    for (std::size_t i = 0; i < cells.size(); ++i) row[names[i]] = std::stoull(cells[i]);
    rows.push_back(row);
  }
  REQUIRE(names == std::vector<std::string>{"op", "launch_sent", "launch_taken", "launch_issued",
                                            "sent", "taken", "known", "answered", "seen", "early",
                                            "slept"});
  return rows;
}

constexpr unsigned long long kStreamSynchronizeOp = 36;  // proto::Op::kStreamSynchronize

}  // namespace

TEST_CASE("answers carry the server's stamps to a client that traces them, in time order",
          "[e2e][stamps]") {
  for (bool stamped : {true, false}) {
    INFO("MPSSHIM_SERVER_STAMP_ANSWERS " << (stamped ? "1" : "unset"));
    // Without the fence watch: a synchronize that returns on its fence's landing (an early
    // answer, the next case) does so before the server's stamps are written.
    Daemon daemon({"--fence-watch", "off"},
                  stamped
                      ? std::map<std::string, std::string>{{"MPSSHIM_SERVER_STAMP_ANSWERS", "1"}}
                      : std::map<std::string, std::string>{});
    const std::string trace = daemon.dir() + "/answers.csv";
    require_pass(
        run_client(daemon, {client(), "basic", "100000"}, {{"MPSSHIM_TRACE_ANSWERS", trace}}),
        daemon);
    const auto rows = read_answer_trace(trace);
    REQUIRE_FALSE(rows.empty());
    int synchronizes = 0;
    for (const auto& r : rows) {
      CHECK(r.at("sent") != 0);
      CHECK(r.at("sent") <= r.at("seen"));  // CLOCK_MONOTONIC, one clock for every process
      CHECK(r.at("early") == 0);
      if (!stamped) {
        CHECK(r.at("taken") + r.at("known") + r.at("answered") == 0);
        continue;
      }
      CHECK(r.at("sent") <= r.at("taken"));
      CHECK(r.at("taken") <= r.at("known"));
      CHECK(r.at("known") <= r.at("answered"));
      CHECK(r.at("answered") <= r.at("seen"));
      if (r.at("op") == kStreamSynchronizeOp && r.at("launch_sent") != 0) {
        ++synchronizes;
        CHECK(r.at("launch_sent") <= r.at("launch_taken"));
        CHECK(r.at("launch_taken") <= r.at("launch_issued"));
        CHECK(r.at("launch_issued") <= r.at("answered"));
      }
    }
    if (stamped) CHECK(synchronizes > 0);
  }
}

TEST_CASE("large pageable copies shared among copy helper threads arrive intact", "[e2e]") {
  // ~16 MB each way, not a multiple of a part or a chunk: every piece is split among 4 threads
  // (libshim/copy_pool.hpp) and the device -> host pieces are 2 MiB.
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "basic", "4000037"}, {{"MPSSHIM_COPY_THREADS", "4"}}),
               daemon);
}

TEST_CASE("a module's functions are listed and walked as the real driver does", "[e2e]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "functions"}), daemon);
}

TEST_CASE("a library's kernels are looked up at their first use, or at once when asked", "[e2e]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "library_kernels", "1"}), daemon);
  require_pass(
      run_client(daemon, {client(), "library_kernels", "0"}, {{"MPSSHIM_KERNEL_LOOKUP", "eager"}}),
      daemon);
  require_pass(
      run_client(daemon, {client(), "library_kernels", "0"}, {{"CUDA_MODULE_LOADING", "EAGER"}}),
      daemon);
}

TEST_CASE("occupancy answers are remembered per function until a function's settings change",
          "[e2e]") {
  Daemon daemon({"--log-level", "debug"});
  require_pass(run_client(daemon, {client(), "occupancy"}), daemon);
  // 1 + 1 + 2 questions reached the server (the first, 64 KiB before and after the limit was
  // raised, on the function and on the kernel); the 100 repeats did not.
  REQUIRE(
      eventually([&] { return daemon.log().find("records by operation") != std::string::npos; }));
  INFO(daemon.log());
  CHECK(std::regex_search(daemon.log(), std::regex("OccupancyMaxActiveBlocks 4(,|\\s|$)")));
}

TEST_CASE("an idle cuCtxSynchronize is answered in the shim, and fails once the server is gone",
          "[e2e]") {
  Daemon daemon;
  Child sync({client(), "idle_sync"}, daemon.client_env(), true);
  {
    INFO("stdout: " << sync.out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(sync.wait_for_output("READY", 60s));
  }
  Outcome stats = daemon.ctl({"stats", "--json"});
  INFO("stats --json:\n" << stats.out);
  REQUIRE(stats.exit_code == 0);
  const nlohmann::json answer = nlohmann::json::parse(stats.out);
  REQUIRE(answer["clients"].size() == 1);
  // The client made 304 synchronizes, 300 of them with nothing sent since the one before: those
  // 300 never reached the server. What did: its setup, allocation, launches, copy and 4
  // synchronizes.
  const auto records = answer["clients"][0]["records"].get<long long>();
  CHECK(records >= 8);
  CHECK(records < 100);

  // Its server killed, the client's next idle synchronize fails.
  const ServerLine server = server_line(daemon);
  REQUIRE(server.pid > 0);
  REQUIRE(::kill(server.pid, SIGKILL) == 0);
  REQUIRE(eventually([&] { return server_line(daemon).pid != server.pid; }));
  sync.close_stdin();
  require_pass(sync.wait(60s), daemon);
}

// Fence watches (broker/server/session/fence_watch.hpp): while a spinning client synchronizes,
// its worker sleeps and the client rings when the fence lands; a client that sleeps itself
// watches nothing and its worker polls. Both get every answer right.
namespace {

// A spinning e2e_client `watched_sync ROUNDS KERNEL_US` with early answers on: every round checks
// that its synchronize waited for the kernel and finds the kernel's words. Its answer trace's
// lines.
std::vector<std::map<std::string, unsigned long long>> early_answer_run(const Daemon& daemon,
                                                                        const char* rounds,
                                                                        const char* kernel_us) {
  const std::string trace = daemon.dir() + "/answers.csv";
  Child spinning({client(), "watched_sync", rounds, kernel_us},
                 daemon.client_env({{"MPSSHIM_WAIT_SPIN_US", "10000000"},
                                    {"MPSSHIM_EARLY_ANSWERS", "on"},
                                    {"MPSSHIM_TRACE_ANSWERS", trace}}),
                 true);
  const bool ready = spinning.wait_for_output("READY", 120s);
  INFO("stdout: " << spinning.out() << "\ndaemon log:\n" << daemon.log());
  REQUIRE(ready);
  spinning.close_stdin();
  require_pass(spinning.wait(60s), daemon);
  return read_answer_trace(trace);
}

}  // namespace

TEST_CASE("a spinning client returns when its synchronize's fence lands, before the answer",
          "[e2e]") {
  for (bool watching : {true, false}) {
    INFO("--fence-watch " << (watching ? "on" : "off"));
    Daemon daemon(watching ? std::vector<std::string>{}
                           : std::vector<std::string>{"--fence-watch", "off"});
    // 20 rounds of 30 ms: the worker sleeps meanwhile, so the client sees the landing first.
    int early = 0;
    for (const auto& r : early_answer_run(daemon, "20", "30000")) {
      if (r.at("early") == 0) continue;
      CHECK(r.at("op") == kStreamSynchronizeOp);
      ++early;
    }
    // Not all 20: a worker that happens to be awake when a fence lands answers first.
    if (watching) {
      CHECK(early >= 1);
    } else {
      CHECK(early == 0);  // without the watch page, only the server's answer ends a call
    }
  }
}

TEST_CASE("slots left owed by early answers come back: many synchronizes in a row", "[e2e]") {
  Daemon daemon;
  // 500 rounds of a 2 ms kernel; each early answer leaves its slot owed until the late answer.
  int early = 0;
  for (const auto& r : early_answer_run(daemon, "500", "2000")) early += r.at("early") == 1;
  INFO(early << " early answers");
  // More than the session's 64 slots: owed slots were taken back, or the client would have
  // waited for a free slot for ever.
  CHECK(early > 64);
}

TEST_CASE("a spinning client watches its synchronize's fence and wakes its worker", "[e2e]") {
  Daemon daemon;
  auto figures = [&](const char* which) {
    Outcome stats = daemon.ctl({"stats", "--json"});
    INFO(which << " stats --json:\n" << stats.out);
    REQUIRE(stats.exit_code == 0);
    const nlohmann::json answer = nlohmann::json::parse(stats.out);
    REQUIRE(answer["clients"].size() == 1);
    return std::pair{answer["clients"][0]["fence_watches"].get<long long>(),
                     answer["clients"][0]["watch_wakes"].get<long long>()};
  };
  {
    // Spinning (yielding) for up to 10 s: it watches for the whole 30 ms of each of 20 rounds.
    // The worker also wakes every few ms for a fault check and then sees a landed fence itself;
    // on a loaded machine a yielding client may miss a landing that way, but not 20 in a row.
    Child spinning({client(), "watched_sync", "20"},
                   daemon.client_env({{"MPSSHIM_WAIT_SPIN_US", "10000000"}}), true);
    INFO("stdout: " << spinning.out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(spinning.wait_for_output("READY", 60s));
    const auto [watches, wakes] = figures("spinning");
    // The synchronizes were left to the watch (a worker kept off its CPU until a fence landed
    // posts none for that one, so not all 20 are required); the fence of at least one landed
    // while the worker slept.
    CHECK(watches >= 10);
    CHECK(wakes >= 1);
    spinning.close_stdin();
    require_pass(spinning.wait(60s), daemon);
  }
  {
    // Asleep after the 60 us spin: it watches nothing, so its doorbell never rings for a fence.
    Child sleeping({client(), "watched_sync"}, daemon.client_env({{"MPSSHIM_WAIT_SPIN_US", "0"}}),
                   true);
    INFO("stdout: " << sleeping.out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(sleeping.wait_for_output("READY", 60s));
    CHECK(figures("sleeping").second == 0);
    sleeping.close_stdin();
    require_pass(sleeping.wait(60s), daemon);
  }
}

namespace {

// The stream synchronizes of a `watched_sync 20 ...` client's trace: 20 of them, none slept
// before the history is full (8) or as long as its wait; how many slept.
int paced_synchronizes(const std::string& trace) {
  std::vector<std::map<std::string, unsigned long long>> syncs;
  for (const auto& row : read_answer_trace(trace)) {
    if (row.at("op") == kStreamSynchronizeOp) syncs.push_back(row);
  }
  REQUIRE(syncs.size() == 20);
  int slept = 0;
  for (std::size_t i = 0; i < syncs.size(); ++i) {
    const auto& r = syncs[i];
    INFO("synchronize " << i << ": waited " << (r.at("seen") - r.at("sent")) << " ns, slept "
                        << r.at("slept") << " ns");
    if (i < 8) CHECK(r.at("slept") == 0);
    CHECK(r.at("slept") < r.at("seen") - r.at("sent"));
    slept += r.at("slept") > 0;
  }
  return slept;
}

}  // namespace

TEST_CASE("a thread's long synchronizes are paced: it sleeps through most of each after 8",
          "[e2e][pacing]") {
  Daemon daemon;
  for (bool paced : {true, false}) {
    INFO("MPSSHIM_WAIT_PACING " << (paced ? "on" : "off"));
    const std::string trace = daemon.dir() + "/paced.csv";
    // 20 rounds of a 30 ms kernel and a synchronize, spinning for up to 10 s otherwise.
    require_pass(run_client(daemon, {client(), "watched_sync", "20", "30000"},
                            {{"MPSSHIM_WAIT_SPIN_US", "10000000"},
                             {"MPSSHIM_WAIT_PACING", paced ? "on" : "off"},
                             {"MPSSHIM_TRACE_ANSWERS", trace}}),
                 daemon);
    // Rounds 9-20 each follow 8 waits of about 30 ms (one cut short by a thread kept off its CPU
    // between the launch and the synchronize would spare one round).
    const int slept = paced_synchronizes(trace);
    if (paced) {
      CHECK(slept >= 10);
    } else {
      CHECK(slept == 0);
    }
  }
}

TEST_CASE("on a crowded server with a CPU per client, long synchronizes are paced too",
          "[e2e][pacing]") {
  // --spin-clients 0: crowded with one client, which has the server's CPUs to itself
  // (proto::kCrowded). Its waits sleep after the short spin; a long one sleeps first, then spins
  // for its end (libshim/wait_policy.hpp).
  Daemon daemon({"--spin-clients", "0"});
  const std::string trace = daemon.dir() + "/crowded.csv";
  require_pass(run_client(daemon, {client(), "watched_sync", "20", "30000"},
                          {{"MPSSHIM_TRACE_ANSWERS", trace}}),
               daemon);
  CHECK(paced_synchronizes(trace) >= 10);
}

// The examples need nvcc to build; meson leaves the "[examples]" cases out of a build without
// them (tests/e2e/meson.build), so a missing one here is an error, never a silent pass.
const char* example_path(const char* name) {
  const char* path = std::getenv(name);
  if (path == nullptr) FAIL(name << " is not set: the examples were not built");
  return path;
}

TEST_CASE("the examples give correct results through the broker", "[e2e][examples]") {
  Daemon daemon;
  for (const char* name : {"EXAMPLE_VECTOR_ADD", "EXAMPLE_MATMUL_TILED", "EXAMPLE_STREAMS_EVENTS",
                           "EXAMPLE_PINNED_ASYNC"}) {
    const char* path = example_path(name);
    SECTION(name) {
      std::vector<std::string> argv = {path};
      if (std::string(name) == "EXAMPLE_MATMUL_TILED")
        argv.insert(argv.end(), {"--m", "128", "--n", "128", "--k", "128"});
      require_pass(run_client(daemon, argv), daemon);
    }
  }
}

TEST_CASE("small_kernels --gaps reads back when each kernel ran, through the broker",
          "[e2e][examples]") {
  const char* path = example_path("EXAMPLE_SMALL_KERNELS");
  Daemon daemon;
  constexpr long long kSpinNs = 200'000;
  Outcome o = run_client(daemon, {path, "--gaps", "--kernels", "64", "--sync-every", "16", "--ns",
                                  std::to_string(kSpinNs)});
  require_pass(o, daemon);
  auto number = [&](const std::string& key) {
    std::smatch m;
    const std::regex re("(?:^| )" + key + "=(-?[0-9.]+)");
    REQUIRE(std::regex_search(o.out, m, re));
    return std::stod(m[1]);
  };
  INFO(o.out);
  // Each stamp pair bounds one kernel's spin on the test driver's clock; a kernel that did not
  // run, or ran with another index, leaves zeros that make these absurd.
  CHECK(number("run_us") >= kSpinNs / 1000.0);
  CHECK(number("run_us") < 100 * kSpinNs / 1000.0);
  CHECK(number("gap_us") >= 0);
  CHECK(number("sync_gap_us") >= 0);
  CHECK(number("gap_p99_us") >= number("gap_p50_us"));
  // 15 positions per run in buckets of 2: positions 1, 2-3, ..., 14-15.
  CHECK(std::regex_search(o.out, std::regex("gap_by_position_us=([0-9.-]+/){7}[0-9.-]+ ")));
  // And one figure for each of the first positions: 1 to 15 here.
  CHECK(std::regex_search(o.out, std::regex("gap_head_us=([0-9.-]+/){14}[0-9.-]+(\\s|$)")));
}

TEST_CASE("kernel_latency --stamps-last-block splits each trip, on a stream of the priority asked",
          "[e2e][examples]") {
  const char* path = example_path("BENCH_KERNEL_LATENCY");
  Daemon daemon;
  constexpr long long kSpinNs = 200'000;
  constexpr int kKernels = 20;
  Outcome o = run_client(
      daemon, {path, "--stamps-last-block", "--stream-priority", "-1", "--ns",
               std::to_string(kSpinNs), "--blocks", "4", "--kernels", std::to_string(kKernels)});
  require_pass(o, daemon);
  auto number = [&](const std::string& key) {
    std::smatch m;
    const std::regex re("(?:^| )" + key + "=(-?[0-9.]+)");
    REQUIRE(std::regex_search(o.out, m, re));
    return std::stod(m[1]);
  };
  INFO(o.out);
  CHECK(number("stream_priority") == -1);
  CHECK(number("stamped") == kKernels);
  // Block 0's start to the last block's end: at least one spin; zeroed or unwritten stamps (a
  // kernel that did not run, or stamps cleared after it) make it absurd.
  CHECK(number("stamp_run_min_us") >= kSpinNs / 1000.0);
  CHECK(number("stamp_run_p99_us") < 100 * kSpinNs / 1000.0);
  CHECK(number("stamp_answer_p50_over_min_us") >= 0);
}

TEST_CASE("ps accounts a real client's work: launches, bytes, memory, GPU time",
          "[e2e][accounting]") {
  Daemon daemon({"--busy-time", "on"});
  constexpr int kLaunches = 6;
  constexpr std::uint64_t kSleepUs = 10'000;  // account mode's sleep_kernel duration
  Child account({client(), "account", std::to_string(kLaunches)}, daemon.client_env(), true);
  {
    INFO("stdout: " << account.out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(account.wait_for_output("READY", 60s));
  }

  Outcome ps = daemon.ctl({"ps", "--json"});
  Outcome text = daemon.ctl({"--json", "ps"});  // the global flag gives the same

  INFO("ps --json:\n" << ps.out);
  REQUIRE(ps.exit_code == 0);
  const nlohmann::json answer = nlohmann::json::parse(ps.out);
  CHECK(nlohmann::json::parse(text.out)["clients"].size() == answer["clients"].size());
  REQUIRE(answer["clients"].size() == 1);
  const nlohmann::json& c = answer["clients"][0];
  CHECK(c["pid"] == account.pid());
  CHECK(c["program"] == "e2e_client");
  CHECK(c["state"] == "active");
  CHECK(c["launches"] == kLaunches);
  CHECK(c["copied_bytes"] ==
        nlohmann::json{{"h2d", 1'000'003}, {"d2h", 250'001}, {"d2d", 500'000}});
  CHECK(c["memory_used_bytes"] == 3 << 20);
  CHECK(c["memory_peak_bytes"] == 4 << 20);
  CHECK(c["pinned_host_bytes"] == 64 << 10);
  CHECK(c["sm_percentage"] == 100);
  CHECK(c["memory_limit_bytes"].is_null());
  // Measured by the test driver's events around the sleeping kernels: at least their sleep,
  // at most the client's life so far.
  const auto busy_us = c["busy_us"].get<std::uint64_t>();
  CHECK(busy_us >= kLaunches * kSleepUs);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const double started = c["start_time"].get<double>();
  CHECK(started <= now);
  CHECK(started > now - 60);
  CHECK(static_cast<double>(busy_us) / 1e6 <= now - started);

  Outcome table = daemon.ctl({"ps"});
  CHECK(table.out.find(std::to_string(account.pid())) != std::string::npos);
  CHECK(table.out.find("e2e_client") != std::string::npos);
  account.close_stdin();
  require_pass(account.wait(60s), daemon);
}

TEST_CASE("quotas changed live through mpsshimctl keep a busy client's results right",
          "[e2e][quota]") {
  Daemon daemon;
  // stress: allocations, copies both ways, vector_add on its own stream, every element checked,
  // until stdin closes.
  Child busy({client(), "stress", "0"}, daemon.client_env(), true);
  {
    INFO("stdout: " << busy.out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(busy.wait_for_output("READY", 60s));
  }
  const std::string pid = std::to_string(busy.pid());
  auto sms = [&] {
    return nlohmann::json::parse(daemon.ctl({"ps", "--json"}).out)["clients"][0]["sms"];
  };
  const auto all_sms = sms();

  for (const char* percentage : {"25", "50", "10", "100"}) {
    Outcome changed = daemon.ctl({"set_active_thread_percentage", "0", pid, percentage});
    INFO("set_active_thread_percentage " << percentage << ": " << changed.out << changed.err);
    CHECK(changed.exit_code == 0);
    CHECK(changed.out.find(std::string(percentage) + "% of the SMs") != std::string::npos);
    std::this_thread::sleep_for(50ms);  // let it work a while at this size
  }
  CHECK(sms() == all_sms);
  Outcome limited = daemon.ctl({"set_device_pinned_mem_limit", "0", pid, "1G", "--json"});
  CHECK(limited.exit_code == 0);
  CHECK(nlohmann::json::parse(limited.out)["ok"] == true);
  CHECK(nlohmann::json::parse(
            daemon.ctl({"ps", "--json"}).out)["clients"][0]["memory_limit_bytes"] == 1 << 30);
  Outcome nobody = daemon.ctl({"set_active_thread_percentage", "0", "1", "50"});
  CHECK(nobody.exit_code == 1);
  CHECK(nobody.err.find("no client with pid 1 on GPU 0") != std::string::npos);

  busy.close_stdin();
  Outcome o = busy.wait(60s);
  require_pass(o, daemon);
  CHECK(daemon.log().find("SM quota changed by the operator to 10%") != std::string::npos);
}

TEST_CASE("pointer attributes libraries ask are answered as true under the shim",
          "[e2e][attributes]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "attributes"}), daemon);
}

TEST_CASE("registered host memory is staged", "[e2e][hostmem]") {
  Daemon daemon;
  // Bigger than one staging chunk, and an odd count, so copies take several pieces.
  require_pass(run_client(daemon, {client(), "hostmem", "1000003"}), daemon);
  require_pass(run_client(daemon, {client(), "hostmem", "17"}), daemon);
}

TEST_CASE("a kernel reaches cuMemHostAlloc memory through its host pointer", "[e2e][hostmem]") {
  // Without address randomization the client's and the server's mmap areas start at the same
  // place, so the client's pinned memory lands where the server has mappings of its own: the
  // server must still map it at the client's address (the GPU sees the server's mapping).
  // The daemon, its servers and the client inherit the personality.
  const int before = ::personality(0xffffffff);
  REQUIRE(before != -1);
  ::personality(static_cast<unsigned long>(before) | ADDR_NO_RANDOMIZE);
  struct Restore {
    int persona;
    ~Restore() { ::personality(static_cast<unsigned long>(persona)); }
  } restore{before};
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "pinned_kernel", "48"}), daemon);
}

TEST_CASE("TMA descriptors are encoded by the server's driver, rules included", "[e2e][tma]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "tensor_map"}), daemon);
}

TEST_CASE(
    "queries the shim answers itself: cache preference, bank size, graph flags, green "
    "context",
    "[e2e][queries]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "queries"}), daemon);
}

TEST_CASE("stream memory operations wait and write in stream order; wrong ones are refused",
          "[e2e][streammem]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "stream_mem_ops"}), daemon);
}

TEST_CASE(
    "batched copies land from pageable, pinned, device and stack sources, and through a "
    "CUDA array; malformed batches are refused",
    "[e2e][copy_batch]") {
  Daemon daemon;
  require_pass(run_client(daemon, {client(), "copy_batch"}), daemon);
}

TEST_CASE(
    "driver calls that fail for lack of memory give the client the driver's error, leak "
    "nothing, and a bystander never notices",
    "[e2e][inject]") {
  // The calls the server makes for a client's allocations, pinned memory, arrays, pools, VMM,
  // modules, streams and graphs; not cuEventCreate, which the bystander's synchronizations use.
  const std::string armed = "/tmp/mpsshim-inject-armed-" + std::to_string(::getpid());
  ::unlink(armed.c_str());
  const std::string spec =
      "p=0.15,seed=" + std::to_string(env_int("E2E_INJECT_SEED", 11)) +
      ",calls=cuMemAlloc_v2+cuMemAllocPitch_v2+cuMemHostRegister_v2+cuArray3DCreate_v2+"
      "cuMemPoolCreate+cuMemAllocFromPoolAsync+cuMemCreate+cuMemMap+cuMemSetAccess+"
      "cuModuleLoadData+cuLibraryLoadData+cuGraphInstantiateWithFlags+cuGreenCtxStreamCreate,"
      "armed_by=" +
      armed;
  Daemon daemon({}, {{"MPSSHIM_TESTDRIVER_INJECT", spec}});
  Child bystander({client(), "bystander"}, daemon.client_env(), true);
  REQUIRE(bystander.wait_for_output("READY", 60s));
  auto held = [&] {
    auto o = daemon.driver_objects();
    return std::vector<long long>{o["allocations"] + o["physical"],
                                  o["device_bytes"],
                                  o["arrays"],
                                  o["pools"],
                                  o["modules"],
                                  o["libraries"],
                                  o["graph_execs"],
                                  o["registrations"]};
  };
  const auto before = held();
  const auto servers = server_lines(daemon);
  for (unsigned seed : {1u, 2u, 3u}) {
    Child victim({client(), "inject", std::to_string(seed), armed}, daemon.client_env(), true);
    REQUIRE(victim.wait_for_output("READY", 60s));
    {
      std::FILE* f = std::fopen(armed.c_str(), "w");
      REQUIRE(f != nullptr);
      std::fclose(f);
    }
    victim.close_stdin();
    Outcome outcome = victim.wait(120s);
    ::unlink(armed.c_str());
    INFO("victim: " << outcome.out << outcome.err << "\ndaemon log:\n" << daemon.log());
    require_pass(outcome, daemon);
    CHECK(outcome.out.find("ooms=0 ") == std::string::npos);  // the injection did fail calls
    CHECK(eventually([&] { return held() == before; }));
  }
  CHECK(daemon.driver_objects()["injected"] > 0);
  bystander.close_stdin();
  Outcome watched = bystander.wait(60s);
  INFO("bystander: " << watched.out << watched.err);
  require_pass(watched, daemon);
  // No fault, no restart: the same server serves on.
  CHECK(server_lines(daemon).at(0).pid == servers.at(0).pid);
}

TEST_CASE("destroyed events, streams, graphs, arrays and pools are freed; their handles stay safe",
          "[e2e][churn]") {
  Daemon daemon;
  require_pass(
      run_client(daemon, {client(), "churn", std::to_string(env_int("E2E_CHURN", 200000))}),
      daemon);
}

TEST_CASE("eight clients at once all get their own correct results", "[e2e]") {
  Daemon daemon;
  std::vector<std::unique_ptr<Child>> clients;
  for (int i = 0; i < 8; ++i) {
    clients.push_back(std::make_unique<Child>(
        std::vector<std::string>{client(), "basic", std::to_string(50000 + 1000 * i)},
        daemon.client_env()));
  }
  for (auto& c : clients) require_pass(c->wait(120s), daemon);
}

TEST_CASE("a client killed mid-stream is cleaned up and the others finish", "[e2e]") {
  Daemon daemon;
  Outcome before = run_client(daemon, {client(), "meminfo"});
  require_pass(before, daemon);
  unsigned long long free_before = field(before.out, "free");

  Child hog({client(), "hog", "512"}, daemon.client_env());
  REQUIRE(hog.wait_for_output("READY", 60s));
  unsigned long long free_during = field(hog.out(), "free");
  CHECK(free_during + (512ull << 20) <= free_before);
  Outcome ps = daemon.ctl({"ps"});
  INFO("ps: " << ps.out);
  CHECK(ps.out.find(std::to_string(hog.pid())) != std::string::npos);

  std::vector<std::unique_ptr<Child>> others;
  for (int i = 0; i < 3; ++i) {
    others.push_back(std::make_unique<Child>(std::vector<std::string>{client(), "basic", "200000"},
                                             daemon.client_env()));
  }
  hog.kill(SIGKILL);
  CHECK(hog.wait(30s).exit_code == -SIGKILL);
  for (auto& c : others) require_pass(c->wait(120s), daemon);

  // Its memory comes back: a new client sees as much free memory as before.
  unsigned long long free_after = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    Outcome after = run_client(daemon, {client(), "meminfo"});
    require_pass(after, daemon);
    free_after = field(after.out, "free");
    if (free_after == free_before) break;
    std::this_thread::sleep_for(100ms);
  }
  INFO("daemon log:\n" << daemon.log());
  CHECK(free_after == free_before);
  CHECK(daemon.ctl({"ps"}).out.find(std::to_string(hog.pid())) == std::string::npos);
}

TEST_CASE("a client cannot reach memory it does not own; the server survives", "[e2e]") {
  Daemon daemon;
  Child owner({client(), "pointer"}, daemon.client_env());
  REQUIRE(owner.wait_for_output("POINTER", 60s));
  std::smatch m;
  std::string text = owner.out();
  REQUIRE(std::regex_search(text, m, std::regex("POINTER ([0-9]+)")));
  unsigned long long foreign = std::stoull(m[1]);
  Outcome o = run_client(daemon, {client(), "forge", std::to_string(foreign)});
  require_pass(o, daemon);
  require_pass(run_client(daemon, {client(), "basic", "1000"}), daemon);
  owner.kill(SIGKILL);
}

TEST_CASE("a memory limit is enforced with a message naming it", "[e2e]") {
  Daemon daemon;
  Outcome o = run_client(daemon, {client(), "overlimit", "128"},
                         {{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=64M"}});
  require_pass(o, daemon);
  CHECK(field(o.out, "total") == (64ull << 20));
  CHECK(daemon.log().find("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") != std::string::npos);
}

TEST_CASE("an SM quota sizes the client's green context and is what it sees", "[e2e]") {
  Daemon daemon;
  Outcome o =
      run_client(daemon, {client(), "quota"}, {{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25"}});
  require_pass(o, daemon);
  // 25% of the test device's 132 SMs, rounded up to the 8-SM partition granularity.
  CHECK(field(o.out, "sms") == 40);
  CHECK(field(o.out, "distinct") <= 40);
  Outcome full = run_client(daemon, {client(), "quota"});
  require_pass(full, daemon);
  CHECK(field(full.out, "sms") == 132);
}

TEST_CASE("without a daemon cuInit fails and says how to start one", "[e2e]") {
  std::map<std::string, std::string> env = {{"CUDA_MPS_PIPE_DIRECTORY", "/nonexistent/mpsshim"},
                                            {"LD_PRELOAD", shim_preload()}};
  Child c({client(), "basic", "16"}, env);
  Outcome o = c.wait(30s);
  INFO("stdout: " << o.out << "\nstderr: " << o.err);
  CHECK(o.exit_code != 0);
  CHECK(o.out.find("CUDA_ERROR_MPS_CONNECTION_FAILED") != std::string::npos);
  CHECK(o.err.find("/nonexistent/mpsshim/control") != std::string::npos);
  CHECK(o.err.find("mpsshimd") != std::string::npos);
}

TEST_CASE("32 clients at once on a server of 4 workers all get their own correct results",
          "[e2e][threaded]") {
  Daemon daemon({"--server-workers", "4"});
  constexpr int kClients = 32;
  std::vector<std::unique_ptr<Child>> clients;
  std::set<int> pids;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Child>(
        std::vector<std::string>{client(), "stress", "8", "gate"}, daemon.client_env(), true));
    pids.insert(clients.back()->pid());
  }
  for (auto& c : clients) {
    INFO("stdout: " << c->out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(c->wait_for_output("READY", 120s));
  }
  // All 32 attached at once, each placed on the least-loaded worker as it came: 8 each, as the
  // server logged it and as `stats --json` reports it.
  CHECK(ps_pids(daemon) == pids);
  std::map<int, int> placed;  // pid -> worker, from the server's log
  {
    const std::regex admitted(
        "\\(pid ([0-9]+), e2e_client, uid [0-9]+\\) connected: .* served "
        "by worker ([0-9]+)");
    std::istringstream lines(daemon.log());
    for (std::string line; std::getline(lines, line);) {
      std::smatch m;
      if (std::regex_search(line, m, admitted)) placed[std::stoi(m[1])] = std::stoi(m[2]);
    }
  }
  std::map<int, int> per_worker;
  std::set<int> placed_pids;
  for (const auto& [pid, worker] : placed) {
    placed_pids.insert(pid);
    ++per_worker[worker];
  }
  {
    INFO("daemon log:\n" << daemon.log());
    CHECK(placed_pids == pids);
    CHECK(per_worker == std::map<int, int>{{0, 8}, {1, 8}, {2, 8}, {3, 8}});
  }
  Outcome stats = daemon.ctl({"stats", "--json"});
  {
    INFO("stats --json:\n" << stats.out);
    CHECK(stats.exit_code == 0);
    // 32 clients: an answer longer than one message, in parts.
    const nlohmann::json answer = nlohmann::json::parse(stats.out);
    std::set<int> listed;
    for (const nlohmann::json& c : answer["clients"]) {
      const int pid = c["pid"].get<int>();
      listed.insert(pid);
      INFO("pid " << pid);
      CHECK(placed.count(pid) == 1);
      CHECK(placed[pid] == c["worker"].get<int>());
    }
    CHECK(listed == pids);
  }
  for (auto& c : clients) c->close_stdin();  // go: all of them work at once
  for (auto& c : clients) {
    Outcome o = c->wait(120s);
    require_pass(o, daemon);
    CHECK(o.out.find("PASS stress iterations=8") != std::string::npos);
  }
  CHECK(daemon.log().find("4 worker thread(s) serve the clients") != std::string::npos);
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
}

TEST_CASE("MPSSHIM_SERVER_IDLE sets the workers' idle strategy; a malformed one is refused",
          "[e2e][idle]") {
  {
    Daemon daemon({}, {{"MPSSHIM_SERVER_IDLE", "10,100,0,30"}});
    require_pass(run_client(daemon, {client(), "basic", "100000"}), daemon);
    CHECK(daemon.log().find("worker idle strategy: spin 10 us, yield 100 us, with GPU work owed "
                            "yield 0 us then naps of 30 us (on a crowded server naps after 0 "
                            "us); parks at once after 8 long watched "
                            "spells in a row") != std::string::npos);
  }
  {
    Daemon daemon({}, {{"MPSSHIM_SERVER_IDLE", "20,50,200,100,0,150"}});
    require_pass(run_client(daemon, {client(), "basic", "100000"}), daemon);
    CHECK(daemon.log().find("yield 200 us then naps of 100 us (on a crowded server naps after "
                            "150 us); never parks at once") != std::string::npos);
  }
  for (const char* malformed : {"10,100,0", "20,50,200,100,-1", "20,50,200,100,8,-5"}) {
    Daemon daemon({}, {{"MPSSHIM_SERVER_IDLE", malformed}});
    require_pass(run_client(daemon, {client(), "basic", "100000"}), daemon);
    CHECK(daemon.log().find("MPSSHIM_SERVER_IDLE=\"" + std::string(malformed) +
                            "\" is not SPIN,YIELD,PENDING_YIELD,PENDING_NAP in "
                            "microseconds") != std::string::npos);
  }
}

TEST_CASE("MPSSHIM_SERVER_TIMER_SLACK sets how late the workers' timed sleeps may end",
          "[e2e][idle]") {
  // The line gives the slack worker 0's thread has, read back from the kernel. The daemon and
  // its server inherit this process's slack (fork and exec keep it).
  const long long own = ::prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
  REQUIRE(own != 2500);
  const auto slack_line = [](long long ns, bool set) {
    return "workers' timed sleeps end at most " + std::to_string(ns) + " ns late (timer slack, " +
           (set ? "MPSSHIM_SERVER_TIMER_SLACK)" : "the server's own)");
  };
  const auto logged = [](const Daemon& daemon, const std::string& line) {
    return eventually([&] { return daemon.log().find(line) != std::string::npos; });
  };
  {
    Daemon daemon;
    require_pass(run_client(daemon, {client(), "basic", "100000"}), daemon);
    CHECK(logged(daemon, slack_line(own, false)));
  }
  {
    Daemon daemon({}, {{"MPSSHIM_SERVER_TIMER_SLACK", "2500"}});
    require_pass(run_client(daemon, {client(), "basic", "100000"}), daemon);
    CHECK(logged(daemon, slack_line(2500, true)));
  }
  {
    Daemon daemon({}, {{"MPSSHIM_SERVER_TIMER_SLACK", "inherit"}});
    require_pass(run_client(daemon, {client(), "basic", "100000"}), daemon);
    CHECK(logged(daemon, slack_line(own, false)));
  }
  for (const char* malformed : {"0", "12us", "-5", "2000000000"}) {
    Daemon daemon({}, {{"MPSSHIM_SERVER_TIMER_SLACK", malformed}});
    require_pass(run_client(daemon, {client(), "basic", "100000"}), daemon);
    CHECK(daemon.log().find("MPSSHIM_SERVER_TIMER_SLACK=\"" + std::string(malformed) +
                            "\" is not nanoseconds") != std::string::npos);
    CHECK(logged(daemon, slack_line(own, false)));
  }
}

TEST_CASE("a dozing worker collects one-way records, and a client about to wait wakes it",
          "[e2e][idle]") {
  // Every spell owing nothing dozes at once, for up to 30 s: a wait that did not wake the
  // worker would last that long.
  Daemon daemon({}, {{"MPSSHIM_SERVER_DOZE", "0,30000000,1"}});
  Child trickling({client(), "trickle", "200"}, daemon.client_env(), true);
  INFO("stdout: " << trickling.out() << "\ndaemon log:\n" << daemon.log());
  REQUIRE(trickling.wait_for_output("READY", 60s));
  const std::string& out = trickling.out();
  const auto at = out.find("elapsed_us=");
  REQUIRE(at != std::string::npos);
  const long long elapsed_us = std::stoll(out.substr(at + 11));
  // 200 launches 30 us apart and 128 MiB of staged copies: well under a second on this path.
  CHECK(elapsed_us < 15'000'000);
  Outcome stats = daemon.ctl({"stats", "--json"});
  INFO("stats --json:\n" << stats.out);
  REQUIRE(stats.exit_code == 0);
  const nlohmann::json answer = nlohmann::json::parse(stats.out);
  REQUIRE(answer["clients"].size() == 1);
  CHECK(answer["clients"][0]["dozes"].get<long long>() >= 1);
  trickling.close_stdin();
  require_pass(trickling.wait(60s), daemon);
  CHECK(daemon.log().find("workers doze after 0 us of a spell owing nothing, for at most "
                          "30000000 us, once 1 such spells in a row lasted that long") !=
        std::string::npos);

  // Malformed: refused with a warning, and the defaults serve.
  Daemon refused({}, {{"MPSSHIM_SERVER_DOZE", "5,0,4"}});
  require_pass(run_client(refused, {client(), "basic", "100000"}), refused);
  CHECK(refused.log().find("MPSSHIM_SERVER_DOZE=\"5,0,4\" is not DOZE_AFTER,DOZE") !=
        std::string::npos);
}

TEST_CASE("clients killed at random points leave the server and the busy clients unharmed",
          "[e2e][threaded]") {
  Daemon daemon({"--server-workers", "4"});
  const ServerLine server = server_line(daemon);
  REQUIRE(server.pid > 0);
  REQUIRE(server.state == "running");
  const int fds_idle = open_fd_count(server.pid);
  REQUIRE(fds_idle > 0);

  constexpr int kBusy = 8;
  std::vector<std::unique_ptr<Child>> busy;
  std::set<int> busy_pids;
  for (int i = 0; i < kBusy; ++i) {
    busy.push_back(std::make_unique<Child>(std::vector<std::string>{client(), "stress", "0"},
                                           daemon.client_env(), true));
    busy_pids.insert(busy.back()->pid());
  }
  for (auto& c : busy) {
    INFO("stdout: " << c->out() << "\ndaemon log:\n" << daemon.log());
    REQUIRE(c->wait_for_output("READY", 120s));
  }
  REQUIRE(eventually([&] { return ps_pids(daemon) == busy_pids; }));
  const int fds_busy = open_fd_count(server.pid);
  REQUIRE(fds_busy > fds_idle);

  // Victims in waves of four; each is killed at a random point: before or while it attaches
  // and sets up, or while it works.
  const int kills = env_int("MPSSHIM_E2E_KILLS", 60);
  const unsigned seed = static_cast<unsigned>(
      env_int("MPSSHIM_E2E_SEED", static_cast<int>(std::random_device{}() % 1000000)));
  INFO("MPSSHIM_E2E_SEED=" << seed);
  std::mt19937 random(seed);
  int killed = 0;
  int killed_working = 0;
  while (killed < kills) {
    std::vector<std::unique_ptr<Child>> wave;
    for (int i = 0; i < 4; ++i) {
      wave.push_back(std::make_unique<Child>(
          std::vector<std::string>{client(), "stress", "1000000"}, daemon.client_env()));
    }
    for (auto& victim : wave) {
      // The sleeps pick the kill point; nothing waits on them.
      if (random() % 3 == 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 30000));
      } else {
        INFO("stdout: " << victim->out() << "\ndaemon log:\n" << daemon.log());
        REQUIRE(victim->wait_for_output("READY", 60s));
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 10000));
        ++killed_working;
      }
      victim->kill(SIGKILL);
    }
    for (auto& victim : wave) {
      Outcome o = victim->wait(30s);
      INFO("victim stdout: " << o.out << "\nstderr: " << o.err);
      CHECK(o.exit_code == -SIGKILL);  // none failed or ended before its kill
      ++killed;
    }
  }
  CHECK(killed_working > 0);

  // The same server, never restarted; only the busy clients are left, and the fds of every
  // victim's session are closed.
  const ServerLine after = server_line(daemon);
  CHECK(after.pid == server.pid);
  CHECK(after.state == "running");
  CHECK(after.restarts == server.restarts);
  {
    INFO("ps:\n" << daemon.ctl({"ps"}).out);
    CHECK(eventually([&] { return ps_pids(daemon) == busy_pids; }));
  }
  {
    bool closed = eventually([&] { return open_fd_count(server.pid) == fds_busy; });
    INFO("server fds: " << open_fd_count(server.pid) << ", " << fds_busy << " before the kills");
    CHECK(closed);
  }

  for (auto& c : busy) c->close_stdin();
  for (auto& c : busy) {
    Outcome o = c->wait(120s);
    require_pass(o, daemon);
  }
  CHECK(eventually([&] { return ps_pids(daemon).empty(); }));
  {
    bool closed = eventually([&] { return open_fd_count(server.pid) == fds_idle; });
    INFO("server fds: " << open_fd_count(server.pid) << ", " << fds_idle << " without clients");
    CHECK(closed);
  }
  CHECK(server_line(daemon).pid == server.pid);
  const std::string log = daemon.log();
  CHECK(log.find("GPU fault") == std::string::npos);
  CHECK(log.find("restarting") == std::string::npos);
}
