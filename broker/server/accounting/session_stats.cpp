#include "broker/server/accounting/session_stats.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "broker/server/ops/dispatch.hpp"
#include "broker/server/session/session.hpp"

namespace mpsshim::server {
namespace {

constexpr std::uint64_t kStampUnitNs = 32;
// The stamp wraps after 2^32 units: no measured delay is longer.
constexpr std::uint64_t kLongestDelayNs = kStampUnitNs << 32;
constexpr std::size_t kTopOps = 4;

std::string one_word(const std::string& name) {
  std::string out = name.empty() ? std::string("-") : name;
  std::replace_if(
      out.begin(), out.end(), [](unsigned char c) { return std::isspace(c) != 0; }, '_');
  return out;
}

std::string delay_us(const SessionStats& stats, double ns) {
  if (stats.delay_samples() == 0) return "-";
  return fmt::format("{:.1f}", ns / 1000.0);
}

}  // namespace

std::uint64_t SessionStats::bucket_lower_ns(std::size_t bucket) {
  return bucket == 0 ? 0 : kStampUnitNs << (bucket - 1);
}

std::uint64_t SessionStats::bucket_upper_ns(std::size_t bucket) {
  return bucket >= kOverflowBucket ? kLongestDelayNs : kStampUnitNs << bucket;
}

std::uint64_t SessionStats::records() const {
  std::uint64_t sum = 0;
  for (const PerOp& op : ops) sum += op.count;
  return sum;
}

std::uint64_t SessionStats::handler_ns() const {
  std::uint64_t sum = 0;
  for (const PerOp& op : ops) sum += op.handler_ns;
  return sum;
}

std::uint64_t SessionStats::delay_samples() const {
  std::uint64_t sum = 0;
  for (std::uint64_t n : delay) sum += n;
  return sum;
}

double SessionStats::delay_percentile_ns(double p) const {
  const std::uint64_t total = delay_samples();
  if (total == 0) return 0;
  const double rank = std::clamp(p, 0.0, 1.0) * static_cast<double>(total);
  std::uint64_t below = 0;
  for (std::size_t b = 0; b < kDelayBuckets; ++b) {
    if (delay[b] == 0) continue;
    if (static_cast<double>(below + delay[b]) >= rank) {
      const double lower = static_cast<double>(bucket_lower_ns(b));
      const double upper = static_cast<double>(bucket_upper_ns(b));
      const double inside = std::max(0.0, rank - static_cast<double>(below));
      return lower + (upper - lower) * inside / static_cast<double>(delay[b]);
    }
    below += delay[b];
  }
  return static_cast<double>(delay_max_ns());
}

std::uint64_t SessionStats::delay_max_ns() const {
  for (std::size_t b = kDelayBuckets; b-- > 0;) {
    if (delay[b] != 0) return bucket_upper_ns(b);
  }
  return 0;
}

std::vector<SessionStats::Top> SessionStats::top(std::size_t n) const {
  std::vector<Top> used;
  for (std::size_t i = 0; i < kOpCount; ++i) {
    if (ops[i].count != 0) used.push_back(Top{static_cast<proto::Op>(i), ops[i]});
  }
  std::sort(used.begin(), used.end(), [](const Top& a, const Top& b) {
    if (a.figures.handler_ns != b.figures.handler_ns) {
      return a.figures.handler_ns > b.figures.handler_ns;
    }
    if (a.figures.count != b.figures.count) return a.figures.count > b.figures.count;
    return a.op < b.op;
  });
  if (used.size() > n) used.resize(n);
  return used;
}

std::string format_session_stats(const Session& session) {
  const SessionStats& stats = session.stats;
  std::string top;
  for (const SessionStats::Top& t : stats.top(kTopOps)) {
    if (!top.empty()) top += ',';
    top += fmt::format("{}:{}:{}", op_name(t.op), t.figures.count, t.figures.handler_ns / 1000);
  }
  return fmt::format(
      "client={} pid={} uid={} program={} records={} server_us={} delay_samples={} "
      "delay_p50_us={} delay_p99_us={} delay_max_us={} batches={} batched={} fence_watches={} "
      "watch_wakes={} dozes={} images_shared={} "
      "images_shared_bytes={} images_private={} images_private_bytes={} top={}\n",
      session.client.id, session.client.pid, session.client.uid, one_word(session.client.program),
      stats.records(), stats.handler_ns() / 1000, stats.delay_samples(),
      delay_us(stats, stats.delay_percentile_ns(0.50)),
      delay_us(stats, stats.delay_percentile_ns(0.99)),
      delay_us(stats, static_cast<double>(stats.delay_max_ns())), stats.batches, stats.batched,
      stats.fence_watches, stats.watch_wakes, stats.dozes, stats.images_shared,
      stats.images_shared_bytes, stats.images_private, stats.images_private_bytes,
      top.empty() ? "-" : top);
}

}  // namespace mpsshim::server
