#include "broker/server/base/log.hpp"

#include <atomic>
#include <cstdio>

namespace mpsshim::server {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::string g_prefix = "mpsshim-server";
std::function<void(LogLevel, std::string_view)> g_sink;

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warning";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}

}  // namespace

void set_log_level(LogLevel level) {
  g_level.store(static_cast<int>(level));
}

bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed);
}

void set_log_prefix(std::string prefix) {
  g_prefix = std::move(prefix);
}

void set_log_sink(std::function<void(LogLevel, std::string_view)> sink) {
  g_sink = std::move(sink);
}

void log_write(LogLevel level, std::string_view line) {
  if (g_sink) {
    g_sink(level, line);
    return;
  }
  // One fwrite per line so lines of concurrent writers to the same pipe do not interleave.
  std::string out = fmt::format("{} {}: {}\n", g_prefix, level_name(level), line);
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

std::optional<LogLevel> parse_log_level(std::string_view name) {
  if (name == "error") return LogLevel::kError;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "info") return LogLevel::kInfo;
  if (name == "debug") return LogLevel::kDebug;
  return std::nullopt;
}

std::string format_bytes(std::uint64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} bytes", bytes);
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  if (value == static_cast<double>(static_cast<std::uint64_t>(value))) {
    return fmt::format("{} {}", static_cast<std::uint64_t>(value), kUnits[unit]);
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

}  // namespace mpsshim::server
