#include "broker/daemon/sm_partitions.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace mpsshim::daemon {
namespace {

// "groups 0-1 and 5-14 (96 SMs)", or "none".
std::string describe_free(const std::vector<bool>& used, unsigned granularity) {
  std::string text;
  unsigned free_groups = 0;
  for (unsigned g = 0; g < used.size();) {
    if (used[g]) {
      ++g;
      continue;
    }
    unsigned end = g;
    while (end < used.size() && !used[end]) ++end;
    text += fmt::format("{}{}-{}", text.empty() ? "" : ", ", g, end - 1);
    free_groups += end - g;
    g = end;
  }
  if (text.empty()) return "none";
  return fmt::format("groups {} ({} SMs)", text, free_groups * granularity);
}

}  // namespace

tl::expected<SmPartition, std::string> SmPartitionTable::add(int gpu, unsigned sms,
                                                             SmGroups split) {
  const unsigned granularity = std::max(split.granularity, 1u);
  if (sms == 0) return tl::unexpected(std::string("a partition needs at least one SM"));
  const unsigned wanted = (sms + granularity - 1) / granularity;
  if (wanted > split.count) {
    return tl::unexpected(
        fmt::format("GPU {} splits into {} groups of {} SMs ({} SMs in all); {} SMs do not fit",
                    gpu, split.count, granularity, split.count * granularity, sms));
  }
  std::vector<bool> used(split.count, false);
  for (const SmPartition& p : partitions_) {
    if (p.gpu != gpu) continue;
    for (unsigned g = p.first_group; g < p.first_group + p.groups && g < split.count; ++g)
      used[g] = true;
  }
  for (unsigned first = 0; first + wanted <= split.count; ++first) {
    if (std::any_of(used.begin() + first, used.begin() + first + wanted, [](bool u) { return u; }))
      continue;
    SmPartition partition{next_id_++, gpu, first, wanted, granularity};
    partitions_.push_back(partition);
    return partition;
  }
  return tl::unexpected(fmt::format(
      "{} SMs ({} groups of {}) overlap the partitions of GPU {}; free: {} (mpsshimctl lspart; "
      "remove one with mpsshimctl sm_partition rm <id>)",
      sms, wanted, granularity, gpu, describe_free(used, granularity)));
}

bool SmPartitionTable::remove(std::uint32_t id) {
  return std::erase_if(partitions_, [id](const SmPartition& p) { return p.id == id; }) != 0;
}

const SmPartition* SmPartitionTable::find(std::uint32_t id) const {
  for (const SmPartition& p : partitions_) {
    if (p.id == id) return &p;
  }
  return nullptr;
}

}  // namespace mpsshim::daemon
