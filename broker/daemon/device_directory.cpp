#include "broker/daemon/device_directory.hpp"

#include <cuda.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "broker/daemon/visible_devices.hpp"
#include "broker/daemon/wire.hpp"

namespace mpsshim::daemon {

namespace {

constexpr int kNotReady = CUDA_ERROR_MPS_SERVER_NOT_READY;

}  // namespace

tl::expected<std::vector<int>, Refusal> visible_gpus(const Supervisor& supervisor,
                                                     const proto::ClientHello& hello) {
  if (!supervisor.gpu_count_known()) {
    const ServerStatus& first = supervisor.status(0);
    if (first.state == ServerState::kFailed) {
      return tl::unexpected(Refusal{
          kNotReady, fmt::format("mpsshimd has no usable GPU: the server for GPU 0 failed ({}); "
                                 "the operator can see why with `mpsshimctl server_list`",
                                 first.problem)});
    }
    return tl::unexpected(
        Refusal{kNotReady, "mpsshimd is still starting its GPU servers; try again in a moment"});
  }
  std::vector<std::optional<GpuUuid>> uuids;
  for (int i = 0; i < supervisor.gpu_count(); ++i) {
    const auto& snapshot = supervisor.status(i).snapshot;
    if (!snapshot) {
      uuids.emplace_back();
      continue;
    }
    GpuUuid uuid;
    std::copy(std::begin(snapshot->uuid), std::end(snapshot->uuid), uuid.begin());
    uuids.emplace_back(uuid);
  }
  return resolve_visible_devices(bounded_string(hello.visible_devices), uuids);
}

tl::expected<std::vector<std::byte>, Refusal> answer_query(const Supervisor& supervisor,
                                                           const proto::ClientHello& hello) {
  auto visible = visible_gpus(supervisor, hello);
  if (!visible) return tl::unexpected(visible.error());
  proto::DaemonDevices head{};
  std::size_t bytes = sizeof head + visible->size() * sizeof(proto::DeviceSnapshot);
  head.header =
      proto::make_header(proto::MessageKind::kDaemonDevices, static_cast<std::uint32_t>(bytes));
  head.device_count = static_cast<std::uint32_t>(visible->size());
  std::vector<std::byte> message(bytes);
  std::memcpy(message.data(), &head, sizeof head);
  std::size_t offset = sizeof head;
  for (int ordinal : *visible) {
    const ServerStatus& status = supervisor.status(ordinal);
    if (!status.snapshot) {
      return tl::unexpected(Refusal{
          kNotReady, fmt::format("GPU {} is not available: its server is {}{}{}", ordinal,
                                 state_name(status.state), status.problem.empty() ? "" : " (",
                                 status.problem.empty() ? "" : status.problem + ")")});
    }
    std::memcpy(message.data() + offset, &*status.snapshot, sizeof(proto::DeviceSnapshot));
    offset += sizeof(proto::DeviceSnapshot);
  }
  return message;
}

tl::expected<int, Refusal> resolve_attach(const Supervisor& supervisor,
                                          const proto::ClientHello& hello) {
  auto visible = visible_gpus(supervisor, hello);
  if (!visible) return tl::unexpected(visible.error());
  if (hello.device < 0 || static_cast<std::size_t>(hello.device) >= visible->size()) {
    return tl::unexpected(
        Refusal{CUDA_ERROR_INVALID_DEVICE,
                fmt::format("device {} does not exist: this client sees {} device(s) "
                            "(CUDA_VISIBLE_DEVICES=\"{}\")",
                            hello.device, visible->size(), bounded_string(hello.visible_devices))});
  }
  return (*visible)[static_cast<std::size_t>(hello.device)];
}

}  // namespace mpsshim::daemon
