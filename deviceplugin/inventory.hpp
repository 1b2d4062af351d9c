// The node's GPUs as mpsshimd reports them (`gpu_states`), and the kubelet devices made of
// them: `replicas` devices per GPU, named `<GPU UUID>::<replica>` (NVIDIA's plugin names its
// shared replicas the same way), healthy while the GPU's server runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "deviceplugin/config.hpp"

namespace mpsshim::deviceplugin {

struct GpuState {
  int index = 0;      // mpsshimd's GPU number (the physical ordinal)
  std::string state;  // starting, running, restarting, failed, stopping, stopped
  std::string uuid;   // GPU-…; "-" before the server first reported
  std::uint64_t memory = 0;
  std::string name;
  bool healthy() const { return state == "running"; }
};

// Parses the daemon's `gpu_states` answer.
tl::expected<std::vector<GpuState>, std::string> parse_gpu_states(const std::string& text);

struct Replica {
  std::string id;  // `<uuid>::<n>`
  int gpu = 0;
  bool healthy = false;
};

// Every replica of every GPU that has a UUID (a GPU never reported cannot be named).
std::vector<Replica> replicas_of(const PluginConfig& config, const std::vector<GpuState>& gpus);

// The replica number of a device ID (`<uuid>::<n>` -> n).
std::optional<int> replica_number(const std::string& device_id);

// The GPU a device ID names, if it is one of `gpus`.
const GpuState* gpu_of_device(const std::vector<GpuState>& gpus, const std::string& device_id);

}  // namespace mpsshim::deviceplugin
