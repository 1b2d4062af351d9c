#include "broker/daemon/client_table.hpp"

#include <fmt/format.h>
#include <pwd.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdint>
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

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string json_number(std::optional<double> value) {
  return value ? fmt::format("{}", *value) : "null";
}

std::string json_number_field(const Fields& fields, std::string_view key) {
  auto it = fields.find(key);
  return json_number(it == fields.end() ? std::nullopt : parse_number(it->second));
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

std::string format_client_table(
    const std::vector<ServerClients>& servers,
    const std::function<std::string(const std::string&)>& allocation_name) {
  constexpr std::string_view kRow = "{:<9}{:<12}{:<5}{:<6}{:<12}{:<12}{:<10}{:<10}{:<17}{}\n";
  std::string table = fmt::format(kRow, "PID", "USER", "GPU", "SMS", "MEMORY", "LIMIT", "LAUNCHES",
                                  "STATE", "PROGRAM", "ALLOCATION");
  auto allocation = [&](const Fields& fields) -> std::string {
    std::string id = field(fields, "allocation");
    if (id == "-" || id == "0") return "-";
    return allocation_name ? allocation_name(id) : id;
  };
  std::string notes;
  for_each_line(
      servers,
      [&](int gpu, const Fields& fields) {
        table += fmt::format(kRow, field(fields, "pid"), user_name(field(fields, "uid")), gpu,
                             field(fields, "sms"), bytes_field(fields, "mem_used", false),
                             bytes_field(fields, "mem_limit", true), field(fields, "launches"),
                             field(fields, "state"), field(fields, "program"), allocation(fields));
      },
      [&](int gpu, const std::string& line) { notes += fmt::format("GPU {}: {}\n", gpu, line); });
  return table + notes;
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

std::string format_stats_table(const std::vector<ServerClients>& servers) {
  constexpr std::string_view kRow =
      "{:<9}{:<12}{:<5}{:<11}{:<10}{:<11}{:<11}{:<11}{:<14}{:<17}{}\n";
  std::string table = fmt::format(kRow, "PID", "USER", "GPU", "RECORDS", "SERVER", "DELAY_P50",
                                  "DELAY_P99", "DELAY_MAX", "BATCHED", "PROGRAM", "TOP");
  std::string notes;
  for_each_line(
      servers,
      [&](int gpu, const Fields& fields) {
        table += fmt::format(kRow, field(fields, "pid"), user_name(field(fields, "uid")), gpu,
                             field(fields, "records"), duration_field(fields, "server_us"),
                             duration_field(fields, "delay_p50_us"),
                             duration_field(fields, "delay_p99_us"),
                             duration_field(fields, "delay_max_us"), batched_field(fields),
                             field(fields, "program"), top_field(fields));
      },
      [&](int gpu, const std::string& line) { notes += fmt::format("GPU {}: {}\n", gpu, line); });
  return table + notes;
}

std::string format_stats_json(const std::vector<ServerClients>& servers, const std::string& notes) {
  std::vector<std::string> clients;
  std::vector<std::string> other_lines;
  auto client = [&](int gpu, const Fields& fields) {
    std::vector<std::string> top;
    auto it = fields.find("top");
    for (const TopEntry& entry : parse_top(it == fields.end() ? "-" : it->second)) {
      top.push_back(fmt::format(R"({{"op": {}, "count": {}, "server_us": {}}})",
                                json_string(entry.op), json_number(entry.count),
                                json_number(entry.server_us)));
    }
    std::string uid = field(fields, "uid");
    clients.push_back(fmt::format(
        R"({{"gpu": {}, "client": {}, "pid": {}, "uid": {}, "user": {}, "program": {}, )"
        R"("records": {}, "server_us": {}, "delay_samples": {}, "delay_p50_us": {}, )"
        R"("delay_p99_us": {}, "delay_max_us": {}, "worker": {}, "batches": {}, "batched": {}, )"
        R"("top": [{}]}})",
        gpu, json_number_field(fields, "client"), json_number_field(fields, "pid"),
        json_number_field(fields, "uid"), json_string(user_name(uid)),
        json_string(field(fields, "program")), json_number_field(fields, "records"),
        json_number_field(fields, "server_us"), json_number_field(fields, "delay_samples"),
        json_number_field(fields, "delay_p50_us"), json_number_field(fields, "delay_p99_us"),
        json_number_field(fields, "delay_max_us"), json_number_field(fields, "worker"),
        json_number_field(fields, "batches"), json_number_field(fields, "batched"),
        fmt::join(top, ", ")));
  };
  for_each_line(servers, client, [&](int gpu, const std::string& line) {
    other_lines.push_back(fmt::format("GPU {}: {}", gpu, line));
  });
  for (const std::string& line : split(notes, '\n')) {
    if (!line.empty()) other_lines.push_back(line);
  }
  std::vector<std::string> quoted;
  for (const std::string& line : other_lines) quoted.push_back(json_string(line));
  return fmt::format("{{\"clients\": [{}], \"notes\": [{}]}}\n", fmt::join(clients, ",\n  "),
                     fmt::join(quoted, ", "));
}

}  // namespace mpsshim::daemon
