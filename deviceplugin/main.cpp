// mpsshim-device-plugin: advertises mpsshimd's GPUs to the kubelet as shared devices and, on
// Allocate, registers each container's quota with mpsshimd. See docs/kubernetes.md.
//
//   mpsshim-device-plugin --config /etc/mpsshim/device-plugin.toml
//
// Exit status: 0 after SIGTERM/SIGINT, 1 when it cannot start (the log says why), 2 for a bad
// command line.
#include <fmt/format.h>
#include <getopt.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include "broker/daemon/log.hpp"
#include "deviceplugin/config.hpp"
#include "deviceplugin/deviceplugin_v1beta1.grpc.pb.h"
#include "deviceplugin/plugin.hpp"

namespace {

using namespace mpsshim;

constexpr const char* kApiVersion = "v1beta1";
constexpr const char* kKubeletSocket = "kubelet.sock";

constexpr const char* kUsage = R"(usage: mpsshim-device-plugin [options]

Advertises the GPUs mpsshimd serves to the kubelet as shared devices (replicas per GPU) and gives
every container that gets some a quota mpsshimd enforces. See docs/kubernetes.md.

  --config PATH        TOML sharing config (default: built-in defaults)
  --plugin-dir DIR     the kubelet's device-plugin directory (overrides plugin_dir)
  --runtime-dir DIR    mpsshimd's runtime directory (overrides runtime_dir)
  --log-level LEVEL    error, warn, info (default), debug or trace
  --check-config       read --config, print the sharing it gives and exit (0: valid)
  -h, --help           this text
)";

struct Options {
  std::string config_path;
  std::string plugin_dir;
  std::string runtime_dir;
  LogLevel log_level = LogLevel::kInfo;
  bool check_config = false;
};

std::optional<Options> parse_options(int argc, char** argv) {
  static const option kLong[] = {
      {"config", required_argument, nullptr, 'c'},
      {"plugin-dir", required_argument, nullptr, 'p'},
      {"runtime-dir", required_argument, nullptr, 'r'},
      {"log-level", required_argument, nullptr, 'l'},
      {"check-config", no_argument, nullptr, 'k'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  Options options;
  for (int c; (c = ::getopt_long(argc, argv, "h", kLong, nullptr)) != -1;) {
    switch (c) {
      case 'c':
        options.config_path = optarg;
        break;
      case 'p':
        options.plugin_dir = optarg;
        break;
      case 'r':
        options.runtime_dir = optarg;
        break;
      case 'k':
        options.check_config = true;
        break;
      case 'l':
        if (auto level = parse_log_level(optarg)) {
          options.log_level = *level;
          break;
        }
        fmt::print(stderr, "--log-level takes error, warn, info, debug or trace, not `{}`\n",
                   optarg);
        return std::nullopt;
      case 'h':
        fmt::print("{}", kUsage);
        std::exit(0);
      default:
        fmt::print(stderr, "{}", kUsage);
        return std::nullopt;
    }
  }
  if (optind != argc) {
    fmt::print(stderr, "unexpected argument `{}`\n{}", argv[optind], kUsage);
    return std::nullopt;
  }
  return options;
}

// Registers the plugin's socket with the kubelet; the kubelet then connects to it.
bool register_with_kubelet(const deviceplugin::PluginConfig& config) {
  auto channel = grpc::CreateChannel("unix:" + config.plugin_dir + "/" + kKubeletSocket,
                                     grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  v1beta1::RegisterRequest request;
  request.set_version(kApiVersion);
  request.set_endpoint(config.endpoint);
  request.set_resource_name(config.resource_name);
  request.mutable_options()->set_get_preferred_allocation_available(true);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1beta1::Empty empty;
  grpc::Status status = stub->Register(&context, request, &empty);
  if (!status.ok()) {
    log_warn("registering {} with the kubelet at {}/{} failed: {}", config.resource_name,
             config.plugin_dir, kKubeletSocket, status.error_message());
    return false;
  }
  log_info("registered {} with the kubelet (endpoint {})", config.resource_name, config.endpoint);
  return true;
}

ino_t inode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

}  // namespace

int main(int argc, char** argv) {
  daemon::configure_daemon_log("mpsshim-device-plugin");
  auto options = parse_options(argc, argv);
  if (!options) return 2;
  set_log_level(options->log_level);
  deviceplugin::PluginConfig config;
  if (!options->config_path.empty()) {
    auto loaded = deviceplugin::load_config(options->config_path);
    if (!loaded) {
      log_error("{}", loaded.error());
      return 1;
    }
    config = std::move(*loaded);
  }
  if (!options->plugin_dir.empty()) config.plugin_dir = options->plugin_dir;
  if (!options->runtime_dir.empty()) config.runtime_dir = options->runtime_dir;
  if (options->check_config) {
    fmt::print("resource {}: {} replicas per GPU{}\n", config.resource_name,
               config.sharing.replicas, config.models.empty() ? "" : " unless a [[model]] matches");
    for (const deviceplugin::SharingRule& model : config.models) {
      fmt::print("  GPUs named *{}*: {} replicas\n", model.match, model.replicas);
    }
    return 0;
  }

  // Signals are taken by sigtimedwait below, on this thread only.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  ::pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  deviceplugin::DevicePlugin plugin(config);
  plugin.poll_daemon();
  std::thread poller([&plugin] { plugin.run_poller(); });

  const std::string socket = config.plugin_dir + "/" + config.endpoint;
  const std::string kubelet_socket = config.plugin_dir + "/" + kKubeletSocket;
  int status = 0;
  bool stopping = false;
  while (!stopping) {
    ::unlink(socket.c_str());  // one left by an earlier run
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
    builder.RegisterService(&plugin);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (!server) {
      log_error("cannot serve on {}", socket);
      status = 1;
      break;
    }
    log_info("serving {} on {} ({} devices; mpsshimd at {})", config.resource_name, socket,
             plugin.device_count(), config.runtime_dir);
    bool registered = false;
    ino_t kubelet_inode = 0;
    // A kubelet that restarts removes every socket in its directory and makes a new
    // kubelet.sock: serve again and register again.
    for (;;) {
      if (!registered) {
        kubelet_inode = inode_of(kubelet_socket);
        registered = kubelet_inode != 0 && register_with_kubelet(config);
      }
      timespec second{1, 0};
      int signal = ::sigtimedwait(&stop_signals, nullptr, &second);
      if (signal == SIGTERM || signal == SIGINT) {
        log_info("{}: stopping", signal == SIGTERM ? "SIGTERM" : "SIGINT");
        stopping = true;
        break;
      }
      if (inode_of(socket) == 0) {
        log_warn("{} was removed (the kubelet restarted?); serving and registering again", socket);
        break;
      }
      if (registered && inode_of(kubelet_socket) != kubelet_inode) {
        log_warn("{} changed (the kubelet restarted); registering again", kubelet_socket);
        registered = false;
      }
    }
    plugin.stop();  // ends the ListAndWatch streams, so Shutdown does not wait for them
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (!stopping) {
      poller.join();
      plugin.restart();
      poller = std::thread([&plugin] { plugin.run_poller(); });
    }
  }
  plugin.stop();
  poller.join();
  ::unlink(socket.c_str());
  return status;
}
