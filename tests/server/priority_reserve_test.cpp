// SMs reserved for normal-priority clients (broker/server/scheduling/priority_reserve.hpp), on the
// test driver, whose record_smid kernel reports, for block b, the b-th SM (cyclically) of its
// stream's green context. Its 132 SMs split in steps of 8 into 15 groups (partition_test.cpp
// lists them), leaving 12 SMs in no group; a reserve of 16 SMs is groups 13 and 14, SMs
// 112-127. While a normal client is connected, a below-normal client of the whole device runs
// on the other 116 SMs; its work queued before the move and after it runs in order, with the
// right results; when the normal client leaves it gets all 132 back.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <set>
#include <vector>

#include "broker/server/scheduling/priority_reserve.hpp"
#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {
namespace {

using batch::bits;
using batch::field;
using batch::Fixture;
using proto::Op;

constexpr int kNormalPid = 7001;
constexpr int kLowPid = 7002;
constexpr unsigned kSms = 132;
constexpr unsigned kReservedSms = 16;
constexpr unsigned kFirstReservedSm = 112;  // group 13 starts here; group 14 ends at 127
constexpr unsigned kOutsideReserve = kSms - kReservedSms;
constexpr int kWords = 4096;

ServerSettings reserve_settings(const char* reserve = "16", bool scheduling = true) {
  ServerSettings settings;
  settings.priority.enabled = scheduling;
  settings.priority.reserve = *parse_sm_reserve(reserve);
  return settings;
}

proto::ClientHello low_hello(int percentage = proto::kUnset) {
  proto::ClientHello hello = default_hello(kLowPid, "batch_job");
  hello.priority = 1;  // CUDA_MPS_CLIENT_PRIORITY=1
  hello.active_thread_percentage = percentage;
  return hello;
}

proto::ClientHello normal_hello(int percentage = proto::kUnset) {
  proto::ClientHello hello = default_hello(kNormalPid, "latency_service");
  hello.active_thread_percentage = percentage;
  return hello;
}

// The client's `ps` line.
std::string ps_line(Harness& h, int pid) {
  const std::string all = h.server->stats_text(false);
  const std::size_t at = all.find(fmt::format(" pid={} ", pid));
  REQUIRE(at != std::string::npos);
  const std::size_t begin = all.rfind('\n', at) == std::string::npos ? 0 : all.rfind('\n', at);
  return all.substr(begin, all.find('\n', at) - begin) + "\n";
}

// The distinct SMs a kernel of one block per SM of the device ran on, on `stream`.
std::set<unsigned> sms_used(Fixture& f, std::uint64_t stream) {
  auto smid = f.function("record_smid");
  const std::uint64_t ids = f.buffer(kSms * 4);
  f.launch(smid, stream, kSms, 1, ids);
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);
  auto read = f.read<unsigned>(ids, kSms);
  return {read.begin(), read.end()};
}

bool touches_reserve(const std::set<unsigned>& sms) {
  return std::any_of(sms.begin(), sms.end(), [](unsigned sm) {
    return sm >= kFirstReservedSm && sm < kFirstReservedSm + 16;
  });
}

Session& session_of(Harness& h, Fixture& f) {
  Session* s = h.server->find_session(f.sut.welcome().client_id);
  REQUIRE(s != nullptr);
  return *s;
}

TEST_CASE("the reserve is planned in whole groups of the split, leaving one at least",
          "[server][priority][reserve]") {
  constexpr unsigned kGroups = 15;
  CHECK(plan_sm_reserve(*parse_sm_reserve("10%"), kSms, 8, kGroups).groups == 2);  // 14 -> 16
  CHECK(plan_sm_reserve(*parse_sm_reserve("1"), kSms, 8, kGroups).groups == 1);
  CHECK(plan_sm_reserve(*parse_sm_reserve("16"), kSms, 8, kGroups).sms() == 16);
  CHECK(plan_sm_reserve(*parse_sm_reserve("4096"), kSms, 8, kGroups).groups == kGroups - 1);
  CHECK_FALSE(plan_sm_reserve(*parse_sm_reserve("0"), kSms, 8, kGroups).on());
  CHECK_FALSE(plan_sm_reserve(*parse_sm_reserve("16"), kSms, 8, 1).on());  // nothing to keep
}

TEST_CASE("a below-normal client leaves the reserved SMs while a normal client is connected",
          "[server][priority][reserve]") {
  Harness h(test_driver(), reserve_settings());
  Fixture low(h, low_hello());
  auto sleeper = low.function("sleep_kernel");
  auto fill = low.function("fill_u32");
  auto scale_add = low.function("scale_add");
  const std::uint64_t stream = low.stream();
  const std::uint64_t x = low.buffer(kWords * 4);
  const std::uint64_t y = low.buffer(kWords * 4);
  low.launch(fill, stream, 8, 256, x, bits(3.0f), kWords);
  CHECK(sms_used(low, stream).size() == kSms);  // alone: the whole device
  CHECK(field(ps_line(h, kLowPid), "sms_held_back") == 0);

  // Work queued and still running when the normal client arrives: y = 1 after a 200 ms kernel.
  low.launch(sleeper, stream, 1, 1, 200'000);
  low.launch(fill, stream, 8, 256, y, bits(1.0f), kWords);
  h.pump(4);
  Fixture normal(h, normal_hello());
  h.pump(4);

  // Later work on the same stream runs after it (y = 2 * 3 + 1), outside the reserve.
  CHECK(field(ps_line(h, kLowPid), "sms") == kOutsideReserve);
  CHECK(field(ps_line(h, kLowPid), "sms_held_back") == kReservedSms);
  low.launch(scale_add, stream, 8, 256, y, x, 2.0f, kWords);
  const std::set<unsigned> held_back = sms_used(low, stream);
  REQUIRE(low.synchronize(stream) == CUDA_SUCCESS);
  CHECK(low.async_error() == CUDA_SUCCESS);
  for (float value : low.read<float>(y, kWords)) REQUIRE(value == 7.0f);
  CHECK(held_back.size() == kOutsideReserve);
  CHECK_FALSE(touches_reserve(held_back));
  CHECK(h.logged("SMs moved because a normal-priority client connected"));
  // The normal client has the whole device, the reserve included.
  CHECK(sms_used(normal, normal.stream()).size() == kSms);
  CHECK(field(ps_line(h, kNormalPid), "sms_held_back") == 0);

  // The normal client leaves: the below-normal one gets the whole device back, in order.
  low.launch(sleeper, stream, 1, 1, 100'000);
  low.launch(fill, stream, 8, 256, y, bits(5.0f), kWords);
  normal.sut.hang_up();
  REQUIRE(h.pump_until([&] { return h.server->session_count() == 1; }));
  h.pump(4);
  low.launch(scale_add, stream, 8, 256, y, x, 1.0f, kWords);  // y = 3 + 5
  CHECK(sms_used(low, stream).size() == kSms);
  for (float value : low.read<float>(y, kWords)) REQUIRE(value == 8.0f);
  CHECK(field(ps_line(h, kLowPid), "sms_held_back") == 0);
  CHECK(h.logged("SMs moved because no normal-priority client is connected any more"));

  // Another normal client: the session takes up the green context it had outside the reserve.
  const std::size_t greens = session_of(h, low).quota_changes.earlier_greens.size();
  {
    TestClient again(h, normal_hello());
    REQUIRE(again.connected());
    h.pump(4);
    CHECK(field(ps_line(h, kLowPid), "sms") == kOutsideReserve);
    CHECK(session_of(h, low).quota_changes.earlier_greens.size() == greens);
    again.hang_up();
    REQUIRE(h.pump_until([&] { return h.server->session_count() == 1; }));
  }
  h.pump(4);
  CHECK(field(ps_line(h, kLowPid), "sms") == kSms);
  CHECK(session_of(h, low).quota_changes.earlier_greens.size() == greens);
  low.sut.hang_up();
}

TEST_CASE("a below-normal client that connects beside a normal one starts outside the reserve",
          "[server][priority][reserve]") {
  Harness h(test_driver(), reserve_settings());
  Fixture normal(h, normal_hello());
  Fixture low(h, low_hello());

  CHECK(field(ps_line(h, kLowPid), "sms_held_back") == kReservedSms);
  const std::set<unsigned> used = sms_used(low, low.stream());
  CHECK(used.size() == kOutsideReserve);
  CHECK_FALSE(touches_reserve(used));
  CHECK(h.logged(fmt::format("{} held back for normal-priority clients", kReservedSms)));
  normal.sut.hang_up();
  low.sut.hang_up();
}

TEST_CASE("below-normal clients on their own workers all leave the reserve when one connects",
          "[server][priority][reserve][threaded]") {
  // Each worker moves its own sessions at the start of its next pass, so the four moves below
  // start together. The real driver fails a split made while another thread splits, and the
  // test driver does too (tests/testdriver/green.cpp): unless the moves take turns
  // (hold_green_builds), some of them fail and those clients keep running on reserved SMs.
  constexpr int kLows = 4;
  ServerSettings settings = reserve_settings();
  settings.workers = kLows;
  Harness h(test_driver(), settings);
  h.start_threaded();
  {
    std::vector<std::unique_ptr<Fixture>> lows;
    std::vector<std::uint64_t> streams;
    for (int i = 0; i < kLows; ++i) {
      proto::ClientHello hello = low_hello();
      hello.pid = kLowPid + 100 + i;
      lows.push_back(std::make_unique<Fixture>(h, hello));
      streams.push_back(lows.back()->stream());
      CHECK(sms_used(*lows.back(), streams.back()).size() == kSms);
    }
    Fixture normal(h, normal_hello());
    for (int i = 0; i < kLows; ++i) {
      INFO("below-normal client " << i);
      const std::set<unsigned> used = sms_used(*lows[i], streams[i]);
      CHECK(used.size() == kOutsideReserve);
      CHECK_FALSE(touches_reserve(used));
    }
    CHECK_FALSE(h.logged("could not leave the SMs reserved"));
    for (auto& low : lows) low->sut.hang_up();
    normal.sut.hang_up();
  }
  CHECK(h.stop_threaded() == 0);
}

// The test driver with its splits failing while `failing_splits` is above 0 (a split that makes
// groups; the server's count of groups at its start passes).
std::atomic<int> failing_splits{0};
const DriverTable& flaky_split_driver() {
  static const DriverTable table = [] {
    DriverTable t = test_driver();
    t.cuDevSmResourceSplitByCount = [](CUdevResource* result, unsigned* groups,
                                       const CUdevResource* in, CUdevResource* remaining,
                                       unsigned flags, unsigned min_count) {
      if (result != nullptr && failing_splits.fetch_sub(1) > 0) {
        return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
      }
      return test_driver().cuDevSmResourceSplitByCount(result, groups, in, remaining, flags,
                                                       min_count);
    };
    return t;
  }();
  return table;
}

TEST_CASE("a below-normal client whose move out of the reserve failed is moved on a later try",
          "[server][priority][reserve]") {
  Harness h(flaky_split_driver(), reserve_settings());
  Fixture low(h, low_hello());
  const std::uint64_t stream = low.stream();
  CHECK(sms_used(low, stream).size() == kSms);

  failing_splits = 2;  // the first move and its first retry
  Fixture normal(h, normal_hello());
  h.pump(4);
  CHECK(h.logged("could not leave the SMs reserved for normal-priority clients"));
  CHECK(h.logged("trying again in 100 ms"));
  REQUIRE(h.pump_until([&] { return field(ps_line(h, kLowPid), "sms") == kOutsideReserve; }));
  CHECK(h.logged("trying again in 200 ms"));
  const std::set<unsigned> used = sms_used(low, stream);
  CHECK(used.size() == kOutsideReserve);
  CHECK_FALSE(touches_reserve(used));
  CHECK_FALSE(h.logged("tries)"));  // not given up

  // Every try failing, for a client that was never outside the reserve (the first one takes up
  // the green context it had there, without a split): given up after kReserveMoveTries, logged
  // as such; tried afresh when a normal client connects or leaves, however soon it comes back.
  normal.sut.hang_up();
  REQUIRE(h.pump_until([&] { return field(ps_line(h, kLowPid), "sms") == kSms; }));
  proto::ClientHello hello = low_hello();
  hello.pid = kLowPid + 1;
  Fixture fresh(h, hello);
  failing_splits = 1000;
  {
    TestClient again(h, normal_hello());
    REQUIRE(again.connected());
    REQUIRE(h.pump_until([&] { return h.logged("(5 tries)"); }));
    CHECK(field(ps_line(h, kLowPid + 1), "sms") == kSms);
    CHECK(field(ps_line(h, kLowPid), "sms") == kOutsideReserve);
    failing_splits = 0;
    again.hang_up();
    REQUIRE(h.pump_until([&] { return h.server->session_count() == 2; }));
  }
  {
    TestClient third(h, normal_hello());
    REQUIRE(third.connected());
    REQUIRE(h.pump_until([&] { return field(ps_line(h, kLowPid + 1), "sms") == kOutsideReserve; }));
    const std::set<unsigned> moved = sms_used(fresh, fresh.stream());
    CHECK(moved.size() == kOutsideReserve);
    CHECK_FALSE(touches_reserve(moved));
    third.hang_up();
    REQUIRE(h.pump_until([&] { return h.server->session_count() == 2; }));
  }
  fresh.sut.hang_up();
  low.sut.hang_up();
}

TEST_CASE("shares that avoid the reserve stay; a normal client's share lies over it",
          "[server][priority][reserve]") {
  Harness h(test_driver(), reserve_settings());
  // 25%: 33 SMs, rounded to 40, the device's first five groups, before the reserve.
  Fixture low(h, low_hello(25));
  Fixture normal(h, normal_hello(25));

  const std::set<unsigned> low_sms = sms_used(low, low.stream());
  const std::set<unsigned> normal_sms = sms_used(normal, normal.stream());
  CHECK(low_sms.size() == 40);
  CHECK(*low_sms.begin() == 0);
  CHECK(field(ps_line(h, kLowPid), "sms_held_back") == 0);
  CHECK_FALSE(h.logged("SMs moved because"));
  // The normal client's 40 SMs are the device's last five groups: the reserve among them.
  CHECK(normal_sms.size() == 40);
  CHECK(normal_sms.count(kFirstReservedSm) == 1);
  CHECK(*normal_sms.rbegin() == kFirstReservedSm + 15);

  // A live quota change of the below-normal client keeps it out of the reserve while held back.
  int status = 0;
  const std::string answer = h.server->control_command(
      fmt::format("set_client_active_thread_percentage {} 100", kLowPid), status);
  INFO(answer);
  CHECK(status == 0);
  CHECK(answer.find("held back for normal-priority clients") != std::string::npos);
  const std::set<unsigned> all_but_reserve = sms_used(low, low.stream());
  CHECK(all_but_reserve.size() == kOutsideReserve);
  CHECK_FALSE(touches_reserve(all_but_reserve));
  low.sut.hang_up();
  normal.sut.hang_up();
}

TEST_CASE("a below-normal client in a static partition keeps its partition",
          "[server][priority][reserve][partition]") {
  Harness h(test_driver(), reserve_settings());
  // Groups 12-14: SMs 104-111 and the reserve's 112-127.
  proto::ServerAdmit pinned = admission_of(low_hello());
  pinned.hello.sm_partition = 4;
  pinned.sm_partition = 4;
  pinned.partition_first_group = 12;
  pinned.partition_groups = 3;
  Fixture low(h, pinned);
  Fixture normal(h, normal_hello());

  const std::set<unsigned> used = sms_used(low, low.stream());
  CHECK(used.size() == 24);
  CHECK(*used.begin() == 104);
  CHECK(touches_reserve(used));
  CHECK(field(ps_line(h, kLowPid), "sms_held_back") == 0);
  low.sut.hang_up();
  normal.sut.hang_up();
}

TEST_CASE("a below-normal client with a capture open moves once the capture ends",
          "[server][priority][reserve]") {
  Harness h(test_driver(), reserve_settings());
  Fixture low(h, low_hello());
  auto fill = low.function("fill_u32");
  const std::uint64_t stream = low.stream();
  const std::uint64_t y = low.buffer(kWords * 4);
  REQUIRE(low.sut.call(Op::kStreamBeginCapture, proto::BeginCaptureReq{stream, 0, 0}).result ==
          CUDA_SUCCESS);
  Fixture normal(h, normal_hello());
  h.pump(4);

  CHECK(field(ps_line(h, kLowPid), "sms") == kSms);  // the capture lives on its stream
  low.launch(fill, stream, 8, 256, y, 5u, kWords);
  REQUIRE(low.sut.call(Op::kStreamEndCapture, proto::HandleReq{stream}).result == CUDA_SUCCESS);
  h.pump(4);
  CHECK(field(ps_line(h, kLowPid), "sms") == kOutsideReserve);
  low.sut.hang_up();
  normal.sut.hang_up();
}

TEST_CASE("nothing is reserved with the reserve at 0 or priority scheduling off",
          "[server][priority][reserve]") {
  for (ServerSettings settings : {reserve_settings("0"), reserve_settings("16", false)}) {
    Harness h(test_driver(), settings);
    Fixture low(h, low_hello());
    Fixture normal(h, normal_hello(25));
    h.pump(4);

    CHECK_FALSE(h.server->sm_reserve().on());
    CHECK(sms_used(low, low.stream()).size() == kSms);
    CHECK(field(ps_line(h, kLowPid), "sms_held_back") == 0);
    CHECK(*sms_used(normal, normal.stream()).begin() == 0);  // the device's first SMs, as before
    low.sut.hang_up();
    normal.sut.hang_up();
  }
}

}  // namespace
}  // namespace mpsshim::server::test
