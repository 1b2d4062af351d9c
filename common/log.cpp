#include "common/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <iterator>
#include <mutex>
#include <new>
#include <string>
#include <system_error>
#include <unordered_set>

namespace mpsshim {
namespace logging {

constinit std::atomic<int> threshold{kUnread};

}  // namespace logging

namespace {

constexpr LogLevel kDefaultLevel = LogLevel::kWarn;
constexpr std::string_view kLevelNames[] = {"error", "warn", "info", "debug", "trace"};
constexpr int kFdUnset = -1;

// Set by configure_log (leaked: threads may log while exit() runs static destructors); null:
// the shim's defaults.
constinit std::atomic<const LogIdentity*> g_identity{nullptr};
// Where lines go; kFdUnset: MPSSHIM_LOG_FILE, else stderr, decided at the first line.
constinit std::atomic<int> g_fd{kFdUnset};

struct Sink {
  std::mutex mutex;
  std::function<void(LogLevel, std::string_view)> write;
};
constinit std::atomic<bool> g_has_sink{false};
Sink& sink() {
  static Sink* const sink = new Sink;  // leaked on purpose, as g_identity
  return *sink;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return std::ranges::equal(a, b, [](char x, char y) {
    auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    return lower(x) == lower(y);
  });
}

void write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;  // nowhere left to report a failing log
    data += written;
    size -= static_cast<std::size_t>(written);
  }
}

// Opened at the first line rather than at load time: nothing depends on constructor order, and a
// program that sets MPSSHIM_LOG_FILE before its first CUDA call is honoured.
int default_fd() noexcept {
  static const int fd = [] {
    const char* path = std::getenv("MPSSHIM_LOG_FILE");
    if (path == nullptr || *path == '\0') return STDERR_FILENO;
    // O_APPEND makes each line's single write() land whole even with several processes.
    const int file = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (file >= 0) return file;
    try {
      const std::string line =
          fmt::format("mpsshim[{}] warn: cannot open MPSSHIM_LOG_FILE {}: {}; logging to stderr\n",
                      ::getpid(), path, std::error_code(errno, std::generic_category()).message());
      write_all(STDERR_FILENO, line.data(), line.size());
    } catch (...) {
      // Out of memory while explaining: stderr it is, silently.
    }
    return STDERR_FILENO;
  }();
  return fd;
}

void append_prefix(fmt::memory_buffer& line, LogLevel level) {
  const LogIdentity* identity = g_identity.load(std::memory_order_acquire);
  if (identity == nullptr) {
    fmt::format_to(std::back_inserter(line), "mpsshim[{}] {}: ", ::getpid(), log_level_name(level));
    return;
  }
  if (identity->timestamps) {
    using namespace std::chrono;
    const auto now = system_clock::now();
    const std::time_t seconds = system_clock::to_time_t(now);
    const auto millis = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
    std::tm local{};
    ::localtime_r(&seconds, &local);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
    fmt::format_to(std::back_inserter(line), "{}.{:03} ", stamp, millis);
  }
  if (identity->tag.empty()) {
    fmt::format_to(std::back_inserter(line), "{}[{}] {}: ", identity->program, ::getpid(),
                   log_level_name(level));
  } else {
    fmt::format_to(std::back_inserter(line), "{}[{}] {}: ", identity->program, identity->tag,
                   log_level_name(level));
  }
}

}  // namespace

std::optional<LogLevel> parse_log_level(std::string_view name) {
  if (equals_ignoring_case(name, "warning")) return LogLevel::kWarn;
  for (std::size_t i = 0; i < std::size(kLevelNames); ++i) {
    if (equals_ignoring_case(name, kLevelNames[i])) return static_cast<LogLevel>(i);
  }
  return std::nullopt;
}

std::string_view log_level_name(LogLevel level) {
  return kLevelNames[static_cast<std::size_t>(level)];
}

namespace logging {

int read_threshold() noexcept {
  const char* text = std::getenv("MPSSHIM_LOG_LEVEL");
  std::optional<int> parsed = static_cast<int>(kDefaultLevel);
  if (text != nullptr && *text != '\0') {
    if (equals_ignoring_case(text, "off") || equals_ignoring_case(text, "none")) {
      parsed = kOff;
    } else if (auto level = parse_log_level(text)) {
      parsed = static_cast<int>(*level);
    } else {
      parsed.reset();
    }
  }
  // A racing set_log_level() wins; racing readers all store the same value.
  int expected = kUnread;
  const bool stored = threshold.compare_exchange_strong(
      expected, parsed.value_or(static_cast<int>(kDefaultLevel)), std::memory_order_relaxed);
  if (stored && !parsed) {
    log_warn("MPSSHIM_LOG_LEVEL={} is not one of off, error, warn, info, debug, trace; using {}",
             text, log_level_name(kDefaultLevel));
  }
  return threshold.load(std::memory_order_relaxed);
}

void vwrite(LogLevel level, fmt::string_view format, fmt::format_args args) noexcept {
  const int saved_errno = errno;
  try {
    if (g_has_sink.load(std::memory_order_acquire)) {
      const std::string message = fmt::vformat(format, args);
      Sink& s = sink();
      const std::scoped_lock lock(s.mutex);
      if (s.write) {
        s.write(level, message);
        errno = saved_errno;
        return;
      }
    }
    fmt::memory_buffer line;
    append_prefix(line, level);
    const std::size_t message_start = line.size();
    fmt::vformat_to(std::back_inserter(line), format, args);
    // One event, one line, whatever the arguments contained.
    std::replace_if(
        line.begin() + static_cast<std::ptrdiff_t>(message_start), line.end(),
        [](char c) { return c == '\n' || c == '\r'; }, ' ');
    line.push_back('\n');
    write_all(log_fd(), line.data(), line.size());
  } catch (...) {
    constexpr std::string_view kLost = "mpsshim: a log message could not be formatted\n";
    write_all(log_fd(), kLost.data(), kLost.size());
  }
  errno = saved_errno;
}

bool first_time(std::string_view key) noexcept {
  // Leaked on purpose: threads may still log while exit() runs static destructors.
  static std::mutex mutex;
  static auto* const seen = new (std::nothrow) std::unordered_set<std::string>;
  if (seen == nullptr) return true;
  try {
    const std::scoped_lock lock(mutex);
    return seen->emplace(key).second;
  } catch (...) {
    return true;  // out of memory: a repeated line beats a lost one
  }
}

}  // namespace logging

void set_log_level(LogLevel level) noexcept {
  logging::threshold.store(static_cast<int>(level), std::memory_order_relaxed);
}

void configure_log(LogIdentity identity) {
  g_identity.store(new LogIdentity(std::move(identity)), std::memory_order_release);
}

void set_log_fd(int fd) noexcept {
  g_fd.store(fd, std::memory_order_relaxed);
}

int log_fd() noexcept {
  const int fd = g_fd.load(std::memory_order_relaxed);
  return fd != kFdUnset ? fd : default_fd();
}

void set_log_sink(std::function<void(LogLevel, std::string_view)> write) {
  Sink& s = sink();
  const std::scoped_lock lock(s.mutex);
  g_has_sink.store(static_cast<bool>(write), std::memory_order_release);
  s.write = std::move(write);
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

}  // namespace mpsshim
