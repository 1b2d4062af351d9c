// The test driver's model of one process's view of the driver: devices, their primary contexts,
// and every object the API hands out. One mutex guards it all; streams run on their own threads.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tests/testdriver/device_memory.hpp"
#include "tests/testdriver/event.hpp"
#include "tests/testdriver/graph.hpp"
#include "tests/testdriver/kernels.hpp"
#include "tests/testdriver/sm_set.hpp"
#include "tests/testdriver/virtual_memory.hpp"
#include "tests/testdriver/work_queue.hpp"

// Definitions of exported entry points: C linkage, visible although the library hides the rest.
#define MPSSHIM_TESTDRIVER_EXPORT extern "C" __attribute__((visibility("default")))

namespace mpsshim::testdriver {

inline constexpr int kDriverVersion = 13000;
inline constexpr int kMaxDevices = 8;
inline constexpr int kMaxThreadsPerBlock = 1024;
inline constexpr int kMaxThreadsPerSm = 2048;
inline constexpr int kMaxBlocksPerSm = 32;
inline constexpr int kSharedPerBlock = 49152;
inline constexpr int kSharedPerBlockOptin = 232448;
inline constexpr int kSharedPerSm = 233472;
inline constexpr int kStreamPriorityLeast = 0;
inline constexpr int kStreamPriorityGreatest = -5;

struct GreenContext;
struct Library;
struct Module;

struct Stream {
  int device;
  CUcontext context;                    // a primary context, or a green context's CUcontext
  std::shared_ptr<GreenContext> green;  // for cuGreenCtxStreamCreate streams
  std::shared_ptr<const std::vector<std::uint16_t>> sms;
  unsigned flags;
  int priority;
  std::shared_ptr<WorkQueue> queue;
  std::shared_ptr<Capture> capture{};       // while capturing (graph.cpp)
  std::vector<CUgraphNode> capture_tail{};  // what the next captured node depends on
  // cuStreamSetAttribute's values by attribute id (stream.cpp); absent: all zero.
  std::map<int, CUstreamAttrValue> attributes{};
};

struct GreenContext {
  int device;
  SmSet sms;
  bool destroyed = false;  // streams outlive it (the API leaves them to the user) and must know
  std::unique_ptr<Stream> default_stream;  // what NULL names while it is current
  char view = 0;                           // its address is the CUcontext cuCtxFromGreenCtx returns
  CUcontext context() { return reinterpret_cast<CUcontext>(&view); }
};

struct PrimaryContext {
  int refcount = 0;
  std::array<std::size_t, CU_LIMIT_MAX> limits{};
  std::unique_ptr<Stream> null_stream;  // while active
  bool active() const { return refcount > 0; }
};

struct Device {
  int ordinal;
  DeviceMemory memory;
  PrimaryContext primary;
  CUcontext handle() { return reinterpret_cast<CUcontext>(&primary); }
};

// The settable part of a function's attributes. A CUkernel keeps one per device and the CUfunction
// it yields in a context shares it, so setting either is seen through both.
struct FuncAttributes {
  int max_dynamic_shared = kSharedPerBlock;
  int carveout = -1;
  std::array<int, 3> required_cluster{};
  int non_portable_cluster = 0;
  int cluster_scheduling = 0;
};

struct Function {
  Module* module;
  const KernelDef* def;
  FuncAttributes* attributes;  // &own, or the CUkernel's for this device
  FuncAttributes own;
};

struct Module {
  int device;
  Library* library;    // null when loaded with cuModuleLoadData
  CUdeviceptr global;  // `test_global`, 256 zeroed bytes
  std::map<const KernelDef*, CUfunction> functions;
};

struct Kernel {
  Library* library;
  const KernelDef* def;
  std::array<FuncAttributes, kMaxDevices> attributes;
};

struct Library {
  std::array<CUmodule, kMaxDevices> modules{};  // loaded into a device's context when first needed
  std::map<const KernelDef*, CUkernel> kernels;
  // As the real driver does for cuDNN's libraries (measured: cuLibraryGetKernelCount 0, while
  // cuLibraryGetKernel finds their kernels by name): a text image holding kListsNoKernels.
  bool lists_no_kernels = false;
};
inline constexpr std::string_view kListsNoKernels = "mpsshim-testdriver: lists no kernels";

struct ResourceDesc {
  int device;
  SmSet sms;
};

struct Allocation {
  int device;
  std::size_t size;
  bool user;  // from cuMemAlloc*, not a module's global
  // A graph memory allocation node's block (graph.hpp): allocated from a launch of its graph
  // until a free node, cuMemFree or cuMemFreeAsync frees it (`graph_live`).
  bool graph = false;
  bool graph_live = false;
  bool freed_by_node = false;  // a free node names it: no other may (cuda.h)
};

struct Registration {
  std::size_t size;
  unsigned flags;
};

// A CUDA array (arrays.cpp): rows packed in a device allocation of its own.
// A tile of a sparse array mapped onto 64 KiB of a tile-pool allocation (sparse_arrays.cpp).
struct SparseTile {
  CUmemGenericAllocationHandle allocation = 0;
  std::size_t offset = 0;
};
struct Array {
  int device;
  CUdeviceptr storage;
  CUDA_ARRAY3D_DESCRIPTOR desc;
  std::size_t element;  // bytes
  // A level of this mipmapped array: freed with it, not by cuArrayDestroy.
  CUmipmappedArray level_of = nullptr;
  // A sparse array's mapped tiles (sparse_arrays.cpp), by tile number; a mip tail's pieces
  // after kMiptailTiles. Copies reach `storage` whatever is mapped.
  std::map<std::uint64_t, SparseTile> tiles{};
  std::size_t row() const { return desc.Width * element; }
  std::size_t rows() const { return desc.Height == 0 ? 1 : desc.Height; }
  std::size_t slices() const { return desc.Depth == 0 ? 1 : desc.Depth; }
};
// A mipmapped array (arrays.cpp): one array per level, each half the one before.
struct MipmappedArray {
  int device;
  CUDA_ARRAY3D_DESCRIPTOR desc;
  std::vector<CUarray> levels;
};
// Bytes of one channel of `format`; 0 for a format arrays do not take (arrays.cpp).
std::size_t channel_bytes(CUarray_format format);

// A texture or surface object (arrays.cpp).
struct TexObject {
  CUDA_RESOURCE_DESC resource;
  CUDA_TEXTURE_DESC texture;
  bool surface;
};

// Objects by handle; the handle is the object's address.
template <class Handle, class T>
class HandleTable {
 public:
  Handle add(std::shared_ptr<T> object) {
    auto handle = reinterpret_cast<Handle>(object.get());
    map_.emplace(handle, std::move(object));
    return handle;
  }
  T* get(Handle h) const {
    auto it = map_.find(h);
    return it == map_.end() ? nullptr : it->second.get();
  }
  std::shared_ptr<T> shared(Handle h) const {
    auto it = map_.find(h);
    return it == map_.end() ? nullptr : it->second;
  }
  void erase(Handle h) { map_.erase(h); }
  std::size_t size() const { return map_.size(); }
  auto begin() const { return map_.begin(); }
  auto end() const { return map_.end(); }
  template <class Pred>
  void erase_if(Pred pred) {
    std::erase_if(map_, [&](const auto& kv) { return pred(*kv.second); });
  }

 private:
  std::unordered_map<Handle, std::shared_ptr<T>> map_;
};

class State;
// MPSSHIM_TESTDRIVER_STATS_FILE (stats_file.cpp): called once by cuInit.
void start_stats_file(State& s);

class State {
 public:
  State();

  std::mutex mutex;  // guards everything below except the atomics
  // Held shared by every operation that touches device memory while it runs, and exclusively
  // while memory is unmapped, so freeing never pulls pages from under a running copy or kernel.
  // Order: memory_use before mutex.
  std::shared_mutex memory_use;

  std::atomic<bool> initialized{false};
  std::atomic<bool> forked{false};             // a child of fork() after cuInit
  std::atomic<CUresult> sticky{CUDA_SUCCESS};  // a device fault poisons the process

  std::vector<std::unique_ptr<Device>> devices;
  std::map<std::uintptr_t, Allocation> allocations;      // by base address
  std::map<std::uintptr_t, Registration> registrations;  // by base address
  HandleTable<CUstream, Stream> streams;
  HandleTable<CUevent, Event> events;
  HandleTable<CUmodule, Module> modules;
  HandleTable<CUfunction, Function> functions;
  HandleTable<CUlibrary, Library> libraries;
  HandleTable<CUkernel, Kernel> kernels;
  HandleTable<CUgreenCtx, GreenContext> green_contexts;
  std::unordered_map<CUcontext, CUgreenCtx> green_by_context;
  // Destroyed streams still running what they were given: the device (and the stream's context)
  // is not idle until they are.
  struct RetiringStream {
    int device;
    CUcontext context;
    std::weak_ptr<WorkQueue> queue;
  };
  std::vector<RetiringStream> retiring;
  HandleTable<CUdevResourceDesc, ResourceDesc> descs;
  HandleTable<CUarray, Array> arrays;
  HandleTable<CUmipmappedArray, MipmappedArray> mipmaps;
  std::map<unsigned long long, TexObject> tex_objects;  // by value; values count up from 1
  unsigned long long next_tex_object = 1;
  HandleTable<CUgraph, Graph> graphs;
  // Graphs embedded in child graph nodes, by handle: the nodes own them (cuGraphDestroy refuses
  // them); an entry expires with its node's graph.
  std::unordered_map<CUgraph, std::weak_ptr<Graph>> embedded_graphs;
  // A conditional node's body handles, the array cuGraphAddNode hands its caller.
  std::unordered_map<CUgraphNode, std::vector<CUgraph>> conditional_bodies;
  HandleTable<CUgraphExec, GraphExec> graph_execs;
  std::uint64_t graph_instantiations = 0;  // test hooks (graph.cpp)
  std::uint64_t graph_node_updates = 0;
  std::uint64_t graph_node_toggles = 0;    // cuGraphNodeSetEnabled calls
  std::uint64_t persisting_l2_resets = 0;  // cuCtxResetPersistingL2Cache calls
  std::unordered_map<const Event*, CapturedRecord> captured_events;
  std::uint64_t next_capture_id = 1;
  std::uint64_t next_split = 1;
  VirtualMemory vmm;  // cuMemCreate / cuMemAddressReserve / cuMemMap (virtual_memory.cpp)

  // Why an entry point may not run at all: not initialized, a forked child, a sticky fault.
  CUresult admission() const;
  void fault(CUresult error);
  int live_objects();
};

// Never destroyed: detached stream workers may still run at exit.
State& state();

// Runs an entry point's body, which takes the State; nothing escapes the C ABI.
template <class Body>
CUresult entry(Body&& body) noexcept {
  State& s = state();
  if (CUresult r = s.admission(); r != CUDA_SUCCESS) return r;
  try {
    return body(s);
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  } catch (...) {
    return CUDA_ERROR_UNKNOWN;
  }
}

// ---- Helpers shared by the entry points. "locked": the caller holds s.mutex.

bool valid_device(const State& s, CUdevice dev);
// The calling thread's current context, while it is usable (locked): an active primary context
// or a live green context; `null_stream` is the stream that NULL names in it.
struct CurrentContext {
  Device* device = nullptr;
  CUcontext handle = nullptr;
  Stream* null_stream = nullptr;
};
CurrentContext context_of(State& s, CUcontext ctx);  // empty when ctx is not usable
CurrentContext current_context(State& s);
inline Device* current_device(State& s) {
  return current_context(s).device;
}
void set_current_context(CUcontext ctx);
// Retains / releases a device's primary context; the last release destroys everything created in
// it, as the real driver does. release_primary unlocks `lock` while it drains the device's work.
CUresult retain_primary(State& s, Device& dev);
CUresult release_primary(State& s, Device& dev, std::unique_lock<std::mutex>& lock);

// Unmaps every tile of a sparse array, as destroying it does (sparse_arrays.cpp; locked).
void unmap_tiles(State& s, Array& array);

// NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name the current context's NULL stream (locked).
CUresult resolve_stream(State& s, CUstream handle, Stream*& out);
// A CUfunction, or a CUkernel cast to one, resolved in `device`'s context (-1: none) (locked).
CUresult resolve_function(State& s, CUfunction handle, int device, Function*& out);

// Host view of [addr, addr + bytes) when it lies in one live allocation or registered range.
std::byte* resolve_range_locked(State& s, std::uintptr_t addr, std::size_t bytes);
std::byte* resolve_range(std::uintptr_t addr, std::size_t bytes);  // takes the lock
// An access policy window (a stream's or a kernel node's attribute) lies in such memory, or is
// empty (locked).
inline bool window_in_memory(State& s, const CUaccessPolicyWindow& w) {
  return w.num_bytes == 0 || resolve_range_locked(s, reinterpret_cast<std::uintptr_t>(w.base_ptr),
                                                  w.num_bytes) != nullptr;
}

// Device memory in a context (locked); user allocations count as live objects.
CUresult allocate(State& s, Device& dev, std::size_t bytes, bool user, CUdeviceptr* out);
void release_allocation(State& s, std::uintptr_t base);  // locked, memory_use held exclusively
// Virtual memory (virtual_memory.cpp), locked: the host view of a range inside read-write
// mappings (nullptr otherwise); live physical allocations and reservations.
std::byte* resolve_mapped_locked(State& s, std::uintptr_t addr, std::size_t bytes);
int live_vmm_objects(const State& s);
// Memory pools (memory_pool.cpp), locked: a pool allocation being released; live pools.
void forget_pool_allocation(State& s, std::uintptr_t base);
int live_pools(const State& s);

// Enqueues work that touches memory: skipped once the process is faulted; a DeviceFault it raises
// becomes the sticky error (locked).
// On a capturing stream the work becomes a node of type `type` of the capture's graph instead, and
// the ticket is 0 (graph.cpp).
WorkQueue::Ticket submit_work(State& s, Stream& stream, std::function<void()> work,
                              CUgraphNodeType type = CU_GRAPH_NODE_TYPE_KERNEL);
// The work of one stream memory operation (a 32- or 64-bit store or wait, a flush, a barrier),
// checked as the driver checks it (stream.cpp; locked).
CUresult mem_op_work(State& s, const CUstreamBatchMemOpParams& op, std::function<void()>& out);
// Adds a node to the capture of `stream` after its current dependencies (locked).
void capture_node(State& s, Stream& stream, CUgraphNodeType type, std::function<void()> work);
// CUDA_SUCCESS, or, for a capturing stream, the capture invalidated and
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: what the real driver does for an operation that cannot
// be captured (synchronization, pageable copies) (locked).
CUresult forbid_in_capture(State& s, Stream& stream);
// cuStreamWaitEvent's capture rules: joins `stream` to the capture the event was recorded in, or
// refuses a wait that crosses a capture's boundary; CUDA_ERROR_NOT_FOUND when capture is not
// involved and the wait is an ordinary one (locked).
CUresult capture_wait(State& s, Stream& stream, const Event& event);
// The stream leaves its capture (destroyed); a capture losing its origin is invalidated (locked).
void leave_capture(State& s, Stream& stream);
// Lets the stream finish its work on its own, still counted by drain() (locked).
void retire_stream(State& s, Stream& stream);
// Waits until every stream of `device` (-1: all devices) has run what it was given; takes and
// releases the lock itself, so call it unlocked.
void drain(State& s, int device);
// Waits until everything queued in context `ctx` ran (cuCtxSynchronize): a green context's
// streams, destroyed ones included, and its default stream; a primary context's whole device.
// Unlocked.
void drain_context(State& s, CUcontext ctx);

// The packed argument buffer of a launch, from kernelParams or `extra` (launch.cpp).
CUresult pack_arguments(const KernelDef& def, void** params, void** extra,
                        std::vector<std::byte>& args);
// A kernel's run over the given SMs, as stream work.
std::function<void()> kernel_work(const KernelDef* def, Dim3 grid, Dim3 block,
                                  std::shared_ptr<const std::vector<std::uint16_t>> sms,
                                  std::shared_ptr<std::vector<std::byte>> args);

// Destroys a module's functions and global (locked, memory_use held exclusively).
void destroy_module(State& s, CUmodule handle);

}  // namespace mpsshim::testdriver
