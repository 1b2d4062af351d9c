// Virtual memory management: the client's physical allocations (cuMemCreate), address
// reservations (cuMemAddressReserve) and the mappings between them (cuMemMap), owned by its
// session like cuMemAlloc memory. docs/vmm.md says what is served and why.
#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <vector>

#include "broker/server/driver/driver.hpp"
#include "broker/server/ops/ops.hpp"
#include "broker/server/session/client_socket.hpp"
#include "common/log.hpp"
#include "proto/control.hpp"
#include "proto/ops_vmm.hpp"

namespace mpsshim::server {
namespace {

constexpr std::uint32_t kAccessFlagsKnown[] = {CU_MEM_ACCESS_FLAGS_PROT_NONE,
                                               CU_MEM_ACCESS_FLAGS_PROT_READ,
                                               CU_MEM_ACCESS_FLAGS_PROT_READWRITE};

CUresult refuse_unsupported(const Session& session, const char* what) {
  log_warn("{} asked for {}, which mpsshim does not serve (docs/vmm.md)", session.who(), what);
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace

CUresult driver_prop(const Session& session, const proto::VmmProp& wire, CUmemAllocationProp* out) {
  if (wire.type == CU_MEM_ALLOCATION_TYPE_MANAGED) {
    return refuse_unsupported(session, "managed VMM memory (CU_MEM_ALLOCATION_TYPE_MANAGED)");
  }
  if (wire.type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (wire.location_type == CU_MEM_LOCATION_TYPE_HOST ||
      wire.location_type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
      wire.location_type == CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT) {
    return refuse_unsupported(session, "VMM memory on the host (CU_MEM_LOCATION_TYPE_HOST*)");
  }
  if (wire.location_type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
  // A POSIX fd may be requested (PyTorch and NCCL do): op_vmm_export hands it out.
  if ((wire.handle_types & ~std::uint32_t{CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR}) != 0) {
    return refuse_unsupported(session, "a fabric or Win32 shareable VMM handle type");
  }
  *out = CUmemAllocationProp{};
  out->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  out->requestedHandleTypes = static_cast<CUmemAllocationHandleType>(wire.handle_types);
  out->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  out->location.id = session.gpu().device;
  out->allocFlags.compressionType = wire.compression;
  out->allocFlags.gpuDirectRDMACapable = wire.rdma_capable;
  out->allocFlags.usage = wire.usage;
  return CUDA_SUCCESS;
}

namespace {

bool wraps(std::uint64_t address, std::uint64_t bytes) {
  return bytes > std::numeric_limits<std::uint64_t>::max() - address;
}

// The reservation [address, address + bytes) lies in, or end().
auto reservation_holding(VirtualMemory& vmm, std::uint64_t address, std::uint64_t bytes) {
  auto after = vmm.reservations.upper_bound(address);
  if (after == vmm.reservations.begin() || bytes == 0 || wraps(address, bytes)) {
    return vmm.reservations.end();
  }
  auto it = std::prev(after);
  const std::uint64_t offset = address - it->first;
  if (offset >= it->second.bytes || bytes > it->second.bytes - offset) {
    return vmm.reservations.end();
  }
  return it;
}

bool overlaps_mapping(const VirtualMemory& vmm, std::uint64_t address, std::uint64_t bytes) {
  auto next = vmm.mappings.lower_bound(address);
  if (next != vmm.mappings.end() && next->first - address < bytes) return true;
  if (next == vmm.mappings.begin()) return false;
  auto prev = std::prev(next);
  return address - prev->first < prev->second.bytes;
}

// The mapping that holds `address`, or end().
auto mapping_holding(VirtualMemory& vmm, std::uint64_t address) {
  auto after = vmm.mappings.upper_bound(address);
  if (after == vmm.mappings.begin()) return vmm.mappings.end();
  auto it = std::prev(after);
  return address - it->first < it->second.bytes ? it : vmm.mappings.end();
}

enum class Cover { kWholeMappings, kPartOfMappings, kNotMapped };

// Whether [address, address + bytes) is exactly a run of back-to-back mappings; their bases in
// `bases` when it is.
Cover whole_mappings(VirtualMemory& vmm, std::uint64_t address, std::uint64_t bytes,
                     std::vector<std::uint64_t>* bases) {
  if (bytes == 0 || wraps(address, bytes)) return Cover::kNotMapped;
  auto it = mapping_holding(vmm, address);
  if (it == vmm.mappings.end()) return Cover::kNotMapped;
  bool whole = it->first == address;
  std::uint64_t at = it->first;
  const std::uint64_t end = address + bytes;
  while (at < end) {
    if (it == vmm.mappings.end() || it->first != at) return Cover::kNotMapped;
    bases->push_back(it->first);
    at += it->second.bytes;
    ++it;
  }
  return whole && at == end ? Cover::kWholeMappings : Cover::kPartOfMappings;
}

// Unmaps one mapping (the driver waits for work that may still use it) and forgets it.
CUresult unmap(Session& session, std::uint64_t base) {
  auto it = session.vmm.mappings.find(base);
  const VmmMapping mapping = it->second;
  if (CUresult r = session.cu().cuMemUnmap(base, mapping.bytes); r != CUDA_SUCCESS) return r;
  session.vmm.mappings.erase(it);
  session.memory.remove(base);
  if (PhysicalAllocObj* allocation = session.objects.get<PhysicalAllocObj>(mapping.allocation)) {
    --allocation->mappings;
  }
  release_if_unused(session, mapping.allocation);
  return CUDA_SUCCESS;
}

}  // namespace

void release_if_unused(Session& session, std::uint64_t id) {
  PhysicalAllocObj* allocation = session.objects.get<PhysicalAllocObj>(id);
  if (allocation == nullptr || allocation->client_refs != 0 || allocation->mappings != 0) return;
  if (CUresult r = session.cu().cuMemRelease(allocation->handle); r != CUDA_SUCCESS) {
    log_warn("{}: cuMemRelease failed: {}", session.who(), describe(session.cu(), r));
  }
  // Shared and still open elsewhere: charged to this client until the last opener closes it.
  const bool still_open = allocation->shared && unshare_physical(session, allocation->shared);
  if (allocation->bytes != PhysicalAllocObj::kImportedBytes && !still_open) {
    session.charge.release(allocation->bytes);
  }
  session.objects.take<PhysicalAllocObj>(id);
}

OpResult op_vmm_granularity(Call& call) {
  auto req = call.request<proto::VmmGranularityReq>();
  if (req.option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
      req.option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  CUmemAllocationProp prop;
  if (CUresult r = driver_prop(call.session, req.prop, &prop); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  std::size_t granularity = 0;
  if (CUresult r = call.cu.cuMemGetAllocationGranularity(
          &granularity, &prop, static_cast<CUmemAllocationGranularity_flags>(req.option));
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.reply(proto::VmmGranularityRep{granularity});
}

namespace {

// A physical allocation of `bytes` for the client, charged to it first: its handle's id, or the
// error (CUDA_ERROR_OUT_OF_MEMORY from the driver or the full handle table; what the charge
// refused is logged and answered by the caller through `over_limit`). `driver_out_of_memory`:
// the driver had no room, the one refusal a memory policy may wait out.
tl::expected<std::uint64_t, CUresult> create_for_client(
    Session& session, std::uint64_t bytes, const proto::VmmProp& wire,
    const std::function<CUresult(MemoryLimitHit)>& over_limit, bool& driver_out_of_memory) {
  CUmemAllocationProp prop;
  if (CUresult r = driver_prop(session, wire, &prop); r != CUDA_SUCCESS) return tl::unexpected(r);
  // Charged before the driver is asked, to the client and to its allocation (the limit a pod's
  // clients share, docs/kubernetes.md); given back if the driver or the table refuses.
  auto held = session.charge.reserve(bytes);
  if (!held) return tl::unexpected(over_limit(held.error()));
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult r = session.cu().cuMemCreate(&handle, static_cast<std::size_t>(bytes), &prop, 0);
      r != CUDA_SUCCESS) {
    driver_out_of_memory = r == CUDA_ERROR_OUT_OF_MEMORY;
    return tl::unexpected(r);
  }
  PhysicalAllocObj allocation;
  allocation.handle = handle;
  allocation.bytes = bytes;
  allocation.prop = wire;
  const std::uint64_t id = session.objects.insert(allocation);
  if (id == 0) {
    session.cu().cuMemRelease(handle);
    return tl::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  }
  held->keep();
  return id;
}

}  // namespace

OpResult op_vmm_create(Call& call) {
  auto req = call.request<proto::VmmCreateReq>();
  Session& session = call.session;
  if (req.bytes == 0 || req.flags != 0) return call.done(CUDA_ERROR_INVALID_VALUE);
  std::optional<OpResult> refused;
  bool driver_out_of_memory = false;
  auto created = create_for_client(
      session, req.bytes, req.prop,
      [&](MemoryLimitHit why) {
        refused = refuse_over_limit(call, req.bytes, "device memory (cuMemCreate)", why);
        return CUDA_ERROR_OUT_OF_MEMORY;
      },
      driver_out_of_memory);
  if (refused) return *refused;
  if (created) return call.reply(proto::VmmHandleRep{*created});
  // The driver's own CUDA_ERROR_OUT_OF_MEMORY may wait for a memory policy, as cuMemAlloc's does.
  if (driver_out_of_memory && wait_for_memory(call, MemoryWait{.call = MemoryWait::Call::kMemCreate,
                                                               .bytes = req.bytes,
                                                               .prop = req.prop})) {
    return call.deferred();
  }
  return call.done(created.error());
}

tl::expected<std::uint64_t, CUresult> retry_vmm_create(Session& session, const MemoryWait& wait,
                                                       bool& may_wait_more) {
  return create_for_client(
      session, wait.bytes, wait.prop, [](MemoryLimitHit) { return CUDA_ERROR_OUT_OF_MEMORY; },
      may_wait_more);
}

// The physical allocation as a POSIX fd another process can import (NCCL's P2P transport shares
// its buffers so): sent on the client's socket before the answer, as the driver hands one out.
// Only what the client created asking for that handle type, as the driver requires.
PhysicalAllocObj* exportable_allocation(Session& session, std::uint64_t handle) {
  PhysicalAllocObj* allocation = session.objects.get<PhysicalAllocObj>(handle);
  if (allocation == nullptr || allocation->client_refs == 0 ||
      (allocation->prop.handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
    return nullptr;
  }
  return allocation;
}

OpResult op_vmm_export(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  PhysicalAllocObj* allocation = exportable_allocation(session, req.handle);
  if (allocation == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  int exported = -1;
  if (CUresult r = call.cu.cuMemExportToShareableHandle(
          &exported, allocation->handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  // Marked before it is sent: a send that fails part-way may still have passed the fd.
  allocation->exported = true;
  if (CUresult r = send_memory_fd(session, proto::UniqueFd(exported), allocation->bytes);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.done();
}

// A shareable handle another process exported, as a physical allocation of this client: mapped
// and given access like its own (the driver checks each mapping against the real size). The
// memory stays charged to the exporter.
OpResult op_vmm_import(Call& call) {
  auto req = call.request<proto::VmmImportReq>();
  Session& session = call.session;
  auto stashed = take_stashed_fd(session, req.token, proto::MessageKind::kPeerMemory);
  if (!stashed) return call.done(stashed.error());
  CUmemGenericAllocationHandle handle = 0;
  if (CUresult r = call.cu.cuMemImportFromShareableHandle(
          &handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(stashed->fd.get())),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  PhysicalAllocObj allocation;
  allocation.handle = handle;
  allocation.bytes = PhysicalAllocObj::kImportedBytes;
  allocation.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  allocation.prop.location_type = CU_MEM_LOCATION_TYPE_DEVICE;
  allocation.prop.handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  const std::uint64_t id = session.objects.insert(allocation);
  if (id == 0) {
    call.cu.cuMemRelease(handle);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return call.reply(proto::VmmHandleRep{id});
}

OpResult op_vmm_release(Call& call) {
  auto req = call.request<proto::HandleReq>();
  PhysicalAllocObj* allocation = call.session.objects.get<PhysicalAllocObj>(req.handle);
  if (allocation == nullptr || allocation->client_refs == 0) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  --allocation->client_refs;
  release_if_unused(call.session, req.handle);
  return call.done();
}

namespace {

// A client's reservation in the server's arena: the address it asked for when that is in the
// arena and free (the driver too treats it as a hint), else the first range that fits. No
// driver call: the whole arena is one reservation of the server (device_heap.hpp), and the
// driver maps into any granule-aligned part of a reservation.
CUresult reserve_in_arena(DeviceHeap& heap, const proto::VmmReserveReq& req, CUdeviceptr* out) {
  const std::uint64_t granule = heap.granularity();
  if (req.bytes % granule != 0 || (req.alignment & (req.alignment - 1)) != 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (req.address != 0 && req.address % granule == 0 &&
      (req.alignment == 0 || req.address % req.alignment == 0) &&
      heap.arena().take_at(req.address, req.bytes)) {
    *out = req.address;
    return CUDA_SUCCESS;
  }
  auto address = heap.arena().take(req.bytes, std::max<std::uint64_t>(req.alignment, granule));
  if (!address) return CUDA_ERROR_OUT_OF_MEMORY;
  *out = *address;
  return CUDA_SUCCESS;
}

}  // namespace

void free_reservation(Session& session, std::uint64_t base, std::uint64_t bytes) {
  if (DeviceHeap* heap = session.gpu().heap.get()) {
    heap->arena().give(base, bytes);
    return;
  }
  if (CUresult r = session.cu().cuMemAddressFree(base, static_cast<std::size_t>(bytes));
      r != CUDA_SUCCESS) {
    log_warn("{}: cuMemAddressFree failed while freeing: {}", session.who(),
             describe(session.cu(), r));
  }
}

OpResult op_vmm_reserve(Call& call) {
  auto req = call.request<proto::VmmReserveReq>();
  VirtualMemory& vmm = call.session.vmm;
  if (req.bytes == 0 || req.flags != 0) return call.done(CUDA_ERROR_INVALID_VALUE);
  if (vmm.reservations.size() >= kMaxVmmRanges) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  CUdeviceptr address = 0;
  if (DeviceHeap* heap = call.session.gpu().heap.get()) {
    if (CUresult r = reserve_in_arena(*heap, req, &address); r != CUDA_SUCCESS) {
      return call.done(r);
    }
  } else if (CUresult r = call.cu.cuMemAddressReserve(&address, static_cast<std::size_t>(req.bytes),
                                                      static_cast<std::size_t>(req.alignment),
                                                      req.address, 0);
             r != CUDA_SUCCESS) {
    return call.done(r);
  }
  vmm.reservations[address] = VmmReservation{req.bytes};
  return call.reply(proto::VmmAddressRep{address});
}

OpResult op_vmm_address_free(Call& call) {
  auto req = call.request<proto::VmmRangeReq>();
  VirtualMemory& vmm = call.session.vmm;
  auto it = vmm.reservations.find(req.address);
  if (it == vmm.reservations.end() || it->second.bytes != req.bytes) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  // Mapped memory must be unmapped first, as the driver requires.
  if (overlaps_mapping(vmm, req.address, req.bytes)) return call.done(CUDA_ERROR_INVALID_VALUE);
  if (!call.session.gpu().heap) {
    if (CUresult r = call.cu.cuMemAddressFree(req.address, static_cast<std::size_t>(req.bytes));
        r != CUDA_SUCCESS) {
      return call.done(r);
    }
  } else {
    free_reservation(call.session, req.address, req.bytes);
  }
  vmm.reservations.erase(it);
  return call.done();
}

OpResult op_vmm_map(Call& call) {
  auto req = call.request<proto::VmmMapReq>();
  Session& session = call.session;
  VirtualMemory& vmm = session.vmm;
  if (req.bytes == 0 || req.flags != 0) return call.done(CUDA_ERROR_INVALID_VALUE);
  // Only the client's own, unreleased handles: another client's id names nothing here.
  PhysicalAllocObj* allocation = session.objects.get<PhysicalAllocObj>(req.handle);
  if (allocation == nullptr || allocation->client_refs == 0) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (req.offset > allocation->bytes || req.bytes > allocation->bytes - req.offset) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (reservation_holding(vmm, req.address, req.bytes) == vmm.reservations.end() ||
      overlaps_mapping(vmm, req.address, req.bytes)) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (vmm.mappings.size() >= kMaxVmmRanges) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  if (CUresult r = call.cu.cuMemMap(req.address, static_cast<std::size_t>(req.bytes),
                                    static_cast<std::size_t>(req.offset), allocation->handle, 0);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  vmm.mappings[req.address] = VmmMapping{req.bytes, req.handle, req.offset, 0};
  ++allocation->mappings;
  return call.done();
}

OpResult op_vmm_unmap(Call& call) {
  auto req = call.request<proto::VmmRangeReq>();
  std::vector<std::uint64_t> bases;
  if (whole_mappings(call.session.vmm, req.address, req.bytes, &bases) != Cover::kWholeMappings) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  for (std::uint64_t base : bases) {
    if (CUresult r = unmap(call.session, base); r != CUDA_SUCCESS) return call.done(r);
  }
  return call.done();
}

OpResult op_vmm_set_access(Call& call) {
  auto req = call.request<proto::VmmSetAccessReq>();
  Session& session = call.session;
  if (req.count > proto::kMaxVmmAccessDescs ||
      !call.exact(sizeof(req), std::uint64_t{req.count} * sizeof(proto::VmmAccessDesc))) {
    return call.malformed(
        fmt::format("sent a cuMemSetAccess record whose {} access descriptors "
                    "do not match its size",
                    req.count));
  }
  if (req.count == 0) return call.done(CUDA_ERROR_INVALID_VALUE);
  std::uint32_t flags = 0;
  for (std::uint32_t i = 0; i < req.count; ++i) {
    proto::VmmAccessDesc desc;
    std::memcpy(&desc, call.payload.data() + sizeof(req) + i * sizeof(desc), sizeof(desc));
    if (desc.location_type != CU_MEM_LOCATION_TYPE_DEVICE) {
      return call.done(refuse_unsupported(session, "access to VMM memory from the host"));
    }
    if (std::find(std::begin(kAccessFlagsKnown), std::end(kAccessFlagsKnown), desc.flags) ==
        std::end(kAccessFlagsKnown)) {
      return call.done(CUDA_ERROR_INVALID_VALUE);
    }
    flags = desc.flags;  // one device per server: the last word for it holds
  }
  std::vector<std::uint64_t> bases;
  switch (whole_mappings(session.vmm, req.address, req.bytes, &bases)) {
    case Cover::kNotMapped:
      return call.done(CUDA_ERROR_INVALID_VALUE);
    case Cover::kPartOfMappings:
      return call.done(refuse_unsupported(session, "access flags for part of a mapping"));
    case Cover::kWholeMappings:
      break;
  }
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = session.gpu().device;
  desc.flags = static_cast<CUmemAccess_flags>(flags);
  if (CUresult r =
          call.cu.cuMemSetAccess(req.address, static_cast<std::size_t>(req.bytes), &desc, 1);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  for (std::uint64_t base : bases) {
    VmmMapping& mapping = session.vmm.mappings[base];
    mapping.access = flags;
    session.memory.remove(base);
    // Copies and memsets write as well as read: only read-write memory is a target.
    if (flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
      session.memory.add(DeviceRange{base, mapping.bytes, RangeKind::kMapped, mapping.allocation});
    }
  }
  return call.done();
}

OpResult op_vmm_get_access(Call& call) {
  auto req = call.request<proto::VmmGetAccessReq>();
  if (req.location_type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return call.done(refuse_unsupported(call.session, "access to VMM memory from the host"));
  }
  auto it = mapping_holding(call.session.vmm, req.address);
  if (it == call.session.vmm.mappings.end()) return call.done(CUDA_ERROR_INVALID_VALUE);
  return call.reply(proto::VmmGetAccessRep{it->second.access});
}

OpResult op_vmm_get_properties(Call& call) {
  auto req = call.request<proto::HandleReq>();
  const PhysicalAllocObj* allocation = call.session.objects.get<PhysicalAllocObj>(req.handle);
  if (allocation == nullptr || allocation->client_refs == 0) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  return call.reply(allocation->prop);
}

OpResult op_vmm_retain(Call& call) {
  auto req = call.request<proto::VmmRetainReq>();
  Session& session = call.session;
  auto it = mapping_holding(session.vmm, req.address);
  if (it == session.vmm.mappings.end()) return call.done(CUDA_ERROR_INVALID_VALUE);
  PhysicalAllocObj* allocation = session.objects.get<PhysicalAllocObj>(it->second.allocation);
  if (allocation == nullptr) return call.done(CUDA_ERROR_INVALID_VALUE);
  if (allocation->client_refs == std::numeric_limits<std::uint32_t>::max()) {
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  ++allocation->client_refs;
  return call.reply(proto::VmmHandleRep{it->second.allocation});
}

void free_virtual_memory(Session& session, FreedTally& tally) {
  const DriverTable& cu = session.cu();
  auto warn_if_failed = [&](CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) {
      log_warn("{}: {} failed while freeing: {}", session.who(), what, describe(cu, r));
    }
  };
  for (const auto& [base, mapping] : session.vmm.mappings) {
    // A suspended client's parked allocations are mapped nowhere (session/vmm_park.hpp).
    const PhysicalAllocObj* allocation = session.objects.get<PhysicalAllocObj>(mapping.allocation);
    if (allocation == nullptr || allocation->handle != 0) {
      warn_if_failed(cu.cuMemUnmap(base, static_cast<std::size_t>(mapping.bytes)), "cuMemUnmap");
    }
    ++tally.mappings;
  }
  session.vmm.mappings.clear();
  session.memory.remove_if([](const DeviceRange& r) { return r.kind == RangeKind::kMapped; });
  for (std::uint64_t id : session.objects.ids<PhysicalAllocObj>()) {
    auto allocation = session.objects.take<PhysicalAllocObj>(id);
    if (allocation->shared) unshare_physical(session, allocation->shared);
    if (allocation->handle != 0)
      warn_if_failed(cu.cuMemRelease(allocation->handle), "cuMemRelease");
    ++tally.physical_allocations;
    if (allocation->bytes != PhysicalAllocObj::kImportedBytes) {
      tally.physical_bytes += allocation->bytes;
    }
  }
  if (session.vmm.parked.host != nullptr) {
    session.gpu().heap->unpin(session.vmm.parked.host, session.vmm.parked.bytes);
    session.vmm.parked = {};
  }
  for (const auto& [base, reservation] : session.vmm.reservations) {
    free_reservation(session, base, reservation.bytes);
    ++tally.reservations;
  }
  session.vmm.reservations.clear();
  for (auto& [id, memory] : session.vmm.shared_opens) close_shared_open(session, memory);
  session.vmm.shared_opens.clear();
}

}  // namespace mpsshim::server
