// Per-client accounting of the server's work: handler time per opcode and the ring delay
// histogram (broker/server/accounting/session_stats.hpp), and what `mpsshimctl stats` reads of it.
#include <catch2/catch.hpp>

#include <map>
#include <sstream>

#include "broker/server/accounting/heap_profile.hpp"
#include "broker/server/accounting/session_stats.hpp"
#include "broker/server/session/session.hpp"
#include "proto/ring.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;

constexpr std::uint64_t kUs = 1000;
constexpr std::uint64_t kMs = 1000 * kUs;
constexpr std::uint64_t kNoDelay = SessionStats::kNotStamped;

std::map<std::string, std::string> fields_of(const std::string& line) {
  std::map<std::string, std::string> fields;
  std::istringstream in(line);
  for (std::string token; in >> token;) {
    auto equals = token.find('=');
    if (equals != std::string::npos) fields[token.substr(0, equals)] = token.substr(equals + 1);
  }
  return fields;
}

TEST_CASE("delays fall into power-of-two buckets of 32 ns", "[server][stats]") {
  CHECK(SessionStats::delay_bucket(0) == 0);
  CHECK(SessionStats::delay_bucket(31) == 0);
  CHECK(SessionStats::delay_bucket(32) == 1);
  CHECK(SessionStats::delay_bucket(63) == 1);
  CHECK(SessionStats::delay_bucket(64) == 2);
  CHECK(SessionStats::delay_bucket(1000) == 5);  // [512, 1024)
  CHECK(SessionStats::delay_bucket(1024) == 6);
  CHECK(SessionStats::delay_bucket(4 * 1000 * kMs) == 27);  // 4 s: the last bounded bucket
  CHECK(SessionStats::delay_bucket(5 * 1000 * kMs) == SessionStats::kOverflowBucket);
  CHECK(SessionStats::delay_bucket(std::uint64_t{1} << 40) == SessionStats::kOverflowBucket);

  for (std::size_t b = 0; b < SessionStats::kDelayBuckets; ++b) {
    INFO("bucket " << b);
    CHECK(SessionStats::delay_bucket(SessionStats::bucket_lower_ns(b)) == b);
    CHECK(SessionStats::delay_bucket(SessionStats::bucket_upper_ns(b) - 1) == b);
  }
}

TEST_CASE("record counts every record and samples only stamped ones", "[server][stats]") {
  SessionStats sut;

  sut.record(Op::kLaunchKernel, 2 * kUs, 500);
  sut.record(Op::kLaunchKernel, 3 * kUs, kNoDelay);
  sut.record(Op::kPing, 1 * kUs, 40);

  CHECK(sut.ops[static_cast<std::size_t>(Op::kLaunchKernel)].count == 2);
  CHECK(sut.ops[static_cast<std::size_t>(Op::kLaunchKernel)].handler_ns == 5 * kUs);
  CHECK(sut.records() == 3);
  CHECK(sut.handler_ns() == 6 * kUs);
  CHECK(sut.delay_samples() == 2);
  CHECK(sut.delay[SessionStats::delay_bucket(500)] == 1);
  CHECK(sut.delay[1] == 1);  // 40 ns
}

TEST_CASE("percentiles come from the histogram, interpolated inside a bucket", "[server][stats]") {
  SessionStats sut;
  CHECK(sut.delay_percentile_ns(0.5) == 0);
  CHECK(sut.delay_max_ns() == 0);

  // 98 records waited ~1 us ([512, 1024) ns), 2 waited ~1 ms ([524288, 1048576) ns).
  for (int i = 0; i < 98; ++i) sut.record(Op::kLaunchKernel, 100, 800);
  for (int i = 0; i < 2; ++i) sut.record(Op::kLaunchKernel, 100, 1 * kMs);

  const double p50 = sut.delay_percentile_ns(0.50);
  const double p99 = sut.delay_percentile_ns(0.99);
  CHECK(p50 >= 512);
  CHECK(p50 < 1024);
  CHECK(p99 >= 524288);
  CHECK(p99 < 1048576);
  CHECK(p50 < p99);
  CHECK(sut.delay_max_ns() == 1048576);
  CHECK(sut.delay_percentile_ns(1.0) == Approx(1048576));
}

TEST_CASE("top orders opcodes by server time, then by count", "[server][stats]") {
  SessionStats sut;
  sut.record(Op::kPing, 1 * kUs, kNoDelay);
  sut.record(Op::kStreamSynchronize, 900 * kUs, kNoDelay);
  for (int i = 0; i < 10; ++i) sut.record(Op::kLaunchKernel, 100 * kUs, kNoDelay);
  sut.record(Op::kMemAlloc, 5 * kUs, kNoDelay);
  sut.record(Op::kEventRecord, 5 * kUs, kNoDelay);
  sut.record(Op::kEventRecord, 0, kNoDelay);

  auto top = sut.top(4);

  REQUIRE(top.size() == 4);
  CHECK(top[0].op == Op::kLaunchKernel);
  CHECK(top[0].figures.count == 10);
  CHECK(top[0].figures.handler_ns == 1000 * kUs);
  CHECK(top[1].op == Op::kStreamSynchronize);
  CHECK(top[2].op == Op::kEventRecord);  // 5 us like MemAlloc, but two records
  CHECK(top[3].op == Op::kMemAlloc);
  CHECK(sut.top(10).size() == 5);
}

TEST_CASE("heap growth lists the opcodes that grew the heap most, largest first",
          "[server][stats]") {
  SessionStats stats;
  CHECK(format_heap_growth(stats, 8).empty());
  stats.record(Op::kImageLoad, 1, kNoDelay);
  stats.record(Op::kImageLoad, 1, kNoDelay);
  stats.record(Op::kLibraryGetKernel, 1, kNoDelay);
  stats.record(Op::kMemFree, 1, kNoDelay);
  stats.record(Op::kStreamCreate, 1, kNoDelay);
  stats.heap_growth[static_cast<std::size_t>(Op::kImageLoad)] = 3 << 20;
  stats.heap_growth[static_cast<std::size_t>(Op::kLibraryGetKernel)] = 5 << 20;
  stats.heap_growth[static_cast<std::size_t>(Op::kMemFree)] = -(1 << 20);  // shrank: not listed
  stats.heap_growth[static_cast<std::size_t>(Op::kStreamCreate)] = 1 << 19;
  CHECK(format_heap_growth(stats, 8) ==
        "LibraryGetKernel +5.0 MiB (1), ImageLoad +3.0 MiB (2), StreamCreate +0.5 MiB (1)");
  CHECK(format_heap_growth(stats, 1) == "LibraryGetKernel +5.0 MiB (1)");
}

TEST_CASE("record counts list the opcodes with the most records, most first", "[server][stats]") {
  SessionStats stats;
  CHECK(format_record_counts(stats, 8).empty());
  for (int i = 0; i < 3; ++i) stats.record(Op::kImageLoad, 1, kNoDelay);
  for (int i = 0; i < 5; ++i) stats.record(Op::kLibraryGetKernel, 1, kNoDelay);
  stats.record(Op::kMemFree, 1, kNoDelay);
  CHECK(format_record_counts(stats, 8) == "LibraryGetKernel 5, ImageLoad 3, MemFree 1");
  CHECK(format_record_counts(stats, 2) == "LibraryGetKernel 5, ImageLoad 3");
}

TEST_CASE("a session's stats line names the client and its figures", "[server][stats]") {
  Gpu gpu{};
  GreenContextPool pool(gpu, 0);
  IpcRegistry ipc(gpu.ordinal);
  Session sut(gpu, pool, ipc, ClientInfo{3, 4123, 1000, 1000, "my program"});
  for (int i = 0; i < 20; ++i) sut.stats.record(Op::kLaunchKernel, 2500, 800);
  sut.stats.record(Op::kStreamSynchronize, 7 * kMs, 800);
  sut.stats.record(Op::kPing, 1500, kNoDelay);
  sut.stats.batches = 2;
  sut.stats.batched = 17;

  std::string line = format_session_stats(sut);

  CHECK(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);
  auto fields = fields_of(line);
  CHECK(fields["client"] == "3");
  CHECK(fields["pid"] == "4123");
  CHECK(fields["uid"] == "1000");
  CHECK(fields["program"] == "my_program");
  CHECK(fields["records"] == "22");
  CHECK(fields["server_us"] == "7051");
  CHECK(fields["delay_samples"] == "21");
  CHECK(fields["delay_p50_us"] == "0.8");  // 512 + 512 * 10.5 / 21 = 768 ns
  CHECK(fields["delay_max_us"] == "1.0");
  CHECK(fields["top"] == "StreamSynchronize:1:7000,LaunchKernel:20:50,Ping:1:1");
  CHECK(fields["batches"] == "2");
  CHECK(fields["batched"] == "17");
}

TEST_CASE("a session without records or stamps shows dashes", "[server][stats]") {
  Gpu gpu{};
  GreenContextPool pool(gpu, 0);
  IpcRegistry ipc(gpu.ordinal);
  Session sut(gpu, pool, ipc, ClientInfo{1, 77, 0, 0, "old"});

  auto empty = fields_of(format_session_stats(sut));
  CHECK(empty["records"] == "0");
  CHECK(empty["top"] == "-");
  CHECK(empty["delay_p50_us"] == "-");

  sut.stats.record(Op::kPing, 1000, kNoDelay);  // a client older than ABI 1.2
  auto unstamped = fields_of(format_session_stats(sut));
  CHECK(unstamped["records"] == "1");
  CHECK(unstamped["delay_samples"] == "0");
  CHECK(unstamped["delay_p99_us"] == "-");
}

TEST_CASE("the delay is read from the stamp across its wrap", "[server][stats]") {
  const std::uint64_t sent = (std::uint64_t{0xffffffff} << proto::kSendStampShift) + 3;
  const std::uint32_t stamp = proto::send_stamp_of(sent);
  const std::uint64_t later = sent + 10 * kUs;  // the 32-bit stamp wrapped in between

  CHECK(stamp == 0xffffffffu);
  CHECK(SessionStats::delay_ns(stamp, later) >= 10 * kUs - 32);
  CHECK(SessionStats::delay_ns(stamp, later) <= 10 * kUs + 32);
  CHECK(SessionStats::delay_ns(0, later) == kNoDelay);
  CHECK(proto::send_stamp_of(std::uint64_t{1} << 37) == 1);  // 0 means "not stamped"
}

TEST_CASE("the server accounts every record a client sends to its session", "[server][stats]") {
  constexpr int kPings = 25;
  Harness h;
  TestClient client(h);
  Session* sut = h.server->find_session(client.welcome().client_id);
  REQUIRE(sut != nullptr);
  const std::uint64_t before = sut->stats.records();

  for (int i = 0; i < kPings; ++i) REQUIRE(client.call_empty(Op::kPing).result == CUDA_SUCCESS);

  const auto& ping = sut->stats.ops[static_cast<std::size_t>(Op::kPing)];
  CHECK(ping.count == kPings);
  CHECK(sut->stats.records() == before + kPings);
  CHECK(sut->stats.handler_ns() >= ping.handler_ns);
  // The harness stamps its records as libshim does: every one is a delay sample, and the
  // server ran each within the two seconds pump_until allows.
  CHECK(sut->stats.delay_samples() == sut->stats.records());
  CHECK(sut->stats.delay_max_ns() > 0);
  CHECK(sut->stats.delay_max_ns() <= SessionStats::bucket_upper_ns(26));
  auto fields = fields_of(format_session_stats(*sut));
  CHECK(fields["pid"] == "4123");
  CHECK(fields["program"] == "vector_add");
  CHECK(fields["top"].find(fmt::format("Ping:{}:", kPings)) != std::string::npos);
}

}  // namespace
}  // namespace mpsshim::server::test
