#include "broker/daemon/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

namespace mpsshim::daemon {

namespace {

constexpr std::array<std::string_view, 4> kLevelNames{"error", "warn", "info", "debug"};

LogLevel g_level = LogLevel::kInfo;
int g_fd = STDERR_FILENO;
std::string g_path;

int open_append(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
}

std::string_view g_program = "mpsshimd";  // a literal: set_log_program takes static names
}  // namespace

std::optional<LogLevel> parse_log_level(std::string_view name) {
  for (std::size_t i = 0; i < kLevelNames.size(); ++i) {
    if (name == kLevelNames[i]) return static_cast<LogLevel>(i);
  }
  if (name == "warning") return LogLevel::kWarn;
  return std::nullopt;
}

std::string_view log_level_name(LogLevel level) {
  return kLevelNames[static_cast<std::size_t>(level)];
}

void set_log_program(std::string_view name) {
  g_program = name;
}

void set_log_level(LogLevel level) {
  g_level = level;
}
bool log_enabled(LogLevel level) {
  return level <= g_level;
}

tl::expected<void, std::string> open_log_file(const std::string& path) {
  int fd = open_append(path);
  if (fd < 0)
    return tl::unexpected(fmt::format("cannot open log file {}: {}", path, std::strerror(errno)));
  if (g_fd != STDERR_FILENO) ::close(g_fd);
  g_fd = fd;
  g_path = path;
  return {};
}

void reopen_log_file() {
  if (g_path.empty()) return;
  int fd = open_append(g_path);
  if (fd < 0) {
    log_error("cannot reopen log file {}: {}; still writing to the old one", g_path,
              std::strerror(errno));
    return;
  }
  ::close(g_fd);
  g_fd = fd;
}

int log_fd() {
  return g_fd;
}

void write_log_line(LogLevel level, std::string_view text) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t seconds = system_clock::to_time_t(now);
  auto millis = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm local{};
  ::localtime_r(&seconds, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &local);
  // One write() per line: with O_APPEND, lines from the daemon and its servers never interleave.
  std::string line = fmt::format("{}.{:03} {}[{}] {}: {}\n", stamp, millis, g_program, ::getpid(),
                                 log_level_name(level), text);
  std::string_view rest = line;
  while (!rest.empty()) {
    ssize_t n = ::write(g_fd, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // nowhere left to complain to
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace mpsshim::daemon
