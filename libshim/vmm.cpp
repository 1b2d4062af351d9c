// Virtual memory management (cuMemCreate, cuMemAddressReserve, cuMemMap, ...): the physical
// allocations, reservations and mappings live on the server of a GPU, which checks every
// request against the client's own (docs/vmm.md). The client remembers which server each of
// its reservations belongs to, and which address ranges are mapped (for unified-addressing
// copies and pointer attributes).
// What a CUmemGenericAllocationHandle holds: vmm_handle.hpp.
#include <unistd.h>

#include <map>
#include <mutex>
#include <vector>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "libshim/peer.hpp"
#include "libshim/vmm_handle.hpp"
#include "libshim/vmm_share.hpp"
#include "proto/ops_vmm.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

namespace {

// A reservation: which GPU's server made it, and the context that was current then (pointer
// attributes name it).
struct Reservation {
  std::uint64_t bytes = 0;
  int device = 0;
  Context* ctx = nullptr;
};

struct Reservations {
  std::mutex mutex;
  std::map<std::uint64_t, Reservation> by_base;

  // The reservation holding `address`; false when none does.
  bool find(std::uint64_t address, std::uint64_t* base, Reservation* out) {
    std::lock_guard lock(mutex);
    auto after = by_base.upper_bound(address);
    if (after == by_base.begin()) return false;
    auto it = std::prev(after);
    if (address - it->first >= it->second.bytes) return false;
    if (base) *base = it->first;
    *out = it->second;
    return true;
  }
};

Reservations& reservations() {
  static Reservations* r = new Reservations();
  return *r;
}

// What each mapping maps (cuMemSetAccess for a peer GPU exports the physical allocation).
struct Mapping {
  std::uint64_t bytes = 0;
  std::uint64_t offset = 0;
  proto::WireHandle wire = 0;
  // Another GPU's allocation imported into this reservation's server for the mapping: that
  // handle is released with the mapping.
  bool imported = false;
};
struct Mappings {
  std::mutex mutex;
  std::map<std::uint64_t, Mapping> by_base;
};
Mappings& mappings() {
  static Mappings* m = new Mappings();
  return *m;
}

CUresult not_supported(const std::string& key, const char* what) {
  log_once("vmm." + key, LogLevel::kWarn, "{} is not supported by mpsshim (docs/vmm.md)", what);
  return CUDA_ERROR_NOT_SUPPORTED;
}

// The device a location names, as the servers serve it: device memory of a visible GPU.
CUresult device_of(const CUmemLocation& location, int& device) {
  if (location.type == CU_MEM_LOCATION_TYPE_HOST ||
      location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
      location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
    return not_supported("host",
                         "VMM memory on or accessed from the host (CU_MEM_LOCATION_TYPE_HOST*)");
  }
  if (location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  if (location.id < 0 || location.id >= visible_device_count()) return CUDA_ERROR_INVALID_DEVICE;
  device = location.id;
  return CUDA_SUCCESS;
}

CUresult wire_prop(const CUmemAllocationProp* prop, int& device, proto::VmmProp& out) {
  if (prop == nullptr || prop->win32HandleMetaData != nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type == CU_MEM_ALLOCATION_TYPE_MANAGED) {
    return not_supported("managed", "managed VMM memory (CU_MEM_ALLOCATION_TYPE_MANAGED)");
  }
  if ((prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
    return not_supported("handle_type", "a fabric or Win32 shareable VMM handle type");
  }
  if (CUresult rc = device_of(prop->location, device); rc != CUDA_SUCCESS) return rc;
  out = proto::VmmProp{};
  out.type = prop->type;
  out.handle_types = prop->requestedHandleTypes;
  out.location_type = prop->location.type;
  out.compression = prop->allocFlags.compressionType;
  out.rdma_capable = prop->allocFlags.gpuDirectRDMACapable;
  out.usage = prop->allocFlags.usage;
  return CUDA_SUCCESS;
}

// Forgets the mapped ranges in [address, address + bytes) (cuMemUnmap succeeded).
void forget_mapped(std::uint64_t address, std::uint64_t bytes) {
  for (std::uint64_t at = address; at < address + bytes;) {
    DeviceRange range{};
    if (!address_book().remove_device(at, &range)) break;
    at += range.bytes;
  }
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(
    size_t* granularity, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags option) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  proto::VmmGranularityReq request{};
  if (CUresult rc = wire_prop(prop, device, request.prop); rc != CUDA_SUCCESS) return rc;
  request.option = option;
  Session* session = nullptr;
  if (CUresult rc = session_for(device, session); rc != CUDA_SUCCESS) return rc;
  proto::VmmGranularityRep reply{};
  if (CUresult rc = session->call(proto::Op::kVmmGranularity, request, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *granularity = reply.bytes;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                            const CUmemAllocationProp* prop,
                                            unsigned long long flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  proto::VmmCreateReq request{};
  if (CUresult rc = wire_prop(prop, device, request.prop); rc != CUDA_SUCCESS) return rc;
  request.bytes = size;
  request.flags = flags;
  Session* session = nullptr;
  if (CUresult rc = session_for(device, session); rc != CUDA_SUCCESS) return rc;
  proto::VmmHandleRep reply{};
  if (CUresult rc = session->call(proto::Op::kVmmCreate, request, &reply); rc != CUDA_SUCCESS) {
    return rc;
  }
  *handle = to_client(device, reply.handle);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Session* session = nullptr;
  proto::WireHandle wire = 0;
  if (CUresult rc = from_client(handle, session, wire); rc != CUDA_SUCCESS) return rc;
  CUresult rc =
      session->call(proto::Op::kVmmRelease, proto::HandleReq{wire}, static_cast<int*>(nullptr));
  if (rc == CUDA_SUCCESS) shared_released(handle);
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Session* session = nullptr;
  proto::WireHandle wire = 0;
  if (CUresult rc = from_client(handle, session, wire); rc != CUDA_SUCCESS) return rc;
  proto::VmmProp reply{};
  if (CUresult rc = session->call(proto::Op::kVmmGetProperties, proto::HandleReq{wire}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *prop = CUmemAllocationProp{};
  prop->type = static_cast<CUmemAllocationType>(reply.type);
  prop->requestedHandleTypes = static_cast<CUmemAllocationHandleType>(reply.handle_types);
  prop->location.type = static_cast<CUmemLocationType>(reply.location_type);
  prop->location.id = vmm_handle_device(handle);
  prop->allocFlags.compressionType = reply.compression;
  prop->allocFlags.gpuDirectRDMACapable = reply.rdma_capable;
  prop->allocFlags.usage = reply.usage;
  return CUDA_SUCCESS;
}

// A reservation belongs to the server of the current context's GPU (the first GPU without a
// current context): every GPU has its own server and address space under mpsshim.
MPSSHIM_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment,
                                                    CUdeviceptr addr, unsigned long long flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (ptr == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  Context* ctx = nullptr;
  if (current(ctx) != CUDA_SUCCESS) ctx = nullptr;
  const int device = ctx != nullptr ? ctx->device : 0;
  Session* session = nullptr;
  if (CUresult rc = session_for(device, session); rc != CUDA_SUCCESS) return rc;
  proto::VmmReserveReq request{size, alignment, addr, flags};
  proto::VmmAddressRep reply{};
  if (CUresult rc = session->call(proto::Op::kVmmReserve, request, &reply); rc != CUDA_SUCCESS) {
    return rc;
  }
  {
    std::lock_guard lock(reservations().mutex);
    reservations().by_base[reply.address] = Reservation{size, device, ctx};
  }
  *ptr = reply.address;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  std::uint64_t base = 0;
  Reservation reservation{};
  if (!reservations().find(ptr, &base, &reservation) || base != ptr) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Session* session = nullptr;
  if (CUresult rc = session_for(reservation.device, session); rc != CUDA_SUCCESS) return rc;
  CUresult rc = session->call(proto::Op::kVmmAddressFree, proto::VmmRangeReq{ptr, size},
                              static_cast<int*>(nullptr));
  if (rc == CUDA_SUCCESS) {
    std::lock_guard lock(reservations().mutex);
    reservations().by_base.erase(ptr);
  }
  return rc;
}

namespace {

// The driver's own fd of one of this process's physical allocations (kVmmExport): what another
// GPU's server imports to map it. Never handed to the application (that gets a shared handle).
CUresult export_driver_fd(CUmemGenericAllocationHandle handle, proto::UniqueFd& fd) {
  Session* session = nullptr;
  proto::WireHandle wire = 0;
  if (CUresult rc = from_client(handle, session, wire); rc != CUDA_SUCCESS) return rc;
  std::lock_guard receiving(session->fd_receive_mutex());
  if (CUresult rc =
          session->call(proto::Op::kVmmExport, proto::HandleReq{wire}, static_cast<int*>(nullptr));
      rc != CUDA_SUCCESS) {
    return rc;
  }
  return session->receive_fd(proto::MessageKind::kPeerMemory, fd);
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                         CUmemGenericAllocationHandle handle,
                                         unsigned long long flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Reservation reservation{};
  if (!reservations().find(ptr, nullptr, &reservation)) return CUDA_ERROR_INVALID_VALUE;
  Session* session = nullptr;
  proto::WireHandle wire = 0;
  if (CUresult rc = from_client(handle, session, wire); rc != CUDA_SUCCESS) return rc;
  const int handle_device = vmm_handle_device(handle);
  bool imported = false;
  if (handle_device != reservation.device) {
    // Another GPU's memory into this GPU's reservation (NCCL in one process maps its peers'
    // buffers so): the reservation's server imports the allocation (its fd) and maps that.
    int can = 0;
    if (cuDeviceCanAccessPeer(&can, reservation.device, handle_device) != CUDA_SUCCESS ||
        can == 0) {
      return not_supported("cross_gpu", "mapping memory of a GPU that is not a peer");
    }
    proto::UniqueFd fd;
    if (CUresult rc = export_driver_fd(handle, fd); rc != CUDA_SUCCESS) {
      return not_supported("cross_gpu_export",
                           "mapping another GPU's memory that was not created exportable "
                           "(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)");
    }
    if (CUresult rc = session_for(reservation.device, session); rc != CUDA_SUCCESS) return rc;
    std::uint32_t token = 0;
    if (CUresult sent = session->send_fd(proto::MessageKind::kPeerMemory, fd.get(), 0, token);
        sent != CUDA_SUCCESS) {
      return sent;
    }
    proto::VmmHandleRep reply{};
    if (CUresult rc = session->call(proto::Op::kVmmImport, proto::VmmImportReq{token, 0}, &reply);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    wire = reply.handle;
    imported = true;
  }
  proto::VmmMapReq request{ptr, size, offset, wire, flags};
  CUresult rc = session->call(proto::Op::kVmmMap, request, static_cast<int*>(nullptr));
  if (rc != CUDA_SUCCESS && imported) {
    session->call(proto::Op::kVmmRelease, proto::HandleReq{wire}, static_cast<int*>(nullptr));
  }
  if (rc == CUDA_SUCCESS) {
    address_book().add_device({ptr, size, reservation.ctx, true, reservation.device});
    {
      std::lock_guard lock(mappings().mutex);
      mappings().by_base[ptr] = Mapping{size, offset, wire, imported};
    }
    if (!imported) shared_mapped(handle);
  }
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Reservation reservation{};
  if (!reservations().find(ptr, nullptr, &reservation)) return CUDA_ERROR_INVALID_VALUE;
  Session* session = nullptr;
  if (CUresult rc = session_for(reservation.device, session); rc != CUDA_SUCCESS) return rc;
  // Peer GPUs' servers that map it let go first (peer.hpp).
  forget_peer_blocks(reservation.device, ptr, size);
  CUresult rc = session->call(proto::Op::kVmmUnmap, proto::VmmRangeReq{ptr, size},
                              static_cast<int*>(nullptr));
  if (rc == CUDA_SUCCESS) {
    forget_mapped(ptr, size);
    std::vector<proto::WireHandle> imported, own;
    {
      std::lock_guard lock(mappings().mutex);
      auto& all = mappings().by_base;
      for (auto it = all.lower_bound(ptr); it != all.lower_bound(ptr + size); ++it) {
        (it->second.imported ? imported : own).push_back(it->second.wire);
      }
      all.erase(all.lower_bound(ptr), all.lower_bound(ptr + size));
    }
    for (proto::WireHandle wire : imported) {
      session->call(proto::Op::kVmmRelease, proto::HandleReq{wire}, static_cast<int*>(nullptr));
    }
    for (proto::WireHandle wire : own) shared_unmapped(to_client(reservation.device, wire));
  }
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                               const CUmemAccessDesc* desc, size_t count) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (desc == nullptr || count == 0 || count > proto::kMaxVmmAccessDescs) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Reservation reservation{};
  if (!reservations().find(ptr, nullptr, &reservation)) return CUDA_ERROR_INVALID_VALUE;
  std::vector<proto::VmmAccessDesc> wire;
  std::vector<int> peers;
  for (size_t i = 0; i < count; ++i) {
    int device = 0;
    if (CUresult rc = device_of(desc[i].location, device); rc != CUDA_SUCCESS) return rc;
    if (device != reservation.device) {
      // Another GPU: its server maps the same memory at the same address (peer.hpp).
      int can = 0;
      if (cuDeviceCanAccessPeer(&can, device, reservation.device) != CUDA_SUCCESS || can == 0) {
        return not_supported("peer", "access to VMM memory from a GPU that is not its peer");
      }
      if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) peers.push_back(device);
      continue;
    }
    wire.push_back(
        proto::VmmAccessDesc{desc[i].location.type, static_cast<std::uint32_t>(desc[i].flags)});
  }
  if (!wire.empty()) {
    Session* session = nullptr;
    if (CUresult rc = session_for(reservation.device, session); rc != CUDA_SUCCESS) return rc;
    proto::VmmSetAccessReq request{ptr, size, static_cast<std::uint32_t>(wire.size()), 0};
    if (CUresult rc = session->call(proto::Op::kVmmSetAccess, &request, sizeof request,
                                    std::as_bytes(std::span(wire)), nullptr, 0);
        rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  if (peers.empty()) return CUDA_SUCCESS;
  // Every mapping in the range, each a whole physical allocation mapped from its start.
  std::vector<std::pair<std::uint64_t, Mapping>> covered;
  {
    std::lock_guard lock(mappings().mutex);
    auto& all = mappings().by_base;
    for (auto it = all.lower_bound(ptr); it != all.end() && it->first < ptr + size; ++it) {
      covered.emplace_back(it->first, it->second);
    }
  }
  if (covered.empty()) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& [base, mapping] : covered) {
    if (mapping.offset != 0) {
      return not_supported("peer-offset",
                           "peer access to a VMM mapping that starts inside its allocation");
    }
    for (int peer : peers) {
      if (CUresult rc =
              map_vmm_on_peer(peer, reservation.device, base, mapping.bytes, mapping.wire);
          rc != CUDA_SUCCESS) {
        return rc;
      }
    }
  }
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags,
                                               const CUmemLocation* location, CUdeviceptr ptr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (CUresult rc = device_of(*location, device); rc != CUDA_SUCCESS) return rc;
  Reservation reservation{};
  if (!reservations().find(ptr, nullptr, &reservation)) return CUDA_ERROR_INVALID_VALUE;
  if (device != reservation.device) {  // another GPU: whether its server maps it (peer.hpp)
    *flags =
        peer_maps(device, ptr) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return CUDA_SUCCESS;
  }
  Session* session = nullptr;
  if (CUresult rc = session_for(reservation.device, session); rc != CUDA_SUCCESS) return rc;
  proto::VmmGetAccessReq request{ptr, location->type, 0};
  proto::VmmGetAccessRep reply{};
  if (CUresult rc = session->call(proto::Op::kVmmGetAccess, request, &reply); rc != CUDA_SUCCESS) {
    return rc;
  }
  *flags = reply.flags;
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle,
                                                            void* addr) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const auto ptr = reinterpret_cast<std::uint64_t>(addr);
  Reservation reservation{};
  if (!reservations().find(ptr, nullptr, &reservation)) return CUDA_ERROR_INVALID_VALUE;
  Session* session = nullptr;
  if (CUresult rc = session_for(reservation.device, session); rc != CUDA_SUCCESS) return rc;
  proto::VmmHandleRep reply{};
  if (CUresult rc = session->call(proto::Op::kVmmRetain, proto::VmmRetainReq{ptr}, &reply);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  *handle = to_client(reservation.device, reply.handle);
  shared_retained(*handle);
  return CUDA_SUCCESS;
}

// Sharing physical memory between processes with a POSIX fd (docs/vmm.md, "Export and import";
// NCCL's P2P transport shares its buffers so): the fd the application gets is a sealed memfd
// naming the allocation in its server's registry (vmm_share.hpp); a process that imports it
// opens it there, under the same-user policy, and maps the memory through its own server.
MPSSHIM_EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void* shareable,
                                                             CUmemGenericAllocationHandle handle,
                                                             CUmemAllocationHandleType type,
                                                             unsigned long long flags) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return not_supported("export-type", "a fabric or Win32 shareable handle");
  }
  Session* session = nullptr;
  proto::WireHandle wire = 0;
  if (CUresult rc = from_client(handle, session, wire); rc != CUDA_SUCCESS) return rc;
  proto::UniqueFd fd;
  std::lock_guard receiving(session->fd_receive_mutex());
  if (CUresult rc =
          session->call(proto::Op::kVmmShare, proto::HandleReq{wire}, static_cast<int*>(nullptr));
      rc != CUDA_SUCCESS) {
    return rc;
  }
  if (CUresult rc = session->receive_fd(proto::MessageKind::kPeerMemory, fd); rc != CUDA_SUCCESS) {
    return rc;
  }
  *static_cast<int*>(shareable) = fd.release();
  return CUDA_SUCCESS;
}

// The memory goes to the server of the calling thread's current GPU (device 0 with no context
// current), where it is mapped like the client's own; the caller keeps its fd, as with the driver.
MPSSHIM_EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle,
                                                               void* os_handle,
                                                               CUmemAllocationHandleType type) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
    return not_supported("import-type", "a fabric or Win32 shareable handle");
  }
  const int given = static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle));
  if (given < 0) return CUDA_ERROR_INVALID_VALUE;
  int device = 0;
  if (CUcontext current = current_context(); current != nullptr) {
    context_identity(current, &device, nullptr);
  }
  // An export of another mpsshim client: opened on its server first, which answers the driver's
  // fd. Any other fd (one of the driver's own) goes to the server as it is.
  proto::IpcHandle shared{};
  int issuer = -1;
  std::uint64_t open = 0;
  proto::UniqueFd opened;
  int fd = given;
  if (read_shared_handle(given, &shared)) {
    if (CUresult rc = open_shared(shared, &issuer, &open, opened); rc != CUDA_SUCCESS) return rc;
    fd = opened.get();
  }
  Session* session = nullptr;
  std::uint32_t token = 0;
  proto::VmmHandleRep reply{};
  CUresult rc = session_for(device, session);
  if (rc == CUDA_SUCCESS) rc = session->send_fd(proto::MessageKind::kPeerMemory, fd, 0, token);
  if (rc == CUDA_SUCCESS) {
    rc = session->call(proto::Op::kVmmImport, proto::VmmImportReq{token, 0}, &reply);
  }
  if (rc != CUDA_SUCCESS) {
    if (issuer >= 0) close_shared(issuer, open);
    return rc;
  }
  *handle = to_client(device, reply.handle);
  if (issuer >= 0) shared_imported(*handle, issuer, open);
  return CUDA_SUCCESS;
}
