// Prometheus metrics of mpsshimd (`--metrics-listen`): the listen address, the listening TCP
// socket, and the text exposition format (version 0.0.4) of what the daemon knows. The HTTP side
// is metrics_server.hpp; the metrics themselves are listed in docs/metrics.md.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <tl/expected.hpp>

#include "broker/daemon/commands.hpp"
#include "broker/daemon/fault_log.hpp"
#include "broker/daemon/supervisor.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

// Where --metrics-listen listens: an IP address (no host names) and a port (0: any free one).
struct MetricsAddress {
  bool ipv6 = false;
  std::string host;  // as inet_pton reads it: "127.0.0.1", "::1"
  std::uint16_t port = 0;
};

// "9400" (127.0.0.1:9400), "127.0.0.1:9400", "0.0.0.0:9400", "[::1]:9400", "[::]:9400".
tl::expected<MetricsAddress, std::string> parse_metrics_address(std::string_view text);
// "127.0.0.1:9400", "[::1]:9400".
std::string format_metrics_address(const MetricsAddress& address);

struct MetricsListener {
  proto::UniqueFd fd;     // listening, non-blocking, close-on-exec
  MetricsAddress actual;  // the port really bound (port 0 picks one)
};
tl::expected<MetricsListener, std::string> listen_metrics(const MetricsAddress& address);

// A label value as the exposition format writes it between its double quotes: backslash,
// double quote and newline escaped; bytes that are not UTF-8 replaced by U+FFFD (Prometheus
// refuses a scrape with invalid UTF-8 in a label value).
std::string escape_label_value(std::string_view value);

// Everything one scrape reports.
struct MetricsInput {
  double start_time_seconds = 0;  // unix time the daemon started
  std::string version;            // empty: no build info sample
  int abi_major = 0;
  int abi_minor = 0;
  std::vector<ServerStatus> servers;  // by GPU: its shared server
  Commands::ClientReports reports;    // the servers that answered this scrape
  std::vector<int> group_servers{};   // by GPU: isolation-group servers running
  std::vector<int> group_faults{};    // by GPU: isolation-group servers ended by a GPU fault
  // GPU faults by their likely culprit: (gpu, uid, program) -> count (fault_log.hpp).
  std::map<FaultLog::Key, std::uint64_t> client_faults{};
};

// The body of GET /metrics.
std::string format_metrics(const MetricsInput& input);

inline constexpr std::string_view kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace mpsshim::daemon
