#include <algorithm>
#include <limits>

#include "broker/server/ops/ops.hpp"
#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/graph_memory.hpp"
#include "broker/server/session/ipc_memory.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/pools.hpp"
#include "broker/server/session/retire.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

// `held` is the memory charged for it, kept once the range is recorded.
bool add_allocation(Session& session, CUdeviceptr base, std::uint64_t bytes, std::uint64_t ctx,
                    MemoryReservation& held) {
  if (!session.memory.add(DeviceRange{base, bytes, RangeKind::kAllocation, ctx})) return false;
  held.keep();
  return true;
}

// Device memory as cuMemAlloc gives it: in the server's arena when it has one (device_heap.hpp).
CUresult allocate_device(Session& session, std::uint64_t bytes, CUdeviceptr* out) {
  if (DeviceHeap* heap = session.gpu().heap.get()) {
    auto placed = heap->allocate(session.client.id, bytes);
    if (!placed) return placed.error();
    *out = *placed;
    return CUDA_SUCCESS;
  }
  return session.cu().cuMemAlloc_v2(out, static_cast<std::size_t>(bytes));
}

// The pitch cuMemAllocPitch picks: rows padded to the texture pitch alignment the driver uses
// for 2D allocations (512 bytes on every GPU since Kepler).
constexpr std::uint64_t kPitchAlignment = 512;

// The allocation of a cuMemAlloc the client may make (its limits checked before): `bytes` charged
// to it, placed, and recorded as its own.
tl::expected<CUdeviceptr, CUresult> allocate_for_client(Session& session, std::uint64_t bytes,
                                                        std::uint64_t ctx,
                                                        MemoryReservation& held) {
  CUdeviceptr dptr = 0;
  if (CUresult r = allocate_device(session, bytes, &dptr); r != CUDA_SUCCESS) {
    return tl::unexpected(r);
  }
  if (!add_allocation(session, dptr, bytes, ctx, held)) {
    free_device(session, dptr);
    return tl::unexpected(CUDA_ERROR_INVALID_VALUE);
  }
  return dptr;
}

}  // namespace

bool wait_for_memory(Call& call, MemoryWait wait) {
  Session& session = call.session;
  MemoryArbiter* arbiter = session.memory_arbiter;
  if (arbiter == nullptr || !call.has_reply_slot() || session.memory_wait.on ||
      !arbiter->may_wait(session.priority.below_normal)) {
    return false;
  }
  wait.on = true;
  wait.slot = call.header.reply_slot;
  wait.taken_ns = session.stamps.record_taken_ns;
  wait.since = std::chrono::steady_clock::now();
  session.memory_wait = wait;
  session.slot_busy[wait.slot] = 1;
  log_info("{}: {} of {} does not fit on the GPU; it waits for a memory policy", session.who(),
           wait.what(), format_bytes(wait.bytes));
  arbiter->want(MemoryWant{session.client.id, wait.bytes, session.priority.below_normal,
                           wait.call != MemoryWait::Call::kMemCreate});
  return true;
}

bool retry_waiting_allocation(Session& session, bool last_try) {
  MemoryWait& wait = session.memory_wait;
  if (!wait.on) return true;
  // The device pointer or the new handle's id, one 64-bit word (proto::MemAllocRep,
  // proto::VmmHandleRep); cuMemAllocPitch's answer adds the pitch (proto::MemAllocPitchRep).
  // Its context may have been destroyed meanwhile, its limit lowered: then it fails as it would
  // have at first. Only the driver's CUDA_ERROR_OUT_OF_MEMORY waits on.
  tl::expected<std::uint64_t, CUresult> placed = tl::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  bool may_wait_more = false;
  if (wait.call == MemoryWait::Call::kMemCreate) {
    placed = retry_vmm_create(session, wait, may_wait_more);
  } else if (wait.call == MemoryWait::Call::kMemAllocAsync) {
    placed = retry_pool_allocation(session, wait, may_wait_more);
  } else if (session.objects.get<ContextObj>(wait.ctx) == nullptr) {
    placed = tl::unexpected(CUDA_ERROR_INVALID_CONTEXT);
  } else if (auto held = session.charge.reserve(wait.bytes)) {
    placed = allocate_for_client(session, wait.bytes, wait.ctx, *held);
    may_wait_more = !placed && placed.error() == CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (may_wait_more && !last_try) return false;
  wait.on = false;
  const auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - wait.since);
  if (placed) {
    log_info("{}: its {} of {} fits after {:.3f} s waiting", session.who(), wait.what(),
             format_bytes(wait.bytes), waited.count());
    static_assert(sizeof(proto::MemAllocRep) == sizeof(std::uint64_t) &&
                  sizeof(proto::VmmHandleRep) == sizeof(std::uint64_t));
    const proto::MemAllocPitchRep rep{*placed, wait.pitch};
    const std::size_t rep_bytes =
        wait.call == MemoryWait::Call::kMemAllocPitch ? sizeof rep : sizeof rep.dptr;
    session.answer(wait.slot, CUDA_SUCCESS,
                   std::span<const std::byte>(reinterpret_cast<const std::byte*>(&rep), rep_bytes),
                   wait.taken_ns);
  } else {
    log_info("{}: its {} of {} fails after {:.3f} s waiting: {}", session.who(), wait.what(),
             format_bytes(wait.bytes), waited.count(), describe(session.cu(), placed.error()));
    session.answer(wait.slot, placed.error(), {}, wait.taken_ns);
  }
  return true;
}

OpResult op_mem_alloc(Call& call) {
  auto req = call.request<proto::MemAllocReq>();
  Session& session = call.session;
  if (session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  if (!within_client_limit(session, ClientLimit::kAllocations))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  if (req.bytes == 0) return call.done(CUDA_ERROR_INVALID_VALUE);
  auto held = session.charge.reserve(req.bytes);
  if (!held) return refuse_over_limit(call, req.bytes, "device memory", held.error());
  auto placed = allocate_for_client(session, req.bytes, req.ctx, *held);
  if (placed) return call.reply(proto::MemAllocRep{*placed});
  if (placed.error() == CUDA_ERROR_OUT_OF_MEMORY &&
      wait_for_memory(
          call,
          MemoryWait{.call = MemoryWait::Call::kMemAlloc, .bytes = req.bytes, .ctx = req.ctx})) {
    return call.deferred();
  }
  return call.done(placed.error());
}

OpResult op_mem_alloc_pitch(Call& call) {
  auto req = call.request<proto::MemAllocPitchReq>();
  Session& session = call.session;
  if (session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  if (req.width_bytes == 0 || req.height == 0 ||
      req.width_bytes > std::numeric_limits<std::uint64_t>::max() / req.height) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (!within_client_limit(session, ClientLimit::kAllocations))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  if (session.gpu().heap) {
    // The driver's own checks: the element size of a texture fetch, rows a pitch can address.
    if (req.element_bytes != 4 && req.element_bytes != 8 && req.element_bytes != 16) {
      return call.done(CUDA_ERROR_INVALID_VALUE);
    }
    const std::uint64_t pitch =
        (req.width_bytes + kPitchAlignment - 1) / kPitchAlignment * kPitchAlignment;
    if (pitch > std::numeric_limits<std::uint64_t>::max() / req.height) {
      return call.done(CUDA_ERROR_INVALID_VALUE);
    }
    // The padding of each row counts: it is device memory the client holds.
    const std::uint64_t bytes = pitch * req.height;
    auto held = session.charge.reserve(bytes);
    if (!held) return refuse_over_limit(call, bytes, "device memory", held.error());
    auto placed = allocate_for_client(session, bytes, req.ctx, *held);
    if (placed) return call.reply(proto::MemAllocPitchRep{*placed, pitch});
    if (placed.error() == CUDA_ERROR_OUT_OF_MEMORY &&
        wait_for_memory(call, MemoryWait{.call = MemoryWait::Call::kMemAllocPitch,
                                         .bytes = bytes,
                                         .ctx = req.ctx,
                                         .pitch = pitch})) {
      return call.deferred();
    }
    return call.done(placed.error());
  }
  // Without the address arena the driver places it and picks the pitch; it fails at once when
  // the GPU is full (the memory policies need the arena: docs/suspend.md).
  const std::uint64_t asked = req.width_bytes * req.height;
  auto held = session.charge.reserve(asked);
  if (!held) return refuse_over_limit(call, asked, "device memory", held.error());
  CUdeviceptr dptr = 0;
  std::size_t pitch = 0;
  if (CUresult r =
          call.cu.cuMemAllocPitch_v2(&dptr, &pitch, req.width_bytes, req.height, req.element_bytes);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  const std::uint64_t bytes = std::uint64_t{pitch} * req.height;
  auto padding = session.charge.reserve(bytes - std::min(bytes, asked));
  if (!padding) {
    free_device(session, dptr);
    return refuse_over_limit(call, bytes, "device memory", padding.error());
  }
  if (!add_allocation(session, dptr, bytes, req.ctx, *held)) {
    free_device(session, dptr);
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  padding->keep();
  return call.reply(proto::MemAllocPitchRep{dptr, pitch});
}

OpResult op_mem_free(Call& call) {
  auto req = call.request<proto::MemFreeReq>();
  Session& session = call.session;
  if (req.dptr == 0) return call.done();  // cuMemFree(0), like free(NULL)
  const DeviceRange* range = session.memory.find(req.dptr);
  if (range != nullptr && range->kind == RangeKind::kOpened) {
    log_debug(
        "{} asked cuMemFree of {:#x}, another client's allocation it opened; refused (it "
        "closes it with cuIpcCloseMemHandle)",
        session.who(), req.dptr);
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  // The graph keeps its address; a later launch allocates it again (graph_memory.hpp).
  if (range != nullptr && is_graph_memory(*range) && range->base == req.dptr) {
    return call.done(call.cu.cuMemFree_v2(req.dptr));
  }
  if (range == nullptr || range->kind != RangeKind::kAllocation) {
    note_not_owned(call, fmt::format("allocation {:#x}", req.dptr));
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if (is_pool_allocation(session, *range)) pool_memory_freed(session, *range);
  Retired bundle;
  bundle.allocations.push_back(*session.memory.remove(req.dptr));
  // Exported and opened by another client: it stays for them, charged to this client until
  // the last of them closes it (docs/ipc.md).
  if (ipc_hand_over(session, req.dptr)) return call.done();
  session.charge.release(bundle.allocations.back().bytes);
  return call.done(retire(session, std::move(bundle)));
}

OpResult op_mem_get_info(Call& call) {
  Session& session = call.session;
  session.charge.take_back_returned();
  std::size_t free_bytes = 0, total_bytes = 0;
  if (CUresult r = call.cu.cuMemGetInfo_v2(&free_bytes, &total_bytes); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  proto::MemGetInfoRep rep{free_bytes, total_bytes};
  if (session.charge.limit() != 0) {
    std::uint64_t left =
        session.charge.limit() - std::min(session.charge.limit(), session.charge.used());
    rep.total_bytes = std::min<std::uint64_t>(total_bytes, session.charge.limit());
    rep.free_bytes = std::min<std::uint64_t>(free_bytes, left);
  }
  // What the allocation's other clients use is not free for this one either.
  if (session.charge.allocation() && session.charge.allocation()->limit() != 0) {
    const AllocationAccount& shared = *session.charge.allocation();
    rep.total_bytes = std::min<std::uint64_t>(rep.total_bytes, shared.limit());
    rep.free_bytes = std::min<std::uint64_t>(
        rep.free_bytes, shared.limit() - std::min(shared.limit(), shared.used()));
  }
  return call.reply(rep);
}

OpResult op_memset(Call& call) {
  auto req = call.request<proto::MemsetReq>();
  Session& session = call.session;
  const std::uint64_t element = req.element_bytes;
  if (element != 1 && element != 2 && element != 4) return call.done(CUDA_ERROR_INVALID_VALUE);
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  const bool two_d = req.pitch != 0;
  if (!two_d && req.height != 1) return call.done(CUDA_ERROR_INVALID_VALUE);
  if (req.width > kMax / element) return call.done(CUDA_ERROR_INVALID_VALUE);
  const std::uint64_t row_bytes = req.width * element;
  // The whole pitched range, from the first row's start to the last row's end.
  std::uint64_t extent = 0;
  if (req.height != 0 && row_bytes != 0) {
    if (two_d && row_bytes > req.pitch) return call.done(CUDA_ERROR_INVALID_VALUE);
    if (req.height - 1 > (kMax - row_bytes) / std::max<std::uint64_t>(req.pitch, 1)) {
      return call.done(CUDA_ERROR_INVALID_VALUE);
    }
    extent = (req.height - 1) * req.pitch + row_bytes;
  }
  if (!owns_memory(call, req.dst, extent)) return call.done(CUDA_ERROR_INVALID_VALUE);
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  open_busy_span(session, stream->stream);
  const DriverTable& cu = call.cu;
  CUresult r = CUDA_SUCCESS;
  if (!two_d) {
    switch (element) {
      case 1:
        r = cu.cuMemsetD8Async(req.dst, static_cast<unsigned char>(req.value), req.width,
                               stream->stream);
        break;
      case 2:
        r = cu.cuMemsetD16Async(req.dst, static_cast<unsigned short>(req.value), req.width,
                                stream->stream);
        break;
      default:
        r = cu.cuMemsetD32Async(req.dst, req.value, req.width, stream->stream);
        break;
    }
  } else {
    switch (element) {
      case 1:
        r = cu.cuMemsetD2D8Async(req.dst, req.pitch, static_cast<unsigned char>(req.value),
                                 req.width, req.height, stream->stream);
        break;
      case 2:
        r = cu.cuMemsetD2D16Async(req.dst, req.pitch, static_cast<unsigned short>(req.value),
                                  req.width, req.height, stream->stream);
        break;
      default:
        r = cu.cuMemsetD2D32Async(req.dst, req.pitch, req.value, req.width, req.height,
                                  stream->stream);
        break;
    }
  }
  return finish_on_stream(call, *stream, r);
}

OpResult op_copy_dtod(Call& call) {
  auto req = call.request<proto::CopyDtoDReq>();
  Session& session = call.session;
  if (!owns_memory(call, req.dst, req.bytes) || !owns_memory(call, req.src, req.bytes)) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  open_busy_span(session, stream->stream);
  CUresult r = call.cu.cuMemcpyDtoDAsync_v2(req.dst, req.src, req.bytes, stream->stream);
  if (r == CUDA_SUCCESS) session.usage.bytes_d2d += req.bytes;
  return finish_on_stream(call, *stream, r);
}

}  // namespace mpsshim::server
