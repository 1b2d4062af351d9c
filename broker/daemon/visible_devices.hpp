// CUDA_VISIBLE_DEVICES, interpreted the way the CUDA driver does, so a client sees the same
// devices in the same order under mpsshim as without it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mpsshim::daemon {

using GpuUuid = std::array<std::uint8_t, 16>;

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it.
std::string format_gpu_uuid(const GpuUuid& uuid);
std::string format_gpu_uuid(const std::uint8_t (&uuid)[16]);

// Physical ordinals named by `spec`, in its order. `uuids[i]` is physical GPU i's UUID, or
// nullopt when not known yet (such a GPU can be named by index only).
//
// As CUDA does: items are comma-separated integers or "GPU-<uuid prefix>"; the list ends at the
// first item that is invalid, out of range, ambiguous or a repeat, and the items before it stay
// visible. "MIG-" items are not supported and therefore end the list. An empty spec means every
// GPU.
std::vector<int> resolve_visible_devices(std::string_view spec,
                                         std::span<const std::optional<GpuUuid>> uuids);

}  // namespace mpsshim::daemon
