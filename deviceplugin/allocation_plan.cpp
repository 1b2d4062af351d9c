#include "deviceplugin/allocation_plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "broker/daemon/sizes.hpp"

namespace mpsshim::deviceplugin {

namespace {

std::string directory_of(const std::string& path) {
  std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace

tl::expected<AllocationPlan, std::string> plan_allocation(const PluginConfig& config,
                                                          const std::vector<GpuState>& gpus,
                                                          const std::vector<std::string>& devices) {
  if (devices.empty()) return tl::unexpected(std::string("no devices were requested"));
  AllocationPlan plan;
  plan.devices = devices;
  std::map<int, int> replicas_on;  // GPU -> replicas of this container on it
  for (const std::string& id : devices) {
    const GpuState* gpu = gpu_of_device(gpus, id);
    if (gpu == nullptr) {
      return tl::unexpected(
          fmt::format("device `{}` is not a replica of a GPU mpsshimd serves", id));
    }
    if (replicas_on[gpu->index]++ == 0) {
      plan.gpus.push_back(gpu->index);
      plan.uuids.push_back(gpu->uuid);
    }
  }
  // One token carries one quota for all its GPUs: the share of the GPU where the container
  // holds the most replicas (a container normally takes replicas of one GPU).
  int most = 0;
  std::uint64_t memory = 0;
  for (const auto& [index, count] : replicas_on) {
    const GpuState& gpu = *std::find_if(gpus.begin(), gpus.end(),
                                        [&](const GpuState& g) { return g.index == index; });
    const GpuShare share = share_for(config, gpu.name, gpu.memory);
    most = std::max(most, std::min(100, share.sm_percentage * count));
    memory = std::max<std::uint64_t>(memory, share.memory_limit * static_cast<unsigned>(count));
  }
  plan.sm_percentage = most;
  plan.memory_limit = memory;
  // The slot: the lowest replica number held on the first GPU, of that GPU's replicas.
  const GpuState& first = *std::find_if(
      gpus.begin(), gpus.end(), [&](const GpuState& g) { return g.index == plan.gpus.front(); });
  plan.slots = share_for(config, first.name, first.memory).replicas;
  plan.own_isolation_group = config.isolate_allocations;
  plan.slot = plan.slots;
  for (const std::string& id : devices) {
    if (const GpuState* gpu = gpu_of_device(gpus, id);
        gpu != nullptr && gpu->index == first.index) {
      plan.slot = std::min(plan.slot, replica_number(id).value_or(0) % plan.slots);
    }
  }
  return plan;
}

std::string registration_command(const AllocationPlan& plan, const std::string& token) {
  std::string line = fmt::format("register_allocation sm={} gpus={} devices={}", plan.sm_percentage,
                                 fmt::join(plan.gpus, ","), fmt::join(plan.devices, ","));
  if (plan.memory_limit != 0) line += fmt::format(" memory={}", plan.memory_limit);
  if (plan.slots > 1) line += fmt::format(" slot={}/{}", plan.slot, plan.slots);
  if (plan.own_isolation_group) line += " isolation=own";
  if (!token.empty()) line += " token=" + token;
  return line;
}

void fill_response(const PluginConfig& config, const AllocationPlan& plan, const std::string& token,
                   v1beta1::ContainerAllocateResponse& response) {
  auto& envs = *response.mutable_envs();
  const std::string shim_dir = directory_of(config.container_shim_library);
  std::string preload;
  for (const std::string& library : config.preload_libraries)
    preload += shim_dir + "/" + library + ":";
  envs["LD_PRELOAD"] = preload + config.container_shim_library;
  envs["CUDA_MPS_PIPE_DIRECTORY"] = config.container_runtime_dir;
  envs["CUDA_VISIBLE_DEVICES"] = fmt::format("{}", fmt::join(plan.uuids, ","));
  envs["MPSSHIM_ALLOCATION_TOKEN"] = token;
  // For the program's own information (and tools that read MPS's variables): the daemon
  // enforces the token's quota whatever these say.
  envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = std::to_string(plan.sm_percentage);
  if (plan.memory_limit != 0) {
    envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = daemon::format_size(plan.memory_limit);
  }
  // Read-only: the pod can connect to the control socket (connect() on a socket needs no
  // writable mount) but cannot replace it or the library.
  v1beta1::Mount* runtime = response.add_mounts();
  runtime->set_container_path(config.container_runtime_dir);
  runtime->set_host_path(config.runtime_dir);
  runtime->set_read_only(true);
  v1beta1::Mount* shim = response.add_mounts();
  shim->set_container_path(shim_dir);
  shim->set_host_path(directory_of(config.shim_library));
  shim->set_read_only(true);
}

}  // namespace mpsshim::deviceplugin
