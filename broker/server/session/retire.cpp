#include "broker/server/session/retire.hpp"

#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/capture.hpp"
#include "broker/server/session/ipc_memory.hpp"

#include <sys/mman.h>

#include <algorithm>

#include "broker/server/accounting/heap_profile.hpp"
#include "broker/server/session/completions.hpp"
#include "broker/server/session/graph_memory.hpp"
#include "broker/server/session/host_callbacks.hpp"
#include "broker/server/session/pools.hpp"
#include "broker/server/session/streams.hpp"
#include "broker/server/session/virtual_memory.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

void warn_if_failed(Session& session, CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    log_warn("{}: {} failed while freeing: {}", session.who(), what, describe(session.cu(), r));
  }
}

void forget_driver_handle(Session& session, const void* handle) {
  session.ids_by_driver_handle.erase(const_cast<void*>(handle));
}

void forget_functions_of(Session& session, std::uint64_t owner) {
  for (std::uint64_t id : session.objects.ids_where<FunctionObj>(
           [&](const FunctionObj& f) { return f.owner == owner; })) {
    auto f = session.objects.take<FunctionObj>(id);
    forget_driver_handle(session, f->function);
  }
}

void forget_globals_of(Session& session, std::uint64_t owner) {
  session.memory.remove_if(
      [&](const DeviceRange& r) { return r.kind == RangeKind::kGlobal && r.owner == owner; });
}

// Texture/surface objects and arrays made in a context `pred` accepts go into the bundle, and
// the holds of sparse arrays on tile pools end (not at the session's end, where
// free_virtual_memory releases and counts every physical allocation).
template <typename Pred>
void take_arrays_and_textures(Session& session, Retired& bundle, Pred pred,
                              bool drop_holds = true) {
  for (std::uint64_t id :
       session.objects.ids_where<TexObj>([&](const TexObj& t) { return pred(t.ctx); })) {
    bundle.textures.push_back(*session.objects.take<TexObj>(id));
  }
  for (std::uint64_t id :
       session.objects.ids_where<ArrayObj>([&](const ArrayObj& a) { return pred(a.ctx); })) {
    auto array = session.objects.take<ArrayObj>(id);
    if (array->mipmap != 0) continue;  // a level: its mipmapped array's, freed with it
    session.charge.release(array->charged);
    if (drop_holds) drop_tile_pools(session, array->tile_pools);
    bundle.arrays.push_back(array->array);
  }
  for (std::uint64_t id : session.objects.ids_where<MipmappedArrayObj>(
           [&](const MipmappedArrayObj& m) { return pred(m.ctx); })) {
    auto mipmap = session.objects.take<MipmappedArrayObj>(id);
    session.charge.release(mipmap->charged);
    if (drop_holds) drop_tile_pools(session, mipmap->tile_pools);
    bundle.mipmaps.push_back(mipmap->mipmap);
  }
}

}  // namespace

void free_device(Session& session, CUdeviceptr base) {
  if (DeviceHeap* heap = session.gpu().heap.get(); heap != nullptr && heap->owns(base)) {
    warn_if_failed(session, heap->free(base), "cuMemFree");
    return;
  }
  warn_if_failed(session, session.cu().cuMemFree_v2(base), "cuMemFree");
}

CUresult retire(Session& session, Retired bundle) {
  auto fences = session.fence_all_streams();
  if (!fences) {
    // The fences could not be recorded; freeing now may wait on queued work, but leaking
    // would be worse.
    free_retired(session, bundle);
    return fences.error();
  }
  bundle.fences = std::move(*fences);
  for (CUstream stream : bundle.record_streams) {
    auto fence = session.acquire_event();
    if (fence && session.cu().cuEventRecordWithFlags(*fence, stream, 0) == CUDA_SUCCESS) {
      bundle.fences.push_back(*fence);
    } else if (fence) {
      session.release_event(*fence);
    }
  }
  session.retiring.push_back(std::move(bundle));
  return CUDA_SUCCESS;
}

void free_retired(Session& session, Retired& bundle, FreedTally* tally) {
  const DriverTable& cu = session.cu();
  // Texture and surface objects first: they refer to the memory and arrays freed below.
  for (const TexObj& t : bundle.textures) {
    warn_if_failed(session,
                   t.surface ? cu.cuSurfObjectDestroy(t.value) : cu.cuTexObjectDestroy(t.value),
                   t.surface ? "cuSurfObjectDestroy" : "cuTexObjectDestroy");
  }
  for (CUmodule m : bundle.modules) warn_if_failed(session, cu.cuModuleUnload(m), "cuModuleUnload");
  for (CUlibrary l : bundle.libraries) {
    warn_if_failed(session, cu.cuLibraryUnload(l), "cuLibraryUnload");
  }
  for (const DeviceRange& a : bundle.allocations) free_device(session, a.base);
  for (const PeerBlock& block : bundle.peer_blocks) unmap_peer_block(session, block);
  bundle.peer_blocks.clear();
  for (const HostRegionObj& region : bundle.regions) {
    warn_if_failed(session, cu.cuMemHostUnregister(region.address), "cuMemHostUnregister");
    if (region.in_pinned_window) {
      session.gpu().pinned->unmap(region.address, region.mapped_bytes);
    } else {
      ::munmap(region.address, region.mapped_bytes);
    }
  }
  for (CUarray a : bundle.arrays) warn_if_failed(session, cu.cuArrayDestroy(a), "cuArrayDestroy");
  for (CUmipmappedArray m : bundle.mipmaps) {
    warn_if_failed(session, cu.cuMipmappedArrayDestroy(m), "cuMipmappedArrayDestroy");
  }
  for (CUgraphExec exec : bundle.graph_execs) {
    warn_if_failed(session, cu.cuGraphExecDestroy(exec), "cuGraphExecDestroy");
  }
  for (CUstream stream : bundle.record_streams) {
    warn_if_failed(session, cu.cuStreamDestroy_v2(stream), "cuStreamDestroy");
  }
  for (CUgreenCtx green : bundle.green_contexts) {
    warn_if_failed(session, cu.cuGreenCtxDestroy(green), "cuGreenCtxDestroy");
  }
  if (tally != nullptr) {
    tally->modules += bundle.modules.size();
    tally->libraries += bundle.libraries.size() + bundle.shared_libraries.size();
    tally->allocations += bundle.allocations.size();
    for (const DeviceRange& a : bundle.allocations) tally->allocation_bytes += a.bytes;
    tally->regions += bundle.regions.size();
    tally->textures += bundle.textures.size();
    tally->arrays += bundle.arrays.size() + bundle.mipmaps.size();
    tally->graphs += bundle.graph_execs.size();
  }
  bundle.textures.clear();
  bundle.arrays.clear();
  bundle.mipmaps.clear();
  bundle.modules.clear();
  bundle.libraries.clear();
  bundle.shared_libraries.clear();  // the last holder's drop unloads
  bundle.allocations.clear();
  bundle.regions.clear();
  bundle.graph_execs.clear();
}

void forget_module(Session& session, std::uint64_t module_id, Retired& bundle) {
  auto module = session.objects.take<ModuleObj>(module_id);
  if (!module) return;
  forget_driver_handle(session, module->module);
  forget_functions_of(session, module_id);
  forget_globals_of(session, module_id);
  if (module->library == 0) bundle.modules.push_back(module->module);
}

void forget_library(Session& session, std::uint64_t library_id, Retired& bundle) {
  auto library = session.objects.take<LibraryObj>(library_id);
  if (!library) return;
  for (std::uint64_t id : session.objects.ids_where<KernelObj>(
           [&](const KernelObj& k) { return k.library == library_id; })) {
    auto kernel = session.objects.take<KernelObj>(id);
    forget_driver_handle(session, kernel->kernel);
    forget_functions_of(session, id);
  }
  for (std::uint64_t id : session.objects.ids_where<ModuleObj>(
           [&](const ModuleObj& m) { return m.library == library_id; })) {
    forget_module(session, id, bundle);
  }
  forget_globals_of(session, library_id);
  if (library->shared) {
    bundle.shared_libraries.push_back(std::move(library->shared));
  } else {
    bundle.libraries.push_back(library->library);
  }
}

void destroy_stream(Session& session, std::uint64_t stream_id) {
  StreamObj* stream = session.objects.get<StreamObj>(stream_id);
  if (stream == nullptr) return;
  if (ContextObj* ctx = session.objects.get<ContextObj>(stream->ctx)) {
    if (stream->blocking && stream->work_since_join && !stream->is_default) {
      if (StreamObj* d = session.objects.get<StreamObj>(ctx->default_stream)) {
        join_streams(session, *stream, *d);
      }
    }
    std::erase(ctx->blocking_streams, stream_id);
  }
  const DriverTable& cu = session.cu();
  close_busy_span(session, stream->stream);
  if (stream->capture_origin) --session.active_captures;
  if (stream->capture_fence != nullptr) session.release_event(stream->capture_fence);
  if (stream->join_event != nullptr) session.destroy_client_event(stream->join_event);
  warn_if_failed(session, cu.cuStreamDestroy_v2(stream->stream), "cuStreamDestroy");
  session.objects.take<StreamObj>(stream_id);
}

CUresult retire_context(Session& session, std::uint64_t ctx_id) {
  Retired bundle;
  ContextObj* ctx = session.objects.get<ContextObj>(ctx_id);
  // A green context of the client's own (cuGreenCtxDestroy): what was made while it was current
  // belongs to the device, as natively (green contexts share their primary context's memory and
  // modules), so the ContextObj stays as the owner of that memory, modules and arrays, without a
  // green context or streams, and goes with the session. The green context itself is destroyed
  // once its streams' work ran (free_retired), never waited for here.
  const CUgreenCtx own_green = ctx->green;
  if (own_green != nullptr) {
    bundle.green_contexts.push_back(own_green);
    ctx->green = nullptr;
    if (ctx->record_stream != nullptr) bundle.record_streams.push_back(ctx->record_stream);
    ctx->record_stream = nullptr;
  } else {
    // Libraries are context-independent (CUDA 12+): the CUDA runtime loads its fat binaries
    // once and keeps using their kernels after cudaDeviceReset, in the next primary context.
    // Every client context lives in this server's one real context, so a library stays until
    // cuLibraryUnload or the end of the session. (Its __device__ variables therefore keep their
    // values across a reset, where the real driver would load them afresh.)
    for (std::uint64_t id : session.objects.ids_where<ModuleObj>(
             [&](const ModuleObj& m) { return m.ctx == ctx_id && m.library == 0; })) {
      forget_module(session, id, bundle);
    }
    for (const DeviceRange& a : session.memory.remove_if([&](const DeviceRange& r) {
           return r.kind == RangeKind::kAllocation && r.owner == ctx_id;
         })) {
      if (ipc_hand_over(session, a.base)) continue;  // others have it open (ipc_memory.hpp)
      session.charge.release(a.bytes);
      bundle.allocations.push_back(a);
    }
    take_arrays_and_textures(session, bundle,
                             [&](std::uint64_t owner_ctx) { return owner_ctx == ctx_id; });
  }
  // Fences go on the context's streams too, before they are destroyed.
  CUresult result = retire(session, std::move(bundle));
  for (std::uint64_t id :
       session.objects.ids_where<EventObj>([&](const EventObj& e) { return e.ctx == ctx_id; })) {
    auto event = session.objects.take<EventObj>(id);
    if (!event->ipc) session.destroy_client_event(event->event);
  }
  for (std::uint64_t id :
       session.objects.ids_where<StreamObj>([&](const StreamObj& s) { return s.ctx == ctx_id; })) {
    destroy_stream(session, id);
  }
  if (own_green == nullptr) {
    session.objects.take<ContextObj>(ctx_id);
  } else if (ContextObj* kept = session.objects.get<ContextObj>(ctx_id)) {
    kept->default_stream = 0;  // destroyed above, with the rest of its streams
    kept->blocking_streams.clear();
  }
  return result;
}

FreedTally free_everything(Session& session) {
  FreedTally tally;
  const DriverTable& cu = session.cu();
  drop_completions(session);
  drop_busy(session);
  if (heap_profile_on()) {
    log_info("{}: heap growth by operation: {}", session.who(),
             format_heap_growth(session.stats, 8));
  }
  if (heap_profile_on() || log_enabled(LogLevel::kDebug)) {
    log_at(heap_profile_on() ? LogLevel::kInfo : LogLevel::kDebug, "{}: records by operation: {}",
           session.who(), format_record_counts(session.stats, 8));
  }
  // The cached launch graphs first: their nodes name the modules and the green context freed
  // below.
  session.launch_batch.release(session);
  for (Retired& bundle : session.retiring) {
    for (CUevent fence : bundle.fences) session.release_event(fence);
    free_retired(session, bundle, &tally);
  }
  session.retiring.clear();

  Retired rest;
  // First: exports others still have open leave the memory map, imports are closed.
  ipc_end_session(session, rest);
  for (std::uint64_t id : session.objects.ids<LibraryObj>()) forget_library(session, id, rest);
  for (std::uint64_t id : session.objects.ids<ModuleObj>()) forget_module(session, id, rest);
  for (std::uint64_t id : session.objects.ids<LinkObj>()) {
    cu.cuLinkDestroy(session.objects.take<LinkObj>(id)->state->link);
  }
  // Graph memory a launch allocated and nothing freed yet outlives its graph in the driver;
  // what is not allocated now the driver refuses, which is no failure here.
  for (const DeviceRange& a : session.memory.remove_if(is_graph_memory)) {
    session.cu().cuMemFree_v2(a.base);
  }
  for (const DeviceRange& a : session.memory.remove_if(
           [](const DeviceRange& r) { return r.kind == RangeKind::kAllocation; })) {
    rest.allocations.push_back(a);
  }
  for (std::uint64_t id : session.objects.ids<HostRegionObj>()) {
    rest.regions.push_back(*session.objects.take<HostRegionObj>(id));
  }
  take_arrays_and_textures(
      session, rest, [](std::uint64_t) { return true; }, false);
  for (auto& [base, block] : session.vmm.peer_blocks) rest.peer_blocks.push_back(block);
  session.vmm.peer_blocks.clear();
  session.memory.remove_if([](const DeviceRange& r) { return r.kind == RangeKind::kPeer; });
  for (std::uint64_t id : session.objects.ids<GraphExecObj>()) {
    rest.graph_execs.push_back(session.objects.take<GraphExecObj>(id)->exec);
  }
  end_open_captures(session);  // no capture may still fill a graph destroyed below
  tally.graphs += forget_graphs(session);
  for (CUevent event : session.quota_changes.graph_events) cu.cuEventDestroy_v2(event);
  session.quota_changes.graph_events.clear();
  free_retired(session, rest, &tally);
  free_virtual_memory(session, tally);
  if (DeviceHeap* heap = session.gpu().heap.get()) heap->forget_owner(session.client.id);
  session.charge.release(session.charge.used());
  session.usage.pinned_bytes = 0;
  destroy_pools(session);  // after their allocations (pool memory is freed with cuMemFree)
  if (session.callbacks) {
    session.callbacks->end();
    session.callbacks->drop_kept();
  }

  for (std::uint64_t id : session.objects.ids<EventObj>()) {
    auto event = session.objects.take<EventObj>(id);
    // An interprocess event's driver events go with its last holder (~IpcEvent).
    if (!event->ipc) warn_if_failed(session, cu.cuEventDestroy_v2(event->event), "cuEventDestroy");
    ++tally.events;
  }
  for (std::uint64_t id : session.objects.ids<StreamObj>()) {
    auto stream = session.objects.take<StreamObj>(id);
    if (stream->join_event != nullptr) cu.cuEventDestroy_v2(stream->join_event);
    if (stream->capture_fence != nullptr) session.release_event(stream->capture_fence);
    warn_if_failed(session, cu.cuStreamDestroy_v2(stream->stream), "cuStreamDestroy");
    ++tally.streams;
  }
  for (std::uint64_t id : session.objects.ids<ContextObj>()) {
    auto ctx = session.objects.take<ContextObj>(id);
    if (ctx->record_stream != nullptr) {
      warn_if_failed(session, cu.cuStreamDestroy_v2(ctx->record_stream), "cuStreamDestroy");
    }
    if (ctx->green != nullptr) {  // after its streams, above
      warn_if_failed(session, cu.cuGreenCtxDestroy(ctx->green), "cuGreenCtxDestroy");
    }
  }
  if (session.fence_stream != nullptr) {
    warn_if_failed(session, cu.cuStreamDestroy_v2(session.fence_stream), "cuStreamDestroy");
    session.fence_stream = nullptr;
  }
  session.active_captures = 0;
  for (CUevent event : session.event_pool) cu.cuEventDestroy_v2(event);
  session.event_pool.clear();
  session.fences.words.release_all(cu);  // the streams are idle: no write is on its way

  if (session.staging_registered) {
    warn_if_failed(session, cu.cuMemHostUnregister(session.segment.staging()),
                   "cuMemHostUnregister(staging)");
    session.staging_registered = false;
  }
  // Last: every stream of them is destroyed above (the pool keeps only empty ones).
  if (session.green.green != nullptr) {
    warn_if_failed(session, session.green_pool().give_back(std::move(session.green)),
                   "giving back its green context");
    session.green = GreenContext{};
  }
  for (GreenContext& earlier : session.quota_changes.earlier_greens) {
    warn_if_failed(session, session.green_pool().give_back(std::move(earlier)),
                   "giving back a green context");
  }
  session.quota_changes.earlier_greens.clear();
  session.quota_changes.stale_events.clear();  // each was destroyed by whoever held it
  session.stash.clear();
  return tally;
}

}  // namespace mpsshim::server
