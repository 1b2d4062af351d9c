// mpsshim-server: started by mpsshimd, one per GPU. See server.hpp.
#include <signal.h>
#include <unistd.h>
#include <chrono>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "broker/server/core/idle_strategy.hpp"
#include "broker/server/core/options.hpp"
#include "broker/server/core/server.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/driver/gpu.hpp"
#include "common/log.hpp"
#include "proto/control.hpp"

namespace {

std::atomic<bool> g_stop{false};

void on_signal(int) {
  g_stop.store(true);
}

void install_signal_handlers() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;  // no SA_RESTART: a parked epoll_wait returns so the loop sees the stop
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

// Tells the daemon how the start went. A server that cannot start says why and exits 1.
void send_ready(int control_fd, int ordinal, int device_count, CUresult status,
                const std::string& message, const mpsshim::proto::DeviceSnapshot* snapshot) {
  using namespace mpsshim::proto;
  ServerReady ready{};
  ready.header = make_header(MessageKind::kServerReady, sizeof ready);
  ready.ordinal = ordinal;
  ready.device_count = device_count;
  ready.pid = static_cast<std::int32_t>(::getpid());
  ready.status = static_cast<std::int32_t>(status);
  std::strncpy(ready.message, message.c_str(), sizeof ready.message - 1);
  if (snapshot != nullptr) ready.snapshot = *snapshot;
  if (int rc = send_struct(control_fd, ready); rc != 0) {
    mpsshim::log_error("could not tell the daemon the server is {}: {}",
                       status == CUDA_SUCCESS ? "ready" : "not starting", std::strerror(rc));
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace mpsshim::server;
  using namespace mpsshim;  // the log (common/log.hpp)
  auto options =
      parse_options(std::span<const char* const>(argv + 1, static_cast<std::size_t>(argc - 1)));
  if (!options) {
    std::fprintf(stderr, "mpsshim-server: %s\n%s", options.error().c_str(), server_usage().c_str());
    return 2;
  }
  if (options->help) {
    std::fputs(server_usage().c_str(), stdout);
    return 0;
  }
  set_log_level(options->log_level);
  // Its stderr is the daemon's log: time-stamped lines like the daemon's, never the shim's
  // MPSSHIM_LOG_FILE.
  configure_log(LogIdentity{"mpsshim-server", fmt::format("gpu {}", options->device), true});
  set_log_fd(STDERR_FILENO);
  install_signal_handlers();
  mpsshim::proto::UniqueFd control(options->control_fd);

  // Every client stream is a hardware queue of its own only if the driver opens enough of
  // them: with the default 8, streams of different clients share queues and stall each other
  // (measured: 16 launching threads reach ~590 k kernels/s with 8, 697 k with 32). Read by the
  // driver at cuInit; an operator's own setting wins.
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
  auto driver = load_driver(options->driver);
  if (!driver) {
    log_error("{}", driver.error().message);
    send_ready(control.get(), options->device, 0, driver.error().status, driver.error().message,
               nullptr);
    return 1;
  }
  auto gpu = open_gpu(*driver, options->device);
  if (!gpu) {
    log_error("{}", gpu.error().message);
    send_ready(control.get(), options->device, 0, gpu.error().status, gpu.error().message, nullptr);
    return 1;
  }
  log_info("serving {} (device {}, {} SMs, {}, driver {}) with {}", gpu->snapshot.name,
           options->device, gpu->snapshot.sm_count, format_bytes(gpu->snapshot.total_memory),
           gpu->snapshot.driver_version, options->driver);

  const int control_fd = control.get();
  Server server(*gpu, options->settings, std::move(control));
  send_ready(control_fd, options->device, gpu->device_count, CUDA_SUCCESS, "ready", &gpu->snapshot);

  int code = server.run(g_stop);
  log_info("stopped");
  return code;
}
