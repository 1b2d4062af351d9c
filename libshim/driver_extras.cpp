// The driver's smaller queries and settings that only the server's driver can answer
// (proto/ops_driver_extras.hpp; docs/cuda-runtime.md, "Smaller queries and settings"): a CUDA
// array's sparse properties and memory requirements, a dma-buf fd for device memory
// (cuMemGetHandleForAddressRange: RDMA NICs register GPU memory with it), persisting L2 lines,
// GPUDirect RDMA write flushes, the synchronous-memops mark of a pointer (kept here), the 1D
// texture width
// and the atomic capabilities. cuCtxGetExecAffinity answers the client's SM quota;
// cuDeviceRegisterAsyncNotification keeps the callback and never calls it (see below).
#include <memory>
#include <mutex>
#include <unordered_map>

#include "libshim/api.hpp"
#include "libshim/array_wire.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "libshim/sync_memops.hpp"
#include "proto/ops_driver_extras.hpp"
#include "proto/ops_graph_nodes.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

namespace {

CUresult array_query(CUarray handle, proto::ArrayQuery query, proto::ArrayQueryRep& reply) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Array* array = object_of<Array>(handle);
  if (array == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return array->ctx->session->call(
      proto::Op::kArrayQuery,
      proto::ArrayQueryReq{array->wire, static_cast<std::uint32_t>(query), 0}, &reply);
}

CUresult setting(Session* session, proto::DriverSetting what, std::uint32_t a, std::uint64_t b,
                 std::uint64_t c, std::uint64_t* value = nullptr) {
  proto::GraphNodeValueRep reply{};
  CUresult rc =
      session->call(proto::Op::kDriverSetting,
                    proto::DriverSettingReq{static_cast<std::uint32_t>(what), a, b, c}, &reply);
  if (rc == CUDA_SUCCESS && value != nullptr) *value = reply.value;
  return rc;
}

CUresult current_session(Session*& out) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  out = ctx->session;
  return CUDA_SUCCESS;
}

// The session of the server that holds device memory at `address` (its owner's).
CUresult memory_session(CUdeviceptr address, Session*& out) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  DeviceRange range{};
  if (!address_book().find_device(address, &range)) return CUDA_ERROR_INVALID_VALUE;
  if (range.vmm || range.ipc_opened || range.ctx == nullptr) return session_for(range.device, out);
  out = range.ctx->session;
  return CUDA_SUCCESS;
}

// The atomic capabilities of `count` operations, one round trip each (a rare query).
CUresult atomic_capabilities(unsigned int* caps, const CUatomicOperation* ops, unsigned count,
                             CUdevice device, proto::DriverSetting what, std::uint64_t peer) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (device_snapshot(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (caps == nullptr || ops == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  Session* session = nullptr;
  if (CUresult rc = session_for(device, session); rc != CUDA_SUCCESS) return rc;
  for (unsigned i = 0; i < count; ++i) {
    std::uint64_t value = 0;
    if (CUresult rc = setting(session, what, static_cast<std::uint32_t>(ops[i]), peer, 0, &value);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    caps[i] = static_cast<unsigned int>(value);
  }
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuArrayGetSparseProperties(CUDA_ARRAY_SPARSE_PROPERTIES* out,
                                                           CUarray handle) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::ArrayQueryRep reply{};
  if (CUresult rc = array_query(handle, proto::ArrayQuery::kSparseProperties, reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *out = sparse_properties(reply);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS* out,
                                                             CUarray handle, CUdevice device) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Array* array = object_of<Array>(handle);
  if (array != nullptr && array->ctx->device != device) return CUDA_ERROR_INVALID_DEVICE;
  proto::ArrayQueryRep reply{};
  if (CUresult rc = array_query(handle, proto::ArrayQuery::kMemoryRequirements, reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *out = memory_requirements(reply);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemGetHandleForAddressRange(void* handle, CUdeviceptr dptr,
                                                              size_t size,
                                                              CUmemRangeHandleType type,
                                                              unsigned long long flags) {
  if (handle == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  Session* session = nullptr;
  if (CUresult rc = memory_session(dptr, session); rc != CUDA_SUCCESS) return rc;
  proto::UniqueFd fd;
  {
    std::lock_guard receiving(session->fd_receive_mutex());
    const proto::MemRangeHandleReq request{dptr, size, static_cast<std::uint32_t>(type), 0, flags};
    if (CUresult rc =
            session->call(proto::Op::kMemRangeHandle, &request, sizeof request, {}, nullptr, 0);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    if (CUresult rc = session->receive_fd(proto::MessageKind::kPeerMemory, fd);
        rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  *static_cast<int*>(handle) = fd.release();
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxResetPersistingL2Cache() {
  Session* session = nullptr;
  if (CUresult rc = current_session(session); rc != CUDA_SUCCESS) return rc;
  return setting(session, proto::DriverSetting::kResetPersistingL2, 0, 0, 0);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuFlushGPUDirectRDMAWrites(CUflushGPUDirectRDMAWritesTarget target,
                                                           CUflushGPUDirectRDMAWritesScope scope) {
  Session* session = nullptr;
  if (CUresult rc = current_session(session); rc != CUDA_SUCCESS) return rc;
  return setting(session, proto::DriverSetting::kFlushRdmaWrites,
                 static_cast<std::uint32_t>(target), static_cast<std::uint64_t>(scope), 0);
}

// The driver sets only CU_POINTER_ATTRIBUTE_SYNC_MEMOPS; the shim keeps it (sync_memops.hpp).
MPSSHIM_EXPORT CUresult CUDAAPI cuPointerSetAttribute(const void* value,
                                                      CUpointer_attribute attribute,
                                                      CUdeviceptr ptr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (value == nullptr || attribute != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return set_sync_memops(ptr, *static_cast<const unsigned int*>(value) != 0);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetTexture1DLinearMaxWidth(size_t* width,
                                                                   CUarray_format format,
                                                                   unsigned channels,
                                                                   CUdevice device) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (device_snapshot(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (width == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Session* session = nullptr;
  if (CUresult rc = session_for(device, session); rc != CUDA_SUCCESS) return rc;
  std::uint64_t value = 0;
  if (CUresult rc = setting(session, proto::DriverSetting::kTexture1DLinearMaxWidth,
                            static_cast<std::uint32_t>(format), channels, 0, &value);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *width = static_cast<size_t>(value);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetHostAtomicCapabilities(unsigned int* caps,
                                                                  const CUatomicOperation* ops,
                                                                  unsigned int count,
                                                                  CUdevice device) {
  return atomic_capabilities(caps, ops, count, device,
                             proto::DriverSetting::kHostAtomicCapabilities, 0);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceGetP2PAtomicCapabilities(unsigned int* caps,
                                                                 const CUatomicOperation* ops,
                                                                 unsigned int count, CUdevice src,
                                                                 CUdevice dst) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  const proto::DeviceSnapshot* peer = device_snapshot(dst);
  if (peer == nullptr || src == dst) return CUDA_ERROR_INVALID_DEVICE;
  return atomic_capabilities(caps, ops, count, src, proto::DriverSetting::kP2PAtomicCapabilities,
                             static_cast<std::uint64_t>(peer->ordinal));
}

MPSSHIM_EXPORT CUresult CUDAAPI cuCtxGetExecAffinity(CUexecAffinityParam* out,
                                                     CUexecAffinityType type) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr || type != CU_EXEC_AFFINITY_TYPE_SM_COUNT) return CUDA_ERROR_INVALID_VALUE;
  // The SMs the context may use: natively the whole device (even where
  // cuDeviceGetExecAffinitySupport says 0: H200, driver 580), here the client's quota.
  *out = CUexecAffinityParam{};
  out->type = CU_EXEC_AFFINITY_TYPE_SM_COUNT;
  out->param.smCount.val = static_cast<unsigned>(client_sm_count(ctx->device));
  return CUDA_SUCCESS;
}

namespace {

struct AsyncNotification {
  CUdevice device;
  CUasyncCallback callback;
  void* user_data;
};
std::mutex g_notifications_mutex;
std::unordered_map<CUasyncCallbackHandle, std::unique_ptr<AsyncNotification>> g_notifications;

}  // namespace

// The driver's one notification, CU_ASYNC_NOTIFICATION_TYPE_OVER_BUDGET, tells a process that its
// device memory went past what the system budgets for it. Under mpsshim a client's budget is its
// memory limit, which the server enforces by refusing allocations past it
// (CUDA_ERROR_OUT_OF_MEMORY), so nothing is ever over it: the registration is kept, as the driver
// keeps it, and the callback is never called.
MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceRegisterAsyncNotification(CUdevice device,
                                                                  CUasyncCallback callback,
                                                                  void* user_data,
                                                                  CUasyncCallbackHandle* out) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (device_snapshot(device) == nullptr) return CUDA_ERROR_INVALID_DEVICE;
  if (callback == nullptr || out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto entry = std::make_unique<AsyncNotification>(AsyncNotification{device, callback, user_data});
  auto handle = reinterpret_cast<CUasyncCallbackHandle>(entry.get());
  std::lock_guard lock(g_notifications_mutex);
  g_notifications.emplace(handle, std::move(entry));
  *out = handle;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuDeviceUnregisterAsyncNotification(CUdevice device,
                                                                    CUasyncCallbackHandle handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  std::lock_guard lock(g_notifications_mutex);
  auto it = g_notifications.find(handle);
  if (it == g_notifications.end() || it->second->device != device) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  g_notifications.erase(it);
  return CUDA_SUCCESS;
}
