// CUDA IPC between clients (docs/ipc.md): a CUipcMemHandle or CUipcEventHandle is the 64-byte
// proto::IpcHandle the server issued. Every server's addresses lie in its own arena of the one
// device address space, so an opened allocation has the exporter's own address, and an opened
// event names the same server events. A memory handle of another GPU's server is opened on that
// server (its policy decides) and its block mapped into the server of the caller's GPU at the
// same address, as peer memory (peer.hpp); an event handle of another GPU's server opens as an
// event of that GPU.
#include <cstring>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "libshim/ipc.hpp"
#include "libshim/object_pool.hpp"
#include "libshim/peer.hpp"
#include "proto/ops_ipc.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
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
    log_once(std::string(call) + ".cross_gpu", LogLevel::kWarn,
             "{}: the handle comes from a GPU this process does not see (CUDA_VISIBLE_DEVICES)",
             call);
  } else if (rc != CUDA_SUCCESS) {
    log_once(std::string(call) + ".refused", LogLevel::kWarn,
             "{}: refused by the server ({}); its log says why (another user's handle, a "
             "freed allocation, a garbled handle)",
             call, static_cast<int>(rc));
  }
}

// The visible device whose server issued `wire`, or -1 (not an mpsshim handle, or a GPU this
// process does not see: its own server then refuses it with the reason).
int issuing_device(const proto::IpcHandle& wire) {
  if (wire.magic != proto::kIpcHandleMagic) return -1;
  for (int d = 0; d < visible_device_count(); ++d) {
    const proto::DeviceSnapshot* snapshot = device_snapshot(d);
    if (snapshot != nullptr && snapshot->ordinal == static_cast<int>(wire.device)) return d;
  }
  return -1;
}

CUresult close_on(Session* session, CUdeviceptr base, std::uint32_t* still_open) {
  proto::IpcCloseRep reply{};
  CUresult rc = session->call(proto::Op::kIpcCloseMemHandle, proto::MemFreeReq{base}, &reply);
  *still_open = reply.still_open;
  return rc;
}

}  // namespace

CUresult mpsshim::shim::ipc_open_memory(Context* ctx, CUdeviceptr* out,
                                        const proto::IpcHandle& wire, unsigned flags,
                                        CUmemoryPool pool) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int issuer = issuing_device(wire);
  if (issuer < 0) issuer = ctx->device;
  Session* session = ctx->session;
  if (issuer != ctx->device) {
    if (CUresult rc = session_for(issuer, session); rc != CUDA_SUCCESS) return rc;
  }
  proto::IpcOpenReq request{wire, 0, flags, 0};
  proto::IpcOpenMemRep reply{};
  CUresult rc = session->call(proto::Op::kIpcOpenMemHandle, request, &reply);
  note_refused(pool != nullptr ? "cuMemPoolImportPointer" : "cuIpcOpenMemHandle", rc);
  if (rc != CUDA_SUCCESS) return rc;
  DeviceRange range{reply.base, reply.bytes, ctx};
  range.ipc_opened = true;
  range.pool_import = pool != nullptr;
  range.pool = pool;
  range.device = issuer;
  address_book().add_device(range);  // opened again: the same range
  if (issuer != ctx->device) {
    // Another GPU's memory: its block mapped into this GPU's server, as the driver maps it for
    // the peer (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS or not: both GPUs must be peers either way).
    rc = reach_from(ctx->device, reply.base, reply.bytes);
    if (rc != CUDA_SUCCESS) {
      log_once("cuIpcOpenMemHandle.peer", LogLevel::kWarn,
               "cuIpcOpenMemHandle: device {}'s memory at {:#x} could not be mapped for device "
               "{} ({})",
               issuer, reply.base, ctx->device, static_cast<int>(rc));
      std::uint32_t still_open = 0;
      if (close_on(session, reply.base, &still_open) == CUDA_SUCCESS && still_open == 0) {
        forget_peer_blocks(issuer, reply.base, reply.bytes);
        address_book().remove_device(reply.base, nullptr);
      }
      return rc;
    }
  }
  *out = reply.base;
  return CUDA_SUCCESS;
}

CUresult mpsshim::shim::ipc_close_memory(const DeviceRange& range) {
  Session* session = range.ctx->session;
  const bool elsewhere = range.device != range.ctx->device;
  if (elsewhere) {
    if (CUresult rc = session_for(range.device, session); rc != CUDA_SUCCESS) return rc;
  }
  std::uint32_t still_open = 0;
  CUresult rc = close_on(session, range.base, &still_open);
  if (rc == CUDA_SUCCESS && still_open == 0) {
    // This GPU's server lets go of the other GPU's block (once nothing else of it is open).
    if (elsewhere) forget_peer_blocks(range.device, range.base, range.bytes);
    address_book().remove_device(range.base, nullptr);
  }
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle* handle, CUdeviceptr dptr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  DeviceRange range{};
  // Pool memory is exported with cuMemPoolExportPointer, not this way (the driver refuses it).
  if (!address_book().find_device(dptr, &range) || range.vmm || range.ipc_opened ||
      range.pool != nullptr) {
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
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  return ipc_open_memory(ctx, dptr, wire_of(handle), flags, nullptr);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle,
                                                   unsigned int flags) {
  return cuIpcOpenMemHandle_v2(dptr, handle, flags);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  DeviceRange range{};
  // An imported pool pointer is freed with cuMemFree / cuMemFreeAsync instead.
  if (!address_book().find_device(dptr, &range) || range.base != dptr || !range.ipc_opened ||
      range.pool_import) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return ipc_close_memory(range);
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
  // An event of another GPU's server is opened there, as an event of that GPU's primary context:
  // queries and synchronizes go to that server, and a stream of this GPU waits for it as for
  // any event of another GPU (the calling thread waits; stream_event.cpp).
  if (const int issuer = issuing_device(wire_of(handle)); issuer >= 0 && issuer != ctx->device) {
    if (CUresult rc = primary_context(issuer, ctx); rc != CUDA_SUCCESS) return rc;
  }
  proto::IpcOpenReq request{wire_of(handle), ctx->wire, 0, 0};
  proto::EventCreateRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kIpcOpenEventHandle, request, &reply);
  note_refused("cuIpcOpenEventHandle", rc);
  if (rc != CUDA_SUCCESS) return rc;
  *out = reinterpret_cast<CUevent>(ObjectPool<Event>::instance().make(
      Magic::kEvent, ctx, reply.event, unsigned{CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING}));
  return CUDA_SUCCESS;
}
