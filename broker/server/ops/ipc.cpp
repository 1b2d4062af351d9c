// cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle, cuIpcGetEventHandle and
// cuIpcOpenEventHandle between clients of this server (docs/ipc.md). The registry
// (ipc_registry.hpp) says what a handle names and who may open it; lifetimes: ipc_memory.hpp.
#include "broker/server/driver/device_heap.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/ops/ops.hpp"
#include "broker/server/session/ipc_memory.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/pools.hpp"
#include "broker/server/session/retire.hpp"
#include "common/log.hpp"
#include "proto/ops_ipc.hpp"

namespace mpsshim::server {
namespace {

IpcOwner owner_of(const Session& session) {
  return {session.client.uid, session.client.id};
}

OpResult refuse_open(Call& call, const IpcRefusal& refusal) {
  return call.done(log_ipc_refusal(call.session, refusal, "open"));
}

}  // namespace

OpResult op_ipc_get_mem_handle(Call& call) {
  auto req = call.request<proto::IpcGetMemHandleReq>();
  Session& session = call.session;
  // The allocation that holds the pointer (base or inner, as the driver takes either); the
  // handle names the whole allocation.
  const DeviceRange* range = session.memory.find_containing(req.dptr);
  if (range == nullptr || range->kind != RangeKind::kAllocation) {
    note_not_owned(call, fmt::format("allocation {:#x}", req.dptr));
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  // Pool memory is exported by cuMemPoolExportPointer with this same handle (the shim refuses
  // it to cuIpcGetMemHandle, as the driver does). Only the arena's: memory the driver's own pool
  // placed (a server without an arena) cannot outlive its free for another client.
  if (is_pool_allocation(session, *range)) {
    const DeviceHeap* heap = session.gpu().heap.get();
    if (heap == nullptr || !heap->owns(range->base) || range->base != req.dptr) {
      return call.done(heap == nullptr ? CUDA_ERROR_NOT_SUPPORTED : CUDA_ERROR_INVALID_VALUE);
    }
  }
  proto::IpcHandle handle{};
  if (auto it = session.ipc_memory.exports.find(range->base);
      it != session.ipc_memory.exports.end()) {
    handle = it->second.handle;
  } else {
    auto [memory, fresh] = session.ipc().export_memory(range->base, range->bytes, owner_of(session),
                                                       session.charge.returned());
    session.ipc_memory.exports.emplace(range->base, IpcHoldings::Export{std::move(memory), fresh});
    // Other clients may use it even after the exporter frees it: never parked (suspension.hpp).
    if (DeviceHeap* heap = session.gpu().heap.get()) heap->mark_exported(range->base);
    handle = fresh;
    log_debug("{} exported allocation {:#x} ({})", session.who(), range->base,
              format_bytes(range->bytes));
  }
  handle.offset = req.dptr - range->base;
  return call.reply(handle);
}

OpResult op_ipc_open_mem_handle(Call& call) {
  auto req = call.request<proto::IpcOpenReq>();
  Session& session = call.session;
  if ((req.flags & ~unsigned{CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS}) != 0) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  auto found = session.ipc().find_memory(req.handle, owner_of(session));
  if (!found) return refuse_open(call, found.error());
  const std::shared_ptr<IpcMemory>& memory = *found;
  const proto::IpcOpenMemRep reply{memory->base, memory->bytes};
  // Open already: one more open of the same pointer, as the driver counts them.
  if (auto it = session.ipc_memory.imports.find(memory->base);
      it != session.ipc_memory.imports.end()) {
    ++it->second.opens;
    return call.reply(reply);
  }
  if (!within_client_limit(session, ClientLimit::kIpcOpens)) {
    return call.done(CUDA_ERROR_TOO_MANY_PEERS);
  }
  if (!session.ipc().add_opener(*memory)) {  // the exporter let go of it since the lookup
    return refuse_open(call, IpcRefusal{CUDA_ERROR_INVALID_HANDLE,
                                        "an IPC memory handle whose exporter freed it just now",
                                        IpcRefusalKind::kStale});
  }
  if (!session.memory.add(
          DeviceRange{memory->base, memory->bytes, RangeKind::kOpened, memory->token})) {
    // Its address is already one of this client's ranges: not possible for another client's
    // live allocation in one address space, but never a reason to name it twice.
    session.ipc().drop_opener(*memory);
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  session.ipc_memory.imports.emplace(memory->base, IpcHoldings::Import{memory, 1});
  log_debug("{} opened allocation {:#x} ({}) of client {}", session.who(), memory->base,
            format_bytes(memory->bytes), memory->owner.client);
  return call.reply(reply);
}

OpResult op_ipc_close_mem_handle(Call& call) {
  auto req = call.request<proto::MemFreeReq>();
  Session& session = call.session;
  Retired freed;
  if (!ipc_close(session, req.dptr, freed)) {
    note_not_owned(call, fmt::format("opened IPC memory {:#x}", req.dptr));
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  const auto it = session.ipc_memory.imports.find(req.dptr);
  const proto::IpcCloseRep reply{it == session.ipc_memory.imports.end() ? 0u : it->second.opens, 0};
  if (!freed.allocations.empty()) {
    if (CUresult r = retire(session, std::move(freed)); r != CUDA_SUCCESS) return call.done(r);
  }
  return call.reply(reply);
}

OpResult op_ipc_get_event_handle(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  EventObj* event = session.objects.get<EventObj>(req.handle);
  if (event == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  constexpr unsigned kNeeded = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
  if ((event->flags & kNeeded) != kNeeded) return call.done(CUDA_ERROR_INVALID_VALUE);
  if (!event->ipc) {
    // From now on the event lives in an IpcEvent that other clients may share. Its driver
    // event was made in the green context of its generation; a record from now on uses one of
    // the client's current green context (IpcEvent::in_context).
    auto shared = std::make_shared<IpcEvent>(session.ipc(), call.cu, event->flags);
    shared->adopt(event->green_generation == session.quota_changes.generation
                      ? session.green.context
                      : nullptr,
                  event->event);
    event->event = nullptr;
    session.ipc().export_event(shared, owner_of(session));
    event->ipc = std::move(shared);
  }
  return call.reply(event->ipc->handle);
}

OpResult op_ipc_open_event_handle(Call& call) {
  auto req = call.request<proto::IpcOpenReq>();
  Session& session = call.session;
  if (session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  auto found = session.ipc().find_event(req.handle, owner_of(session));
  if (!found) return refuse_open(call, found.error());
  if (!within_client_limit(session, ClientLimit::kEvents))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  EventObj opened{nullptr, req.ctx, (*found)->flags(), session.quota_changes.generation, *found};
  std::uint64_t id = session.objects.insert(std::move(opened));
  if (id == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  return call.reply(proto::EventCreateRep{id});
}

}  // namespace mpsshim::server
