#include "broker/daemon/client_view.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

namespace mpsshim::daemon {

namespace {

std::optional<double> number(const ClientFields& fields, std::string_view key) {
  auto it = fields.find(key);
  if (it == fields.end()) return std::nullopt;
  double value = 0;
  const std::string& text = it->second;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::string text(const ClientFields& fields, std::string_view key) {
  auto it = fields.find(key);
  return it == fields.end() ? std::string() : it->second;
}

// The inode of /proc/<pid>/ns/pid: equal for two processes in one pid namespace.
std::optional<ino_t> pid_namespace(const std::string& pid) {
  struct stat st {};
  if (::stat(("/proc/" + pid + "/ns/pid").c_str(), &st) != 0) return std::nullopt;
  return st.st_ino;
}

// The last number of the "NSpid:" line of /proc/<pid>/status: its pid in its own namespace.
std::optional<long> innermost_pid(long pid) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(status, line);) {
    if (!line.starts_with("NSpid:")) continue;
    std::istringstream words(line.substr(6));
    long last = -1;
    for (long value; words >> value;) last = value;
    if (last > 0) return last;
  }
  return std::nullopt;
}

}  // namespace

std::string cgroup_identity(long pid) {
  std::ifstream file(fmt::format("/proc/{}/cgroup", pid));
  std::string all;
  for (std::string line; std::getline(file, line);) {
    if (line.starts_with("0::")) return line.substr(3);
    // "4:memory:/kubepods/..." -> "memory:/kubepods/..." (the hierarchy numbers are the host's).
    auto colon = line.find(':');
    all += (all.empty() ? "" : ";") + (colon == std::string::npos ? line : line.substr(colon + 1));
  }
  return all;
}

bool BusySampler::needs_reading(const std::vector<ServerClients>& ps, Clock::time_point now) const {
  bool needed = false;
  for_each_client(ps, [&](int gpu, const ClientFields& fields) {
    if (!number(fields, "busy_us")) return;  // mpsshimd --busy-time off
    auto it = readings_.find(gpu);
    if (it == readings_.end() || now - it->second.at > kMaxWindow) needed = true;
  });
  return needed;
}

std::string BusySampler::key(int gpu, const ClientFields& fields) {
  return fmt::format("{}/{}/{}", gpu, text(fields, "isolation_group"), text(fields, "client"));
}

BusySampler::Deltas BusySampler::take(const std::vector<ServerClients>& ps, Clock::time_point now) {
  std::map<int, GpuReadings> fresh;
  for_each_client(ps, [&](int gpu, const ClientFields& fields) {
    GpuReadings& readings = fresh[gpu];
    readings.at = now;
    if (auto busy = number(fields, "busy_us")) readings.busy_us[key(gpu, fields)] = *busy;
  });
  Deltas deltas;
  for (auto& [gpu, readings] : fresh) {
    auto before = readings_.find(gpu);
    const bool usable = before != readings_.end() && now - before->second.at <= kMaxWindow;
    if (usable) {
      deltas.window[gpu] = now - before->second.at;
      for (const auto& [client, busy] : readings.busy_us) {
        // A client that came after the last reading counts from its start, which lies inside
        // the window.
        auto old = before->second.busy_us.find(client);
        double since = old == before->second.busy_us.end() ? busy : busy - old->second;
        deltas.busy_us[client] = std::max(0.0, since);
      }
      if (now - before->second.at < kMinWindow) continue;  // keep the older readings
    }
    readings_[gpu] = std::move(readings);
  }
  return deltas;
}

nlohmann::json build_client_view(const ViewContext& context, const std::vector<ServerClients>& ps,
                                 const BusySampler::Deltas& deltas) {
  struct Held {
    std::uint64_t used = 0;
    unsigned sms = 0;
    double busy_us = 0;
    bool busy_known = false;
    nlohmann::json processes = nlohmann::json::array();
  };
  std::map<int, Held> held;
  const bool by_allocation = context.scope.allocation_id != 0;
  for_each_client(ps, [&](int gpu, const ClientFields& fields) {
    auto pid = number(fields, "pid");
    if (!pid) return;
    const long client_pid = static_cast<long>(*pid);
    if (by_allocation) {
      if (number(fields, "allocation").value_or(0) != context.scope.allocation_id) return;
    } else if (context.scope.cgroup.empty() ||
               context.cgroup_of(client_pid) != context.scope.cgroup) {
      return;
    }
    Held& h = held[gpu];
    const auto used = static_cast<std::uint64_t>(number(fields, "mem_used").value_or(0));
    h.used += used;
    h.sms = std::max(h.sms, static_cast<unsigned>(number(fields, "sms").value_or(0)));
    if (auto busy = deltas.busy_us.find(BusySampler::key(gpu, fields));
        busy != deltas.busy_us.end()) {
      h.busy_us += busy->second;
      h.busy_known = true;
    }
    if (text(fields, "state") == "draining") return;  // gone; its memory is still held
    if (auto shown = context.visible_pid(client_pid)) {
      h.processes.push_back(
          {{"pid", *shown}, {"memory_used_bytes", used}, {"program", text(fields, "program")}});
    }
  });
  nlohmann::json gpus = nlohmann::json::array();
  for (const ViewGpu& gpu : context.gpus) {
    auto found = held.find(gpu.gpu);
    const bool has_clients = found != held.end();
    const Held h = has_clients ? found->second : Held{};
    nlohmann::json entry{
        {"uuid", gpu.uuid},
        {"gpu", gpu.gpu},
        {"ordinal", gpu.ordinal},
        {"memory_total_bytes", gpu.total_memory},
        {"memory_limit_bytes",
         gpu.memory_limit == 0 ? nlohmann::json() : nlohmann::json(gpu.memory_limit)},
        {"memory_used_bytes", h.used},
        {"processes", h.processes},
    };
    // The scope's clients' SMs; before it has any, what its quota would give one.
    unsigned sms = h.sms;
    if (sms == 0) sms = static_cast<unsigned>((gpu.sms * gpu.sm_percentage + 99) / 100);
    entry["sms"] = std::min(sms, gpu.sms);
    auto window = deltas.window.find(gpu.gpu);
    if (!has_clients) {
      entry["busy_percent"] = 0.0;  // nothing of the scope runs there
    } else if (window != deltas.window.end() && h.busy_known && window->second.count() > 0) {
      const double window_us = std::chrono::duration<double, std::micro>(window->second).count();
      // Busy time is summed over a client's streams: two busy streams count twice.
      entry["busy_percent"] = std::min(100.0, 100.0 * h.busy_us / window_us);
    } else {
      entry["busy_percent"] = nullptr;  // not measured (mpsshimd --busy-time off)
    }
    gpus.push_back(std::move(entry));
  }
  std::string scope = by_allocation ? fmt::format("allocation {} ({})", context.scope.allocation_id,
                                                  context.scope.pod)
                                    : fmt::format("cgroup {}", context.scope.cgroup);
  return nlohmann::json{{"scope", scope}, {"gpus", std::move(gpus)}};
}

std::optional<long> pid_seen_by(long pid, long requester) {
  auto client_ns = pid_namespace(std::to_string(pid));
  auto requester_ns = pid_namespace(std::to_string(requester));
  if (!client_ns || !requester_ns) return std::nullopt;
  if (*client_ns == *requester_ns) return innermost_pid(pid);
  if (*requester_ns == pid_namespace("self")) return pid;
  return std::nullopt;
}

}  // namespace mpsshim::daemon
