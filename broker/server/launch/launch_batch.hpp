// Launch batching: a session's kernel launches that sit one after another in its ring, all for
// the same stream, go out as one cuGraphLaunch of a cached executable graph instead of one
// cuLaunchKernelEx each. The driver serializes cuLaunchKernel inside one process (~1.35 us each
// on an H100, whatever the number of threads); updating a node of an executable graph
// (cuGraphExecKernelNodeSetParams, ~0.4 us) does not serialize across threads, and one graph
// launch then issues every node. See docs/launch-batching.md.
//
// Only what is already in the ring is batched: the worker's drain pass (worker.cpp) flushes the
// batch when the ring is empty or the pass ends, dispatch_record flushes it before any other
// record, and op_launch_kernel before a launch that cannot join it. A batch shorter than the
// minimum goes out eagerly, as it would without batching.
//
// One per session, used only by the thread that owns the session.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "broker/server/driver/driver_table.hpp"
#include "broker/server/launch/kernel_params.hpp"
#include "proto/ops.hpp"

namespace mpsshim::server {

class Session;

struct LaunchBatchSettings {
  // Runs shorter than this go out eagerly (one cuLaunchKernelEx each): a graph launch of a
  // few nodes costs more than their eager launches. Measured on an H100 with PyTorch ResNet-50
  // b1, whose batches were mostly 2 launches long: 3.23 ms per iteration with 2, 2.65 ms with
  // batching off (mpsshim-server --launch-batch-min N).
  std::size_t min_launches = 8;
  // A batch that reaches this many launches goes out at once. 0 or 1: batching off
  // (mpsshim-server --launch-batch N, mpsshimd --launch-batching off, and per client
  // MPSSHIM_LAUNCH_BATCHING=off). Measured on an H100 (docs/benchmarks.md): 8 and 32 clients of
  // small kernels (a synchronize every 64 launches) went from 455 k / 503 k kernels/s eager to
  // 576 k / 1,369 k with 64.
  std::size_t max_launches = 64;
  // How a batch of at least the minimum goes out (mpsshim-server --launch-batch-graphs).
  //   kPadded: as one graph launch whatever its length: the cached graph of the next power of
  //     two, its nodes past the batch's end disabled (cuGraphNodeSetEnabled). A session needs at
  //     most log2(max) graphs per mix of CUkernels and CUfunctions, and the GPU runs the batch's
  //     kernels back to back. Measured on an H100 (driver 580): a disabled node costs the stream
  //     ~0.3 us and its toggle ~0.3 us of CPU (tools/probes/graph_tail_disabled.cpp); with 8
  //     clients the runs below left the stream idle 3.4 us per kernel in their eager tail and
  //     several us at each extra graph launch, 0.9 us between a graph's kernels; 8 clients of
  //     small kernels 643 k kernels/s in runs, 663 k padded (docs/launch-batching.md).
  //   kRuns: in runs of power-of-two lengths, longest first, each one graph launch; a run shorter
  //     than the minimum eagerly (42: 32 + 8, then 2 eager launches).
  //   kExact: one graph of the batch's exact length (a graph per length that occurs).
  enum class Graphs { kPadded, kRuns, kExact };
  Graphs graphs = Graphs::kPadded;
  // The cache of executable graphs, per session: at most this many graphs, and this many kernel
  // nodes in all of them; the least recently used graph goes first. The key is a run's length
  // and which of its nodes are CUkernels, not its functions (every launch of a graph sets each
  // node's function): with exact lengths, batches of every length up to 64 need 64 graphs (2080
  // nodes), which these bounds hold.
  std::size_t cache_graphs = 64;
  std::size_t cache_nodes = 4096;
  // A run of a key not cached goes out eagerly the first `eager_sightings` times its key is
  // seen; a graph is built for it only at the next. Instantiating a graph costs many eager
  // launches, so a shape that never comes back should not pay for one. 0: build at the first
  // sight.
  std::size_t eager_sightings = 1;
  // The ramp after an idle stream: the first launch after the stream was idle (everything the
  // client queued on it known done: it synchronized) goes out at once, and the batches after
  // it hold the minimum, then twice as many, up to this many; then the maximum. 0: no ramp,
  // every batch as large as the ring holds. Without it, a client that queues a burst right
  // after a synchronize kept the GPU idle while the whole burst collected and its nodes were
  // updated: small_kernels --gaps measured 31-63 us of idle stream at each synchronize of its
  // 64-launch runs, 13.6 us with this ramp, 10.5-11 us natively (H100; docs/launch-batching.md),
  // and 8 clients 659 k kernels/s against 624 k. While the GPU runs the first kernels the next
  // batch collects. A longer ramp (1, 8, 16, 32) did no better and costs more driver calls;
  // so does any ramp, hence a crowded server (Server::crowded: more clients than it lets spin)
  // does without: there the driver's launch lock, not one stream's idle time, limits
  // throughput (32 clients: 1.07 M kernels/s with a ramp on every client, 1.90 M without).
  // mpsshim-server --launch-batch-ramp N|on|off.
  std::size_t ramp_last = 8;
  // A graph node that holds a launch's function, context, shape and argument bytes already is
  // not updated (NodeState). mpsshim-server --launch-batch-keep-nodes on|off.
  bool keep_nodes = true;
  // At a session's first launch that may be batched, right after it went out, the padded
  // graphs of the minimum's and the maximum's lengths (8 and 64) are built for launches of its
  // kind (CUfunction or CUkernel), without waiting for eager_sightings: the ramp after an idle
  // stream asks for exactly these, and building them takes a client's first batches 0.6-0.8 ms
  // alone and 2.6-4.4 ms when 8 clients build at once (H200), which a program's first launch
  // (its warm-up, usually) hides better than its first burst. Graphs::kPadded only.
  // mpsshim-server --launch-batch-prepare on|off.
  bool prepare_graphs = true;

  bool enabled() const { return max_launches >= 2 && min_launches <= max_launches; }
};

// A launch that passed every check op_launch_kernel makes, waiting to go out.
struct BatchedLaunch {
  CUfunction function = nullptr;  // what cuLaunchKernelEx takes (a CUkernel cast to one)
  bool kernel = false;            // a CUkernel: its graph node runs in the client's green context
  std::uint32_t grid[3] = {};
  std::uint32_t block[3] = {};
  std::uint32_t shared_bytes = 0;
  std::uint32_t args_bytes = 0;  // the packed argument block's length
};

class LaunchBatcher {
 public:
  LaunchBatcher() = default;
  ~LaunchBatcher();
  LaunchBatcher(const LaunchBatcher&) = delete;
  LaunchBatcher& operator=(const LaunchBatcher&) = delete;

  // The server's settings; taken at every drain pass (cheap: a few words).
  void configure(const LaunchBatchSettings& settings) { settings_ = settings; }
  const LaunchBatchSettings& settings() const { return settings_; }

  // Whether a launch of `function` with this shape may wait in a batch: batching is on, the
  // function's own limits allow the shape (checked here so that a launch the driver would refuse
  // goes out eagerly and fails exactly as it does without batching), it needs no cluster and its
  // argument block covers every parameter.
  // A launch with attributes, a reply slot or during a capture never asks (op_launch_kernel).
  bool accepts(Session& session, const BatchedLaunch& launch);

  bool pending() const { return !pending_.empty(); }
  std::uint64_t stream() const { return stream_; }

  // Adds a launch for `stream_id` (the stream of any launch already pending). Copies the
  // arguments. `stream_was_idle`: nothing the client queued on the stream before this launch
  // is still running (the ramp starts again, ramp_last). Returns true when the batch is
  // full and must be flushed now.
  bool add(std::uint64_t stream_id, const BatchedLaunch& launch, std::span<const std::byte> args,
           bool stream_was_idle);

  // Issues what is pending, in runs (Graphs): a run below the minimum eagerly, else
  // as one graph launch, or eagerly if any step of its graph path fails. Errors are reported as
  // the eager launches report them (a one-way call's error waits in async_error). Returns a
  // sticky error (the caller raises the fault), else CUDA_SUCCESS.
  CUresult flush(Session& session);

  // Something a cached graph or a function's limits may depend on changed (a function's
  // attribute, an unloaded module or library, a destroyed context, a context limit): every
  // cached graph and limit is dropped. Nothing may be pending.
  void forget(const DriverTable& cu);
  // A function's attribute changed (cuFuncSetAttribute, ...): its limits are read again at its
  // next launch, the cached graphs stay, and each node is set again at its next launch (a node
  // may have taken the attributes its function had when it was set). Nothing may be pending.
  void forget_limits();

  // Session end: destroys every cached graph (the session's streams are idle) and logs what
  // batching did for the session.
  void release(Session& session);

  std::size_t cached_graphs() const { return cache_.size(); }

 private:
  struct Limits {
    int max_threads = 0;         // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
    int max_dynamic_shared = 0;  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    bool eager_only = false;     // needs a cluster, or its limits or parameters could not be read
    // A node takes its arguments as kernelParams, pointers into the launch's argument block
    // (kernel_params.hpp).
    ParamLayout layout;
  };
  // What a node was last given (cuGraphExecKernelNodeSetParams): a launch that would give it
  // the same function, context, shape and argument bytes again leaves it as it is. A loop that
  // launches the same kernels on the same buffers (small_kernels, an inference step on the
  // caching allocator's blocks) then costs one cuGraphLaunch per batch and no node updates.
  struct NodeState {
    bool known = false;
    BatchedLaunch launch;
    CUcontext context = nullptr;
    std::vector<std::byte> args;
  };
  // An executable graph whose kernel nodes form a chain; node i is a CUkernel's when kernels[i].
  // Every launch sets each enabled node's function, shape and arguments, unless set[i] says the
  // node holds them already. Nodes [0, enabled) are enabled, the rest disabled (Graphs::kPadded).
  struct Cached {
    std::uint64_t hash = 0;
    std::vector<bool> kernels;
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    std::vector<CUgraphNode> nodes;
    std::vector<NodeState> set;
    std::size_t enabled = 0;
    std::uint64_t last_used = 0;
  };

  // Launches pending_[first, first + count): one graph launch of `nodes` kernel nodes (the last
  // nodes - count disabled: Graphs::kPadded), or eager launches.
  struct Run {
    std::size_t first = 0;
    std::size_t count = 0;
    std::size_t nodes = 0;
  };

  const Limits& limits_of(Session& session, const BatchedLaunch& launch);
  // The next run of the pending launches from `first` on.
  Run next_run(std::size_t first) const;
  // Whether node k of the run's graph is a CUkernel's: its launch's, and a padded node the
  // last launch's (so a padded run of one kind finds the graph of that kind).
  bool node_kind(Run run, std::size_t k) const {
    return pending_[run.first + std::min(k, run.count - 1)].kernel;
  }
  // Enables the graph's first `count` nodes and disables the others, calling the driver only for
  // the nodes whose state changes. An error: the driver refused a change (`failed` says which);
  // the graph is then not trusted.
  CUresult set_enabled(const DriverTable& cu, Cached& entry, std::size_t count,
                       std::string& failed);
  std::uint64_t key_hash(Run run) const;
  Cached* find(std::uint64_t hash, Run run);
  bool seen_enough(std::uint64_t hash);
  bool refused(std::uint64_t hash) const;
  Cached* build(Session& session, std::uint64_t hash, Run run);
  void evict_for(const DriverTable& cu, std::size_t nodes);
  void drop(const DriverTable& cu, std::size_t index);  // destroys and removes cache_[index]
  void destroy(const DriverTable& cu, Cached& entry);
  // False when the run must go out eagerly instead (nothing of it was queued).
  bool launch_graph(Session& session, CUstream stream, Run run);
  CUresult issue_eagerly(Session& session, CUstream stream, Run run);
  const std::byte* args_of(std::size_t i) const { return args_.data() + offsets_[i]; }
  // The node parameters of pending_[i], its kernelParams pointing into args_ through
  // params_ (valid until the next call).
  CUDA_KERNEL_NODE_PARAMS node_params(const Session& session, std::size_t i);
  // Whether `node` already holds what pending_[i] would give it.
  bool holds(const NodeState& node, const Session& session, std::size_t i) const;
  void remember(NodeState& node, const Session& session, std::size_t i) const;

  // The most launches the batch may hold before it goes out: the ramp's step after an idle
  // stream (ramp_last), else the maximum.
  std::size_t limit() const;
  // Builds the graphs LaunchBatchSettings::prepare_graphs names for launches like pending_[0],
  // once per session.
  void prepare(Session& session);

  LaunchBatchSettings settings_;
  // The batch.
  std::uint64_t stream_ = 0;
  // The ramp's current limit: 1 for the launch that found its stream idle, then the minimum,
  // doubling at each flush; 0 once it reached the maximum (no ramp until the next idle stream).
  std::size_t ramp_ = 0;
  bool prepared_ = false;  // prepare() ran
  std::vector<BatchedLaunch> pending_;
  std::vector<std::size_t> offsets_;  // into args_, 16-byte aligned
  std::vector<std::byte> args_;
  // The cache.
  std::vector<Cached> cache_;
  std::size_t cached_nodes_ = 0;
  std::uint64_t clock_ = 0;
  std::unordered_map<CUfunction, Limits> limits_;
  std::vector<void*> params_;  // one node's kernelParams
  // Recent sequences seen without a graph, and sequences whose graph could not be built or
  // updated (never tried again until forget()): hashes, oldest overwritten.
  std::array<std::uint64_t, 64> seen_{};
  std::size_t seen_next_ = 0;
  std::array<std::uint64_t, 16> refused_{};
  std::size_t refused_next_ = 0;
  const DriverTable* cu_ = nullptr;  // the driver that made the cached graphs
};

// The session's batch flushed outside a record's handler (before another record, at the end of
// a drain pass); its driver time is added to LaunchKernel's server time in the session's stats.
CUresult flush_launches(Session& session);

// Whether `record` (a ring record in shared memory, header included) is a launch that would
// join the session's waiting batch: one for the batch's stream, while a batch waits. A hint for
// where a drain pass may end, read without copying; dispatch decides from a private copy.
bool continues_launch_batch(const Session& session, std::span<const std::byte> record);

}  // namespace mpsshim::server
