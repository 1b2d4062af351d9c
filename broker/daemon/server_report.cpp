#include "broker/daemon/server_report.hpp"

#include <fmt/format.h>

#include <cstring>

#include "broker/daemon/sizes.hpp"
#include "broker/daemon/visible_devices.hpp"
#include "broker/daemon/wire.hpp"

namespace mpsshim::daemon {

namespace {

std::string discovery_note(const Supervisor& supervisor) {
  if (supervisor.gpu_count_known()) return "";
  return "(the GPU count is not known yet: it comes from the server for GPU 0)\n";
}

}  // namespace

std::string format_driver_version(int version) {
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

namespace {

// Every server: each GPU's shared one, then the isolation groups' in the order they started.
std::vector<ServerStatus> every_server(const Supervisor& supervisor) {
  std::vector<ServerStatus> all;
  for (int i = 0; i < supervisor.gpu_count(); ++i) all.push_back(supervisor.status(i));
  for (auto& [slot, status] : supervisor.group_servers()) all.push_back(status);
  return all;
}

std::string server_details(const ServerStatus& s) {
  if (s.state == ServerState::kRunning && s.snapshot) return bounded_string(s.snapshot->name);
  return s.problem;
}

}  // namespace

std::string format_server_list(const Supervisor& supervisor) {
  constexpr std::string_view kRow = "{:<5}{:<9}{:<12}{:<10}{:<20}{}\n";
  std::string text = fmt::format(kRow, "GPU", "PID", "STATE", "RESTARTS", "ISOLATION", "DETAILS");
  for (const ServerStatus& s : every_server(supervisor)) {
    std::string pid = s.pid > 0 ? std::to_string(s.pid) : "-";
    text += fmt::format(kRow, s.ordinal, pid, state_name(s.state), s.restarts,
                        s.group.empty() ? "shared" : s.group, server_details(s));
  }
  return text + discovery_note(supervisor);
}

nlohmann::json server_list_json(const Supervisor& supervisor) {
  nlohmann::json servers = nlohmann::json::array();
  for (const ServerStatus& s : every_server(supervisor)) {
    servers.push_back({{"gpu", s.ordinal},
                       {"pid", s.pid > 0 ? nlohmann::json(s.pid) : nlohmann::json(nullptr)},
                       {"state", state_name(s.state)},
                       {"restarts", s.restarts},
                       {"isolation_group", s.group.empty() ? "shared" : s.group},
                       {"details", server_details(s)}});
  }
  return servers;
}

nlohmann::json device_query_json(const Supervisor& supervisor) {
  nlohmann::json gpus = nlohmann::json::array();
  for (int i = 0; i < supervisor.gpu_count(); ++i) {
    const ServerStatus& s = supervisor.status(i);
    nlohmann::json gpu = {
        {"gpu", i},
        {"server_state", state_name(s.state)},
        {"server_pid", s.pid > 0 ? nlohmann::json(s.pid) : nlohmann::json(nullptr)},
        {"name", nullptr},
        {"uuid", nullptr},
        {"memory_bytes", nullptr},
        {"sms", nullptr},
        {"driver_version", nullptr}};
    if (s.snapshot) {
      const proto::DeviceSnapshot& d = *s.snapshot;
      gpu["name"] = bounded_string(d.name);
      gpu["uuid"] = format_gpu_uuid(d.uuid);
      gpu["memory_bytes"] = d.total_memory;
      gpu["sms"] = d.sm_count;
      gpu["driver_version"] = d.driver_version;
    }
    gpus.push_back(std::move(gpu));
  }
  return gpus;
}

nlohmann::json gpu_states_json(const Supervisor& supervisor) {
  nlohmann::json gpus = nlohmann::json::array();
  for (int i = 0; i < supervisor.gpu_count(); ++i) {
    const ServerStatus& s = supervisor.status(i);
    const proto::DeviceSnapshot* d = s.snapshot ? &*s.snapshot : nullptr;
    gpus.push_back({{"gpu", i},
                    {"state", state_name(s.state)},
                    {"restarts", s.restarts},
                    {"uuid", d ? nlohmann::json(format_gpu_uuid(d->uuid)) : nullptr},
                    {"memory_bytes", d ? nlohmann::json(d->total_memory) : nullptr},
                    {"sms", d ? nlohmann::json(d->sm_count) : nullptr},
                    {"name", d ? nlohmann::json(bounded_string(d->name)) : nullptr}});
  }
  return gpus;
}

std::string format_device_query(const Supervisor& supervisor) {
  std::string text;
  for (int i = 0; i < supervisor.gpu_count(); ++i) {
    const ServerStatus& s = supervisor.status(i);
    std::string server =
        fmt::format("{}{}", state_name(s.state), s.pid > 0 ? fmt::format(", pid {}", s.pid) : "");
    if (!s.snapshot) {
      text += fmt::format("GPU {}: no device information yet\n  server:  {}\n", i, server);
      continue;
    }
    const proto::DeviceSnapshot& d = *s.snapshot;
    text += fmt::format(
        "GPU {}: {}\n  UUID:    {}\n  memory:  {} ({} bytes)\n  SMs:     {}\n"
        "  driver:  {} ({})\n  server:  {}\n",
        i, d.name, format_gpu_uuid(d.uuid), format_size_approx(d.total_memory), d.total_memory,
        d.sm_count, format_driver_version(d.driver_version), d.driver_version, server);
  }
  return text + discovery_note(supervisor);
}

std::string format_gpu_states(const Supervisor& supervisor) {
  std::string text;
  for (int i = 0; i < supervisor.gpu_count(); ++i) {
    const ServerStatus& s = supervisor.status(i);
    const proto::DeviceSnapshot* d = s.snapshot ? &*s.snapshot : nullptr;
    text += fmt::format("gpu={} state={} restarts={} uuid={} memory={} sms={} name={}\n", i,
                        state_name(s.state), s.restarts, d ? format_gpu_uuid(d->uuid) : "-",
                        d ? std::to_string(d->total_memory) : "-",
                        d ? std::to_string(d->sm_count) : "-",
                        d ? std::string(d->name, ::strnlen(d->name, sizeof d->name)) : "-");
  }
  return text;
}

}  // namespace mpsshim::daemon
