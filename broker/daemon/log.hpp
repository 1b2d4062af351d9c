// The daemon's log: one line per event, "2025-01-31 14:02:11.482 mpsshimd[811] warn: ...".
// The level is checked before anything is formatted, so debug lines cost nothing when off.
#pragma once

#include <fmt/format.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <tl/expected.hpp>

namespace mpsshim::daemon {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

std::optional<LogLevel> parse_log_level(std::string_view name);
std::string_view log_level_name(LogLevel level);

void set_log_level(LogLevel level);
// The program name each line carries (default "mpsshimd"); `name` must outlive the logging.
void set_log_program(std::string_view name);
bool log_enabled(LogLevel level);

// Lines go to stderr (journald under systemd) until a file is opened.
tl::expected<void, std::string> open_log_file(const std::string& path);
void reopen_log_file();  // SIGHUP, after logrotate moved the file
int log_fd();            // where children (the servers) should write their stderr

void write_log_line(LogLevel level, std::string_view text);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (!log_enabled(level)) return;
  write_log_line(level, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void log_error(fmt::format_string<Args...> format, Args&&... args) {
  log(LogLevel::kError, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  log(LogLevel::kWarn, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  log(LogLevel::kInfo, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
  log(LogLevel::kDebug, format, std::forward<Args>(args)...);
}

}  // namespace mpsshim::daemon
