// Peer access between the GPUs of one client (docs/architecture.md, "Peer access"): the server of
// GPU g hands the client the POSIX fd of the physical block holding one of its allocations; the
// server of GPU h maps that block at the same address (every device address lies in its GPU's
// arena, so the address is free in every other server) and gives its own GPU access to it. A
// kernel or copy on GPU h then reaches GPU g's memory over the peer link, as natively.
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstring>

#include "broker/server/ops/ops.hpp"
#include "broker/server/session/client_socket.hpp"
#include "broker/server/session/retire.hpp"
#include "common/log.hpp"
#include "proto/address_arenas.hpp"
#include "proto/control.hpp"

namespace mpsshim::server {

OpResult op_peer_export(Call& call) {
  auto req = call.request<proto::PeerExportReq>();
  Session& session = call.session;
  DeviceHeap* heap = session.gpu().heap.get();
  const DeviceRange* range = session.memory.find_containing(req.address);
  // The client's own allocation, or another client's that it opened with cuIpcOpenMemHandle
  // (it opens a handle of this GPU for a context on another GPU: ipc.md, "Across GPUs"). The
  // block is the exporter's either way, held by this session's open until it closes it.
  std::uint64_t owner = session.client.id;
  if (range != nullptr && range->kind == RangeKind::kOpened) {
    if (auto opened = session.ipc_memory.imports.find(range->base);
        opened != session.ipc_memory.imports.end()) {
      owner = opened->second.memory->owner.client;
    }
  } else if (range != nullptr && range->kind != RangeKind::kAllocation) {
    range = nullptr;
  }
  if (heap == nullptr || range == nullptr) {
    note_not_owned(call, fmt::format("allocation {:#x} to export to a peer", req.address));
    return call.done(heap == nullptr ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE);
  }
  auto exported = heap->export_block(owner, req.address);
  if (!exported) return call.done(exported.error());
  if (CUresult r = send_memory_fd(session, proto::UniqueFd(exported->fd), exported->bytes);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.reply(proto::PeerExportRep{exported->base, exported->bytes});
}

OpResult op_peer_import(Call& call) {
  auto req = call.request<proto::PeerImportReq>();
  Session& session = call.session;
  const DriverTable& cu = call.cu;
  auto stashed = take_stashed_fd(session, req.token, proto::MessageKind::kPeerMemory);
  if (!stashed) return call.done(stashed.error());
  DeviceHeap* heap = session.gpu().heap.get();
  // Only another GPU's arena: this server's own addresses are its own allocations'.
  const int arena = proto::arena_holding(req.base);
  if (heap == nullptr) return call.done(CUDA_ERROR_NOT_SUPPORTED);
  if (arena < 0 || heap->arena().holds(req.base) || req.bytes == 0 ||
      req.bytes % heap->granularity() != 0 || req.base % heap->granularity() != 0 ||
      proto::arena_holding(req.base + req.bytes - 1) != arena) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (session.vmm.peer_blocks.count(req.base) != 0) return call.done();  // mapped already
  if (session.memory.find(req.base) != nullptr ||
      session.memory.find(req.base + req.bytes - 1) != nullptr) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  PeerBlock block{req.base, req.bytes, 0};
  if (CUresult r = cu.cuMemImportFromShareableHandle(
          &block.handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(stashed->fd.get())),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  // Inside the window the server reserved whole at start (device_heap.hpp): no reservation of
  // its own. The driver refuses a mapping over one that exists.
  CUresult r = cu.cuMemMap(req.base, req.bytes, 0, block.handle, 0);
  if (r == CUDA_SUCCESS) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = session.gpu().device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = cu.cuMemSetAccess(req.base, req.bytes, &access, 1);
    if (r != CUDA_SUCCESS) cu.cuMemUnmap(req.base, req.bytes);
  }
  if (r != CUDA_SUCCESS) {
    cu.cuMemRelease(block.handle);
    return call.done(r);
  }
  session.vmm.peer_blocks.emplace(req.base, block);
  session.memory.add(DeviceRange{req.base, req.bytes, RangeKind::kPeer, 0});
  return call.done();
}

OpResult op_peer_release(Call& call) {
  auto req = call.request<proto::PeerReleaseReq>();
  Session& session = call.session;
  auto it = session.vmm.peer_blocks.find(req.base);
  if (it == session.vmm.peer_blocks.end()) return call.done(CUDA_ERROR_INVALID_VALUE);
  Retired bundle;
  bundle.peer_blocks.push_back(it->second);
  session.vmm.peer_blocks.erase(it);
  session.memory.remove(req.base);
  // Unmapped once the work queued on its streams so far is done: it may still read the block.
  return call.done(retire(session, std::move(bundle)));
}

void unmap_peer_block(Session& session, const PeerBlock& block) {
  const DriverTable& cu = session.cu();
  for (CUresult r : {cu.cuMemUnmap(block.base, block.bytes), cu.cuMemRelease(block.handle)}) {
    if (r != CUDA_SUCCESS) {
      log_warn("{}: unmapping a peer block at {:#x} failed: {}", session.who(), block.base,
               describe(cu, r));
    }
  }
}

}  // namespace mpsshim::server
