// Per-client caps: how many objects of each kind one client may hold on a GPU's server, so that
// one client (buggy or hostile) cannot exhaust the server, the driver or the host for the
// others. Device memory has its own limit (quota.hpp); these cover everything else a flood of
// requests could pile up.
//
// Set with `mpsshimd --client-limit NAME=VALUE` (passed on as `mpsshim-server --client-limit
// NAME=VALUE`); docs/daemon.md lists them with the reason for each default. No CUDA here: the
// daemon includes this to check the names it passes on.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace mpsshim::server {

enum class ClientLimit : std::uint8_t {
  kStreams,        // streams, the default stream of every context included
  kEvents,         // the client's own events
  kModules,        // modules and libraries loaded, and JIT links open
  kGraphs,         // graphs and executable graphs
  kMemoryPools,    // memory pools it created
  kAllocations,    // device allocations (cuMemAlloc*, cuMemAllocAsync, graph memory), counted
  kPinnedBytes,    // pinned host memory registered or allocated (bytes)
  kHostFunctions,  // host functions queued and not yet run, or kept by its graphs
  kInFlight,       // GPU work the server tracks for it (replies, staging chunks, deferred frees)
  kIpcOpens,       // other clients' allocations it holds open (cuIpcOpenMemHandle; docs/ipc.md)
  kCount
};

struct ClientLimitSpec {
  const char* name;     // as in --client-limit NAME=VALUE
  const char* counted;  // "streams": what the number counts, for log lines
  std::uint64_t default_value;
  bool bytes;  // the value is a size (mpsshimd takes 4G, 512M)
};

// The defaults are generous for real programs (docs/daemon.md says why each): a program that
// reaches one is most likely leaking.
inline constexpr std::array<ClientLimitSpec, static_cast<std::size_t>(ClientLimit::kCount)>
    kClientLimitSpecs{{
        {"streams", "streams", 1024, false},
        {"events", "events", 65536, false},
        {"modules", "modules, libraries and JIT links", 16384, false},
        {"graphs", "graphs and executable graphs", 16384, false},
        {"memory-pools", "memory pools", 256, false},
        {"allocations", "device allocations", 1u << 20, false},
        // 0: half of the host's memory, decided when the server starts (resolve_defaults).
        {"pinned", "bytes of pinned host memory", 0, true},
        {"host-functions", "queued host functions", 16384, false},
        {"in-flight", "operations in flight", 1024, false},
        {"ipc-opens", "opened IPC memory handles", 16384, false},
    }};

inline const ClientLimitSpec& spec_of(ClientLimit limit) {
  return kClientLimitSpecs[static_cast<std::size_t>(limit)];
}

// The cap of each kind for every client of a server; 0 means none.
struct ClientLimits {
  std::array<std::uint64_t, static_cast<std::size_t>(ClientLimit::kCount)> values{};

  ClientLimits();
  std::uint64_t operator[](ClientLimit limit) const {
    return values[static_cast<std::size_t>(limit)];
  }
  void set(ClientLimit limit, std::uint64_t value) {
    values[static_cast<std::size_t>(limit)] = value;
  }
};

std::optional<ClientLimit> find_client_limit(std::string_view name);

// "streams=2048" into `limits`; the error names the argument and the known names. A value may
// be 0 (no cap). Sizes are plain bytes here: mpsshimd converts 4G before passing it on.
std::optional<std::string> parse_client_limit(std::string_view text, ClientLimits& limits);

// "streams, events, modules, ..." for usage texts.
std::string client_limit_names();

}  // namespace mpsshim::server
