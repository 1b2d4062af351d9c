#include "broker/server/accounting/heap_profile.hpp"

#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "broker/server/accounting/session_stats.hpp"
#include "broker/server/ops/dispatch.hpp"

namespace mpsshim::server {

bool heap_profile_on() {
  static const bool on = [] {
    const char* value = std::getenv("MPSSHIM_SERVER_HEAP_PROFILE");
    return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
  }();
  return on;
}

std::int64_t heap_in_use_bytes() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<std::int64_t>(info.uordblks + info.hblkhd);
}

std::string format_heap_growth(const SessionStats& stats, std::size_t n) {
  std::vector<std::size_t> grew;
  for (std::size_t op = 0; op < SessionStats::kOpCount; ++op) {
    if (stats.heap_growth[op] > 0) grew.push_back(op);
  }
  std::sort(grew.begin(), grew.end(), [&](std::size_t a, std::size_t b) {
    return stats.heap_growth[a] > stats.heap_growth[b];
  });
  std::string out;
  for (std::size_t i = 0; i < grew.size() && i < n; ++i) {
    const std::size_t op = grew[i];
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {:+.1f} MiB ({})", op_name(static_cast<proto::Op>(op)),
                       static_cast<double>(stats.heap_growth[op]) / (1024.0 * 1024.0),
                       stats.ops[op].count);
  }
  return out;
}

std::string format_record_counts(const SessionStats& stats, std::size_t n) {
  std::vector<std::size_t> used;
  for (std::size_t op = 0; op < SessionStats::kOpCount; ++op) {
    if (stats.ops[op].count > 0) used.push_back(op);
  }
  std::stable_sort(used.begin(), used.end(), [&](std::size_t a, std::size_t b) {
    return stats.ops[a].count > stats.ops[b].count;
  });
  std::string out;
  for (std::size_t i = 0; i < used.size() && i < n; ++i) {
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", op_name(static_cast<proto::Op>(used[i])), stats.ops[used[i]].count);
  }
  return out;
}

}  // namespace mpsshim::server
