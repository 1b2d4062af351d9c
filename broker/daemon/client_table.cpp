#include "broker/daemon/client_table.hpp"

#include <fmt/format.h>
#include <pwd.h>
#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <map>
#include <sstream>
#include <string_view>

#include "broker/daemon/sizes.hpp"

namespace mpsshim::daemon {

namespace {

using Fields = std::map<std::string, std::string, std::less<>>;

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

}  // namespace

std::string format_client_table(const std::vector<ServerClients>& servers) {
  constexpr std::string_view kRow = "{:<9}{:<12}{:<5}{:<6}{:<12}{:<12}{:<10}{:<10}{}\n";
  std::string table = fmt::format(kRow, "PID", "USER", "GPU", "SMS", "MEMORY", "LIMIT", "LAUNCHES",
                                  "STATE", "PROGRAM");
  std::string notes;
  for (const ServerClients& server : servers) {
    std::istringstream lines(server.text);
    for (std::string line; std::getline(lines, line);) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      Fields fields = parse_fields(line);
      if (!fields.contains("pid")) {
        notes += fmt::format("GPU {}: {}\n", server.gpu, line);
        continue;
      }
      table += fmt::format(kRow, field(fields, "pid"), user_name(field(fields, "uid")), server.gpu,
                           field(fields, "sms"), bytes_field(fields, "mem_used", false),
                           bytes_field(fields, "mem_limit", true), field(fields, "launches"),
                           field(fields, "state"), field(fields, "program"));
    }
  }
  return table + notes;
}

}  // namespace mpsshim::daemon
