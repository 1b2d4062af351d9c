#include "broker/daemon/metrics.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "broker/daemon/visible_devices.hpp"
#include "broker/daemon/wire.hpp"

namespace mpsshim::daemon {

namespace {

constexpr std::string_view kAddressHelp =
    "give PORT, IPV4:PORT or [IPV6]:PORT, e.g. 9400, 127.0.0.1:9400, 0.0.0.0:9400 or [::1]:9400";

tl::expected<std::uint16_t, std::string> parse_port(std::string_view text, std::string_view whole) {
  unsigned value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size() || value > 65535) {
    return tl::unexpected(fmt::format("--metrics-listen `{}`: `{}` is not a port (0-65535); {}",
                                      whole, text, kAddressHelp));
  }
  return static_cast<std::uint16_t>(value);
}

std::optional<double> number_of(const ClientFields& fields, std::string_view key) {
  auto it = fields.find(key);
  if (it == fields.end()) return std::nullopt;
  const std::string& text = it->second;
  double value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size() ||
      !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

// Whole numbers without an exponent while they are exact; others as fmt writes them
// (shortest round trip), which Prometheus' parser reads.
std::string format_value(double value) {
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    return fmt::format("{:.0f}", value);
  }
  return fmt::format("{}", value);
}

// Length of the valid UTF-8 sequence at the start of `text`, 0 when it is not one.
std::size_t utf8_sequence(std::string_view text) {
  auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  std::uint32_t code = 0;
  if ((lead & 0xe0) == 0xc0) {
    length = 2;
    code = lead & 0x1f;
  } else if ((lead & 0xf0) == 0xe0) {
    length = 3;
    code = lead & 0x0f;
  } else if ((lead & 0xf8) == 0xf0) {
    length = 4;
    code = lead & 0x07;
  } else {
    return 0;
  }
  if (text.size() < length) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xc0) != 0x80) return 0;
    code = (code << 6) | (byte(i) & 0x3f);
  }
  constexpr std::uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < kSmallest[length] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return 0;
  return length;
}

// One metric family: HELP and TYPE, then its samples ("{labels} value").
struct Family {
  Family(std::string_view name, std::string_view type, std::string_view help)
      : name(name), type(type), help(help) {}

  std::string_view name;
  std::string_view type;
  std::string_view help;
  std::string samples;

  void add(const std::string& labels, double value) {
    samples += fmt::format("{}{} {}\n", name, labels, format_value(value));
  }
};

using Labels = std::vector<std::pair<std::string_view, std::string>>;

std::string label_text(const Labels& labels) {
  if (labels.empty()) return "";
  std::string text = "{";
  for (const auto& [key, value] : labels) {
    if (text.size() > 1) text += ',';
    text += fmt::format("{}=\"{}\"", key, escape_label_value(value));
  }
  return text + "}";
}

std::string gpu_label(int gpu) {
  return label_text({{"gpu", std::to_string(gpu)}});
}

// gpu, client (when the server gives it), pid, user, program; allocation, namespace and pod
// for a client of a Kubernetes allocation (docs/kubernetes.md).
std::string client_labels(int gpu, const ClientFields& fields) {
  auto text = [&](std::string_view key) -> std::string {
    auto it = fields.find(key);
    return it == fields.end() ? "" : it->second;
  };
  Labels labels{{"gpu", std::to_string(gpu)}};
  if (std::string client = text("client"); !client.empty()) labels.emplace_back("client", client);
  labels.emplace_back("pid", text("pid"));
  std::string uid = text("uid");
  labels.emplace_back("user", uid.empty() ? "" : user_name_of(uid));
  labels.emplace_back("program", text("program"));
  if (std::string allocation = text("allocation"); !allocation.empty() && allocation != "0") {
    labels.emplace_back("allocation", allocation);
    if (std::string pod = text("pod"); !pod.empty()) {
      labels.emplace_back("namespace", text("namespace"));
      labels.emplace_back("pod", pod);
    }
  }
  return label_text(labels);
}

}  // namespace

tl::expected<MetricsAddress, std::string> parse_metrics_address(std::string_view text) {
  MetricsAddress address;
  std::string_view port_text;
  if (text.find(':') == std::string_view::npos && text.find('[') == std::string_view::npos) {
    address.host = "127.0.0.1";  // a bare port: this machine only
    port_text = text;
  } else if (text.starts_with('[')) {
    std::size_t close = text.find("]:");
    if (close == std::string_view::npos) {
      return tl::unexpected(
          fmt::format("--metrics-listen `{}`: an IPv6 address needs its port after `]:`; {}", text,
                      kAddressHelp));
    }
    address.ipv6 = true;
    address.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    std::size_t colon = text.rfind(':');
    address.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    if (address.host.find(':') != std::string::npos) {
      return tl::unexpected(fmt::format(
          "--metrics-listen `{}`: put an IPv6 address in brackets; {}", text, kAddressHelp));
    }
  }
  auto port = parse_port(port_text, text);
  if (!port) return tl::unexpected(port.error());
  address.port = *port;
  unsigned char scratch[sizeof(in6_addr)];
  if (::inet_pton(address.ipv6 ? AF_INET6 : AF_INET, address.host.c_str(), scratch) != 1) {
    return tl::unexpected(fmt::format("--metrics-listen `{}`: `{}` is not an IP{} address; {}",
                                      text, address.host, address.ipv6 ? "v6" : "v4",
                                      kAddressHelp));
  }
  return address;
}

std::string format_metrics_address(const MetricsAddress& address) {
  return address.ipv6 ? fmt::format("[{}]:{}", address.host, address.port)
                      : fmt::format("{}:{}", address.host, address.port);
}

tl::expected<MetricsListener, std::string> listen_metrics(const MetricsAddress& address) {
  auto failure = [&](std::string_view what) {
    return tl::unexpected(fmt::format("cannot listen for metrics on {}: {}: {}",
                                      format_metrics_address(address), what, std::strerror(errno)));
  };
  int family = address.ipv6 ? AF_INET6 : AF_INET;
  proto::UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return failure("socket");
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_storage storage{};
  socklen_t length = 0;
  if (address.ipv6) {
    ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(address.port);
    ::inet_pton(AF_INET6, address.host.c_str(), &in6->sin6_addr);
    length = sizeof *in6;
  } else {
    auto* in4 = reinterpret_cast<sockaddr_in*>(&storage);
    in4->sin_family = AF_INET;
    in4->sin_port = htons(address.port);
    ::inet_pton(AF_INET, address.host.c_str(), &in4->sin_addr);
    length = sizeof *in4;
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&storage), length) != 0) return failure("bind");
  if (::listen(fd.get(), 16) != 0) return failure("listen");
  MetricsAddress actual = address;
  sockaddr_storage bound{};
  socklen_t bound_length = sizeof bound;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &bound_length) == 0) {
    actual.port = ntohs(address.ipv6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                     : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  return MetricsListener{std::move(fd), std::move(actual)};
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  while (!value.empty()) {
    std::size_t length = utf8_sequence(value);
    if (length == 0) {
      out += "\xef\xbf\xbd";  // U+FFFD REPLACEMENT CHARACTER
      value.remove_prefix(1);
      continue;
    }
    switch (value.front()) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out.append(value.data(), length);
    }
    value.remove_prefix(length);
  }
  return out;
}

std::string format_metrics(const MetricsInput& input) {
  Family start{"mpsshim_daemon_start_time_seconds", "gauge",
               "Start time of mpsshimd since the unix epoch, in seconds."};
  Family build{"mpsshim_build_info", "gauge",
               "Always 1; labels: the mpsshimd version and the mpsshim ABI it speaks."};
  Family up{"mpsshim_server_up", "gauge",
            "1 while the GPU's mpsshim-server runs and takes clients, else 0."};
  Family restarts{"mpsshim_server_restarts_total", "counter",
                  "Times mpsshimd restarted the GPU's server."};
  Family faults{"mpsshim_server_gpu_faults_total", "counter",
                "Times the GPU's server exited after a GPU fault (exit status 70)."};
  Family group_servers{"mpsshim_isolation_group_servers", "gauge",
                       "Server processes of isolation groups running on the GPU (mpsshimd "
                       "--isolation), beside its shared server."};
  Family group_faults{"mpsshim_isolation_group_gpu_faults_total", "counter",
                      "Times a server of an isolation group on the GPU exited after a GPU fault "
                      "(exit status 70); only that group's clients lost their work."};
  Family client_faults{"mpsshim_client_faults_total", "counter",
                       "GPU faults whose likely cause was a client of this user and program: its "
                       "work returned the fault first (docs/isolation.md)."};
  Family answered{"mpsshim_server_scrape_answered", "gauge",
                  "1 when the GPU's server answered this scrape's client queries in time, else 0 "
                  "(its client metrics are then missing)."};
  Family clients{"mpsshim_server_clients", "gauge", "Clients connected to the GPU's server."};
  Family info{"mpsshim_gpu_info", "gauge",
              "Always 1; labels: the GPU's name, UUID and the server's driver version."};
  Family sms{"mpsshim_gpu_sms", "gauge", "Streaming multiprocessors of the GPU."};
  Family memory{"mpsshim_gpu_memory_bytes", "gauge", "Device memory of the GPU, in bytes."};
  Family launches{"mpsshim_client_launches_total", "counter", "Kernels the client launched."};
  Family used{"mpsshim_client_memory_used_bytes", "gauge",
              "Device memory the client holds, in bytes."};
  Family limit{"mpsshim_client_memory_limit_bytes", "gauge",
               "The client's device memory limit, in bytes; no sample when it has none."};
  Family client_sms{"mpsshim_client_sms", "gauge",
                    "Streaming multiprocessors the client's work runs on now: its SM quota, less "
                    "those it leaves to normal-priority clients (see "
                    "mpsshim_client_sms_held_back)."};
  Family held_back{"mpsshim_client_sms_held_back", "gauge",
                   "Streaming multiprocessors of the client's SM quota it leaves to "
                   "normal-priority clients now (mpsshimd --priority-reserve-sms); 0 for others."};
  Family peak{"mpsshim_client_memory_peak_bytes", "gauge",
              "The most device memory the client has held since it connected, in bytes."};
  Family pinned{"mpsshim_client_pinned_host_memory_bytes", "gauge",
                "Pinned host memory the client holds (cuMemAllocHost, registered), in bytes."};
  Family suspended{"mpsshim_client_suspended", "gauge",
                   "1 while the operator has the client suspended (mpsshimctl suspend), else 0."};
  Family parked{"mpsshim_client_parked_bytes", "gauge",
                "Device memory of the suspended client parked in the server's host memory, in "
                "bytes."};
  Family suspended_time{"mpsshim_client_suspended_seconds_total", "counter",
                        "Time the client has spent suspended, in seconds."};
  Family busy{"mpsshim_client_busy_seconds_total", "counter",
              "GPU time of the client's work, measured on the GPU with events around it and "
              "summed over its streams, in seconds."};
  Family copied{"mpsshim_client_copied_bytes_total", "counter",
                "Bytes the client copied; label direction: h2d, d2h or d2d."};
  Family client_start{"mpsshim_client_start_time_seconds", "gauge",
                      "When the client connected, since the unix epoch, in seconds."};
  Family records{"mpsshim_client_records_total", "counter",
                 "Ring records (driver calls) the server executed for the client."};
  Family server_seconds{"mpsshim_client_server_seconds_total", "counter",
                        "Server time spent executing the client's records, in seconds."};
  Family batched{"mpsshim_client_launches_batched_total", "counter",
                 "Kernel launches of the client that went out inside graph launches."};
  Family graphs{"mpsshim_client_graph_launches_total", "counter",
                "Graph launches the server issued for the client's batched kernel launches."};
  Family images{"mpsshim_client_images_loaded_total", "counter",
                "Kernel images the client loaded: shared with other clients, or its own."};
  Family image_bytes{"mpsshim_client_image_bytes_loaded_total", "counter",
                     "Bytes of the kernel images the client loaded: shared, or its own."};

  start.add("", input.start_time_seconds);
  if (!input.version.empty()) {
    build.add(label_text({{"version", input.version},
                          {"abi", fmt::format("{}.{}", input.abi_major, input.abi_minor)}}),
              1);
  }

  std::vector<int> client_count(input.servers.size(), -1);  // -1: did not answer
  for (const ServerClients& server : input.reports.ps) {
    if (server.gpu >= 0 && static_cast<std::size_t>(server.gpu) < client_count.size()) {
      client_count[server.gpu] = 0;
    }
  }
  for_each_client(input.reports.ps, [&](int gpu, const ClientFields& fields) {
    if (gpu >= 0 && static_cast<std::size_t>(gpu) < client_count.size()) ++client_count[gpu];
    std::string labels = client_labels(gpu, fields);
    if (auto v = number_of(fields, "launches")) launches.add(labels, *v);
    if (auto v = number_of(fields, "mem_used")) used.add(labels, *v);
    if (auto v = number_of(fields, "mem_limit"); v && *v > 0) limit.add(labels, *v);
    if (auto v = number_of(fields, "sms")) client_sms.add(labels, *v);
    if (auto v = number_of(fields, "sms_held_back")) held_back.add(labels, *v);
    if (auto v = number_of(fields, "mem_peak")) peak.add(labels, *v);
    if (auto v = number_of(fields, "pinned")) pinned.add(labels, *v);
    if (auto state = fields.find("state"); state != fields.end()) {
      const bool off_gpu = state->second == "suspended" || state->second == "preempted" ||
                           state->second == "mem-wait";
      suspended.add(labels, off_gpu ? 1 : 0);
    }
    if (auto v = number_of(fields, "parked")) parked.add(labels, *v);
    if (auto v = number_of(fields, "suspended_us")) suspended_time.add(labels, *v / 1e6);
    if (auto v = number_of(fields, "busy_us")) busy.add(labels, *v / 1e6);
    if (auto v = number_of(fields, "start_time")) client_start.add(labels, *v);
    for (std::string_view direction : {"h2d", "d2h", "d2d"}) {
      if (auto v = number_of(fields, fmt::format("{}_bytes", direction))) {
        // The direction label goes inside the client's braces.
        copied.add(
            fmt::format("{},direction=\"{}\"}}", labels.substr(0, labels.size() - 1), direction),
            *v);
      }
    }
  });
  for_each_client(input.reports.stats, [&](int gpu, const ClientFields& fields) {
    std::string labels = client_labels(gpu, fields);
    if (auto v = number_of(fields, "records")) records.add(labels, *v);
    if (auto v = number_of(fields, "server_us")) server_seconds.add(labels, *v / 1e6);
    if (auto v = number_of(fields, "batched")) batched.add(labels, *v);
    if (auto v = number_of(fields, "batches")) graphs.add(labels, *v);
    for (std::string_view sharing : {"shared", "private"}) {
      // The sharing label goes inside the client's braces.
      const std::string with_sharing =
          fmt::format("{},sharing=\"{}\"}}", labels.substr(0, labels.size() - 1), sharing);
      if (auto v = number_of(fields, fmt::format("images_{}", sharing))) {
        images.add(with_sharing, *v);
      }
      if (auto v = number_of(fields, fmt::format("images_{}_bytes", sharing))) {
        image_bytes.add(with_sharing, *v);
      }
    }
  });

  for (std::size_t i = 0; i < input.servers.size(); ++i) {
    const ServerStatus& server = input.servers[i];
    const int gpu = static_cast<int>(i);
    const std::string labels = gpu_label(gpu);
    up.add(labels, server.state == ServerState::kRunning ? 1 : 0);
    restarts.add(labels, server.restarts);
    faults.add(labels, server.gpu_faults);
    if (i < input.group_servers.size()) group_servers.add(labels, input.group_servers[i]);
    if (i < input.group_faults.size()) group_faults.add(labels, input.group_faults[i]);
    answered.add(labels, client_count[i] >= 0 ? 1 : 0);
    if (client_count[i] >= 0) clients.add(labels, client_count[i]);
    if (server.snapshot) {
      const proto::DeviceSnapshot& d = *server.snapshot;
      info.add(label_text({{"gpu", std::to_string(gpu)},
                           {"name", bounded_string(d.name)},
                           {"uuid", format_gpu_uuid(d.uuid)},
                           {"driver_version", std::to_string(d.driver_version)}}),
               1);
      sms.add(labels, d.sm_count);
      memory.add(labels, static_cast<double>(d.total_memory));
    }
  }

  for (const auto& [key, count] : input.client_faults) {
    const auto& [gpu, uid, program] = key;
    client_faults.add(label_text({{"gpu", std::to_string(gpu)},
                                  {"user", user_name_of(std::to_string(uid))},
                                  {"program", program}}),
                      static_cast<double>(count));
  }

  std::string text;
  for (const Family* family :
       {&start,        &build,         &up,        &restarts,       &faults,         &group_servers,
        &group_faults, &client_faults, &answered,  &clients,        &info,           &sms,
        &memory,       &launches,      &used,      &limit,          &client_sms,     &held_back,
        &peak,         &pinned,        &suspended, &parked,         &suspended_time, &busy,
        &copied,       &client_start,  &records,   &server_seconds, &batched,        &graphs,
        &images,       &image_bytes}) {
    text += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}", family->name, family->help, family->name,
                        family->type, family->samples);
  }
  return text;
}

}  // namespace mpsshim::daemon
