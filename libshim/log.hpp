// The shim's log: one line per event, "mpsshim[<pid>] <level>: <message>", to stderr or, when
// MPSSHIM_LOG_FILE names a file, appended to it. MPSSHIM_LOG_LEVEL picks the most verbose level
// shown (error, warn, info, debug, trace, or off; default warn).
//
// Safe from any thread, before main and after exit handlers have run (nothing here has a
// constructor or destructor that could run in the wrong order). The level is checked before
// the message is formatted, so a disabled call costs a load and a compare. Never throws, and
// leaves errno as it found it: the driver's callers may be inspecting it.
#pragma once

#include <fmt/core.h>

#include <atomic>
#include <string_view>

namespace mpsshim::shim {

enum class Level : int { error = 0, warn = 1, info = 2, debug = 3, trace = 4 };

namespace detail {

// Threshold value before MPSSHIM_LOG_LEVEL has been read; "off" is -1.
inline constexpr int kLevelUnread = -2;
extern constinit std::atomic<int> log_threshold;
int read_log_threshold() noexcept;
void vlog(Level level, fmt::string_view format, fmt::format_args args) noexcept;
// True the first time `key` is seen in this process.
bool first_time(std::string_view key) noexcept;

}  // namespace detail

inline bool log_enabled(Level level) noexcept {
  int threshold = detail::log_threshold.load(std::memory_order_relaxed);
  if (threshold == detail::kLevelUnread) [[unlikely]] {
    threshold = detail::read_log_threshold();
  }
  return static_cast<int>(level) <= threshold;
}

// Overrides MPSSHIM_LOG_LEVEL from now on.
void set_log_level(Level level) noexcept;

template <typename... Args>
void log(Level level, fmt::format_string<Args...> format, Args&&... args) noexcept {
  if (!log_enabled(level)) return;
  detail::vlog(level, format, fmt::make_format_args(args...));
}

// Logs the first call that finds `once` false, and sets it. A call whose level is disabled
// leaves `once` alone, so raising the level later still shows the message once.
template <typename... Args>
void log_once(std::atomic<bool>& once, Level level, fmt::format_string<Args...> format,
              Args&&... args) noexcept {
  if (!log_enabled(level)) return;
  // The plain load keeps the common already-logged case from writing a shared cache line.
  if (once.load(std::memory_order_relaxed) || once.exchange(true, std::memory_order_relaxed)) {
    return;
  }
  detail::vlog(level, format, fmt::make_format_args(args...));
}

// As above, keyed by a string (e.g. an unknown UUID) when no flag can be set aside per site.
// Takes a lock and may allocate: not for hot paths.
template <typename... Args>
void log_once(std::string_view key, Level level, fmt::format_string<Args...> format,
              Args&&... args) noexcept {
  if (!log_enabled(level) || !detail::first_time(key)) return;
  detail::vlog(level, format, fmt::make_format_args(args...));
}

}  // namespace mpsshim::shim
