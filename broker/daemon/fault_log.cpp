#include "broker/daemon/fault_log.hpp"

#include <fmt/format.h>

#include <ctime>
#include <utility>

namespace mpsshim::daemon {

namespace {

template <typename T>
std::optional<T> parse_number(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  std::uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return static_cast<T>(value);
}

std::string local_time(std::chrono::system_clock::time_point when) {
  const std::time_t t = std::chrono::system_clock::to_time_t(when);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &tm);
  return text;
}

}  // namespace

tl::expected<FaultReport, std::string> parse_fault_report(std::string_view text, int status) {
  FaultReport report;
  report.error = status;
  std::string_view rest = text;
  bool have_program = false;
  while (!rest.empty()) {
    const std::size_t equals = rest.find('=');
    if (equals == std::string_view::npos) break;
    const std::string_view key = rest.substr(0, equals);
    rest.remove_prefix(equals + 1);
    if (key == "program") {  // the rest of the line
      report.program = std::string(rest);
      have_program = true;
      break;
    }
    const std::size_t space = rest.find(' ');
    const std::string_view value = rest.substr(0, space);
    rest.remove_prefix(space == std::string_view::npos ? rest.size() : space + 1);
    bool ok = true;
    if (key == "client") {
      auto n = parse_number<std::uint32_t>(value);
      ok = n.has_value();
      report.client = n.value_or(0);
    } else if (key == "pid") {
      auto n = parse_number<pid_t>(value);
      ok = n.has_value();
      report.pid = n.value_or(0);
    } else if (key == "uid") {
      auto n = parse_number<uid_t>(value);
      ok = n.has_value();
      report.uid = n.value_or(0);
    } else if (key == "clients") {
      auto n = parse_number<std::size_t>(value);
      ok = n.has_value();
      report.clients_ended = n.value_or(0);
    } else if (key == "op") {
      report.op = std::string(value);
    } else if (key == "error") {
      report.error_name = std::string(value);
    }  // an unknown key from a newer server: skipped
    if (!ok) return tl::unexpected(fmt::format("`{}={}` is not a number", key, value));
  }
  if (!have_program) return tl::unexpected(std::string("no program= field"));
  if (report.error_name.empty()) report.error_name = fmt::format("CUresult {}", status);
  return report;
}

std::string describe_fault(const FaultReport& report) {
  std::string where = report.group.empty() ? "" : fmt::format("; isolation group {}", report.group);
  std::string cause =
      report.client == 0
          ? fmt::format("no client's call returned it first{}", where)
          : fmt::format(
                "first returned by the work of client pid {} ({}, uid {}{}), its likely "
                "cause",
                report.pid, report.program, report.uid, where);
  return fmt::format("GPU fault on GPU {} ({}) at {}: {}; {} client(s) ended", report.gpu,
                     report.error_name, local_time(report.when), cause, report.clients_ended);
}

nlohmann::json fault_json(const FaultReport& report) {
  const auto seconds = std::chrono::duration<double>(report.when.time_since_epoch()).count();
  nlohmann::json culprit = nullptr;
  if (report.client != 0) {
    culprit = {
        {"pid", report.pid}, {"uid", report.uid}, {"program", report.program}, {"call", report.op}};
  }
  return {{"gpu", report.gpu},
          {"isolation_group", report.group.empty() ? "shared" : report.group},
          {"server_pid", report.server_pid},
          {"error", report.error_name},
          {"time", seconds},
          {"likely_culprit", culprit},
          {"clients_ended", report.clients_ended}};
}

void FaultLog::add(FaultReport report) {
  if (report.client != 0) {
    ++by_culprit_[Key{report.gpu, report.uid, report.program}];
    last_by_program_[{report.uid, report.program}] = report;
  }
  recent_.push_back(std::move(report));
  while (recent_.size() > kKept) recent_.pop_front();
}

std::optional<FaultReport> FaultLog::recent_culprit(uid_t uid, std::string_view program,
                                                    Clock::time_point now,
                                                    std::chrono::seconds window) const {
  auto found = last_by_program_.find(std::pair<uid_t, std::string>{uid, std::string(program)});
  if (found == last_by_program_.end() || now - found->second.seen > window) return std::nullopt;
  return found->second;
}

}  // namespace mpsshim::daemon
