// Stream-ordered allocation. Every client gets pools of its own (never the device's default
// pool, which all clients would share), bounded by its memory limit; what it allocates from
// them is in its allocation map, owned by the pool's id, so pointer checks and session-end
// cleanup treat it like any allocation of the client.
//
// The memory comes from the server's arena (device_heap.hpp), as cuMemAlloc's does: the driver
// places a pool's memory at the same addresses in every process (0x420000000 for the first
// allocation in each of two servers, measured on two H200s), so two GPUs' pools would collide,
// and another GPU's server could not map it at its address. cuMemFreeAsync gives the memory back
// once the work the client queued before it has run (retire.hpp), so reuse is always safe; the
// driver's own pool only serves allocations made while a stream is captured (the graph owns that
// memory) and servers without an arena.
#include <algorithm>

#include "broker/server/driver/device_heap.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/ops/ops.hpp"
#include "broker/server/session/graph_memory.hpp"
#include "broker/server/session/ipc_memory.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/pools.hpp"
#include "broker/server/session/retire.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

// A pool's bound is the client's limit, rounded up to the driver's 2 MiB allocation granule.
constexpr std::uint64_t kPoolGranule = std::uint64_t{2} << 20;

CUresult create_pool(Session& session, std::uint64_t max_bytes, unsigned short usage,
                     bool is_default, std::uint64_t* id) {
  CUmemPoolProps props{};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = session.gpu().device;
  props.usage = usage;
  std::uint64_t bound = max_bytes;
  if (session.charge.limit() != 0) {
    const std::uint64_t limit = proto::round_up(session.charge.limit(), kPoolGranule);
    bound = bound == 0 ? limit : std::min(bound, limit);
  }
  props.maxSize = static_cast<std::size_t>(bound);
  CUmemoryPool pool = nullptr;
  if (CUresult r = session.cu().cuMemPoolCreate(&pool, &props); r != CUDA_SUCCESS) return r;
  *id = session.objects.insert(PoolObj{pool, is_default, bound});
  if (*id == 0) {
    session.cu().cuMemPoolDestroy(pool);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return CUDA_SUCCESS;
}

// The pool a request names; 0 is the session's default pool, made on first use.
PoolObj* find_pool(Session& session, proto::WireHandle wire, std::uint64_t* id, CUresult* error) {
  *error = CUDA_SUCCESS;
  if (wire != 0) {
    *id = wire;
    PoolObj* pool = session.objects.get<PoolObj>(wire);
    if (pool == nullptr) *error = CUDA_ERROR_INVALID_VALUE;
    return pool;
  }
  auto defaults = session.objects.ids_where<PoolObj>([](const PoolObj& p) { return p.is_default; });
  if (!defaults.empty()) {
    *id = defaults.front();
  } else if (CUresult r = create_pool(session, 0, 0, true, id); r != CUDA_SUCCESS) {
    *error = r;
    return nullptr;
  }
  return session.objects.get<PoolObj>(*id);
}

bool settable(std::uint32_t attribute) {
  switch (attribute) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      return true;
    default:
      return false;
  }
}

bool is_int_attribute(std::uint32_t attribute) {
  return attribute == CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES ||
         attribute == CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC ||
         attribute == CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES;
}

bool known_attribute(std::uint32_t attribute) {
  return attribute >= CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES &&
         attribute <= CU_MEMPOOL_ATTR_USED_MEM_HIGH;
}

// The four memory figures count the pool's arena allocations on top of what the driver's pool
// holds (graph memory). The arena keeps nothing cached for a pool, so reserved equals used.
std::uint64_t arena_share(const PoolObj& pool, std::uint32_t attribute) {
  switch (attribute) {
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      return pool.used;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      return pool.used_high;
    default:
      return 0;
  }
}

// Whether work on `stream` would join a capture now (a captured allocation is a graph node).
bool capturing(Session& session, const StreamObj& stream) {
  if (session.active_captures == 0) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  session.cu().cuStreamIsCapturing(stream.stream, &status);
  return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

// `bytes` of the server's arena for the client's pool `pool_id`, recorded as its allocation and
// counted in the pool; the client's limit already holds them (`held`, kept on success).
tl::expected<CUdeviceptr, CUresult> place_in_pool(Session& session, std::uint64_t pool_id,
                                                  PoolObj& pool, std::uint64_t bytes,
                                                  MemoryReservation& held) {
  if (pool.max_bytes != 0 && pool.used + bytes > pool.max_bytes) {
    return tl::unexpected(CUDA_ERROR_OUT_OF_MEMORY);  // the pool's maxSize, as the driver answers
  }
  // Fresh memory, or memory whose last free has run: usable by any stream from now on.
  DeviceHeap& heap = *session.gpu().heap;
  auto got = heap.allocate(session.client.id, bytes);
  if (!got) return got;
  if (!session.memory.add(DeviceRange{*got, bytes, RangeKind::kAllocation, pool_id})) {
    heap.free(*got);
    return tl::unexpected(CUDA_ERROR_INVALID_VALUE);
  }
  pool.used += bytes;
  pool.used_high = std::max(pool.used_high, pool.used);
  held.keep();
  return got;
}

}  // namespace

void pool_memory_freed(Session& session, const DeviceRange& range) {
  if (PoolObj* pool = session.objects.get<PoolObj>(range.owner); pool != nullptr) {
    pool->used -= std::min(pool->used, range.bytes);
  }
}

bool is_pool_allocation(Session& session, const DeviceRange& range) {
  // cuMemAlloc'ed memory is owned by a live context; pool memory by its pool's id, which
  // names no context even after the pool is gone.
  return range.kind == RangeKind::kAllocation &&
         session.objects.get<ContextObj>(range.owner) == nullptr;
}

void destroy_pools(Session& session) {
  for (std::uint64_t id : session.objects.ids<PoolObj>()) {
    CUresult r = session.cu().cuMemPoolDestroy(session.objects.take<PoolObj>(id)->pool);
    if (r != CUDA_SUCCESS) {
      log_warn("{}: cuMemPoolDestroy failed while freeing: {}", session.who(),
               describe(session.cu(), r));
    }
  }
}

OpResult op_mem_pool_create(Call& call) {
  auto req = call.request<proto::MemPoolCreateReq>();
  if (req.usage > 0xffff) return call.done(CUDA_ERROR_INVALID_VALUE);
  if (!within_client_limit(call.session, ClientLimit::kMemoryPools))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  std::uint64_t id = 0;
  if (CUresult r = create_pool(call.session, req.max_bytes, static_cast<unsigned short>(req.usage),
                               false, &id);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.reply(proto::MemPoolCreateRep{id});
}

OpResult op_mem_pool_destroy(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  const PoolObj* pool = session.objects.get<PoolObj>(req.handle);
  if (pool == nullptr || pool->is_default) return call.done(CUDA_ERROR_INVALID_VALUE);
  // The driver keeps the pool until its outstanding allocations are freed; they stay the
  // client's (owned by the dead id, freed with cuMemFreeAsync, cuMemFree or at session end).
  CUresult r = call.cu.cuMemPoolDestroy(pool->pool);
  session.objects.take<PoolObj>(req.handle);
  return call.done(r);
}

OpResult op_mem_pool_set_attribute(Call& call) {
  auto req = call.request<proto::MemPoolAttributeReq>();
  std::uint64_t id = 0;
  CUresult error = CUDA_SUCCESS;
  PoolObj* pool = find_pool(call.session, req.pool, &id, &error);
  if (pool == nullptr) return call.done(error);
  if (!settable(req.attribute)) return call.done(CUDA_ERROR_INVALID_VALUE);
  const auto attribute = static_cast<CUmemPool_attribute>(req.attribute);
  if (is_int_attribute(req.attribute)) {
    int value = static_cast<int>(static_cast<std::uint32_t>(req.value));
    return call.done(call.cu.cuMemPoolSetAttribute(pool->pool, attribute, &value));
  }
  cuuint64_t value = req.value;
  CUresult r = call.cu.cuMemPoolSetAttribute(pool->pool, attribute, &value);
  // Resetting a high-water mark (the driver takes only 0) starts it again from what is used.
  if (r == CUDA_SUCCESS && (req.attribute == CU_MEMPOOL_ATTR_USED_MEM_HIGH ||
                            req.attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)) {
    pool->used_high = pool->used;
  }
  return call.done(r);
}

OpResult op_mem_pool_get_attribute(Call& call) {
  auto req = call.request<proto::MemPoolAttributeReq>();
  std::uint64_t id = 0;
  CUresult error = CUDA_SUCCESS;
  PoolObj* pool = find_pool(call.session, req.pool, &id, &error);
  if (pool == nullptr) return call.done(error);
  if (!known_attribute(req.attribute)) return call.done(CUDA_ERROR_INVALID_VALUE);
  const auto attribute = static_cast<CUmemPool_attribute>(req.attribute);
  proto::MemPoolAttributeRep rep{};
  if (is_int_attribute(req.attribute)) {
    int value = 0;
    if (CUresult r = call.cu.cuMemPoolGetAttribute(pool->pool, attribute, &value);
        r != CUDA_SUCCESS) {
      return call.done(r);
    }
    rep.value = static_cast<std::uint32_t>(value);
  } else {
    cuuint64_t value = 0;
    if (CUresult r = call.cu.cuMemPoolGetAttribute(pool->pool, attribute, &value);
        r != CUDA_SUCCESS) {
      return call.done(r);
    }
    rep.value = value + arena_share(*pool, req.attribute);
  }
  return call.reply(rep);
}

OpResult op_mem_pool_trim_to(Call& call) {
  auto req = call.request<proto::MemPoolTrimReq>();
  std::uint64_t id = 0;
  CUresult error = CUDA_SUCCESS;
  PoolObj* pool = find_pool(call.session, req.pool, &id, &error);
  if (pool == nullptr) return call.done(error);
  return call.done(call.cu.cuMemPoolTrimTo(pool->pool, static_cast<std::size_t>(req.keep_bytes)));
}

OpResult op_mem_alloc_async(Call& call) {
  auto req = call.request<proto::MemAllocAsyncReq>();
  Session& session = call.session;
  if (!within_client_limit(session, ClientLimit::kAllocations))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  if (req.bytes == 0) return call.done(CUDA_ERROR_INVALID_VALUE);
  std::uint64_t pool_id = 0;
  CUresult error = CUDA_SUCCESS;
  PoolObj* pool = find_pool(session, req.pool, &pool_id, &error);
  if (pool == nullptr) return call.done(error);
  auto held = session.charge.reserve(req.bytes);
  if (!held) {
    return refuse_over_limit(call, req.bytes, "device memory (cudaMallocAsync)", held.error());
  }
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  if (session.gpu().heap != nullptr && !capturing(session, *stream)) {
    const bool bounded = pool->max_bytes != 0 && pool->used + req.bytes > pool->max_bytes;
    auto placed = place_in_pool(session, pool_id, *pool, req.bytes, *held);
    if (placed) return call.reply(proto::MemAllocRep{*placed});
    // The GPU full, not the pool's bound: it waits for the memory policies as cuMemAlloc does.
    if (!bounded && placed.error() == CUDA_ERROR_OUT_OF_MEMORY &&
        wait_for_memory(call, MemoryWait{.call = MemoryWait::Call::kMemAllocAsync,
                                         .bytes = req.bytes,
                                         .pool = pool_id})) {
      return call.deferred();
    }
    return call.done(placed.error());
  }
  CUdeviceptr dptr = 0;
  if (CUresult r = call.cu.cuMemAllocFromPoolAsync(&dptr, static_cast<std::size_t>(req.bytes),
                                                   pool->pool, stream->stream);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  if (!session.memory.add(DeviceRange{dptr, req.bytes, RangeKind::kAllocation, pool_id})) {
    call.cu.cuMemFreeAsync(dptr, stream->stream);
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  held->keep();
  return call.reply(proto::MemAllocRep{dptr});
}

tl::expected<std::uint64_t, CUresult> retry_pool_allocation(Session& session,
                                                            const MemoryWait& wait,
                                                            bool& may_wait_more) {
  may_wait_more = false;
  PoolObj* pool = session.objects.get<PoolObj>(wait.pool);
  if (pool == nullptr) return tl::unexpected(CUDA_ERROR_INVALID_VALUE);  // destroyed meanwhile
  auto held = session.charge.reserve(wait.bytes);
  if (!held) return tl::unexpected(CUDA_ERROR_OUT_OF_MEMORY);
  const bool bounded = pool->max_bytes != 0 && pool->used + wait.bytes > pool->max_bytes;
  auto placed = place_in_pool(session, wait.pool, *pool, wait.bytes, *held);
  may_wait_more = !placed && !bounded && placed.error() == CUDA_ERROR_OUT_OF_MEMORY;
  return placed;
}

OpResult op_mem_free_async(Call& call) {
  auto req = call.request<proto::MemFreeAsyncReq>();
  Session& session = call.session;
  const DeviceRange* range = session.memory.find(req.dptr);
  const bool graph_memory = range != nullptr && is_graph_memory(*range) && range->base == req.dptr;
  if (range == nullptr || (range->kind != RangeKind::kAllocation && !graph_memory)) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  if (graph_memory) {  // the graph keeps its address (graph_memory.hpp)
    return finish_on_stream(call, *stream, call.cu.cuMemFreeAsync(req.dptr, stream->stream));
  }
  DeviceHeap* heap = session.gpu().heap.get();
  const bool pooled = is_pool_allocation(session, *range);
  if (!pooled || (heap != nullptr && heap->owns(req.dptr))) {
    // In the arena (cuMemAlloc'ed or a pool's): freed once every stream of the client passed
    // this point, which includes `stream`'s work before the free.
    if (pooled && capturing(session, *stream)) {
      // The driver would make the free a graph node, run when the graph runs; the arena's
      // memory cannot be freed so.
      log_warn(
          "{}: cuMemFreeAsync of {:#x} while its stream is captured is not supported by "
          "mpsshim (memory allocated outside the capture); refused",
          session.who(), req.dptr);
      return call.done(CUDA_ERROR_NOT_SUPPORTED);
    }
    Retired bundle;
    bundle.allocations.push_back(*session.memory.remove(req.dptr));
    if (pooled) pool_memory_freed(session, bundle.allocations.back());
    // Exported (cuMemPoolExportPointer) and imported by another client: it stays for them,
    // charged to this client until the last of them frees its import (docs/ipc.md).
    if (ipc_hand_over(session, req.dptr)) return call.done();
    session.charge.release(bundle.allocations.back().bytes);
    return call.done(retire(session, std::move(bundle)));
  }
  const std::uint64_t bytes = range->bytes;
  CUresult r = call.cu.cuMemFreeAsync(req.dptr, stream->stream);
  if (r == CUDA_SUCCESS) {
    session.memory.remove(req.dptr);
    session.charge.release(bytes);
  }
  return finish_on_stream(call, *stream, r);
}

}  // namespace mpsshim::server
