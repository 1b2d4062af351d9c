// Device memory (allocated by the server, checked against the client's limit there) and pinned
// host memory: a memfd the client maps and the server maps at the same address when it can and
// registers with the driver, so async copies from it are zero-copy DMA and, under unified
// addressing, the host pointer is also the device pointer.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "common/log.hpp"
#include "libshim/address_window.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/graph_objects.hpp"
#include "libshim/host_memory.hpp"
#include "libshim/ipc.hpp"
#include "libshim/managed_advice.hpp"
#include "libshim/peer.hpp"
#include "proto/address_arenas.hpp"
#include "proto/address_reservation.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

namespace {

CUresult allocate(Context* ctx, std::size_t bytes, CUdeviceptr* out) {
  proto::MemAllocReq request{ctx->wire, bytes};
  proto::MemAllocRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kMemAlloc, request, &reply);
  if (rc != CUDA_SUCCESS) return rc;
  address_book().add_device({reply.dptr, bytes, ctx});
  *out = reply.dptr;
  return share_with_peers(ctx->device, reply.dptr, bytes);
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  return allocate(ctx, bytes, dptr);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width,
                                                   size_t height, unsigned int element_bytes) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (dptr == nullptr || pitch == nullptr || width == 0 || height == 0 ||
      (element_bytes != 4 && element_bytes != 8 && element_bytes != 16)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  proto::MemAllocPitchReq request{ctx->wire, width, height, element_bytes, 0};
  proto::MemAllocPitchRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kMemAllocPitch, request, &reply);
  if (rc != CUDA_SUCCESS) return rc;
  address_book().add_device({reply.dptr, reply.pitch * height, ctx});
  *dptr = reply.dptr;
  *pitch = reply.pitch;
  return share_with_peers(ctx->device, reply.dptr, reply.pitch * height);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (dptr == 0) return CUDA_SUCCESS;
  DeviceRange range{};
  if (!address_book().find_device(dptr, &range)) {
    PinnedRange managed{};
    const auto* p = reinterpret_cast<const void*>(dptr);
    if (address_book().find_pinned(p, &managed) && managed.managed && managed.base == p) {
      managed_advice().remove(dptr);
      return free_pinned(managed);
    }
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (range.base != dptr || range.vmm) {
    return CUDA_ERROR_INVALID_VALUE;  // a VMM mapping is freed with cuMemUnmap
  }
  if (range.pool_import) return ipc_close_memory(range);  // imported pool memory goes back
  if (range.ipc_opened) {
    log_once("cuMemFree.ipc", LogLevel::kWarn,
             "cuMemFree: {:#x} was opened with cuIpcOpenMemHandle; it is closed with "
             "cuIpcCloseMemHandle",
             dptr);
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Other GPUs' servers that mapped it let go first: the memory goes once the last holder does.
  forget_peer_blocks(range.ctx->device, range.base, range.bytes);
  proto::MemFreeReq request{dptr};
  CUresult rc = range.ctx->session->call(proto::Op::kMemFree, request, static_cast<int*>(nullptr));
  // Graph memory stays its graph's: the graph's next launch allocates it again.
  if (rc == CUDA_SUCCESS && !is_graph_memory(dptr)) address_book().remove_device(dptr, nullptr);
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::MemGetInfoRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kMemGetInfo, proto::CtxReq{ctx->wire}, &reply);
  if (rc != CUDA_SUCCESS) return rc;
  *free_bytes = reply.free_bytes;
  *total_bytes = reply.total_bytes;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size,
                                                        CUdeviceptr dptr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  DeviceRange range{};
  PinnedRange managed{};
  if (address_book().find_device(dptr, &range)) {
    if (base) *base = range.base;
    if (size) *size = range.bytes;
  } else if (address_book().find_pinned(reinterpret_cast<const void*>(dptr), &managed) &&
             managed.managed &&
             dptr - reinterpret_cast<CUdeviceptr>(managed.base) < managed.requested) {
    if (base) *base = reinterpret_cast<CUdeviceptr>(managed.base);
    if (size) *size = managed.requested;
  } else {
    return CUDA_ERROR_NOT_FOUND;
  }
  return CUDA_SUCCESS;
}

// ---- pinned host memory ----

namespace {

bool in_pinned_window(std::uint64_t address, std::uint64_t bytes) {
  return address >= proto::kPinnedWindowBase && bytes <= proto::kPinnedWindowBytes &&
         address - proto::kPinnedWindowBase <= proto::kPinnedWindowBytes - bytes;
}

}  // namespace

// Pinned host memory is a memfd both processes map. With the pinned window reserved here, the
// server picks the address (in its slice of the window) and this process maps the memfd at the
// same one, so the host pointer is the device pointer in both, as under unified addressing;
// without it, this process maps first and the server tries the same address.
CUresult mpsshim::shim::allocate_pinned(void** pp, size_t bytes, unsigned int flags, bool managed) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (pp == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  std::size_t mapped = (bytes + 4095) / 4096 * 4096;
  int fd = ::memfd_create("mpsshim-pinned", MFD_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  if (::ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    ::close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const bool server_places = pinned_window_reserved();
  void* base = nullptr;
  if (!server_places) {
    base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      ::close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  std::uint32_t token = 0;
  CUresult rc = ctx->session->send_fd(proto::MessageKind::kHostMemory, fd, mapped, token);
  proto::HostRegisterRep reply{};
  if (rc == CUDA_SUCCESS) {
    proto::HostRegisterReq request{reinterpret_cast<std::uint64_t>(base), mapped, token, flags};
    rc = ctx->session->call(proto::Op::kHostRegister, request, &reply);
  }
  if (rc == CUDA_SUCCESS && server_places) {
    // MAP_FIXED only over this process's own reservation: an answer outside the window is
    // mapped wherever the kernel puts it.
    const bool fixed = in_pinned_window(reply.host_address, mapped);
    void* want = fixed ? reinterpret_cast<void*>(reply.host_address) : nullptr;
    base =
        ::mmap(want, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | (fixed ? MAP_FIXED : 0), fd, 0);
    if (base == MAP_FAILED || (fixed && base != want)) {
      if (base != MAP_FAILED) ::munmap(base, mapped);
      base = nullptr;
      ctx->session->call(proto::Op::kHostUnregister, proto::HostUnregisterReq{reply.region},
                         static_cast<int*>(nullptr));
      rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  if (rc != CUDA_SUCCESS) {
    if (!server_places) ::munmap(base, mapped);
    ::close(fd);
    return rc == CUDA_ERROR_OUT_OF_MEMORY ? rc : CUDA_ERROR_OUT_OF_MEMORY;
  }
  PinnedRange range{static_cast<std::byte*>(base), mapped, ctx,  reply.region,
                    reply.device_pointer,          fd,     flags};
  range.managed = managed;
  range.requested = bytes;
  address_book().add_pinned(range);
  *pp = base;
  return CUDA_SUCCESS;
}

CUresult mpsshim::shim::free_pinned(const PinnedRange& range) {
  address_book().remove_pinned(range.base, nullptr);
  proto::HostUnregisterReq request{range.region};
  CUresult rc =
      range.ctx->session->call(proto::Op::kHostUnregister, request, static_cast<int*>(nullptr));
  // Other GPUs' servers that mapped it for their copies let go too.
  for (const PinnedRange::Elsewhere& slot : range.elsewhere) {
    if (slot.session == nullptr || slot.session->fault() != CUDA_SUCCESS) continue;
    slot.session->call(proto::Op::kHostUnregister, proto::HostUnregisterReq{slot.region},
                       static_cast<int*>(nullptr));
  }
  // In the pinned window the range goes back to the reservation, not to the process's mmap.
  const auto address = reinterpret_cast<std::uint64_t>(range.base);
  if (!pinned_window_reserved() || !in_pinned_window(address, range.bytes) ||
      !proto::return_to_reservation(range.base, range.bytes)) {
    ::munmap(range.base, range.bytes);
  }
  ::close(range.memfd);
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytes) {
  return allocate_pinned(pp, bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytes, unsigned int flags) {
  constexpr unsigned kKnown =
      CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if ((flags & ~kKnown) != 0) return CUDA_ERROR_INVALID_VALUE;
  return allocate_pinned(pp, bytes, flags);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemFreeHost(void* p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  PinnedRange range{};
  // Managed memory is freed with cuMemFree, as natively.
  if (!address_book().find_pinned(p, &range) || range.base != p || range.managed) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return free_pinned(range);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* p,
                                                             unsigned int flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (dptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  PinnedRange range{};
  if (!address_book().find_pinned(p, &range)) {
    return find_registered(p, nullptr) ? registered_device_pointer_refused()
                                       : CUDA_ERROR_INVALID_VALUE;
  }
  if (range.managed) return CUDA_ERROR_INVALID_VALUE;  // as the driver answers for managed memory
  *dptr = range.device_pointer + (static_cast<std::byte*>(p) - range.base);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemHostGetFlags(unsigned int* flags, void* p) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  PinnedRange range{};
  RegisteredRange registered{};
  if (address_book().find_pinned(p, &range)) {
    *flags = range.flags;
  } else if (find_registered(p, &registered)) {
    *flags = registered.flags;
  } else {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

// ---- pointer attributes ----

namespace {

// Memory registered with cuMemHostRegister: host memory the device cannot address.
CUresult registered_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  RegisteredRange range{};
  if (!find_registered(reinterpret_cast<void*>(ptr), &range)) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = CU_MEMORYTYPE_HOST;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      *static_cast<void**>(data) = reinterpret_cast<void*>(ptr);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      return registered_device_pointer_refused();
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<int*>(data) = 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = range.device;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = range.base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = range.bytes;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult pointer_attribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  DeviceRange device{};
  PinnedRange pinned{};
  bool is_device = address_book().find_device(ptr, &device);
  bool is_pinned =
      !is_device && (address_book().find_pinned(reinterpret_cast<void*>(ptr), &pinned) ||
                     address_book().find_pinned_by_device(ptr, &pinned));
  if (!is_device && !is_pinned) return registered_attribute(data, attribute, ptr);
  // A VMM mapping reserved with no current context belongs to none (ctx nullptr).
  Context* ctx = is_device ? device.ctx : pinned.ctx;
  const int ordinal = is_device && device.vmm ? device.device : ctx->device;
  std::uint64_t offset =
      is_device ? ptr - device.base
                : (ptr >= pinned.device_pointer && ptr - pinned.device_pointer < pinned.bytes
                       ? ptr - pinned.device_pointer
                       : ptr - reinterpret_cast<std::uint64_t>(pinned.base));
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(ctx);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      // Managed memory reads as device memory, as natively (IS_MANAGED tells it apart).
      *static_cast<unsigned*>(data) =
          is_device || pinned.managed ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = is_device ? ptr : pinned.device_pointer + offset;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (is_device) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<void**>(data) = pinned.base + offset;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<int*>(data) = !is_device && pinned.managed;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = ordinal;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) =
          is_device ? device.base : reinterpret_cast<CUdeviceptr>(pinned.base);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) =
          is_device ? device.bytes : (pinned.managed ? pinned.requested : pinned.bytes);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<int*>(data) = 1;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      *static_cast<int*>(data) = 1;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      // Unique for the process's life, as natively (a freed allocation's id is not reused).
      *static_cast<unsigned long long*>(data) = is_device ? device.id : pinned.region;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      // What cuIpcGetMemHandle takes (libshim/ipc.cpp, docs/ipc.md): this process's own
      // cuMemAlloc memory; not pool memory, VMM mappings, module globals or opened handles.
      *static_cast<int*>(data) = is_device && !device.vmm && !device.ipc_opened &&
                                 device.pool == nullptr && !device.module_global;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      // A VMM mapping's allocation's requested types (only POSIX fds are served), asked of the
      // server only here, so that cuMemMap stays one round trip; nothing else here can be
      // exported through a shareable handle (exportable pools are refused, docs/memory-pools.md).
      if (is_device && device.vmm) {
        CUmemGenericAllocationHandle handle{};
        if (CUresult rc = cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(ptr));
            rc != CUDA_SUCCESS) {
          return rc;
        }
        CUmemAllocationProp prop{};
        CUresult rc = cuMemGetAllocationPropertiesFromHandle(&prop, handle);
        cuMemRelease(handle);
        if (rc != CUDA_SUCCESS) return rc;
        *static_cast<unsigned*>(data) = static_cast<unsigned>(prop.requestedHandleTypes);
      } else {
        *static_cast<unsigned*>(data) = 0;
      }
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
      // The memory lives in the server's context: a NIC driver asked from this process cannot
      // pin it, so no GPUDirect RDMA from a client.
      *static_cast<int*>(data) = 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
      // This process's own memory is read-write from its device; a VMM mapping's access is what
      // cuMemSetAccess gave its device.
      if (is_device && device.vmm) {
        CUmemLocation location{CU_MEM_LOCATION_TYPE_DEVICE, ordinal};
        unsigned long long flags = 0;
        if (CUresult rc = cuMemGetAccess(&flags, &location, ptr); rc != CUDA_SUCCESS) return rc;
        *static_cast<int*>(data) = static_cast<int>(flags);
      } else {
        *static_cast<int*>(data) = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
      }
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      *static_cast<CUmemoryPool*>(data) = is_device ? device.pool : nullptr;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
      // The allocation or the VMM mapping the pointer is in (the address book keeps each).
      *static_cast<void**>(data) =
          is_device ? reinterpret_cast<void*>(device.base) : static_cast<void*>(pinned.base);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      *static_cast<size_t*>(data) = is_device ? device.bytes : pinned.bytes;
      return CUDA_SUCCESS;
    default:
      log_once("cuPointerGetAttribute." + std::to_string(attribute), LogLevel::kWarn,
               "cuPointerGetAttribute: attribute {} is not supported by mpsshim",
               static_cast<int>(attribute));
      return CUDA_ERROR_NOT_SUPPORTED;
  }
}

std::size_t attribute_size(CUpointer_attribute attribute) {
  switch (attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
      return 8;
    default:
      return 4;
  }
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attribute,
                                                      CUdeviceptr ptr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return pointer_attribute(data, attribute, ptr);
}

// Unlike the singular form, the real driver answers for memory it does not know (host memory
// malloc'ed by the app) with zeroed values: PyTorch and CuPy rely on that to classify pointers.
MPSSHIM_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int count,
                                                       CUpointer_attribute* attributes, void** data,
                                                       CUdeviceptr ptr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (attributes == nullptr || data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i) {
    if (data[i] == nullptr) continue;
    CUresult rc = pointer_attribute(data[i], attributes[i], ptr);
    // A registered range has no device pointer (refused above, logged): report it as 0 here,
    // where cudaPointerGetAttributes asks for it together with the host-side attributes.
    if (rc == CUDA_ERROR_INVALID_VALUE ||
        (rc == CUDA_ERROR_NOT_SUPPORTED && attributes[i] == CU_POINTER_ATTRIBUTE_DEVICE_POINTER)) {
      std::memset(data[i], 0, attribute_size(attributes[i]));
    } else if (rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  return CUDA_SUCCESS;
}
