// The one log of every mpsshim program (the shim, mpsshim-server, mpsshimd, mpsshimctl, the
// device plugin): one line per event,
//
//   [2026-01-31 14:02:11.482 ]<program>[<tag>] <level>: <message>
//
// written with one write(2) to a file descriptor, so that lines of several threads and
// processes appending to one file or pipe never interleave. Until a program configures it
// (configure_log) it is the shim's: program "mpsshim", tagged with the pid, no time stamp,
// appended to the file MPSSHIM_LOG_FILE names (else stderr), at the level MPSSHIM_LOG_LEVEL
// names (else warn); the shim never configures it, because it may log before main.
//
// Safe from any thread, before main and after exit handlers have run (what the defaults need has
// no constructor or destructor). The level is checked before the message is formatted, so a
// disabled call costs a load and a compare. Never throws, and leaves errno as it found it: the
// driver's callers may be inspecting it.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace mpsshim {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3, kTrace = 4 };

// error, warn (or warning), info, debug, trace; any case.
std::optional<LogLevel> parse_log_level(std::string_view name);
std::string_view log_level_name(LogLevel level);

namespace logging {

// The threshold before the level has been read from MPSSHIM_LOG_LEVEL; "off" is kOff.
inline constexpr int kUnread = -2;
inline constexpr int kOff = -1;
extern constinit std::atomic<int> threshold;
int read_threshold() noexcept;
void vwrite(LogLevel level, fmt::string_view format, fmt::format_args args) noexcept;
// True the first time `key` is seen in this process.
bool first_time(std::string_view key) noexcept;

}  // namespace logging

inline bool log_enabled(LogLevel level) noexcept {
  int threshold = logging::threshold.load(std::memory_order_relaxed);
  if (threshold == logging::kUnread) [[unlikely]] {
    threshold = logging::read_threshold();
  }
  return static_cast<int>(level) <= threshold;
}

// Overrides MPSSHIM_LOG_LEVEL from now on.
void set_log_level(LogLevel level) noexcept;

// How a program's lines look and where they go; set once, first thing in main, before any
// other thread logs.
struct LogIdentity {
  std::string program;     // "mpsshimd"
  std::string tag;         // inside the brackets; empty: the pid
  bool timestamps = true;  // local time to the millisecond, first on the line
};
void configure_log(LogIdentity identity);
// Where lines go from now on (a log file; STDERR_FILENO by default). The caller owns the fd
// and keeps it open while it is set.
void set_log_fd(int fd) noexcept;
int log_fd() noexcept;
// Lines go to `sink` instead, without the prefix (tests); an empty function restores the fd.
void set_log_sink(std::function<void(LogLevel, std::string_view)> sink);

template <typename... Args>
void log_at(LogLevel level, fmt::format_string<Args...> format, Args&&... args) noexcept {
  if (!log_enabled(level)) return;
  logging::vwrite(level, format, fmt::make_format_args(args...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> format, Args&&... args) noexcept {
  log_at(LogLevel::kError, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) noexcept {
  log_at(LogLevel::kWarn, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) noexcept {
  log_at(LogLevel::kInfo, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> format, Args&&... args) noexcept {
  log_at(LogLevel::kDebug, format, std::forward<Args>(args)...);
}
template <typename... Args>
void log_trace(fmt::format_string<Args...> format, Args&&... args) noexcept {
  log_at(LogLevel::kTrace, format, std::forward<Args>(args)...);
}

// Logs the first call that finds `once` false, and sets it. A call whose level is disabled
// leaves `once` alone, so raising the level later still shows the message once.
template <typename... Args>
void log_once(std::atomic<bool>& once, LogLevel level, fmt::format_string<Args...> format,
              Args&&... args) noexcept {
  if (!log_enabled(level)) return;
  // The plain load keeps the common already-logged case from writing a shared cache line.
  if (once.load(std::memory_order_relaxed) || once.exchange(true, std::memory_order_relaxed)) {
    return;
  }
  logging::vwrite(level, format, fmt::make_format_args(args...));
}

// As above, keyed by a string (e.g. an unknown UUID) when no flag can be set aside per site.
// Takes a lock and may allocate: not for hot paths.
template <typename... Args>
void log_once(std::string_view key, LogLevel level, fmt::format_string<Args...> format,
              Args&&... args) noexcept {
  if (!log_enabled(level) || !logging::first_time(key)) return;
  logging::vwrite(level, format, fmt::make_format_args(args...));
}

// "1.5 GiB", "512 MiB", "4096 bytes": sizes the way an operator reads them.
std::string format_bytes(std::uint64_t bytes);

}  // namespace mpsshim
