#include "broker/server/driver/gpu.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/log.hpp"

namespace mpsshim::server {
namespace {

StartError failed(const DriverTable& cu, CUresult r, const char* what, int ordinal) {
  return StartError{r, fmt::format("{} for device {} failed: {}", what, ordinal, describe(cu, r))};
}

}  // namespace

tl::expected<Gpu, StartError> open_gpu(const DriverTable& cu, int ordinal) {
  Gpu gpu;
  gpu.cu = &cu;
  gpu.ordinal = ordinal;
  if (CUresult r = cu.cuInit(0); r != CUDA_SUCCESS) {
    return tl::unexpected(failed(cu, r, "cuInit", ordinal));
  }
  if (CUresult r = cu.cuDeviceGetCount(&gpu.device_count); r != CUDA_SUCCESS) {
    return tl::unexpected(failed(cu, r, "cuDeviceGetCount", ordinal));
  }
  if (CUresult r = cu.cuDeviceGet(&gpu.device, ordinal); r != CUDA_SUCCESS) {
    return tl::unexpected(failed(cu, r, "cuDeviceGet", ordinal));
  }
  if (CUresult r = cu.cuDevicePrimaryCtxRetain(&gpu.primary, gpu.device); r != CUDA_SUCCESS) {
    return tl::unexpected(failed(cu, r, "retaining the primary context", ordinal));
  }
  if (CUresult r = cu.cuCtxSetCurrent(gpu.primary); r != CUDA_SUCCESS) {
    return tl::unexpected(failed(cu, r, "making the primary context current", ordinal));
  }

  proto::DeviceSnapshot& snap = gpu.snapshot;
  snap.ordinal = ordinal;
  if (CUresult r = cu.cuDeviceGetName(snap.name, sizeof snap.name - 1, gpu.device);
      r != CUDA_SUCCESS) {
    return tl::unexpected(failed(cu, r, "cuDeviceGetName", ordinal));
  }
  CUuuid uuid{};
  if (CUresult r = cu.cuDeviceGetUuid_v2(&uuid, gpu.device); r != CUDA_SUCCESS) {
    return tl::unexpected(failed(cu, r, "cuDeviceGetUuid_v2", ordinal));
  }
  static_assert(sizeof uuid.bytes == sizeof snap.uuid);
  std::memcpy(snap.uuid, uuid.bytes, sizeof snap.uuid);
  std::size_t total = 0;
  if (CUresult r = cu.cuDeviceTotalMem_v2(&total, gpu.device); r != CUDA_SUCCESS) {
    return tl::unexpected(failed(cu, r, "cuDeviceTotalMem", ordinal));
  }
  snap.total_memory = total;
  if (CUresult r = cu.cuDriverGetVersion(&snap.driver_version); r != CUDA_SUCCESS) {
    return tl::unexpected(failed(cu, r, "cuDriverGetVersion", ordinal));
  }
  if (CUresult r = cu.cuDeviceGetDevResource(gpu.device, &gpu.sm_resource, CU_DEV_RESOURCE_TYPE_SM);
      r != CUDA_SUCCESS) {
    return tl::unexpected(failed(cu, r, "cuDeviceGetDevResource(SM)", ordinal));
  }
  snap.sm_count = gpu.sm_resource.sm.smCount;
  snap.sm_min_partition = gpu.sm_resource.sm.minSmPartitionSize;
  snap.sm_coscheduled_alignment = gpu.sm_resource.sm.smCoscheduledAlignment;

  // An attribute the driver refuses reads 0, as the real driver reports unsupported ones.
  static_assert(CU_DEVICE_ATTRIBUTE_MAX <= proto::kMaxDeviceAttributes);
  for (int a = 1; a < CU_DEVICE_ATTRIBUTE_MAX; ++a) {
    int value = 0;
    if (cu.cuDeviceGetAttribute(&value, static_cast<CUdevice_attribute>(a), gpu.device) !=
        CUDA_SUCCESS) {
      value = 0;
    }
    snap.attributes[a] = value;
  }
  snap.attribute_count = CU_DEVICE_ATTRIBUTE_MAX;
  if (CUresult r = cu.cuCtxGetStreamPriorityRange(&snap.stream_priority_least,
                                                  &snap.stream_priority_greatest);
      r != CUDA_SUCCESS) {
    return tl::unexpected(failed(cu, r, "cuCtxGetStreamPriorityRange", ordinal));
  }
  for (int other = 0; other < gpu.device_count && other < 32; ++other) {
    CUdevice peer = 0;
    int can = 0, atomics = 0, arrays = 0;
    if (other == ordinal || cu.cuDeviceGet(&peer, other) != CUDA_SUCCESS ||
        cu.cuDeviceCanAccessPeer(&can, gpu.device, peer) != CUDA_SUCCESS || can == 0) {
      continue;
    }
    const std::uint32_t bit = std::uint32_t{1} << other;
    snap.peer_access_mask |= bit;
    if (cu.cuDeviceGetP2PAttribute(&atomics, CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED,
                                   gpu.device, peer) == CUDA_SUCCESS &&
        atomics != 0) {
      snap.peer_atomics_mask |= bit;
    }
    if (cu.cuDeviceGetP2PAttribute(&arrays, CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED,
                                   gpu.device, peer) == CUDA_SUCCESS &&
        arrays != 0) {
      snap.peer_array_mask |= bit;
    }
  }

  std::string why = "MPSSHIM_ADDRESS_ARENA=off";
  const char* arena = std::getenv("MPSSHIM_ADDRESS_ARENA");
  if (arena == nullptr || std::string_view(arena) != "off") {
    gpu.heap = DeviceHeap::open(cu, gpu.device, static_cast<unsigned>(ordinal), &why);
  }
  if (arena == nullptr || std::string_view(arena) != "off") {
    std::string pinned_why;
    gpu.pinned = PinnedWindow::open(static_cast<unsigned>(ordinal), &pinned_why);
    if (!gpu.pinned) {
      log_warn(
          "GPU {}: no pinned window ({}): clients' pinned host memory is mapped at other "
          "addresses here, and a kernel handed its host pointer would fault",
          ordinal, pinned_why);
    }
  }
  if (gpu.heap) {
    snap.arena_base = gpu.heap->arena().base();
    snap.arena_bytes = gpu.heap->arena().bytes();
    log_info("GPU {}: device addresses in its arena {:#x} + {} GiB", ordinal, snap.arena_base,
             snap.arena_bytes >> 30);
  } else {
    log_warn(
        "GPU {}: no address arena ({}); the driver places device memory, and another GPU's "
        "server may hand out the same addresses (docs/architecture.md, one device address space)",
        ordinal, why);
  }
  return gpu;
}

}  // namespace mpsshim::server
