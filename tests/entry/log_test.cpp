// The log (common/log.cpp) with the shim's defaults, on its own. One process, one sink: the log
// file is chosen before the first message, and the cases read only what was appended since the
// previous read.
#include <unistd.h>

#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "common/log.hpp"

namespace {

using namespace mpsshim;  // the log under test (common/log.hpp)

// Counts how often fmt formats it, to prove a disabled message is never formatted.
struct Counted {
  int* formatted;
};

class LogFile {
 public:
  static LogFile& get() {
    static LogFile file;
    return file;
  }
  // What the log gained since the last call.
  std::string take() {
    std::ifstream in(path_);
    std::stringstream text;
    text << in.rdbuf();
    const std::string all = text.str();
    const std::string fresh = all.substr(consumed_);
    consumed_ = all.size();
    return fresh;
  }
  ~LogFile() { ::unlink(path_.c_str()); }

 private:
  LogFile() {
    std::string path = "/tmp/mpsshim-log-test-XXXXXX";
    const int fd = ::mkstemp(path.data());
    REQUIRE(fd >= 0);
    ::close(fd);
    path_ = path;
    ::setenv("MPSSHIM_LOG_FILE", path_.c_str(), 1);
    ::setenv("MPSSHIM_LOG_LEVEL", "info", 1);
  }
  std::string path_;
  std::size_t consumed_ = 0;
};

std::string prefix(const char* level) {
  return "mpsshim[" + std::to_string(::getpid()) + "] " + level + ": ";
}

}  // namespace

template <>
struct fmt::formatter<Counted> : fmt::formatter<int> {
  auto format(const Counted& counted, format_context& context) const {
    ++*counted.formatted;
    return fmt::formatter<int>::format(*counted.formatted, context);
  }
};

TEST_CASE("a message at an enabled level is one prefixed line", "[log]") {
  auto& file = LogFile::get();
  file.take();

  log_info("client {} asked for {} GiB", 4123, 80);

  REQUIRE(file.take() == prefix("info") + "client 4123 asked for 80 GiB\n");
}

TEST_CASE("a message above the level is neither formatted nor written", "[log]") {
  auto& file = LogFile::get();
  file.take();
  int formatted = 0;

  log_debug("{}", Counted{&formatted});

  REQUIRE(formatted == 0);
  REQUIRE(file.take().empty());
}

TEST_CASE("newlines in arguments do not split the line", "[log]") {
  auto& file = LogFile::get();
  file.take();

  log_warn("server said: {}", "first\nsecond\r\n");

  REQUIRE(file.take() == prefix("warn") + "server said: first second  \n");
}

TEST_CASE("log_once logs the first call of a flag or a key", "[log]") {
  auto& file = LogFile::get();
  file.take();
  std::atomic<bool> once{false};

  for (int i = 0; i < 3; ++i) log_once(once, LogLevel::kError, "flag {}", i);
  for (int i = 0; i < 3; ++i) log_once("key-a", LogLevel::kError, "key a {}", i);
  log_once("key-b", LogLevel::kError, "key b");

  REQUIRE(file.take() == prefix("error") + "flag 0\n" + prefix("error") + "key a 0\n" +
                             prefix("error") + "key b\n");
}

TEST_CASE("set_log_level overrides the environment; errno survives", "[log]") {
  auto& file = LogFile::get();
  file.take();
  constexpr int kCallerErrno = 1234;

  mpsshim::set_log_level(LogLevel::kTrace);
  errno = kCallerErrno;
  log_trace("now visible");
  REQUIRE(errno == kCallerErrno);
  mpsshim::set_log_level(LogLevel::kInfo);

  REQUIRE(file.take() == prefix("trace") + "now visible\n");
}
