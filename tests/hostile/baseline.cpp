#include "baseline.hpp"

#include <cstdio>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

namespace mpsshim::hostile_test {
namespace {

using namespace std::chrono_literals;

template <typename Done>
bool wait_until(Done&& done, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

nlohmann::json ctl_json(const e2e::Daemon& daemon, const std::string& command) {
  e2e::Outcome o = daemon.ctl({command, "--json"});
  try {
    return nlohmann::json::parse(o.out);
  } catch (const std::exception&) {
    return nlohmann::json::object();
  }
}

bool no_clients(const e2e::Daemon& daemon) {
  nlohmann::json ps = ctl_json(daemon, "ps");
  return ps.contains("clients") && ps["clients"].empty();
}

}  // namespace

std::map<std::string, std::string> stats_env(const std::string& stats_path) {
  return {{"MPSSHIM_TESTDRIVER_STATS_FILE", stats_path}};
}

pid_t server_pid(const e2e::Daemon& daemon) {
  nlohmann::json list = ctl_json(daemon, "server_list");
  if (!list.contains("servers") || list["servers"].empty()) return 0;
  const auto& pid = list["servers"][0]["pid"];
  return pid.is_number() ? pid.get<pid_t>() : 0;
}

int server_restarts(const e2e::Daemon& daemon) {
  nlohmann::json list = ctl_json(daemon, "server_list");
  if (!list.contains("servers") || list["servers"].empty()) return -1;
  return list["servers"][0]["restarts"].get<int>();
}

DriverStats read_driver_stats(const std::string& stats_path) {
  DriverStats stats;
  FILE* f = std::fopen(stats_path.c_str(), "r");
  if (f == nullptr) return stats;
  if (std::fscanf(f, "live_objects=%ld device_bytes=%lld", &stats.live_objects,
                  &stats.device_bytes) != 2) {
    stats = DriverStats{};
  }
  std::fclose(f);
  return stats;
}

Baseline take_baseline(const e2e::Daemon& daemon, const std::string& stats_path) {
  Baseline b;
  if (!wait_until([&] { return no_clients(daemon); }, 10s)) {
    b.unsettled = "clients were still listed after 10 s";
    return b;
  }
  b.server_pid = server_pid(daemon);
  // Settled: the same figures twice, 200 ms apart.
  const bool settled = wait_until(
      [&] {
        Baseline now{b.server_pid, e2e::open_fd_count(b.server_pid), read_driver_stats(stats_path),
                     ""};
        std::this_thread::sleep_for(200ms);
        Baseline later{b.server_pid, e2e::open_fd_count(b.server_pid),
                       read_driver_stats(stats_path), ""};
        b = later;
        return now.server_fds == later.server_fds && now.driver == later.driver &&
               later.driver.live_objects >= 0;
      },
      10s);
  if (!settled) b.unsettled = "the server's fds and the driver's objects did not settle in 10 s";
  return b;
}

std::string differences_from(const e2e::Daemon& daemon, const std::string& stats_path,
                             const Baseline& baseline) {
  if (!wait_until([&] { return no_clients(daemon); }, 10s)) return "clients are still listed";
  std::string what;
  wait_until(
      [&] {
        std::ostringstream diff;
        const pid_t pid = server_pid(daemon);
        if (pid != baseline.server_pid) {
          diff << "the server is pid " << pid << ", was " << baseline.server_pid << "; ";
        }
        if (int restarts = server_restarts(daemon); restarts != 0) {
          diff << "the server restarted " << restarts << " time(s); ";
        }
        if (int fds = e2e::open_fd_count(baseline.server_pid); fds != baseline.server_fds) {
          diff << "server fds " << fds << ", baseline " << baseline.server_fds << "; ";
        }
        DriverStats now = read_driver_stats(stats_path);
        if (!(now == baseline.driver)) {
          diff << "test driver objects " << now.live_objects << " / device bytes "
               << now.device_bytes << ", baseline " << baseline.driver.live_objects << " / "
               << baseline.driver.device_bytes << "; ";
        }
        what = diff.str();
        return what.empty();
      },
      10s);
  return what;
}

std::string log_line(const e2e::Daemon& daemon, pid_t pid, const std::string& text) {
  const std::string pid_text = "pid " + std::to_string(pid);
  std::string found;
  wait_until(
      [&] {
        std::istringstream lines(daemon.log());
        for (std::string line; std::getline(lines, line);) {
          if (line.find(text) == std::string::npos) continue;
          const auto at = line.find(pid_text);
          // "pid 123" must not be the start of "pid 1234".
          if (at != std::string::npos) {
            const char after =
                at + pid_text.size() < line.size() ? line[at + pid_text.size()] : ' ';
            if (after < '0' || after > '9') {
              found = line;
              return true;
            }
          }
        }
        return false;
      },
      5s);
  return found;
}

}  // namespace mpsshim::hostile_test
