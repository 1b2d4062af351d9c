#include "broker/daemon/client_table.hpp"

#include <fmt/format.h>
#include <pwd.h>
#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <optional>
#include <sstream>

#include "broker/daemon/sizes.hpp"

namespace mpsshim::daemon {

namespace {

struct ClientRow {
  long pid;
  long uid;
  std::uint64_t sms;
  std::uint64_t memory;
  std::uint64_t launches;
  std::string state;
  std::string program;
};

template <typename T>
bool read_number(std::string_view token, T& out) {
  auto [end, error] = std::from_chars(token.data(), token.data() + token.size(), out);
  return error == std::errc{} && end == token.data() + token.size();
}

std::optional<ClientRow> parse_row(const std::string& line) {
  std::istringstream in(line);
  std::string pid, uid, sms, memory, launches;
  ClientRow row;
  if (!(in >> pid >> uid >> sms >> memory >> launches >> row.state)) return std::nullopt;
  if (!read_number(pid, row.pid) || !read_number(uid, row.uid) || !read_number(sms, row.sms) ||
      !read_number(memory, row.memory) || !read_number(launches, row.launches)) {
    return std::nullopt;
  }
  std::getline(in >> std::ws, row.program);
  return row;
}

std::string user_name(long uid) {
  passwd entry{};
  passwd* found = nullptr;
  char buffer[1024];
  if (::getpwuid_r(static_cast<uid_t>(uid), &entry, buffer, sizeof buffer, &found) == 0 &&
      found != nullptr) {
    return found->pw_name;
  }
  return std::to_string(uid);
}

}  // namespace

std::string format_client_table(const std::vector<ServerClients>& servers) {
  constexpr std::string_view kRow = "{:<9}{:<12}{:<5}{:<6}{:<12}{:<10}{:<11}{}\n";
  std::string table =
      fmt::format(kRow, "PID", "USER", "GPU", "SMS", "MEMORY", "LAUNCHES", "STATE", "PROGRAM");
  std::string unparsed;
  for (const ServerClients& server : servers) {
    std::istringstream lines(server.text);
    for (std::string line; std::getline(lines, line);) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      if (auto row = parse_row(line)) {
        table +=
            fmt::format(kRow, row->pid, user_name(row->uid), server.gpu, row->sms,
                        format_size_approx(row->memory), row->launches, row->state, row->program);
      } else {
        unparsed += fmt::format("GPU {}: {}\n", server.gpu, line);
      }
    }
  }
  return table + unparsed;
}

}  // namespace mpsshim::daemon
