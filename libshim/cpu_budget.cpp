#include "libshim/cpu_budget.hpp"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace mpsshim::shim {
namespace {

std::string first_line(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

bool parse_long(std::string_view text, long& out) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  return error == std::errc() && end == text.data() + text.size();
}

// The process's cgroup paths from /proc/self/cgroup: v2's ("0::/path") and v1's cpu controller's
// ("4:cpu,cpuacct:/path").
void cgroup_paths(std::string& v2, std::string& v1_cpu) {
  std::ifstream file("/proc/self/cgroup");
  std::string line;
  while (std::getline(file, line)) {
    const auto first = line.find(':');
    const auto second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty()) v2 = path;
    if (controllers == "cpu" || controllers.starts_with("cpu,") ||
        controllers.find(",cpu,") != std::string::npos || controllers.ends_with(",cpu")) {
      v1_cpu = path;
    }
  }
}

// 0 when no quota applies or none can be read. Inside a container the cgroup file system is
// usually the container's own, so the root's files are tried after the path's.
int cgroup_cpu_limit() {
  std::string v2, v1;
  cgroup_paths(v2, v1);
  for (const std::string& dir : {"/sys/fs/cgroup" + v2, std::string("/sys/fs/cgroup")}) {
    const std::string text = first_line(dir + "/cpu.max");
    if (!text.empty()) return cpus_of_cpu_max(text);
  }
  for (const std::string& dir : {"/sys/fs/cgroup/cpu" + v1, "/sys/fs/cgroup/cpu,cpuacct" + v1,
                                 std::string("/sys/fs/cgroup/cpu")}) {
    long quota = 0, period = 0;
    if (parse_long(first_line(dir + "/cpu.cfs_quota_us"), quota) &&
        parse_long(first_line(dir + "/cpu.cfs_period_us"), period)) {
      return cpus_of_cfs_quota(quota, period);
    }
  }
  return 0;
}

}  // namespace

int cpus_of_cfs_quota(long quota_us, long period_us) {
  if (quota_us <= 0 || period_us <= 0) return 0;
  return static_cast<int>((quota_us + period_us - 1) / period_us);
}

int cpus_of_cpu_max(std::string_view cpu_max) {
  const auto space = cpu_max.find(' ');
  if (space == std::string_view::npos) return 0;
  const std::string_view quota = cpu_max.substr(0, space);
  if (quota == "max") return 0;
  long q = 0, period = 0;
  if (!parse_long(quota, q) || !parse_long(cpu_max.substr(space + 1), period)) return 0;
  return cpus_of_cfs_quota(q, period);
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof set, &set) == 0
                 ? CPU_COUNT(&set)
                 : static_cast<int>(std::thread::hardware_concurrency());
  if (const int quota = cgroup_cpu_limit(); quota > 0) cpus = std::min(cpus, quota);
  return std::max(cpus, 1);
}

}  // namespace mpsshim::shim
