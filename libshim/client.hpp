// Process-wide state of the shim: the configuration read from the environment at cuInit, the
// device table the daemon sent, one lazily attached Session per device, and the client-side
// objects that CUcontext / CUstream / CUevent / CUmodule / CUlibrary / CUfunction / CUkernel
// handles point at.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "libshim/api.hpp"
#include "libshim/session.hpp"
#include "proto/control.hpp"
#include "proto/device_snapshot.hpp"
#include "proto/ops.hpp"

namespace mpsshim::shim {

inline constexpr int kMaxDevices = 64;

// What the client asks for, from CUDA_MPS_* and MPSSHIM_* variables (docs/environment.md).
struct ClientConfig {
  std::vector<std::string> socket_candidates;  // control sockets to try, in order
  int active_thread_percentage = proto::kUnset;
  int priority = proto::kUnset;
  std::uint64_t memory_limit_all = 0;         // CUDA_MPS_PINNED_DEVICE_MEM_LIMIT without ordinal
  std::map<int, std::uint64_t> memory_limit;  // per visible ordinal
  bool ignore_sm_coscheduling = false;        // MPSSHIM_SM_GRANULARITY=2
  bool launch_batching = true;                // MPSSHIM_LAUNCH_BATCHING=off: false
  bool early_answers = false;                 // MPSSHIM_EARLY_ANSWERS=on: true
  bool wait_pacing = true;                    // MPSSHIM_WAIT_PACING=off: false
  bool own_isolation_group = false;           // MPSSHIM_ISOLATION=own
  // A library's kernels are handed out from the names its load's reply lists and looked up on
  // the server at their first use (libshim/kernel_lookup.hpp). MPSSHIM_KERNEL_LOOKUP=eager, or
  // CUDA_MODULE_LOADING=EAGER, looks each up when cuLibraryGetKernel asks: false.
  bool lazy_kernels = true;
  // What cuModuleGetLoadingMode answers: lazy, as the real driver does by default since CUDA
  // 12.2, unless CUDA_MODULE_LOADING=EAGER. The CUDA runtime asks it and, told lazy, loads each fat
  // binary registered with it at the first use of one of its kernels; told eager, it loads every
  // one at the context's start (a PyTorch ResNet-50 client: 4,389 library loads instead of 24).
  bool lazy_loading = true;
  // MPSSHIM_ALLOCATION_TOKEN, else the first line of MPSSHIM_ALLOCATION_TOKEN_FILE: what the
  // Kubernetes device plugin handed this pod (docs/kubernetes.md). "" when none.
  std::string allocation_token;
  // CUDA_MPS_SM_PARTITION: the static SM partition to run in (mpsshimctl sm_partition add);
  // 0 = none, proto::kBadSmPartition = set to something that is no partition id.
  std::uint32_t sm_partition = 0;
  std::string visible_devices;
  std::string program;
};
ClientConfig read_client_config();
// The hello this process sends the daemon (`device`: a visible ordinal, -1 for none).
proto::ClientHello make_client_hello(proto::MessageKind kind, int device,
                                     const ClientConfig& config);
// "4G", "512M", "1024" (bytes) -> bytes; 0 when malformed.
std::uint64_t parse_memory_size(const std::string& text);

// Magic words let entry points reject a handle that is not one of ours (or was destroyed)
// instead of corrupting memory.
enum class Magic : std::uint32_t {
  kDead = 0,
  kContext = 0x43545831,
  kStream = 0x53545231,
  kEvent = 0x45565431,
  kModule = 0x4d4f4431,
  kLibrary = 0x4c494231,
  kFunction = 0x46554e31,
  kArray = 0x41525231,
  kMemPool = 0x504f4f31,
  kMipmappedArray = 0x4d495031,
  kGreenContext = 0x47524e31,
  kResourceDesc = 0x44534331,
};

struct Context;

struct Stream {
  Magic magic = Magic::kStream;
  Context* ctx = nullptr;
  proto::WireHandle wire = 0;
  unsigned flags = 0;
  int priority = 0;
  std::uint64_t id = 0;
  // The arrays cuStreamGetCaptureInfo last answered for this stream (its dependency nodes and
  // their edge data): the caller may read them until its next call on the stream, as natively.
  // Written under the capture book's mutex (libshim/graph.cpp).
  std::vector<CUgraphNode> capture_deps;
  std::vector<CUgraphEdgeData> capture_edges;
  // CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY as set (0: never set), answered by the shim: the
  // client's waits follow the shim's wait policy (libshim/wait_policy.hpp) either way.
  unsigned sync_policy = 0;
};

struct Event {
  Magic magic = Magic::kEvent;
  Context* ctx = nullptr;
  proto::WireHandle wire = 0;
  unsigned flags = 0;
};

struct Function;

struct Module {
  Magic magic = Magic::kModule;
  Context* ctx = nullptr;
  proto::WireHandle wire = 0;
  std::mutex mutex;
  std::unordered_map<std::string, Function*> functions;  // cuModuleGetFunction cache
  // The names of all its functions in the driver's order, once asked (cuModuleGetFunctionCount,
  // cuModuleEnumerateFunctions); a loaded module's functions never change. Under `mutex`.
  std::vector<std::string> function_names;
  bool function_names_known = false;
  bool owned_by_library = false;
};

struct Library {
  Magic magic = Magic::kLibrary;
  // The context it was shipped from; nullptr until bound: loaded with no current context (see
  // below). The server keeps a shipped library for the whole session, as libraries are
  // context-independent: destroying or resetting that context does not unload it.
  Context* ctx = nullptr;
  proto::WireHandle wire = 0;
  std::mutex mutex;
  // Libraries are context-independent: the CUDA runtime loads its fat binaries with
  // cuLibraryLoadData before any context exists. Such a library is shipped into the first
  // context current at a use; until then it holds its image pieces, pointing into the caller's
  // memory under CU_LIBRARY_BINARY_IS_PRESERVED (as the runtime passes) or else into a copy.
  std::vector<std::span<const std::byte>> unbound_pieces;
  std::vector<std::byte> unbound_copy;
  std::unordered_map<std::string, Function*> kernels;
  Module* module = nullptr;
  // Its kernels' names in the driver's order, as the server listed them when the library was
  // shipped (kernel_lookup.hpp); `listed` views them. Under `mutex`; set once, when shipped.
  std::vector<std::string> kernel_names;
  std::unordered_set<std::string_view> listed;
  bool kernel_names_known = false;
  // A library is context-independent, and so are its kernels: the CUDA runtime launches one
  // CUkernel on every GPU the process uses. Each GPU is another server, so the image is shipped
  // to each GPU's server at its first launch there (kernel_on_device, module.cpp). Kept for that
  // while the process sees more than one GPU: views of the caller's memory when it is preserved
  // (CU_LIBRARY_BINARY_IS_PRESERVED, as the runtime loads), else our copy. Under `mutex`.
  std::vector<std::span<const std::byte>> image;
  std::vector<std::byte> image_copy;
  struct Elsewhere {
    Context* ctx;  // a context of that GPU, the one it was shipped from
    proto::WireHandle wire;
  };
  std::vector<Elsewhere> elsewhere;
};

// A CUfunction or a CUkernel: the runtime passes a CUkernel where a CUfunction is expected
// (as the real driver allows), so both handles point at this one type.
struct Function {
  Magic magic = Magic::kFunction;
  bool is_kernel = false;
  Context* ctx = nullptr;
  proto::WireHandle wire = 0;
  std::string name;
  std::vector<proto::ParamSlot> params;
  std::uint32_t args_bytes = 0;
  Module* module = nullptr;
  Library* library = nullptr;
  std::atomic<Function*> function_of_kernel{nullptr};  // cuKernelGetFunction, cached
  Function* kernel_of = nullptr;  // for a function cuKernelGetFunction gave: its kernel
  // A library's kernel on other GPUs' servers, by visible device (kernel_on_device).
  std::array<std::atomic<Function*>, 16> on_device{};
  // False for a library's kernel handed out from its listed names until its first use looks it
  // up on the server (kernel_lookup.hpp: usable()). wire, params and args_bytes are written
  // before it turns true (release) and read only after it was seen true (acquire).
  std::atomic<bool> looked_up{true};
  // cuOccupancyMaxActiveBlocksPerMultiprocessor's answers (libshim/launch.cpp), the last few
  // asked, under occupancy_mutex. An answer holds while no function's settings changed since:
  // `generation` is function_settings_generation's value when it was asked.
  struct OccupancyAnswer {
    std::uint64_t generation = 0;  // 0: empty
    std::size_t dynamic_smem = 0;
    int block_size = 0;
    unsigned flags = 0;
    int blocks = 0;
  };
  std::mutex occupancy_mutex;
  std::array<OccupancyAnswer, 16> occupancy{};
  unsigned occupancy_next = 0;
  // Attribute cache: value + 1 (0 = not fetched). Invalidated by Set*Attribute.
  std::array<std::atomic<std::int64_t>, CU_FUNC_ATTRIBUTE_MAX> attributes{};
};

// Bumped whenever a function's attributes or cache preference are set (cuFuncSetAttribute,
// cuKernelSetAttribute, cuFuncSetCacheConfig): what a function's occupancy depends on. One counter
// for all functions, as a CUkernel and the CUfunction cuKernelGetFunction gives for it share their
// settings on the server; sets are rare (PyTorch sets a kernel's dynamic shared memory once).
inline std::atomic<std::uint64_t> function_settings_generation{1};

struct Context {
  Magic magic = Magic::kContext;
  int device = 0;
  bool primary = false;
  // Scheduling flags and the rest: set by any thread (cuCtxSetFlags, cuDevicePrimaryCtxSetFlags),
  // read by every waiting thread (wait_policy.hpp).
  std::atomic<unsigned> flags{0};
  std::atomic<std::uint64_t> id{0};
  std::atomic<bool> active{false};
  std::atomic<int> primary_refs{0};
  Session* session = nullptr;
  proto::WireHandle wire = 0;
  Stream legacy;  // the context's legacy default stream (a private stream on the server)
  std::mutex mutex;
  // The session's record count (Session::records_committed) right after the record of this
  // context's last synchronize that succeeded, taken before it was sent; while the count is
  // still that, nothing was sent since and cuCtxSynchronize is answered here (context.cpp).
  std::atomic<std::uint64_t> synced_through{~std::uint64_t{0}};
  // The green context this context is (cuCtxFromGreenCtx), or null (green_context.cpp).
  CUgreenCtx green = nullptr;
};

// A CUgreenCtx (green_context.cpp): a client context whose streams run on SMs carved out of the
// client's quota by the server. Its CUcontext (cuCtxFromGreenCtx) is `ctx`.
struct GreenContext {
  Magic magic = Magic::kGreenContext;
  Context ctx;
  unsigned sm_count = 0;
};

// A CUdevResourceDesc (green_context.cpp): the server's descriptor, on one device's server.
// Never freed, as the driver's are not (the API has no call that frees one).
struct ResourceDesc {
  Magic magic = Magic::kResourceDesc;
  int device = 0;
  Session* session = nullptr;
  proto::WireHandle wire = 0;
};

struct MipmappedArray;

// A CUarray (array.cpp): the server's array and the descriptor it was made with.
struct Array {
  Magic magic = Magic::kArray;
  Context* ctx = nullptr;
  proto::WireHandle wire = 0;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  MipmappedArray* level_of = nullptr;  // a level of it (mipmapped_array.cpp)
};

// A CUmipmappedArray (mipmapped_array.cpp): the server's, and the levels handed out so far
// (the same handle each time a level is asked for, as natively), under `mutex`.
struct MipmappedArray {
  Magic magic = Magic::kMipmappedArray;
  Context* ctx = nullptr;
  proto::WireHandle wire = 0;
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  unsigned levels = 0;
  std::mutex mutex{};
  std::vector<Array*> given{};
};

template <typename T>
inline constexpr Magic kMagicOf = Magic::kDead;
template <>
inline constexpr Magic kMagicOf<Context> = Magic::kContext;
template <>
inline constexpr Magic kMagicOf<Stream> = Magic::kStream;
template <>
inline constexpr Magic kMagicOf<Event> = Magic::kEvent;
template <>
inline constexpr Magic kMagicOf<Module> = Magic::kModule;
template <>
inline constexpr Magic kMagicOf<Library> = Magic::kLibrary;
template <>
inline constexpr Magic kMagicOf<Function> = Magic::kFunction;
template <>
inline constexpr Magic kMagicOf<Array> = Magic::kArray;
template <>
inline constexpr Magic kMagicOf<MipmappedArray> = Magic::kMipmappedArray;
template <>
inline constexpr Magic kMagicOf<GreenContext> = Magic::kGreenContext;
template <>
inline constexpr Magic kMagicOf<ResourceDesc> = Magic::kResourceDesc;

// A CUmemoryPool: one of the client's pools on the server of its device (memory_pool.cpp).
struct MemPool {
  Magic magic = Magic::kMemPool;
  Session* session = nullptr;
  int device = 0;
  proto::WireHandle wire = 0;  // 0: the session's default pool
  bool is_default = false;
  // Other devices given read-write access (cuMemPoolSetAccess), bit per visible device: each
  // allocation of the pool is mapped into their servers too (memory_pool.cpp, peer.hpp).
  std::atomic<std::uint64_t> peers{0};
  // Interprocess pools (memory_pool_ipc.cpp): `exportable` was created with POSIX fd handles;
  // `imported` came from another process's export (no session, no server pool: it only names
  // the exporter's pool, by `export_id`, for cuMemPoolImportPointer).
  bool exportable = false;
  bool imported = false;
  std::uint64_t export_id = 0;
};
template <>
inline constexpr Magic kMagicOf<MemPool> = Magic::kMemPool;

// The object behind a handle, or nullptr if it is not a live object of that type.
template <typename T, typename Handle>
T* object_of(Handle handle) {
  T* object = reinterpret_cast<T*>(handle);
  if (object == nullptr || object->magic != kMagicOf<T>) return nullptr;
  return object;
}

// ---- process state ----

// CUDA_SUCCESS once cuInit succeeded; CUDA_ERROR_NOT_INITIALIZED before; cuInit's failure after.
CUresult init_status() noexcept;
CUresult initialize() noexcept;
const ClientConfig& config() noexcept;

// The session of a visible device, attached on first use.
CUresult session_for(int device, Session*& out) noexcept;
// The session with GPU `ordinal` as mpsshimd numbers it (DeviceSnapshot::ordinal): the visible
// device's, or one of its own when this process does not see that GPU (CUDA_VISIBLE_DEVICES),
// for what only that GPU's server can answer (opening another process's shared memory).
CUresult session_for_gpu(int ordinal, Session*& out) noexcept;
// The granted SM count of a device: attaches the session (the server decides the rounding).
int client_sm_count(int device) noexcept;

// ---- contexts (context.cpp) ----

// The calling thread's current context, activated (it has a session and a server context).
CUresult current(Context*& out) noexcept;
CUresult activate(Context* ctx) noexcept;
// cuCtxDestroy of a created context or a green context's: everything made in it goes on its
// server; the object stays, dead, so that a stale handle is refused (context.cpp).
CUresult destroy_context(Context* ctx) noexcept;
// A context made on the server from what kCtxCreate or kGreenCtxCreate answered: its session,
// ids and default stream; active from now on (context.cpp).
void adopt_server_context(Context* ctx, Session* session, proto::WireHandle wire,
                          proto::WireHandle default_stream) noexcept;
// The flags of the calling thread's current context (0, CU_CTX_SCHED_AUTO, without one). Reads
// thread-local and atomic state only: the wait path asks it on every synchronize.
unsigned current_context_flags() noexcept;
// The context a context-independent object (a library loaded with no current context) is
// shipped into: the current one, else, on a thread with none, the first retained primary
// context. The real driver hands out a library's kernels with no context current (cuBLASLt does
// so on PyTorch's autograd thread, which never called cudaSetDevice for device 0); the shim must
// ship the image somewhere to answer, and the server keeps a library for the whole session
// whatever context shipped it.
CUresult context_for_library(Context*& out) noexcept;
// A visible device's primary context, activated (retained or not): where a call that names a
// device rather than a context (cuKernelGetAttribute) is answered.
CUresult primary_context(int device, Context*& out) noexcept;

// Which stream a CUstream argument means: NULL -> the context's legacy stream, or the calling
// thread's per-thread stream for a _ptsz/_ptds entry point; CU_STREAM_LEGACY / PER_THREAD as
// documented; else one of our Stream objects.
enum class DefaultStream { kLegacy, kPerThread };
CUresult resolve_stream(CUstream handle, DefaultStream mode, Context*& ctx,
                        Stream*& stream) noexcept;

// Device pointers the client owns, for cuMemcpy's unified addressing and cuPointerGetAttribute.
// A VMM mapping (vmm.cpp) is one too, but not memory cuMemFree takes; its ctx is the context
// current at its reservation (nullptr when there was none).
struct DeviceRange {
  std::uint64_t base;
  std::uint64_t bytes;
  Context* ctx;
  bool vmm = false;
  // VMM mappings: the GPU whose server holds it; memory opened with cuIpcOpenMemHandle: the GPU
  // whose server issued the handle (ipc.cpp), which may differ from ctx's
  int device = 0;
  CUmemoryPool pool = nullptr;  // stream-ordered allocations: the pool it came from
  std::uint64_t id = 0;         // unique for the process's life; add_device assigns it
  // Another client's allocation opened with cuIpcOpenMemHandle (ipc.cpp): closed with
  // cuIpcCloseMemHandle, never freed with cuMemFree.
  bool ipc_opened = false;
  // ... opened with cuMemPoolImportPointer (memory_pool_ipc.cpp): closed with cuMemFree or
  // cuMemFreeAsync, as the driver takes imported pool memory back.
  bool pool_import = false;
  bool module_global =
      false;  // a module's __device__ variable (cuModuleGetGlobal), not an allocation
};
struct PinnedRange {
  std::byte* base;
  std::uint64_t bytes;
  Context* ctx;
  proto::WireHandle region;
  std::uint64_t device_pointer;
  int memfd;
  unsigned flags;
  // cuMemAllocManaged memory (managed.cpp): the same shared, device-mapped pages, answered as
  // managed; `requested` is the size the program asked for (its range, as the driver reports it).
  bool managed = false;
  std::uint64_t requested = 0;
  // The same memory registered with other GPUs' servers, on its first copy on one of their
  // streams (under unified addressing pinned memory is every GPU's): their regions.
  struct Elsewhere {
    Session* session = nullptr;
    proto::WireHandle region = 0;
  };
  static constexpr std::size_t kElsewhere = 8;
  std::array<Elsewhere, kElsewhere> elsewhere{};
};
class AddressBook {
 public:
  void add_device(const DeviceRange& range);
  bool remove_device(std::uint64_t base, DeviceRange* removed);
  bool find_device(std::uint64_t address, DeviceRange* out) const;
  // Whether a device range other than the one at `except_base` overlaps [lo, hi): a block of
  // another GPU mapped for one allocation may hold others (peer.cpp).
  bool others_within(std::uint64_t lo, std::uint64_t hi, std::uint64_t except_base) const;
  // Every device range, copied (cuCtxEnablePeerAccess walks them).
  std::vector<DeviceRange> device_ranges() const;
  void add_pinned(const PinnedRange& range);
  bool remove_pinned(const void* base, PinnedRange* removed);
  bool find_pinned(const void* address, PinnedRange* out) const;
  bool find_pinned_by_device(std::uint64_t address, PinnedRange* out) const;
  // Records that the pinned range at `base` is `region` on `session` too; false when it is gone
  // or has no room left.
  bool add_pinned_elsewhere(const void* base, Session* session, proto::WireHandle region);

 private:
  mutable std::shared_mutex mutex_;
  std::map<std::uint64_t, DeviceRange> device_;
  std::uint64_t last_device_id_ = 0;  // under mutex_: the ids of CU_POINTER_ATTRIBUTE_BUFFER_ID
  std::map<std::uintptr_t, PinnedRange> pinned_;
};
AddressBook& address_book() noexcept;

}  // namespace mpsshim::shim
