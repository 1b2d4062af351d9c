// What a client's handles name on the server.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "broker/server/images/image_cache.hpp"
#include "broker/server/launch/kernel_params.hpp"
#include "broker/server/session/handle_table.hpp"
#include "broker/server/session/ipc_registry.hpp"
#include "proto/ops_vmm.hpp"

namespace mpsshim::server {

// A context of the client's. Its default stream emulates the legacy NULL stream among the
// context's blocking streams (see streams.hpp).
struct ContextObj {
  std::uint32_t flags = 0;
  std::uint64_t default_stream = 0;
  std::uint64_t default_epoch = 0;  // bumped by every operation queued on the default stream
  std::vector<std::uint64_t> blocking_streams;
  // A green context of the client's own (cuGreenCtxCreate, ops/green_context.cpp), carved out
  // of its quota: its streams are made in it, and it is destroyed after them. Null: the
  // context's streams are made in the client's quota (Session::green).
  CUgreenCtx green = nullptr;
  std::uint32_t green_generation = 0;  // Session::quota_changes.generation when it was made
  // A stream of `green` that cuCtxRecordEvent records from (ops/event.cpp), made at the first;
  // fenced and destroyed before `green` when the green context goes (retire.cpp).
  CUstream record_stream = nullptr;
};

struct StreamObj {
  CUstream stream = nullptr;  // always a cuGreenCtxStreamCreate stream of the client's
  std::uint64_t ctx = 0;
  // Made in a green context of the client's own (ContextObj::green): a live SM quota change
  // leaves it there, and its launches go eagerly (a batch's graph would run in the quota's).
  bool in_client_green = false;
  int priority = 0;  // as created (effective_priority): a live SM quota change recreates it
  bool is_default = false;
  bool blocking = false;           // created without CU_STREAM_NON_BLOCKING
  bool work_since_join = false;    // blocking: work the default stream has not waited for yet
  std::uint64_t joined_epoch = 0;  // blocking: the default stream's epoch last waited for
  CUevent join_event = nullptr;    // recorded here to make another stream wait for this one
  // Stream capture (capture.hpp): the stream began a capture (it must end it); a pool event
  // recorded just before the stream began or joined a capture, which fences stand in for while
  // it captures; the id of the graph being captured: the client's own graph from the start for
  // cuStreamBeginCaptureToGraph, otherwise once the client asked for it.
  bool capture_origin = false;
  CUevent capture_fence = nullptr;
  std::uint64_t capture_graph = 0;
  // Operations queued on it so far (use_stream), and how many of them are known to have
  // completed (a fence reached, a query that found it idle). Equal: the stream is idle, and a
  // synchronize answers without asking the driver (a query costs ~1.5 us on an H100) or
  // fencing it. What the server itself records on the stream (joins, retire fences, timing
  // events) is not the client's work and not counted.
  std::uint64_t queued = 0;
  std::uint64_t settled = 0;
  bool idle() const { return settled == queued; }
};

struct EventObj {
  CUevent event = nullptr;
  std::uint64_t ctx = 0;
  unsigned flags = 0;
  // Session::quota_changes.generation when it was made: cuda.h has an event record only on streams
  // of its own context, so after a live SM quota change its next record gets a fresh one
  // (sm_quota_change.hpp; the documented rule, which an H200's driver does not enforce between
  // green contexts of one device: tools/probes/green_nested.cu).
  std::uint32_t green_generation = 0;
  // An interprocess event (exported with cuIpcGetEventHandle, or opened): `event` is then null
  // and the event lives in the IpcEvent, shared with the other clients that hold it.
  std::shared_ptr<IpcEvent> ipc;
  // Named by an event record or wait node (ops/graph_nodes.cpp): the driver event is then never
  // destroyed before the session's graphs; a quota change parks it in
  // Session::quota_changes.graph_events.
  bool in_graph = false;
  // What a query, a synchronize or a stream wait looks at.
  CUevent driver_event() const { return ipc ? ipc->latest() : event; }
};

struct ModuleObj {
  CUmodule module = nullptr;
  std::uint64_t ctx = 0;
  std::uint64_t library = 0;  // not 0: the library's own module (cuLibraryGetModule)
};

struct LibraryObj {
  CUlibrary library = nullptr;
  std::uint64_t ctx = 0;
  // Set when other sessions may use the same library (image_cache.hpp): `library` is its
  // library, unloaded when the last holder lets go, never by this session alone.
  std::shared_ptr<SharedLibrary> shared;
};

struct FunctionObj {
  CUfunction function = nullptr;
  std::uint64_t owner = 0;  // the module or kernel it came from
  ParamLayout layout;       // for graph kernel nodes' kernelParams (kernel_params.hpp)
};

struct KernelObj {
  CUkernel kernel = nullptr;
  std::uint64_t library = 0;
  CUfunction function = nullptr;  // cuKernelGetFunction, fetched on first need
  ParamLayout layout;
};

// A memfd of the client's, mapped here and registered with the driver.
struct HostRegionObj {
  void* address = nullptr;
  std::uint64_t bytes = 0;
  std::uint64_t mapped_bytes = 0;
  CUdeviceptr device = 0;
  bool in_pinned_window = false;  // mapped by the GPU's PinnedWindow, unmapped through it
};

// A CUDA array of the client's (ops/copies.cpp). `charged` bytes count against its limit.
struct ArrayObj {
  CUarray array = nullptr;
  std::uint64_t ctx = 0;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  std::uint64_t element_bytes = 0;
  std::uint64_t charged = 0;
  // A level of this mipmapped array (MipmappedArrayObj): the driver's array is the mipmapped
  // array's, never destroyed on its own, and charged with it.
  std::uint64_t mipmap = 0;
  // A sparse array: the physical allocations its tiles were mapped onto (ops/sparse_array.cpp),
  // each held (PhysicalAllocObj::mappings) until the array goes.
  std::vector<std::uint64_t> tile_pools{};
};

// A mipmapped array of the client's (ops/mipmapped_array.cpp); its levels are ArrayObjs made
// when first asked for (`levels_given`: their ids, 0 until then).
struct MipmappedArrayObj {
  CUmipmappedArray mipmap = nullptr;
  std::uint64_t ctx = 0;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  unsigned levels = 0;
  std::uint64_t element_bytes = 0;
  std::uint64_t charged = 0;
  std::vector<std::uint64_t> levels_given;
  std::vector<std::uint64_t> tile_pools{};  // as ArrayObj's
};

// A texture or surface object of the client's; `value` is what the driver handed out.
struct TexObj {
  unsigned long long value = 0;
  bool surface = false;
  std::uint64_t ctx = 0;
};

// A graph of the client's. Not owned while a capture still builds it (the driver frees it if the
// capture fails), nor when it is the graph embedded in a child graph node (`embedded_in`: the id
// of the graph that holds the node), which the driver frees with that graph.
struct GraphObj {
  CUgraph graph = nullptr;
  std::uint64_t ctx = 0;
  bool owned = true;
  std::uint64_t embedded_in = 0;
  // Embedded in a child graph or conditional node: that node's id, so that the graph is
  // forgotten when the node is destroyed (0: not known, or not embedded).
  std::uint64_t embedded_node = 0;
  // The conditional handles made for it (cuGraphConditionalHandleCreate): a conditional node
  // may name only these.
  std::vector<CUgraphConditionalHandle> conditionals{};
};

struct GraphExecObj {
  CUgraphExec exec = nullptr;
  std::uint64_t ctx = 0;
};

struct GraphNodeObj {
  CUgraphNode node = nullptr;
  std::uint64_t graph = 0;
};

// A memory pool of the client's own (cuMemPoolCreate, or its default pool). Its allocations
// come from the server's arena (device_heap.hpp) like cuMemAlloc's; the driver's pool serves
// only allocations made while a stream is captured (graph memory) and keeps the attributes the
// client sets (ops/memory_pool.cpp).
struct PoolObj {
  CUmemoryPool pool = nullptr;
  bool is_default = false;
  std::uint64_t max_bytes = 0;  // CUmemPoolProps::maxSize, bounded by the client's limit; 0: none
  std::uint64_t used = 0;       // bytes of its live allocations in the arena
  std::uint64_t used_high = 0;  // their high-water mark since creation or the last reset
};

// A physical allocation of the client's (cuMemCreate; ops/vmm.cpp). It lives while the client
// holds a handle to it (cuMemCreate and each cuMemRetainAllocationHandle add one, cuMemRelease
// takes one) or while it is mapped (`mappings`: address ranges, and sparse arrays whose tiles
// were mapped onto it); until then its bytes count against the client's limit.
// The server keeps the driver's handle until both counts are 0, then releases it.
struct PhysicalAllocObj {
  CUmemGenericAllocationHandle handle = 0;
  // Imported (cuMemImportFromShareableHandle): its size is the exporter's, unknown here (the
  // driver checks each mapping), and it is charged to the exporter, not to this client.
  static constexpr std::uint64_t kImportedBytes = ~std::uint64_t{0};
  std::uint64_t bytes = 0;
  proto::VmmProp prop{};
  std::uint32_t client_refs = 1;
  std::uint32_t mappings = 0;
  // Shared with other clients by fd (cuMemExportToShareableHandle, ops/vmm_share.cpp): the
  // registry's entry and the handle every export of it hands out.
  std::shared_ptr<IpcMemory> shared;
  proto::IpcHandle shared_handle{};
  // Handed out as a POSIX fd (cuMemExportToShareableHandle): another process may map it.
  bool exported = false;
  // Its bytes are on the host while its client is suspended, at `parked_at` in the session's
  // block of them (VirtualMemory::parked, session/vmm_park.hpp); `handle` is 0 while its device
  // memory is given back.
  bool parked = false;
  std::uint64_t parked_at = 0;
};

// A JIT link of the client's (cuLinkCreate; ops/link.cpp). The driver writes its logs into
// `info_log` and `error_log` and its outputs (the wall time, the logs' lengths) into `values`,
// and reads the inputs until the link completes: all of it lives on the heap, where the table
// moving a LinkObj does not move it.
struct LinkState {
  CUlinkState link = nullptr;
  std::uint64_t ctx = 0;
  std::vector<CUjit_option> options;
  std::vector<void*> values;
  std::vector<char> info_log;
  std::vector<char> error_log;
  std::vector<std::vector<std::byte>> inputs;
};
struct LinkObj {
  std::unique_ptr<LinkState> state;
};

using ObjectTable =
    HandleTable<ContextObj, StreamObj, EventObj, ModuleObj, LibraryObj, FunctionObj, KernelObj,
                HostRegionObj, ArrayObj, TexObj, GraphObj, GraphExecObj, GraphNodeObj, PoolObj,
                PhysicalAllocObj, LinkObj, MipmappedArrayObj>;

}  // namespace mpsshim::server
