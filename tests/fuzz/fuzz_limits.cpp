// libFuzzer target: the size and limit parsers, and the daemon's operator command parser
// (docs/testing.md, "Fuzzing"). Each input is one text, given to:
//  - mpsshimd's parse_size (broker/daemon/sizes.cpp): what it accepts must survive a round trip
//    through format_size; format_size_approx of any value;
//  - libshim's parse_memory_size and parse_memory_limits (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT,
//    libshim/config.cpp): limits only for ordinals the shim has;
//  - Commands::execute (broker/daemon/commands.cpp) as an mpsshimctl line, on a daemon whose
//    one server never started: the reply must come exactly once.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "broker/daemon/allocations.hpp"
#include "broker/daemon/commands.hpp"
#include "broker/daemon/event_loop.hpp"
#include "broker/daemon/log.hpp"
#include "broker/daemon/sizes.hpp"
#include "broker/daemon/supervisor.hpp"
// parse_memory_limits is file-local: the shim's config parser is compiled into this target.
#include "libshim/config.cpp"

namespace {

using namespace mpsshim;

void fail(const char* what, std::string_view text) {
  std::fprintf(stderr, "fuzz_limits: %s (input \"%.*s\")\n", what, static_cast<int>(text.size()),
               text.data());
  std::abort();
}

void daemon_sizes(std::string_view text) {
  if (auto bytes = daemon::parse_size(text)) {
    std::string formatted = daemon::format_size(*bytes);
    if (daemon::parse_size(formatted) != bytes) fail("parse_size(format_size(x)) != x", text);
    (void)daemon::format_size_approx(*bytes);
  }
}

void shim_limits(std::string_view text) {
  std::string s(text);
  (void)shim::parse_memory_size(s);
  shim::ClientConfig config;
  shim::parse_memory_limits(s, config);
  for (const auto& [ordinal, bytes] : config.memory_limit) {
    if (ordinal < 0 || ordinal >= shim::kMaxDevices || bytes == 0) fail("bad limit", text);
  }
}

void command(std::string_view text) {
  daemon::EventLoop loop;
  daemon::SupervisorConfig config;
  config.server_path = "/nonexistent/mpsshim-server";
  daemon::Supervisor supervisor(loop, config, {});
  int shutdowns = 0;
  daemon::AllocationRegistry allocations;
  daemon::Commands commands(supervisor, allocations, [&] { ++shutdowns; });
  int replies = 0;
  commands.execute(text, [&](daemon::CtlReply) { ++replies; });
  if (replies != 1) fail("a command was not answered exactly once", text);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_log_level(LogLevel::kError);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  daemon_sizes(text);
  shim_limits(text);
  command(text);
  return 0;
}
