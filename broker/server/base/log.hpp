// Operator-facing log lines: one line per event, levels gated before anything is formatted.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace mpsshim::server {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level);
bool log_enabled(LogLevel level);
// Prefix of every line, e.g. "mpsshim-server[gpu 0]".
void set_log_prefix(std::string prefix);
// Where lines go (stderr by default; the daemon collects the server's stderr). Tests capture.
void set_log_sink(std::function<void(LogLevel, std::string_view)> sink);
void log_write(LogLevel level, std::string_view line);
std::optional<LogLevel> parse_log_level(std::string_view name);

template <typename... Args>
void log_at(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(level)) log_write(level, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> format, Args&&... args) {
  log_at(LogLevel::kError, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  log_at(LogLevel::kWarn, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  log_at(LogLevel::kInfo, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) {
  log_at(LogLevel::kDebug, format, std::forward<Args>(args)...);
}

// "1.5 GiB", "512 MiB", "4096 bytes": sizes the way an operator reads them.
std::string format_bytes(std::uint64_t bytes);

}  // namespace mpsshim::server
