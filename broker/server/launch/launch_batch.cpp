#include "broker/server/launch/launch_batch.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "broker/server/base/answer_stamps.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/session/session.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

// The grid and block limits of every GPU CUDA 13 supports (compute capability 7.5 and later).
// A shape outside them goes out eagerly, where the driver refuses it as it always did.
constexpr std::uint32_t kMaxGridX = 2147483647u;
constexpr std::uint32_t kMaxGridYZ = 65535u;
constexpr std::uint32_t kMaxBlockXY = 1024u;
constexpr std::uint32_t kMaxBlockZ = 64u;

constexpr std::size_t kArgsAlign = 16;  // a kernel's parameter block may hold 16-byte members

// Whether the client's green context has fewer SMs than the device: an SM quota.
bool has_sm_quota(const Session& session) {
  return session.green.sm_count != 0 && session.green.sm_count < session.gpu().snapshot.sm_count;
}

}  // namespace

LaunchBatcher::~LaunchBatcher() {
  // Normally empty: free_everything released the cache at the session's end.
  if (cu_ != nullptr) forget(*cu_);
}

const LaunchBatcher::Limits& LaunchBatcher::limits_of(Session& session,
                                                      const BatchedLaunch& launch) {
  auto it = limits_.find(launch.function);
  if (it != limits_.end()) return it->second;
  // Read once per function (until forget()): a handful of driver calls, then a map lookup.
  const DriverTable& cu = session.cu();
  auto get = [&](CUfunction_attribute attribute, int* value) {
    if (launch.kernel) {
      return cu.cuKernelGetAttribute(value, attribute, reinterpret_cast<CUkernel>(launch.function),
                                     session.gpu().device);
    }
    return cu.cuFuncGetAttribute(value, attribute, launch.function);
  };
  Limits limits;
  int cluster_width = 0, cluster_must_be_set = 0;
  bool read = get(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &limits.max_threads) == CUDA_SUCCESS &&
              get(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, &limits.max_dynamic_shared) ==
                  CUDA_SUCCESS &&
              get(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH, &cluster_width) == CUDA_SUCCESS &&
              get(CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET, &cluster_must_be_set) == CUDA_SUCCESS;
  // The parameter layout, for the nodes' kernelParams.
  read =
      read && read_param_layout(cu, launch.function, launch.kernel, limits.layout) == CUDA_SUCCESS;
  // A function compiled for clusters launches with a cluster shape whose rules the eager path
  // leaves to the driver: it always goes eagerly.
  limits.eager_only = !read || cluster_width != 0 || cluster_must_be_set != 0;
  return limits_.emplace(launch.function, limits).first->second;
}

CUDA_KERNEL_NODE_PARAMS LaunchBatcher::node_params(const Session& session, std::size_t i) {
  const BatchedLaunch& l = pending_[i];
  CUDA_KERNEL_NODE_PARAMS p{};
  if (l.kernel) {
    // A CUkernel runs in the node's context: the client's green context, as for the client's
    // own hand-built kernel nodes (ops/graph.cpp).
    p.kern = reinterpret_cast<CUkernel>(l.function);
    p.ctx = session.green.context;
  } else {
    p.func = l.function;
  }
  p.gridDimX = l.grid[0];
  p.gridDimY = l.grid[1];
  p.gridDimZ = l.grid[2];
  p.blockDimX = l.block[0];
  p.blockDimY = l.block[1];
  p.blockDimZ = l.block[2];
  p.sharedMemBytes = l.shared_bytes;
  // One pointer per parameter into the launch's copy of its argument block (accepts() saw that
  // the block covers every parameter); the driver copies the values.
  p.kernelParams =
      point_at_params(limits_.at(l.function).layout, const_cast<std::byte*>(args_of(i)), params_);
  return p;
}

bool LaunchBatcher::holds(const NodeState& node, const Session& session, std::size_t i) const {
  const BatchedLaunch& l = pending_[i];
  const BatchedLaunch& n = node.launch;
  if (!node.known || n.function != l.function || n.kernel != l.kernel ||
      n.shared_bytes != l.shared_bytes || n.args_bytes != l.args_bytes ||
      !std::equal(std::begin(n.grid), std::end(n.grid), std::begin(l.grid)) ||
      !std::equal(std::begin(n.block), std::end(n.block), std::begin(l.block))) {
    return false;
  }
  if (l.kernel && node.context != session.green.context) return false;
  return std::memcmp(node.args.data(), args_of(i), l.args_bytes) == 0;
}

void LaunchBatcher::remember(NodeState& node, const Session& session, std::size_t i) const {
  const BatchedLaunch& l = pending_[i];
  node.known = true;
  node.launch = l;
  node.context = l.kernel ? session.green.context : nullptr;
  node.args.assign(args_of(i), args_of(i) + l.args_bytes);  // keeps its capacity
}

void LaunchBatcher::forget_limits() {
  limits_.clear();
  for (Cached& c : cache_) {
    for (NodeState& node : c.set) node.known = false;
  }
}

bool LaunchBatcher::accepts(Session& session, const BatchedLaunch& l) {
  if (!settings_.enabled()) return false;
  // A module's CUfunction runs in its own context when it is a graph node (cuda.h, the ctx
  // field of CUDA_KERNEL_NODE_PARAMS), and the server loads modules in its primary context:
  // under an SM quota that node could leave the client's green context. Until that is measured
  // on the GPU, such launches go eagerly; CUkernels name the green context in their nodes.
  if (!l.kernel && has_sm_quota(session)) return false;
  if (l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0 || l.grid[0] > kMaxGridX ||
      l.grid[1] > kMaxGridYZ || l.grid[2] > kMaxGridYZ) {
    return false;
  }
  if (l.block[0] == 0 || l.block[1] == 0 || l.block[2] == 0 || l.block[0] > kMaxBlockXY ||
      l.block[1] > kMaxBlockXY || l.block[2] > kMaxBlockZ) {
    return false;
  }
  const Limits& limits = limits_of(session, l);
  if (limits.eager_only) return false;
  if (l.args_bytes < limits.layout.bytes) return false;
  const std::uint64_t threads = std::uint64_t{l.block[0]} * l.block[1] * l.block[2];
  return threads <= static_cast<std::uint64_t>(std::max(limits.max_threads, 0)) &&
         l.shared_bytes <= static_cast<std::uint64_t>(std::max(limits.max_dynamic_shared, 0));
}

std::size_t LaunchBatcher::limit() const {
  return ramp_ != 0 ? std::min(ramp_, settings_.max_launches) : settings_.max_launches;
}

bool LaunchBatcher::add(std::uint64_t stream_id, const BatchedLaunch& launch,
                        std::span<const std::byte> args, bool stream_was_idle) {
  if (pending_.empty()) {
    stream_ = stream_id;
    args_.clear();
    if (stream_was_idle && settings_.ramp_last != 0) ramp_ = 1;
  }
  const std::size_t offset = (args_.size() + kArgsAlign - 1) / kArgsAlign * kArgsAlign;
  // Grows to the largest batch seen, then stays: no allocation per batch after that.
  args_.resize(offset + args.size());
  if (!args.empty()) std::memcpy(args_.data() + offset, args.data(), args.size());
  BatchedLaunch copy = launch;
  copy.args_bytes = static_cast<std::uint32_t>(args.size());
  pending_.push_back(copy);
  offsets_.push_back(offset);
  return pending_.size() >= limit();
}

LaunchBatcher::Run LaunchBatcher::next_run(std::size_t first) const {
  const std::size_t remaining = pending_.size() - first;
  std::size_t pow2 = 1;
  switch (settings_.graphs) {
    case LaunchBatchSettings::Graphs::kExact:
      return {first, remaining, remaining};
    case LaunchBatchSettings::Graphs::kPadded:
      while (pow2 < remaining) pow2 *= 2;
      return {first, remaining, pow2};
    case LaunchBatchSettings::Graphs::kRuns:
      break;
  }
  while (pow2 * 2 <= remaining) pow2 *= 2;
  return {first, pow2, pow2};
}

CUresult LaunchBatcher::flush(Session& session) {
  if (pending_.empty()) return CUDA_SUCCESS;
  CUresult sticky = CUDA_SUCCESS;
  const StreamObj* stream = session.objects.get<StreamObj>(stream_);
  if (stream == nullptr) {
    // Cannot happen: a stream is destroyed only by a record, and every record other than a
    // launch flushes the batch first. Reported as the eager launches would have been.
    session.post_async_error(CUDA_ERROR_INVALID_HANDLE);
  } else {
    // In runs, one after another on the stream: each a graph launch, or eager launches when it
    // is shorter than the minimum or its graph path fails.
    const std::size_t min = std::max<std::size_t>(settings_.min_launches, 2);
    for (std::size_t first = 0; first < pending_.size() && sticky == CUDA_SUCCESS;) {
      const Run run = next_run(first);
      if (run.count < min || !launch_graph(session, stream->stream, run)) {
        sticky = issue_eagerly(session, stream->stream, run);
      }
      first += run.count;
    }
    if (sticky == CUDA_SUCCESS && !prepared_) prepare(session);
  }
  pending_.clear();
  offsets_.clear();
  if (ramp_ != 0) {  // the next step of the ramp: the minimum, then twice the last
    const std::size_t min = std::max<std::size_t>(settings_.min_launches, 2);
    ramp_ = ramp_ < min ? min : 2 * ramp_;
    if (ramp_ > settings_.ramp_last || ramp_ >= settings_.max_launches) ramp_ = 0;
  }
  return sticky;
}

void LaunchBatcher::prepare(Session& session) {
  prepared_ = true;
  if (!settings_.prepare_graphs || settings_.graphs != LaunchBatchSettings::Graphs::kPadded) return;
  auto padded = [](std::size_t n) {
    std::size_t pow2 = 1;
    while (pow2 < n) pow2 *= 2;
    return pow2;
  };
  const std::size_t lengths[] = {padded(std::max<std::size_t>(settings_.min_launches, 2)),
                                 padded(settings_.max_launches)};
  for (std::size_t nodes : lengths) {
    // Every node of the graph gets pending_[0]'s launch (node_kind, build: the run's last).
    const Run run{0, 1, nodes};
    const std::uint64_t hash = key_hash(run);
    if (nodes > settings_.cache_nodes || settings_.cache_graphs == 0 || refused(hash) ||
        find(hash, run) != nullptr) {
      continue;
    }
    if (build(session, hash, run) == nullptr) return;  // logged; not tried again
  }
}

CUresult LaunchBatcher::issue_eagerly(Session& session, CUstream stream, Run run) {
  // Exactly what op_launch_kernel does for a launch without attributes, one by one.
  const DriverTable& cu = session.cu();
  for (std::size_t i = run.first; i < run.first + run.count; ++i) {
    const BatchedLaunch& l = pending_[i];
    std::size_t args_size = l.args_bytes;
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<std::byte*>(args_of(i)),
                     CU_LAUNCH_PARAM_BUFFER_SIZE, &args_size, CU_LAUNCH_PARAM_END};
    CUlaunchConfig config{};
    config.gridDimX = l.grid[0];
    config.gridDimY = l.grid[1];
    config.gridDimZ = l.grid[2];
    config.blockDimX = l.block[0];
    config.blockDimY = l.block[1];
    config.blockDimZ = l.block[2];
    config.sharedMemBytes = l.shared_bytes;
    config.hStream = stream;
    CUresult r =
        cu.cuLaunchKernelEx(&config, l.function, nullptr, args_size != 0 ? extra : nullptr);
    if (answer_stamps_on()) session.stamps.launch_issued_ns = SessionStats::now_ns();
    if (r == CUDA_SUCCESS) {
      ++session.launches;
    } else if (is_sticky(r, false)) {
      return r;  // the server fails every session; nothing later would run
    } else {
      session.post_async_error(r);
    }
  }
  return CUDA_SUCCESS;
}

bool LaunchBatcher::launch_graph(Session& session, CUstream stream, Run run) {
  const DriverTable& cu = session.cu();
  const std::uint64_t hash = key_hash(run);
  Cached* entry = find(hash, run);
  if (entry == nullptr) {
    // A run larger than the whole cache may hold never gets a graph.
    if (run.nodes > settings_.cache_nodes || settings_.cache_graphs == 0) return false;
    if (refused(hash) || !seen_enough(hash)) return false;
    entry = build(session, hash, run);
    if (entry == nullptr) {
      ++session.stats.batch_fallbacks;
      return false;
    }
  }
  entry->last_used = ++clock_;
  // Every node gets this run's shapes and arguments; the driver copies them, and a launch of the
  // graph already queued keeps the values it was launched with. With the client's green context
  // current, as when the graph was made: a CUfunction's node belongs to the context current
  // when it is set, and an update may not move it to another.
  CUresult r = CUDA_SUCCESS;
  std::size_t failed_node = run.count;  // which step failed: a node's update, else another
  std::string failed_step;
  {
    GreenCurrent green(session);
    // The padded nodes keep whatever they held: they are disabled.
    for (std::size_t k = 0; k < run.count && r == CUDA_SUCCESS; ++k) {
      NodeState& node = entry->set[k];
      if (settings_.keep_nodes && holds(node, session, run.first + k)) {
        ++session.stats.batch_nodes_kept;
        continue;
      }
      CUDA_KERNEL_NODE_PARAMS params = node_params(session, run.first + k);
      r = cu.cuGraphExecKernelNodeSetParams_v2(entry->exec, entry->nodes[k], &params);
      if (r == CUDA_SUCCESS) {
        remember(node, session, run.first + k);
      } else {
        node.known = false;  // a refused update may have changed it partly
        failed_node = k;
      }
    }
    if (r == CUDA_SUCCESS) r = set_enabled(cu, *entry, run.count, failed_step);
    if (r == CUDA_SUCCESS) {
      r = cu.cuGraphLaunch(entry->exec, stream);
      if (answer_stamps_on()) session.stamps.launch_issued_ns = SessionStats::now_ns();
      if (r != CUDA_SUCCESS) failed_step = "cuGraphLaunch";
    }
  }
  if (r == CUDA_SUCCESS) {
    session.launches += run.count;
    ++session.stats.batches;
    session.stats.batched += run.count;
    session.stats.batch_padding += run.nodes - run.count;
    return true;
  }
  // Nothing of this run ran (a failed update or launch queues nothing): it goes out eagerly,
  // where each launch fails or succeeds as it would have without batching. A node that would
  // not take a function (a node update may change the function only within limits: the same
  // context, no dynamic parallelism, ...) keeps that function out of batches from now on; a
  // graph that would not launch is not trusted again.
  // The first fallback of a session is worth an operator's eye: it says which driver answer
  // keeps batching from working (docs/launch-batching.md).
  const std::string step = failed_node < run.count
                               ? fmt::format("updating node {} of {}", failed_node, run.count)
                               : failed_step;
  if (session.stats.batch_fallbacks == 0) {
    log_warn("{}: a batch of {} launches went out eagerly: {} failed: {}", session.who(), run.count,
             step, describe(cu, r));
  } else {
    log_debug("{}: a batch of {} launches went out eagerly: {} failed: {}", session.who(),
              run.count, step, describe(cu, r));
  }
  ++session.stats.batch_fallbacks;
  if (failed_node < run.count) {
    limits_.at(pending_[run.first + failed_node].function).eager_only = true;
  } else {
    refused_[refused_next_++ % refused_.size()] = hash;
    drop(cu, static_cast<std::size_t>(entry - cache_.data()));
  }
  return false;
}

CUresult LaunchBatcher::set_enabled(const DriverTable& cu, Cached& entry, std::size_t count,
                                    std::string& failed) {
  // Only the nodes whose state changes: batch lengths move by a few launches between batches.
  for (; entry.enabled < count; ++entry.enabled) {
    if (CUresult r = cu.cuGraphNodeSetEnabled(entry.exec, entry.nodes[entry.enabled], 1);
        r != CUDA_SUCCESS) {
      failed = fmt::format("enabling node {} of {}", entry.enabled, entry.nodes.size());
      return r;
    }
  }
  for (; entry.enabled > count; --entry.enabled) {
    if (CUresult r = cu.cuGraphNodeSetEnabled(entry.exec, entry.nodes[entry.enabled - 1], 0);
        r != CUDA_SUCCESS) {
      failed = fmt::format("disabling node {} of {}", entry.enabled - 1, entry.nodes.size());
      return r;
    }
  }
  return CUDA_SUCCESS;
}

std::uint64_t LaunchBatcher::key_hash(Run run) const {
  // FNV-1a over the node count and each node's kind (CUkernel or CUfunction). Not the
  // functions: every update sets each node's function too.
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](std::uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(run.nodes);
  for (std::size_t k = 0; k < run.nodes; ++k) mix(node_kind(run, k) ? 1 : 0);
  return h;
}

LaunchBatcher::Cached* LaunchBatcher::find(std::uint64_t hash, Run run) {
  for (Cached& c : cache_) {
    if (c.hash != hash || c.kernels.size() != run.nodes) continue;
    bool same = true;
    for (std::size_t k = 0; k < run.nodes && same; ++k) same = c.kernels[k] == node_kind(run, k);
    if (same) return &c;
  }
  return nullptr;
}

bool LaunchBatcher::seen_enough(std::uint64_t hash) {
  const auto seen = static_cast<std::size_t>(std::count(seen_.begin(), seen_.end(), hash));
  if (seen >= settings_.eager_sightings) {
    std::replace(seen_.begin(), seen_.end(), hash, std::uint64_t{0});
    return true;
  }
  seen_[seen_next_++ % seen_.size()] = hash;
  return false;
}

bool LaunchBatcher::refused(std::uint64_t hash) const {
  return std::find(refused_.begin(), refused_.end(), hash) != refused_.end();
}

LaunchBatcher::Cached* LaunchBatcher::build(Session& session, std::uint64_t hash, Run run) {
  const DriverTable& cu = session.cu();
  struct Timed {  // every way out counts its time
    SessionStats& stats;
    std::uint64_t started = SessionStats::now_ns();
    ~Timed() { stats.batch_build_ns += SessionStats::now_ns() - started; }
  } timed{session.stats};
  evict_for(cu, run.nodes);
  Cached entry;
  entry.hash = hash;
  CUresult r = CUDA_SUCCESS;
  {
    GreenCurrent green(session);
    r = cu.cuGraphCreate(&entry.graph, 0);
    // A chain: node k depends on node k - 1, as launches on one stream are ordered. The
    // parameters are this run's; the graph's first launch sets them again (entry.set knows
    // nothing yet).
    // A padded node gets the run's last launch, so that it is a valid node of its kind; it is
    // disabled before any launch of the graph (set_enabled).
    for (std::size_t k = 0; k < run.nodes && r == CUDA_SUCCESS; ++k) {
      CUDA_KERNEL_NODE_PARAMS params = node_params(session, run.first + std::min(k, run.count - 1));
      CUgraphNode node = nullptr;
      r = cu.cuGraphAddKernelNode_v2(&node, entry.graph,
                                     entry.nodes.empty() ? nullptr : &entry.nodes.back(),
                                     entry.nodes.empty() ? 0 : 1, &params);
      if (r == CUDA_SUCCESS) entry.nodes.push_back(node);
    }
    if (r == CUDA_SUCCESS) r = cu.cuGraphInstantiateWithFlags(&entry.exec, entry.graph, 0);
  }
  if (r != CUDA_SUCCESS) {
    // The first failure of a session is worth an operator's eye (docs/launch-batching.md).
    if (session.stats.batch_fallbacks == 0) {
      log_warn("{}: no graph for a batch of {} launches, it goes out eagerly: {}", session.who(),
               run.count, describe(cu, r));
    } else {
      log_debug("{}: no graph for a batch of {} launches: {}", session.who(), run.count,
                describe(cu, r));
    }
    destroy(cu, entry);
    refused_[refused_next_++ % refused_.size()] = hash;
    return nullptr;
  }
  for (std::size_t k = 0; k < run.nodes; ++k) entry.kernels.push_back(node_kind(run, k));
  entry.set.resize(entry.nodes.size());
  entry.enabled = entry.nodes.size();
  cu_ = &cu;
  cached_nodes_ += entry.nodes.size();
  ++session.stats.batch_graphs;
  cache_.push_back(std::move(entry));
  return &cache_.back();
}

void LaunchBatcher::evict_for(const DriverTable& cu, std::size_t nodes) {
  while (!cache_.empty() && (cache_.size() >= settings_.cache_graphs ||
                             cached_nodes_ + nodes > settings_.cache_nodes)) {
    auto oldest = std::min_element(
        cache_.begin(), cache_.end(),
        [](const Cached& a, const Cached& b) { return a.last_used < b.last_used; });
    drop(cu, static_cast<std::size_t>(oldest - cache_.begin()));
  }
}

void LaunchBatcher::drop(const DriverTable& cu, std::size_t index) {
  cached_nodes_ -= std::min(cached_nodes_, cache_[index].nodes.size());
  destroy(cu, cache_[index]);
  cache_.erase(cache_.begin() + static_cast<std::ptrdiff_t>(index));
}

void LaunchBatcher::destroy(const DriverTable& cu, Cached& entry) {
  // An executable graph still queued on the GPU is freed by the driver once it completes
  // (cuGraphExecDestroy: "If the executable graph is in-flight, it will not be terminated, but
  // rather freed asynchronously on completion").
  if (entry.exec != nullptr) cu.cuGraphExecDestroy(entry.exec);
  if (entry.graph != nullptr) cu.cuGraphDestroy(entry.graph);
  entry.exec = nullptr;
  entry.graph = nullptr;
}

void LaunchBatcher::forget(const DriverTable& cu) {
  for (Cached& c : cache_) destroy(cu, c);
  cache_.clear();
  cached_nodes_ = 0;
  limits_.clear();
  seen_.fill(0);
  refused_.fill(0);
}

void LaunchBatcher::release(Session& session) {
  const SessionStats& stats = session.stats;
  if (stats.batches != 0 || stats.batch_fallbacks != 0) {
    log_info(
        "{}: {} launches went out in {} graph launches (mean batch {:.1f}, {} disabled nodes "
        "past their ends, {} nodes left as they were); {} graphs built in {:.1f} ms, {} batches "
        "issued eagerly after a failure",
        session.who(), stats.batched, stats.batches,
        stats.batches == 0
            ? 0.0
            : static_cast<double>(stats.batched) / static_cast<double>(stats.batches),
        stats.batch_padding, stats.batch_nodes_kept, stats.batch_graphs,
        static_cast<double>(stats.batch_build_ns) / 1e6, stats.batch_fallbacks);
  }
  forget(session.cu());
}

CUresult flush_launches(Session& session) {
  if (!session.launch_batch.pending()) return CUDA_SUCCESS;
  const std::uint64_t started = SessionStats::now_ns();
  CUresult r = session.launch_batch.flush(session);
  // The launches' driver time, outside any record's handler: it counts as LaunchKernel's server
  // time (the records themselves were counted when dispatched).
  session.stats.ops[static_cast<std::size_t>(proto::Op::kLaunchKernel)].handler_ns +=
      SessionStats::now_ns() - started;
  return r;
}

bool continues_launch_batch(const Session& session, std::span<const std::byte> record) {
  const LaunchBatcher& batch = session.launch_batch;
  if (!batch.pending() || record.size() < sizeof(proto::RecordHeader) + sizeof(proto::LaunchReq)) {
    return false;
  }
  proto::RecordHeader header;
  std::memcpy(&header, record.data(), sizeof header);
  if (header.opcode != static_cast<std::uint16_t>(proto::Op::kLaunchKernel)) return false;
  proto::LaunchReq req;
  std::memcpy(&req, record.data() + sizeof header, sizeof req);
  return req.stream == batch.stream();
}

}  // namespace mpsshim::server
