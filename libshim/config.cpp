// The client's configuration, read once at cuInit from the environment. Names follow NVIDIA
// MPS where MPS has one (docs/environment.md lists them all).
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>

#include "common/log.hpp"
#include "libshim/client.hpp"

namespace mpsshim::shim {

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

std::string trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

// MPS's form: "2G" for every device, or "0=1G,1=512M" per device ordinal.
void parse_memory_limits(const std::string& text, ClientConfig& config) {
  std::string_view rest = text;
  while (!rest.empty()) {
    std::size_t comma = rest.find(',');
    std::string item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (item.empty()) continue;
    std::size_t eq = item.find('=');
    if (eq == std::string::npos) {
      config.memory_limit_all = parse_memory_size(item);
      if (config.memory_limit_all == 0) {
        log_warn("ignoring CUDA_MPS_PINNED_DEVICE_MEM_LIMIT item '{}': not a size", item);
      }
      continue;
    }
    char* end = nullptr;
    long ordinal = std::strtol(item.c_str(), &end, 10);
    std::uint64_t bytes = parse_memory_size(item.substr(eq + 1));
    if (end != item.c_str() + eq || ordinal < 0 || ordinal >= kMaxDevices || bytes == 0) {
      log_warn(
          "ignoring CUDA_MPS_PINNED_DEVICE_MEM_LIMIT item '{}' (expected "
          "<ordinal>=<size>, e.g. 0=4G)",
          item);
      continue;
    }
    config.memory_limit[static_cast<int>(ordinal)] = bytes;
  }
}

// The daemon checks the token; here it is only carried. A token that does not fit the hello is
// sent cut short, which the daemon refuses as unknown (and says so).
std::string read_allocation_token() {
  if (std::string token = trim(env("MPSSHIM_ALLOCATION_TOKEN")); !token.empty()) return token;
  std::string path = env("MPSSHIM_ALLOCATION_TOKEN_FILE");
  if (path.empty()) return {};
  std::ifstream file(path);
  std::string line;
  if (!file || !std::getline(file, line)) {
    log_warn("cannot read MPSSHIM_ALLOCATION_TOKEN_FILE={}; connecting without a token", path);
    return {};
  }
  return trim(line);
}

}  // namespace

std::uint64_t parse_memory_size(const std::string& text) {
  std::string s = trim(text);
  if (s.empty()) return 0;
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(s.c_str(), &end);
  if (errno != 0 || end == s.c_str() || value <= 0) return 0;
  std::string unit = trim(end);
  double scale = 1;
  if (unit.empty() || unit == "B" || unit == "b") {
    scale = 1;
  } else {
    switch (unit[0]) {
      case 'K':
      case 'k':
        scale = 1024.0;
        break;
      case 'M':
      case 'm':
        scale = 1024.0 * 1024;
        break;
      case 'G':
      case 'g':
        scale = 1024.0 * 1024 * 1024;
        break;
      case 'T':
      case 't':
        scale = 1024.0 * 1024 * 1024 * 1024;
        break;
      default:
        return 0;
    }
    std::string_view tail = std::string_view(unit).substr(1);
    if (!(tail.empty() || tail == "B" || tail == "iB" || tail == "b")) return 0;
  }
  // Too big for 64 bits (or infinite, or NaN): no size. Converting it would be undefined.
  const double bytes = value * scale;
  if (!(bytes < 18446744073709551616.0)) return 0;
  return static_cast<std::uint64_t>(bytes);
}

proto::ClientHello make_client_hello(proto::MessageKind kind, int device,
                                     const ClientConfig& config) {
  proto::ClientHello hello{};
  hello.header = proto::make_header(kind, sizeof hello);
  hello.pid = ::getpid();
  hello.device = device;
  hello.active_thread_percentage = config.active_thread_percentage;
  hello.priority = config.priority;
  hello.sm_partition = config.sm_partition;
  if (auto it = config.memory_limit.find(device); it != config.memory_limit.end()) {
    hello.device_memory_limit = it->second;
  } else {
    hello.device_memory_limit = config.memory_limit_all;
  }
  hello.flags = (config.ignore_sm_coscheduling ? proto::kHelloIgnoreSmCoscheduling : 0) |
                (config.launch_batching ? 0 : proto::kHelloNoLaunchBatching) |
                (config.own_isolation_group ? proto::kHelloOwnIsolationGroup : 0);
  std::strncpy(hello.visible_devices, config.visible_devices.c_str(),
               sizeof hello.visible_devices - 1);
  std::strncpy(hello.program, config.program.c_str(), sizeof hello.program - 1);
  std::strncpy(hello.allocation_token, config.allocation_token.c_str(),
               sizeof hello.allocation_token - 1);
  return hello;
}

ClientConfig read_client_config() {
  ClientConfig config;
  if (std::string dir = env("CUDA_MPS_PIPE_DIRECTORY"); !dir.empty()) {
    config.socket_candidates.push_back(dir + "/control");
  } else {
    config.socket_candidates.push_back("/tmp/mpsshim-" + std::to_string(::getuid()) + "/control");
    config.socket_candidates.push_back("/run/mpsshim/control");
  }
  if (std::string pct = env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); !pct.empty()) {
    char* end = nullptr;
    double value = std::strtod(pct.c_str(), &end);
    if (end == pct.c_str() || value <= 0 || value > 100) {
      log_warn(
          "ignoring CUDA_MPS_ACTIVE_THREAD_PERCENTAGE='{}': expected a number in "
          "(0, 100]",
          pct);
    } else {
      // Round up: asking for 12.5% of 132 SMs must not give less than 12.5%.
      config.active_thread_percentage = static_cast<int>(value + 0.999);
    }
  }
  if (std::string prio = env("CUDA_MPS_CLIENT_PRIORITY"); !prio.empty()) {
    if (prio == "0" || prio == "1") {
      config.priority = prio[0] - '0';
    } else {
      log_warn(
          "ignoring CUDA_MPS_CLIENT_PRIORITY='{}': expected 0 (normal) or 1 "
          "(below normal)",
          prio);
    }
  }
  if (std::string partition = env("CUDA_MPS_SM_PARTITION"); !partition.empty()) {
    // The id `mpsshimctl sm_partition add` answered. Anything else is sent as "bad", so the
    // daemon refuses the client instead of running it outside the partition it asked for.
    char* end = nullptr;
    const unsigned long id = std::strtoul(partition.c_str(), &end, 10);
    if (*end != '\0' || id == 0 || id >= proto::kBadSmPartition) {
      log_error(
          "CUDA_MPS_SM_PARTITION='{}' is not a partition id (a number from mpsshimctl lspart)",
          partition);
      config.sm_partition = proto::kBadSmPartition;
    } else {
      config.sm_partition = static_cast<std::uint32_t>(id);
    }
  }
  parse_memory_limits(env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), config);
  config.ignore_sm_coscheduling = env("MPSSHIM_SM_GRANULARITY") == "2";
  // For debugging: the server issues this process's launches one by one instead of batching
  // the ones waiting in its ring into graph launches (docs/launch-batching.md).
  if (std::string batching = env("MPSSHIM_LAUNCH_BATCHING"); !batching.empty()) {
    if (batching == "off" || batching == "0") {
      config.launch_batching = false;
    } else if (batching != "on" && batching != "1") {
      log_warn("ignoring MPSSHIM_LAUNCH_BATCHING='{}': expected off or on", batching);
    }
  }
  // A call returns when its fence lands, before the server's answer (docs/architecture.md,
  // "Early answers"): off by default, as it cost 3-5% of small-kernel throughput on an H200.
  if (std::string early = env("MPSSHIM_EARLY_ANSWERS"); !early.empty()) {
    if (early == "on" || early == "1") {
      config.early_answers = true;
    } else if (early != "off" && early != "0") {
      log_warn("ignoring MPSSHIM_EARLY_ANSWERS='{}': expected off or on", early);
    }
  }
  // Waits that took long their last times sleep first (wait_pacer.hpp).
  if (std::string pacing = env("MPSSHIM_WAIT_PACING"); !pacing.empty()) {
    if (pacing == "off" || pacing == "0") {
      config.wait_pacing = false;
    } else if (pacing != "on" && pacing != "1") {
      log_warn("ignoring MPSSHIM_WAIT_PACING='{}': expected off or on", pacing);
    }
  }
  // A process that trusts no other client asks for server processes of its own
  // (docs/isolation.md); it can only add isolation to what the operator's rule gives.
  if (std::string isolation = env("MPSSHIM_ISOLATION"); !isolation.empty()) {
    // A value it cannot read errs towards isolation: the variable is a request for it.
    config.own_isolation_group = isolation != "shared";
    if (isolation != "own" && isolation != "shared") {
      log_warn(
          "MPSSHIM_ISOLATION='{}' is neither own nor shared; taking it as own (server processes "
          "of this process's own)",
          isolation);
    }
  }
  // For debugging: a library's kernels are looked up on the server when cuLibraryGetKernel asks,
  // not at their first use (libshim/kernel_lookup.hpp). CUDA_MODULE_LOADING=EAGER asks the same
  // of the real driver, so it does it here too.
  config.lazy_loading = env("CUDA_MODULE_LOADING") != "EAGER";
  config.lazy_kernels = config.lazy_loading;
  if (std::string lookup = env("MPSSHIM_KERNEL_LOOKUP"); !lookup.empty()) {
    if (lookup == "eager" || lookup == "lazy") {
      config.lazy_kernels = lookup == "lazy";
    } else {
      log_warn("ignoring MPSSHIM_KERNEL_LOOKUP='{}': expected lazy or eager", lookup);
    }
  }
  config.allocation_token = read_allocation_token();
  config.visible_devices = env("CUDA_VISIBLE_DEVICES");
  config.program = program_invocation_short_name;
  return config;
}

}  // namespace mpsshim::shim
