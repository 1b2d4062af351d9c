// A stand-in for mpsshim-server that speaks the daemon's side of the protocol and nothing else,
// so the daemon can be tested without a GPU or a driver.
//
//   --device N --control-fd FD [anything else, kept for show_state]
//
// Environment:
//   FAKE_SERVER_DEVICES=N          GPUs it reports (default 1)
//   FAKE_SERVER_FAIL_DEVICE=K      the server for GPU K reports a failed start and exits 1
//   FAKE_SERVER_SILENT_DEVICE=K    the server for GPU K never answers kServerStatsQuery
//   FAKE_SERVER_CLIENTS=N          `ps` lists N clients (pids 5000...): an answer of several
//                                  messages (proto/text_parts.hpp)
//   FAKE_SERVER_HANG_ON_STOP=1     ignore SIGTERM and the daemon's hang-up (tests the daemon's
//                                  SIGKILL escalation)
//
// Behaviour: on ServerAdmit it sends the client a Refused with cuda_error 0 and the text
// "fake server <gpu> admitted pid <pid>"; kServerStatsQuery gets one client line naming
// "fake-client-gpu<gpu>" (the `ps` fields, or with the text "stats" the `stats` fields);
// kServerTerminateClient is acknowledged; kCtlRequest "crash" exits 70
// (as a GPU fault would), "hang_up" closes the control socket and lives on, "show_state" answers
// with its command line and the requests it took, "sm_partition_groups" with an H100's split,
// anything else is acknowledged and remembered.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "broker/daemon/wire.hpp"
#include "proto/control.hpp"
#include "proto/text_parts.hpp"
#include "proto/unix_socket.hpp"

namespace {

using namespace mpsshim;
using daemon::make_refused;
using daemon::make_text;
using daemon::text_of;
using proto::MessageKind;

constexpr int kExitGpuFault = 70;

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? std::atoi(value) : fallback;
}

proto::ServerReady make_ready(int gpu, int gpus, bool fail) {
  proto::ServerReady ready{};
  ready.header = proto::make_header(MessageKind::kServerReady, sizeof ready);
  ready.ordinal = gpu;
  ready.device_count = gpus;
  ready.pid = ::getpid();
  if (fail) {
    ready.status = 100;  // CUDA_ERROR_NO_DEVICE
    fmt::format_to_n(ready.message, sizeof ready.message - 1, "fake failure of GPU {}", gpu);
    return ready;
  }
  proto::DeviceSnapshot& d = ready.snapshot;
  fmt::format_to_n(d.name, sizeof d.name - 1, "Fake GPU {}", gpu);
  // UUIDs share their first byte so that "GPU-ab" is ambiguous and "GPU-ab22" names GPU 1.
  d.uuid[0] = 0xab;
  for (int i = 1; i < 16; ++i) d.uuid[i] = static_cast<std::uint8_t>(0x11 * (gpu + 1));
  d.total_memory = std::uint64_t{80} << 30;
  d.driver_version = 13000;
  d.ordinal = gpu;
  d.sm_count = 132;
  return ready;
}

}  // namespace

int main(int argc, char** argv) {
  int gpu = -1;
  int control = -1;
  std::string command_line;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    command_line += (i > 1 ? " " : "") + std::string(arg);
    if (arg == "--device" && i + 1 < argc) gpu = std::atoi(argv[i + 1]);
    if (arg == "--control-fd" && i + 1 < argc) control = std::atoi(argv[i + 1]);
  }
  if (gpu < 0 || control < 0) {
    fmt::print(stderr, "fake_server: --device and --control-fd are required\n");
    return 64;
  }
  bool hang_on_stop = env_int("FAKE_SERVER_HANG_ON_STOP", 0) == 1;
  if (hang_on_stop) ::signal(SIGTERM, SIG_IGN);

  bool fail = env_int("FAKE_SERVER_FAIL_DEVICE", -1) == gpu;
  proto::send_struct(control, make_ready(gpu, env_int("FAKE_SERVER_DEVICES", 1), fail));
  if (fail) return 1;
  bool silent = env_int("FAKE_SERVER_SILENT_DEVICE", -1) == gpu;
  const int many_clients = env_int("FAKE_SERVER_CLIENTS", 0);

  std::vector<std::string> taken;
  proto::Received message;
  while (proto::receive_message(control, message) == 0 && !message.bytes.empty()) {
    auto header = daemon::header_of(message);
    if (!header) continue;
    auto kind = static_cast<MessageKind>(header->kind);
    if (kind == MessageKind::kServerAdmit) {
      auto admit = daemon::decode<proto::ServerAdmit>(message);
      if (!admit || message.fds.size() != 1) continue;
      proto::send_struct(
          message.fds[0].get(),
          make_refused(0, fmt::format("fake server {} admitted pid {}", gpu, admit->peer_pid)));
      continue;
    }
    auto request = daemon::decode<proto::TextMessage>(message);
    if (!request) continue;
    std::string text = text_of(*request);
    if (kind == MessageKind::kServerStatsQuery && text == "stats") {
      if (silent) continue;
      proto::send_struct(
          control,
          make_text(MessageKind::kServerStats, 0,
                    fmt::format("client=1 pid=4242 uid={} program=fake-client-gpu{} "
                                "records=20512 server_us=55123 delay_samples=20512 "
                                "delay_p50_us=0.4 delay_p99_us=3.1 delay_max_us=8.2 "
                                "batches=300 batched=19200 fence_watches=12 watch_wakes=9 dozes=7 "
                                "images_shared=441 "
                                "images_shared_bytes=289931264 images_private=3 "
                                "images_private_bytes=8388608 "
                                "worker=0 top=LaunchKernel:20000:51234,StreamSynchronize:12:3100"
                                "\nnot a client line\n",
                                ::getuid(), gpu)));
    } else if (kind == MessageKind::kServerStatsQuery && many_clients > 0) {
      if (silent) continue;
      std::string lines;
      for (int i = 0; i < many_clients; ++i) {
        lines += fmt::format(
            "client={} pid={} uid={} program=many-{} sms=8 sm_percentage=7 mem_used=0 "
            "mem_peak={} mem_limit=0 pinned=0 launches={} busy_us={} h2d_bytes={} d2h_bytes=0 "
            "d2d_bytes=0 priority=0 state=active start_time=1795568665.{:03}\n",
            i + 1, 5000 + i, ::getuid(), i, 4096 * i, i, 1000 * i, 512 * i, i);
      }
      for (const auto& part : proto::text_messages(MessageKind::kServerStats, 0, lines)) {
        proto::send_struct(control, part);
      }
    } else if (kind == MessageKind::kServerStatsQuery) {
      if (silent) continue;
      proto::send_struct(control,
                         make_text(MessageKind::kServerStats, 0,
                                   fmt::format("client=1 pid=4242 uid={} program=fake-client-gpu{} "
                                               "sms=66 sm_percentage=50 mem_used=1048576 "
                                               "mem_peak=3145728 mem_limit=0 pinned=65536 "
                                               "launches=7 busy_us=1250000 h2d_bytes=4096 "
                                               "d2h_bytes=2048 d2d_bytes=1024 priority=1 "
                                               "state={} start_time=1795568665.250 "
                                               "sms_held_back={} parked={} suspended_us={} "
                                               "worker=0\nnot a client line\n",
                                               ::getuid(), gpu, gpu == 1 ? "suspended" : "active",
                                               gpu == 1 ? 16 : 0, gpu == 1 ? 1048576 : 0,
                                               gpu == 1 ? 2500000 : 0)));
    } else if (kind == MessageKind::kServerTerminateClient) {
      proto::send_struct(control,
                         make_text(MessageKind::kCtlReply, 0,
                                   fmt::format("fake server {} terminated client {}", gpu, text)));
    } else if (kind == MessageKind::kCtlRequest && text == "crash") {
      ::_exit(kExitGpuFault);
    } else if (kind == MessageKind::kCtlRequest && text == "hang_up") {
      ::close(control);  // and live on, useless: the daemon must notice and replace us
      for (;;) ::pause();
    } else if (kind == MessageKind::kCtlRequest && text == "show_state") {
      proto::send_struct(control, make_text(MessageKind::kCtlReply, 0,
                                            fmt::format("args: {}\ntaken: {}\n", command_line,
                                                        fmt::join(taken, "; "))));
    } else if (kind == MessageKind::kCtlRequest && text == "sm_partition_groups") {
      // As an H100's server answers (static SM partitions).
      proto::send_struct(control, make_text(MessageKind::kCtlReply, 0, "groups=16 granularity=8"));
    } else if (kind == MessageKind::kCtlRequest) {
      taken.push_back(text);
      proto::send_struct(control, make_text(MessageKind::kCtlReply, 0,
                                            fmt::format("fake server {} took: {}", gpu, text)));
    }
  }
  while (hang_on_stop) ::pause();
  return 0;
}
