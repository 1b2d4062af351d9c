// CUDA IPC between clients of one GPU's server (docs/ipc.md): a CUipcMemHandle or
// CUipcEventHandle is the 64-byte proto::IpcHandle the server issued. Every client of a server
// shares its address space, so an opened allocation has the exporter's own address, and an
// opened event names the same server events.
#include <cstring>

#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/log.hpp"
#include "libshim/object_pool.hpp"
#include "proto/ops_ipc.hpp"

using namespace mpsshim::shim;
namespace proto = mpsshim::proto;

static_assert(sizeof(CUipcMemHandle) == sizeof(proto::IpcHandle));
static_assert(sizeof(CUipcEventHandle) == sizeof(proto::IpcHandle));

namespace {

template <typename Handle>
proto::IpcHandle wire_of(const Handle& handle) {
  proto::IpcHandle wire{};
  std::memcpy(&wire, handle.reserved, sizeof(wire));
  return wire;
}

// Why the server refused, for the program's log: the server's log has the details.
void note_refused(const char* call, CUresult rc) {
  if (rc == CUDA_ERROR_NOT_SUPPORTED) {
    log_once(std::string(call) + ".cross_gpu", Level::warn,
             "{}: the handle comes from another GPU's server; IPC across GPUs is not yet "
             "supported by mpsshim",
             call);
  } else if (rc != CUDA_SUCCESS) {
    log_once(std::string(call) + ".refused", Level::warn,
             "{}: refused by the server ({}); its log says why (another user's handle, a "
             "freed allocation, a garbled handle)",
             call, static_cast<int>(rc));
  }
}

CUresult open_memory(CUdeviceptr* out, const CUipcMemHandle& handle, unsigned flags) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::IpcOpenReq request{wire_of(handle), 0, flags, 0};
  proto::IpcOpenMemRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kIpcOpenMemHandle, request, &reply);
  note_refused("cuIpcOpenMemHandle", rc);
  if (rc != CUDA_SUCCESS) return rc;
  DeviceRange range{reply.base, reply.bytes, ctx};
  range.ipc_opened = true;
  address_book().add_device(range);  // opened again: the same range
  *out = reply.base;
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  DeviceRange range{};
  if (!address_book().find_device(dptr, &range) || range.vmm || range.ipc_opened) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  proto::IpcHandle reply{};
  if (CUresult rc = range.ctx->session->call(proto::Op::kIpcGetMemHandle,
                                             proto::IpcGetMemHandleReq{dptr}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  std::memcpy(handle->reserved, &reply, sizeof(reply));
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle,
                                                      unsigned int flags) {
  return open_memory(dptr, handle, flags);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle,
                                                   unsigned int flags) {
  return open_memory(dptr, handle, flags);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  DeviceRange range{};
  if (!address_book().find_device(dptr, &range) || range.base != dptr || !range.ipc_opened) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  proto::IpcCloseRep reply{};
  CUresult rc =
      range.ctx->session->call(proto::Op::kIpcCloseMemHandle, proto::MemFreeReq{dptr}, &reply);
  if (rc == CUDA_SUCCESS && reply.still_open == 0) address_book().remove_device(dptr, nullptr);
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle* handle, CUevent hevent) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Event* event = object_of<Event>(hevent);
  if (event == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::IpcHandle reply{};
  if (CUresult rc = event->ctx->session->call(proto::Op::kIpcGetEventHandle,
                                              proto::HandleReq{event->wire}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  std::memcpy(handle->reserved, &reply, sizeof(reply));
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuIpcOpenEventHandle(CUevent* out, CUipcEventHandle handle) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::IpcOpenReq request{wire_of(handle), ctx->wire, 0, 0};
  proto::EventCreateRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kIpcOpenEventHandle, request, &reply);
  note_refused("cuIpcOpenEventHandle", rc);
  if (rc != CUDA_SUCCESS) return rc;
  *out = reinterpret_cast<CUevent>(ObjectPool<Event>::instance().make(
      Magic::kEvent, ctx, reply.event, unsigned{CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING}));
  return CUDA_SUCCESS;
}
