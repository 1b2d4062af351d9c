// One client's session: who it is, its socket, segment and ring, its green context and quota,
// the objects it made, what it is waiting for. Owned by the worker it was placed on: only that
// thread touches it (docs/architecture.md, "Threads of mpsshim-server"). Its concerns are parts
// of their own: the memory charge (memory_charge.hpp), interprocess memory, fences, busy time,
// live quota changes, the reserve's retries, stamps, logged refusals and the operator's
// suspension (session_parts.hpp).
#pragma once

#include <cuda.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tl/expected.hpp>

#include "broker/server/accounting/allocation_account.hpp"
#include "broker/server/accounting/client_limits.hpp"
#include "broker/server/accounting/client_usage.hpp"
#include "broker/server/accounting/session_stats.hpp"
#include "broker/server/driver/gpu.hpp"
#include "broker/server/driver/host_fences.hpp"
#include "broker/server/driver/shared_segment.hpp"
#include "broker/server/launch/launch_batch.hpp"
#include "broker/server/scheduling/green_context.hpp"
#include "broker/server/scheduling/green_context_pool.hpp"
#include "broker/server/scheduling/memory_arbiter.hpp"
#include "broker/server/scheduling/priority_gate.hpp"
#include "broker/server/scheduling/priority_reserve.hpp"
#include "broker/server/session/allocation_map.hpp"
#include "broker/server/session/client_green.hpp"
#include "broker/server/session/ipc_registry.hpp"
#include "broker/server/session/memory_charge.hpp"
#include "broker/server/session/objects.hpp"
#include "broker/server/session/session_parts.hpp"
#include "broker/server/session/virtual_memory.hpp"
#include "proto/control.hpp"
#include "proto/ops.hpp"
#include "proto/ring.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::server {

class HostCallbackChannel;

struct ClientInfo {
  std::uint32_t id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string program;
};

// GPU work a reply, a staging chunk or a deferred free waits for. Done when every event has
// completed; the first error is the result.
struct Completion {
  enum class Owner : std::uint8_t {
    kPool,    // a server event: back to the session's pool afterwards
    kClient,  // the client's own event (EventSynchronize): left alone
    kDestroy  // the client destroyed its event while this waited: destroyed afterwards
  };
  struct Wait {
    CUevent event;
    Owner owner;
    // Written by the GPU just before `event` (host_fences.hpp): the wait is over when the word
    // holds it; the event is then queried only to learn of a fault.
    HostFence fence{};
    // The client stream fenced and its StreamObj::queued then: completed, the stream is known
    // idle up to there (0: not tracked).
    std::uint64_t stream_id = 0;
    std::uint64_t stream_queued = 0;
  };
  std::vector<Wait> waits;
  std::size_t done = 0;  // waits[0, done) have completed
  std::uint32_t slot = proto::kNoReply;
  std::uint32_t chunk = kNoChunk;
  std::uint32_t generation = 0;
  CUresult result = CUDA_SUCCESS;
  proto::Op op = proto::Op::kPad;
  std::uint64_t taken_ns = 0;  // its request left the ring (answer_stamps.hpp; 0 when off)
  // Keeps what the waits name alive until the completion is gone (an interprocess event
  // another client may destroy meanwhile).
  std::shared_ptr<const void> keep_alive;
  // A wait on a host fence asks the driver (its event) no earlier than this, ever less often
  // (fault_check_after: `fault_checks` so far); so does a wait without one, every
  // Session::fences.event_poll.
  std::chrono::steady_clock::time_point next_fault_check{};
  std::uint32_t fault_checks = 0;

  static constexpr std::uint32_t kNoChunk = 0xffffffffu;
};

// Objects the client let go of that the GPU may still be using: freed once the fences (events
// recorded on every stream of the client at the time) have completed, so freeing never blocks
// the server on the client's queued work.
struct Retired {
  std::vector<CUevent> fences;
  std::size_t fences_done = 0;
  std::vector<CUmodule> modules;
  std::vector<CUlibrary> libraries;
  // Shared libraries (image_cache.hpp): dropping the last reference unloads.
  std::vector<std::shared_ptr<SharedLibrary>> shared_libraries;
  std::vector<DeviceRange> allocations;
  std::vector<HostRegionObj> regions;
  std::vector<TexObj> textures;  // destroyed before the arrays they may sample
  std::vector<CUarray> arrays;
  std::vector<CUmipmappedArray> mipmaps;  // after their levels' textures, like arrays
  std::vector<CUgraphExec> graph_execs;
  std::vector<PeerBlock> peer_blocks;  // another GPU's memory this server mapped (ops/peer.cpp)
  // Green contexts of the client's own (cuGreenCtxDestroy): after their streams' work, and
  // the streams cuCtxRecordEvent recorded from in them (ContextObj::record_stream), fenced too.
  std::vector<CUgreenCtx> green_contexts;
  std::vector<CUstream> record_streams;
};

// A memfd the client sent on its socket, waiting for the ring record that names its token.
struct StashedFd {
  proto::MessageKind kind;
  std::uint64_t bytes;
  proto::UniqueFd fd;
};

// Counts for the disconnect log line.
struct FreedTally {
  std::size_t allocations = 0;
  std::uint64_t allocation_bytes = 0;
  std::size_t modules = 0;
  std::size_t libraries = 0;
  std::size_t streams = 0;
  std::size_t events = 0;
  std::size_t regions = 0;
  std::size_t arrays = 0;
  std::size_t textures = 0;
  std::size_t graphs = 0;
  std::size_t physical_allocations = 0;  // cuMemCreate'd, released at the end
  std::uint64_t physical_bytes = 0;
  std::size_t mappings = 0;
  std::size_t reservations = 0;
};

class Session {
 public:
  // `green_pool` and `ipc` are the server's; they outlive every session.
  Session(const Gpu& gpu, GreenContextPool& green_pool, IpcRegistry& ipc, ClientInfo client);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const Gpu& gpu() const { return *gpu_; }
  const DriverTable& cu() const { return *gpu_->cu; }
  // Where its green contexts come from and go back to (green_context_pool.hpp).
  GreenContextPool& green_pool() const { return *green_pool_; }
  // The server's interprocess handles (ipc_registry.hpp), shared with its other sessions.
  IpcRegistry& ipc() const { return *ipc_; }
  // The server's shared libraries (image_cache.hpp); null: every image loaded for this session.
  ImageCache* image_cache() const { return images_; }
  void set_image_cache(ImageCache* images) { images_ = images; }

  // "client 3 (pid 4123, vector_add)"
  std::string who() const;

  // ---- answering the client -----------------------------------------------------------
  proto::SessionControl* control() const { return segment.view().control(); }
  // Writes the reply, publishes kSlotReady and wakes a sleeping waiter.
  // taken_ns / known_ns: when the request left the ring and when its answer was known
  // (answer_stamps.hpp; 0: now).
  void answer(std::uint32_t slot, CUresult result, std::span<const std::byte> payload = {},
              std::uint64_t taken_ns = 0, std::uint64_t known_ns = 0);
  // Stores the copy's result, then publishes the chunk's generation and wakes a waiter.
  void finish_chunk(std::uint32_t chunk, std::uint32_t generation, CUresult result);
  // A one-way call failed: the first such error waits for the client's next synchronizing call.
  void post_async_error(CUresult result);
  // Wakes everyone who might sleep on this segment (fault, termination).
  void wake_everyone();

  // ---- events --------------------------------------------------------------------------
  // An event in the client's green context: cuda.h asks events to share their stream's context
  // (an H200's driver 580 does not enforce it between green contexts of one device:
  // tools/probes/green_nested.cu; the server keeps to the documented rule).
  tl::expected<CUevent, CUresult> create_event(unsigned flags);
  // A timing-free server event from the pool.
  tl::expected<CUevent, CUresult> acquire_event();
  void release_event(CUevent event);
  // An event of a green context the client had before a live SM quota change
  // (sm_quota_change.hpp) is destroyed, not pooled: true when `event` was one.
  bool destroy_if_stale(CUevent event);

  // ---- completions ---------------------------------------------------------------------
  // Records a pool event on `stream` and queues `completion` to fire when it completes.
  CUresult complete_after(CUstream stream, Completion completion);
  // The same for the client's stream `id`, which it then knows idle up to now.
  CUresult complete_after(std::uint64_t id, StreamObj& stream, Completion completion);
  // Adds a wait for the work queued on `stream` so far to `completion`: a host fence (when
  // the session uses them and `host_fence`) and a pool event recorded after it; `id`, if not
  // 0, is the client stream's, `queued` its StreamObj::queued now.
  CUresult fence_into(Completion& completion, CUstream stream, bool host_fence = true,
                      std::uint64_t id = 0, std::uint64_t queued = 0);
  // Fences the client's stream `id` into `completion`, with a host fence unless more work than
  // fences.max_queued is queued on it.
  CUresult fence_stream_into(Completion& completion, std::uint64_t id, StreamObj& stream);
  // Queues `completion` with what it already waits for (answered at the next poll, after the
  // session's earlier completions).
  void complete_queued(Completion completion);
  // Events recorded now on every live stream of the client.
  tl::expected<std::vector<CUevent>, CUresult> fence_all_streams();
  std::size_t pending_gpu_work() const {
    return pending.size() + retiring.size() + busy.closed.size();
  }

  // The client destroyed one of its events: destroyed now, or when the completion that still
  // waits on it fires.
  void destroy_client_event(CUevent event);

  // ---- identity and settings ---------------------------------------------------------------
  ClientInfo client;
  Lifecycle life;  // active or draining, and why it ends (session_parts.hpp)
  // Suspended by the operator or a memory policy: its ring is not read, its memory parked
  // (suspension.hpp).
  Suspension suspension;
  // A cuMemAlloc waiting for a memory policy (session_parts.hpp), and the server's arbiter
  // where a policy is on (else null: an allocation that does not fit fails at once).
  MemoryWait memory_wait;
  MemoryArbiter* memory_arbiter = nullptr;

  proto::UniqueFd socket;
  proto::UniqueFd doorbell;
  SharedSegment segment;
  proto::RingConsumer ring;
  GreenContext green;
  QuotaChanges quota_changes;  // live SM quota changes (session_parts.hpp)
  // The SM resources and descriptors for green contexts of the client's own (client_green.hpp).
  ClientGreen client_green;
  bool staging_registered = false;
  // Host functions run in the client (host_callbacks.hpp); shared with queued host functions.
  std::shared_ptr<HostCallbackChannel> callbacks;

  MemoryCharge charge;    // device memory charged to it and its allocation (memory_charge.hpp)
  int priority_bias = 0;  // added to every stream priority the client asks for
  SmShare sm;             // its SMs: share, placement, the reserve (session_parts.hpp)

  ObjectTable objects;
  AllocationMap memory;
  IpcHoldings ipc_memory;  // what it exported and opened (session_parts.hpp)
  VirtualMemory vmm;       // address reservations and mappings (virtual_memory.hpp)
  // The driver hands out the same CUfunction/CUkernel/CUmodule again for the same name: one id.
  std::unordered_map<void*, std::uint64_t> ids_by_driver_handle;
  std::map<std::uint32_t, StashedFd> stash;

  std::vector<Completion> pending;
  std::vector<Retired> retiring;
  std::vector<CUevent> event_pool;
  FencePolicy fences;  // host-fence words and when to use them (session_parts.hpp)
  // Captures begun and not yet ended: while 0, no stream of the client is capturing and nothing
  // asks the driver. fence_stream stands in for capturing streams in fence_all_streams.
  std::uint32_t active_captures = 0;
  CUstream fence_stream = nullptr;
  std::vector<std::uint8_t> slot_busy;  // a deferred answer is owed on this slot

  std::uint64_t launches = 0;
  std::uint64_t records = 0;
  RecordStamps stamps;  // session_parts.hpp
  ClientUsage usage;    // busy time, bytes copied, pinned memory (mpsshimctl ps)
  BusySpans busy;       // GPU busy time (session_parts.hpp, busy_time.hpp)
  SessionStats stats;   // server time per opcode, ring delays (mpsshimctl stats)
  // Consecutive launches waiting to go out as one graph launch, and the session's cache of
  // executable graphs (launch_batch.hpp). Empty between drain passes.
  LaunchBatcher launch_batch;
  // False when the client asked for its launches to go out one by one (MPSSHIM_LAUNCH_BATCHING=off
  // in its environment: kHelloNoLaunchBatching).
  bool launch_batching = true;
  // Its client rings a dozing worker only for records it waits on (proto::kAbiMinorDoze);
  // an older one rings for every record, which ends every doze at once.
  bool rings_when_awaited = false;
  // Its per-client caps (ServerSettings::client_limits, copied at admission; limit_check.hpp).
  ClientLimits limits;
  RefusalsLogged refusals_logged;  // session_parts.hpp
  // Its class (CUDA_MPS_CLIENT_PRIORITY), whether it holds back others or is held back, and
  // the fences after its last passes (priority_gate.hpp).
  PriorityState priority;
  // Steps its streams rank above what they ask: 1 for a normal client while priority
  // scheduling is on (priority_gate.hpp), else 0.
  int priority_boost = 0;

 private:
  const Gpu* gpu_;
  GreenContextPool* green_pool_;
  IpcRegistry* ipc_;
  ImageCache* images_ = nullptr;
};

// The client's green context current for a call that takes the current context (graph
// creation, instantiation, node creation), the primary context again afterwards, as everywhere
// else in the server.
class GreenCurrent {
 public:
  explicit GreenCurrent(Session& session) : session_(session) {
    session.cu().cuCtxSetCurrent(session.green.context);
  }
  ~GreenCurrent() { session_.cu().cuCtxSetCurrent(session_.gpu().primary); }
  GreenCurrent(const GreenCurrent&) = delete;
  GreenCurrent& operator=(const GreenCurrent&) = delete;

 private:
  Session& session_;
};

}  // namespace mpsshim::server
