// What one container gets for the replicas the kubelet gave it: the quota (a replica's share
// times the replicas it holds on a GPU), the GPUs, and then what Allocate answers: mounts and
// environment, with the token mpsshimd issued for the quota.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "deviceplugin/config.hpp"
#include "deviceplugin/deviceplugin_v1beta1.pb.h"
#include "deviceplugin/inventory.hpp"

namespace mpsshim::deviceplugin {

struct AllocationPlan {
  std::vector<std::string> devices;  // the kubelet's device IDs
  std::vector<int> gpus;             // mpsshimd's GPU numbers, in first-seen order
  std::vector<std::string> uuids;    // the same GPUs, for CUDA_VISIBLE_DEVICES
  int sm_percentage = 100;           // on each of its GPUs
  std::uint64_t memory_limit = 0;    // on each of its GPUs, shared by all its processes
  // Its SMs: part `slot` of `slots` of the GPU (the lowest replica it holds of the GPU's
  // replicas), so that containers of different replicas run on different SMs.
  int slot = 0;
  int slots = 0;
  // The config's isolation = "allocation": servers of its own (register_allocation isolation=own).
  bool own_isolation_group = false;
};

// Fails for a device ID that names no GPU mpsshimd reports.
tl::expected<AllocationPlan, std::string> plan_allocation(const PluginConfig& config,
                                                          const std::vector<GpuState>& gpus,
                                                          const std::vector<std::string>& devices);

// The mpsshimctl command that registers the plan (the daemon answers `allocation=ID token=HEX`).
std::string registration_command(const AllocationPlan& plan, const std::string& token = "");

// Fills the kubelet's answer for one container.
void fill_response(const PluginConfig& config, const AllocationPlan& plan, const std::string& token,
                   v1beta1::ContainerAllocateResponse& response);

}  // namespace mpsshim::deviceplugin
