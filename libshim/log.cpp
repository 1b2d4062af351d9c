#include "libshim/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <system_error>
#include <unordered_set>

namespace mpsshim::shim {
namespace detail {

constinit std::atomic<int> log_threshold{kLevelUnread};

}  // namespace detail

namespace {

constexpr int kLevelOff = -1;
constexpr Level kDefaultLevel = Level::warn;
constexpr std::string_view kLevelNames[] = {"error", "warn", "info", "debug", "trace"};

std::string_view level_name(Level level) {
  return kLevelNames[static_cast<std::size_t>(level)];
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return std::ranges::equal(a, b, [](char x, char y) {
    auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    return lower(x) == lower(y);
  });
}

std::optional<int> parse_threshold(std::string_view text) {
  if (equals_ignoring_case(text, "off") || equals_ignoring_case(text, "none")) return kLevelOff;
  if (equals_ignoring_case(text, "warning")) return static_cast<int>(Level::warn);
  for (std::size_t i = 0; i < std::size(kLevelNames); ++i) {
    if (equals_ignoring_case(text, kLevelNames[i])) return static_cast<int>(i);
  }
  return std::nullopt;
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

// Opened at the first message rather than at load time: nothing depends on constructor order,
// and a program that sets MPSSHIM_LOG_FILE before its first CUDA call is honoured.
int sink() noexcept {
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

}  // namespace

namespace detail {

int read_log_threshold() noexcept {
  const char* text = std::getenv("MPSSHIM_LOG_LEVEL");
  const std::optional<int> parsed =
      text != nullptr && *text != '\0' ? parse_threshold(text) : static_cast<int>(kDefaultLevel);
  // A racing set_log_level() wins; racing readers all store the same value.
  int expected = kLevelUnread;
  const bool stored = log_threshold.compare_exchange_strong(
      expected, parsed.value_or(static_cast<int>(kDefaultLevel)), std::memory_order_relaxed);
  if (stored && !parsed) {
    log(Level::warn,
        "MPSSHIM_LOG_LEVEL={} is not one of off, error, warn, info, debug, trace; using {}", text,
        level_name(kDefaultLevel));
  }
  return log_threshold.load(std::memory_order_relaxed);
}

void vlog(Level level, fmt::string_view format, fmt::format_args args) noexcept {
  const int saved_errno = errno;
  try {
    fmt::memory_buffer line;
    fmt::format_to(std::back_inserter(line), "mpsshim[{}] {}: ", ::getpid(), level_name(level));
    const std::size_t message_start = line.size();
    fmt::vformat_to(std::back_inserter(line), format, args);
    // One event, one line, whatever the arguments contained.
    std::replace_if(
        line.begin() + message_start, line.end(), [](char c) { return c == '\n' || c == '\r'; },
        ' ');
    line.push_back('\n');
    write_all(sink(), line.data(), line.size());
  } catch (...) {
    constexpr std::string_view kLost = "mpsshim: a log message could not be formatted\n";
    write_all(sink(), kLost.data(), kLost.size());
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

}  // namespace detail

void set_log_level(Level level) noexcept {
  detail::log_threshold.store(static_cast<int>(level), std::memory_order_relaxed);
}

}  // namespace mpsshim::shim
