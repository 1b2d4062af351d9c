#include "broker/daemon/client_table.hpp"

#include <fmt/format.h>
#include <pwd.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include "broker/daemon/sizes.hpp"

namespace mpsshim::daemon {

namespace {

using Fields = ClientFields;

Fields parse_fields(const std::string& line) {
  Fields fields;
  std::istringstream in(line);
  for (std::string token; in >> token;) {
    std::size_t equals = token.find('=');
    if (equals == std::string::npos || equals == 0) continue;
    fields.emplace(token.substr(0, equals), token.substr(equals + 1));
  }
  return fields;
}

std::string field(const Fields& fields, std::string_view key) {
  auto it = fields.find(key);
  return it == fields.end() || it->second.empty() ? "-" : it->second;
}

std::string user_name(const std::string& uid_text) {
  uid_t uid = 0;
  auto [end, error] = std::from_chars(uid_text.data(), uid_text.data() + uid_text.size(), uid);
  if (error != std::errc{} || end != uid_text.data() + uid_text.size()) return uid_text;
  passwd entry{};
  passwd* found = nullptr;
  char buffer[1024];
  if (::getpwuid_r(uid, &entry, buffer, sizeof buffer, &found) == 0 && found != nullptr) {
    return found->pw_name;
  }
  return uid_text;
}

// Bytes for people ("1.0 MiB"); 0 as a limit means none.
std::string bytes_field(const Fields& fields, std::string_view key, bool zero_is_none) {
  std::string text = field(fields, key);
  std::uint64_t bytes = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), bytes);
  if (error != std::errc{} || end != text.data() + text.size()) return text;
  if (bytes == 0 && zero_is_none) return "none";
  return format_size_approx(bytes);
}

// The SMs a client runs on; "116/132" while it leaves some of its share (132) to
// normal-priority clients (sms_held_back=, broker/server/scheduling/priority_reserve.hpp).
std::string sms_field(const Fields& fields) {
  const std::string sms = field(fields, "sms");
  unsigned runs_on = 0, held_back = 0;
  const std::string held = field(fields, "sms_held_back");
  auto [a, a_error] = std::from_chars(sms.data(), sms.data() + sms.size(), runs_on);
  auto [b, b_error] = std::from_chars(held.data(), held.data() + held.size(), held_back);
  if (a_error != std::errc{} || b_error != std::errc{} || held_back == 0) return sms;
  return fmt::format("{}/{}", runs_on, runs_on + held_back);
}

std::optional<double> parse_number(std::string_view text) {
  double value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{} || end != text.data() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

// Microseconds for people: 0.4us, 812us, 51.2ms, 1.25s.
std::string format_us(double us) {
  if (us < 10) return fmt::format("{:.1f}us", us);
  if (us < 1000) return fmt::format("{:.0f}us", us);
  if (us < 1e6) return fmt::format("{:.1f}ms", us / 1e3);
  return fmt::format("{:.2f}s", us / 1e6);
}

std::string duration_field(const Fields& fields, std::string_view key) {
  std::string text = field(fields, key);
  auto us = parse_number(text);
  return us ? format_us(*us) : text;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::istringstream in(text);
  for (std::string part; std::getline(in, part, separator);) parts.push_back(part);
  return parts;
}

struct TopEntry {
  std::string op;
  std::optional<double> count;
  std::optional<double> server_us;
};

// "LaunchKernel:20000:51234,StreamSynchronize:12:3100"
std::vector<TopEntry> parse_top(const std::string& text) {
  std::vector<TopEntry> entries;
  if (text == "-") return entries;
  for (const std::string& item : split(text, ',')) {
    std::vector<std::string> parts = split(item, ':');
    TopEntry entry{parts.empty() ? item : parts[0], std::nullopt, std::nullopt};
    if (parts.size() == 3) {
      entry.count = parse_number(parts[1]);
      entry.server_us = parse_number(parts[2]);
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::string top_field(const Fields& fields) {
  std::string text = field(fields, "top");
  std::vector<TopEntry> entries = parse_top(text);
  if (entries.empty()) return text;
  std::string out;
  for (const TopEntry& entry : entries) {
    if (!out.empty()) out += ',';
    out += entry.op;
    if (entry.count && entry.server_us) {
      out += fmt::format(":{:.0f}:{}", *entry.count, format_us(*entry.server_us));
    }
  }
  return out;
}

// A figure as JSON: an integer when it is one, else a number, else null (missing or not a
// number).
nlohmann::json json_number(const Fields& fields, std::string_view key) {
  auto it = fields.find(key);
  if (it == fields.end()) return nullptr;
  const std::string& text = it->second;
  std::uint64_t whole = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), whole);
  if (!text.empty() && error == std::errc{} && end == text.data() + text.size()) return whole;
  if (auto value = parse_number(text)) return *value;
  return nullptr;
}

// Who a server's line is about: the keys `ps --json` and `stats --json` share.
nlohmann::json client_identity(int gpu, const Fields& fields) {
  return {{"gpu", gpu},
          {"client", json_number(fields, "client")},
          {"pid", json_number(fields, "pid")},
          {"uid", json_number(fields, "uid")},
          {"user", user_name(field(fields, "uid"))},
          {"program", field(fields, "program")}};
}

// A word as JSON: the text, or null when the server (or the daemon) did not give it.
nlohmann::json json_string(const Fields& fields, std::string_view key) {
  auto it = fields.find(key);
  if (it == fields.end() || it->second.empty()) return nullptr;
  return it->second;
}

nlohmann::json json_optional(std::optional<double> value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

// The lines that are not clients, then the notes, as a JSON array.
nlohmann::json notes_json(std::vector<std::string> other_lines, const std::string& notes) {
  for (const std::string& line : split(notes, '\n')) {
    if (!line.empty()) other_lines.push_back(line);
  }
  return other_lines;
}

// Unix seconds for people: "2026-11-21T10:20:49" in local time.
std::string start_time_field(const Fields& fields) {
  auto seconds = parse_number(field(fields, "start_time"));
  if (!seconds) return "-";
  std::time_t t = static_cast<std::time_t>(*seconds);
  std::tm local{};
  if (::localtime_r(&t, &local) == nullptr) return "-";
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &local);
  return text;
}

// Calls `client(gpu, fields)` for every client line of the servers' answers and `note(gpu, line)`
// for every other non-blank line (a line without pid=).
template <typename OnClient, typename OnNote>
void for_each_line(const std::vector<ServerClients>& servers, OnClient client, OnNote note) {
  for (const ServerClients& server : servers) {
    std::istringstream lines(server.text);
    for (std::string line; std::getline(lines, line);) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      Fields fields = parse_fields(line);
      if (fields.contains("pid")) {
        client(server.gpu, fields);
      } else {
        note(server.gpu, line);
      }
    }
  }
}

}  // namespace

void for_each_client(const std::vector<ServerClients>& servers,
                     const std::function<void(int gpu, const ClientFields& fields)>& client) {
  for_each_line(servers, client, [](int, const std::string&) {});
}

std::string user_name_of(const std::string& uid_text) {
  return user_name(uid_text);
}

std::string with_isolation_group(const std::string& text, const std::string& group) {
  if (group.empty()) return text;
  std::string out;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    out.append(text, start, end - start);
    if (text.compare(start, 7, "client=") == 0) out += " isolation_group=" + group;
    out += '\n';
    start = end + 1;
  }
  return out;
}

std::string format_client_table(
    const std::vector<ServerClients>& servers,
    const std::function<std::string(const std::string&)>& allocation_name) {
  constexpr std::string_view kRow =
      "{:<9}{:<12}{:<5}{:<9}{:<12}{:<12}{:<12}{:<12}{:<12}{:<10}{:<10}{:<12}{:<12}{:<12}{:<6}"
      "{:<11}{:<21}{:<17}{:<16}{}\n";
  std::string table = fmt::format(kRow, "PID", "USER", "GPU", "SMS", "MEMORY", "PEAK", "LIMIT",
                                  "PINNED", "PARKED", "LAUNCHES", "BUSY", "H2D", "D2H", "D2D",
                                  "PRIO", "STATE", "STARTED", "PROGRAM", "ALLOCATION", "ISOLATION");
  auto allocation = [&](const Fields& fields) -> std::string {
    std::string id = field(fields, "allocation");
    if (id == "-" || id == "0") return "-";
    return allocation_name ? allocation_name(id) : id;
  };
  // Clients of the shared servers show "shared", those of an isolation group its name.
  auto isolation = [](const Fields& fields) -> std::string {
    std::string group = field(fields, "isolation_group");
    return group == "-" ? "shared" : group;
  };
  std::string notes;
  for_each_line(
      servers,
      [&](int gpu, const Fields& fields) {
        table += fmt::format(
            kRow, field(fields, "pid"), user_name(field(fields, "uid")), gpu, sms_field(fields),
            bytes_field(fields, "mem_used", false), bytes_field(fields, "mem_peak", false),
            bytes_field(fields, "mem_limit", true), bytes_field(fields, "pinned", false),
            bytes_field(fields, "parked", false), field(fields, "launches"),
            duration_field(fields, "busy_us"), bytes_field(fields, "h2d_bytes", false),
            bytes_field(fields, "d2h_bytes", false), bytes_field(fields, "d2d_bytes", false),
            field(fields, "priority"), field(fields, "state"), start_time_field(fields),
            field(fields, "program"), allocation(fields), isolation(fields));
      },
      [&](int gpu, const std::string& line) { notes += fmt::format("GPU {}: {}\n", gpu, line); });
  return table + notes;
}

nlohmann::json client_table_json(const std::vector<ServerClients>& servers,
                                 const std::string& notes) {
  nlohmann::json clients = nlohmann::json::array();
  std::vector<std::string> other_lines;
  for_each_line(
      servers,
      [&](int gpu, const Fields& fields) {
        nlohmann::json limit = json_number(fields, "mem_limit");
        if (limit == 0) limit = nullptr;  // no limit
        nlohmann::json allocation = json_number(fields, "allocation");
        if (allocation == 0) allocation = nullptr;  // not a pod's client
        nlohmann::json partition = json_number(fields, "partition");
        if (partition == 0) partition = nullptr;  // not pinned to a static SM partition
        nlohmann::json entry = client_identity(gpu, fields);
        entry.update({
            {"state", field(fields, "state")},
            {"start_time", json_number(fields, "start_time")},
            {"sms", json_number(fields, "sms")},
            {"sm_percentage", json_number(fields, "sm_percentage")},
            {"sms_held_back", json_number(fields, "sms_held_back")},
            {"priority", json_number(fields, "priority")},
            {"memory_used_bytes", json_number(fields, "mem_used")},
            {"memory_peak_bytes", json_number(fields, "mem_peak")},
            {"memory_limit_bytes", limit},
            {"pinned_host_bytes", json_number(fields, "pinned")},
            {"parked_bytes", json_number(fields, "parked")},
            {"suspended_us", json_number(fields, "suspended_us")},
            {"launches", json_number(fields, "launches")},
            {"busy_us", json_number(fields, "busy_us")},
            {"copied_bytes",
             {{"h2d", json_number(fields, "h2d_bytes")},
              {"d2h", json_number(fields, "d2h_bytes")},
              {"d2d", json_number(fields, "d2d_bytes")}}},
            {"worker", json_number(fields, "worker")},
            {"allocation", allocation},
            {"namespace", json_string(fields, "namespace")},
            {"pod", json_string(fields, "pod")},
            {"partition", partition},
            {"priority_held_us", json_number(fields, "held_us")},
            {"isolation_group",
             field(fields, "isolation_group") == "-" ? "shared" : field(fields, "isolation_group")},
        });
        clients.push_back(std::move(entry));
      },
      [&](int gpu, const std::string& line) {
        other_lines.push_back(fmt::format("GPU {}: {}", gpu, line));
      });
  return {{"clients", std::move(clients)}, {"notes", notes_json(std::move(other_lines), notes)}};
}

// Launches that went out in graph launches, and their mean number per graph launch:
// "19200/64.0"; "0" when none did; "-" from a server that does not say.
std::string batched_field(const Fields& fields) {
  auto batched = parse_number(field(fields, "batched"));
  auto batches = parse_number(field(fields, "batches"));
  if (!batched || !batches) return "-";
  if (*batches == 0) return "0";
  return fmt::format("{}/{:.1f}", *batched, *batched / *batches);
}

// Kernel images the client loaded that it shares with other clients / that it loaded alone:
// "441/3"; "-" from a server that does not say.
std::string images_field(const Fields& fields) {
  auto shared = parse_number(field(fields, "images_shared"));
  auto own = parse_number(field(fields, "images_private"));
  if (!shared || !own) return "-";
  return fmt::format("{}/{}", *shared, *own);
}

std::string format_stats_table(const std::vector<ServerClients>& servers) {
  constexpr std::string_view kRow =
      "{:<9}{:<12}{:<5}{:<11}{:<10}{:<11}{:<11}{:<11}{:<14}{:<11}{:<11}{:<17}{}\n";
  std::string table =
      fmt::format(kRow, "PID", "USER", "GPU", "RECORDS", "SERVER", "DELAY_P50", "DELAY_P99",
                  "DELAY_MAX", "BATCHED", "IMAGES", "PRIVATE", "PROGRAM", "TOP");
  std::string notes;
  for_each_line(
      servers,
      [&](int gpu, const Fields& fields) {
        table += fmt::format(
            kRow, field(fields, "pid"), user_name(field(fields, "uid")), gpu,
            field(fields, "records"), duration_field(fields, "server_us"),
            duration_field(fields, "delay_p50_us"), duration_field(fields, "delay_p99_us"),
            duration_field(fields, "delay_max_us"), batched_field(fields), images_field(fields),
            bytes_field(fields, "images_private_bytes", false), field(fields, "program"),
            top_field(fields));
      },
      [&](int gpu, const std::string& line) { notes += fmt::format("GPU {}: {}\n", gpu, line); });
  return table + notes;
}

nlohmann::json stats_json(const std::vector<ServerClients>& servers, const std::string& notes) {
  nlohmann::json clients = nlohmann::json::array();
  std::vector<std::string> other_lines;
  auto client = [&](int gpu, const Fields& fields) {
    nlohmann::json top = nlohmann::json::array();
    auto it = fields.find("top");
    for (const TopEntry& entry : parse_top(it == fields.end() ? "-" : it->second)) {
      top.push_back({{"op", entry.op},
                     {"count", json_optional(entry.count)},
                     {"server_us", json_optional(entry.server_us)}});
    }
    nlohmann::json entry = client_identity(gpu, fields);
    entry.update({
        {"records", json_number(fields, "records")},
        {"server_us", json_number(fields, "server_us")},
        {"delay_samples", json_number(fields, "delay_samples")},
        {"delay_p50_us", json_number(fields, "delay_p50_us")},
        {"delay_p99_us", json_number(fields, "delay_p99_us")},
        {"delay_max_us", json_number(fields, "delay_max_us")},
        {"worker", json_number(fields, "worker")},
        {"batches", json_number(fields, "batches")},
        {"batched", json_number(fields, "batched")},
        {"fence_watches", json_number(fields, "fence_watches")},
        {"watch_wakes", json_number(fields, "watch_wakes")},
        {"dozes", json_number(fields, "dozes")},
        {"images_shared", json_number(fields, "images_shared")},
        {"images_shared_bytes", json_number(fields, "images_shared_bytes")},
        {"images_private", json_number(fields, "images_private")},
        {"images_private_bytes", json_number(fields, "images_private_bytes")},
        {"top", std::move(top)},
    });
    clients.push_back(std::move(entry));
  };
  for_each_line(servers, client, [&](int gpu, const std::string& line) {
    other_lines.push_back(fmt::format("GPU {}: {}", gpu, line));
  });
  return {{"clients", std::move(clients)}, {"notes", notes_json(std::move(other_lines), notes)}};
}

}  // namespace mpsshim::daemon
