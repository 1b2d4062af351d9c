// The driver's peer-access entry points: what the hardware between two GPUs allows (each GPU's
// server asked its driver at start: DeviceSnapshot's peer masks), and peer access between the
// contexts of two GPUs (peer.hpp maps the memory).
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "libshim/peer.hpp"

using namespace mpsshim::shim;

namespace {

// Whether `dev`'s GPU reaches `peer`'s: the hardware says so, and both servers place their
// memory in the one address space, without which neither could map the other's.
bool peers(const mpsshim::proto::DeviceSnapshot& dev, const mpsshim::proto::DeviceSnapshot& peer,
           std::uint32_t mask) {
  return dev.ordinal != peer.ordinal && dev.ordinal >= 0 && peer.ordinal >= 0 &&
         peer.ordinal < 32 && (mask & (std::uint32_t{1} << peer.ordinal)) != 0 &&
         dev.arena_bytes != 0 && peer.arena_bytes != 0;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceCanAccessPeer(int* can, CUdevice dev, CUdevice peer) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (can == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto* a = device_snapshot(dev);
  const auto* b = device_snapshot(peer);
  if (a == nullptr || b == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  *can = peers(*a, *b, a->peer_access_mask) ? 1 : 0;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attribute,
                                                        CUdevice src, CUdevice dst) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto* a = device_snapshot(src);
  const auto* b = device_snapshot(dst);
  if (a == nullptr || b == nullptr || src == dst) return CUDA_ERROR_INVALID_DEVICE;
  const bool reach = peers(*a, *b, a->peer_access_mask);
  switch (attribute) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
      *value = 0;
      return CUDA_SUCCESS;
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
      *value = reach ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
      *value = reach && peers(*a, *b, a->peer_atomics_mask) ? 1 : 0;
      return CUDA_SUCCESS;
    case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED:
      *value = reach && peers(*a, *b, a->peer_array_mask) ? 1 : 0;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peer_ctx, unsigned int flags) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Context* peer = object_of<Context>(peer_ctx);
  if (peer == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  int can = 0;
  if (CUresult rc = cuDeviceCanAccessPeer(&can, ctx->device, peer->device); rc != CUDA_SUCCESS) {
    return rc;
  }
  if (can == 0) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
  return enable_peer_access(ctx->device, peer->device);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peer_ctx) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  Context* peer = object_of<Context>(peer_ctx);
  if (peer == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (peer->device == ctx->device) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
  return disable_peer_access(ctx->device, peer->device);
}
