// What a client sees: its visible GPUs (CUDA_VISIBLE_DEVICES applied to the GPUs the servers
// reported) for kClientQuery, and the physical GPU behind its device ordinal for kClientAttach.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "broker/daemon/supervisor.hpp"
#include "proto/control.hpp"

namespace mpsshim::daemon {

// The CUresult and sentence a refused client gets.
struct Refusal {
  int cuda_error;
  std::string message;
};

// The kDaemonDevices message (header + one DeviceSnapshot per visible GPU, in the client's
// order), or why the client cannot have it now.
tl::expected<std::vector<std::byte>, Refusal> answer_query(const Supervisor& supervisor,
                                                           const proto::ClientHello& hello);

// The physical ordinals of the GPUs the client sees, in its order (CUDA_VISIBLE_DEVICES applied).
tl::expected<std::vector<int>, Refusal> visible_gpus(const Supervisor& supervisor,
                                                     const proto::ClientHello& hello);

// The physical ordinal of the client's hello.device.
tl::expected<int, Refusal> resolve_attach(const Supervisor& supervisor,
                                          const proto::ClientHello& hello);

}  // namespace mpsshim::daemon
