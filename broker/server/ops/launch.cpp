#include <cstring>

#include "broker/server/base/answer_stamps.hpp"
#include "broker/server/launch/launch_batch.hpp"
#include "broker/server/ops/launch_attributes.hpp"
#include "broker/server/ops/ops.hpp"
#include "broker/server/session/busy_time.hpp"

namespace mpsshim::server {
namespace {

// A function or kernel handle as cuLaunchKernelEx takes it (as resolve_function gives it), and
// whether it is a CUkernel (a batched launch's graph node names the context a CUkernel runs in).
CUresult resolve_launch_function(Call& call, proto::WireHandle id, CUfunction* out, bool* kernel) {
  if (const FunctionObj* f = call.session.objects.get<FunctionObj>(id)) {
    *out = f->function;
    *kernel = false;
    return CUDA_SUCCESS;
  }
  if (const KernelObj* k = call.session.objects.get<KernelObj>(id)) {
    *out = reinterpret_cast<CUfunction>(k->kernel);
    *kernel = true;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_HANDLE;
}

}  // namespace

OpResult op_launch_kernel(Call& call) {
  auto req = call.request<proto::LaunchReq>();
  const std::uint64_t attribute_bytes =
      std::uint64_t{req.attribute_count} * sizeof(proto::WireLaunchAttribute);
  if (req.attribute_count > proto::kMaxLaunchAttributes || req.args_bytes > proto::kMaxArgsBytes ||
      !call.exact(sizeof req, attribute_bytes + req.args_bytes)) {
    return call.malformed(
        fmt::format("a launch states {} attributes and {} argument bytes that the "
                    "record does not hold",
                    req.attribute_count, req.args_bytes));
  }
  Session& session = call.session;
  if (answer_stamps_on()) session.stamps.launch_taken_ns = session.stamps.record_taken_ns;
  LaunchBatcher& batch = session.launch_batch;
  // Whether this launch may join the session's batch (launch_batch.hpp): batching is on, and
  // nothing about the launch needs more than a kernel node of a chain launched into the stream
  // gives. Launch attributes (cooperative, clusters, priority, ...) are not carried by a node
  // update; a reply slot wants an answer after this very launch; during a capture the launch
  // belongs in the client's graph.
  const bool may_join = batch.settings().enabled() && !call.has_reply_slot() &&
                        req.attribute_count == 0 && session.active_captures == 0;
  // Anything this launch does on the driver (its legacy-stream joins, the launch itself, the
  // error it reports) comes after the launches already waiting. A launch for another stream
  // sends them out and may start a batch of its own. (Flushed here, their driver time counts
  // in this record's handler time.)
  auto flush_first = [&] { return batch.pending() ? batch.flush(session) : CUDA_SUCCESS; };
  if (!may_join || (batch.pending() && batch.stream() != req.stream)) {
    if (CUresult r = flush_first(); r != CUDA_SUCCESS) return call.done(r);
  }

  CUfunction function = nullptr;
  bool kernel = false;
  if (CUresult r = resolve_launch_function(call, req.function, &function, &kernel);
      r != CUDA_SUCCESS) {
    if (CUresult f = flush_first(); f != CUDA_SUCCESS) return call.done(f);
    return call.done(r);
  }
  CUlaunchAttribute attributes[proto::kMaxLaunchAttributes];
  if (CUresult r = convert_launch_attributes(session, call.trailing(sizeof req, attribute_bytes),
                                             req.attribute_count, attributes);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  std::span<const std::byte> wire_args =
      call.trailing(sizeof req + attribute_bytes, req.args_bytes);

  if (may_join) {
    BatchedLaunch launch;
    launch.function = function;
    launch.kernel = kernel;
    std::memcpy(launch.grid, req.grid, sizeof launch.grid);
    std::memcpy(launch.block, req.block, sizeof launch.block);
    launch.shared_bytes = req.shared_bytes;
    launch.args_bytes = req.args_bytes;
    const StreamObj* known = session.objects.get<StreamObj>(req.stream);
    // A batch's graph runs in the quota's green context: a stream of the client's own green
    // context (StreamObj::in_client_green) launches eagerly, on its own SMs.
    if (known == nullptr || known->in_client_green || !batch.accepts(session, launch)) {
      // Goes out eagerly below, after the batch.
      if (CUresult f = flush_first(); f != CUDA_SUCCESS) return call.done(f);
    } else {
      // Before use_stream counts this launch as queued on it.
      const bool stream_was_idle = known->idle();
      CUresult error = CUDA_SUCCESS;
      // Legacy-stream joins are made now, before the batch's first launch; later launches of
      // the batch are on the same stream with nothing between them and need none.
      StreamObj* stream = use_stream(call, req.stream, true, &error);
      if (stream == nullptr) {
        if (CUresult f = flush_first(); f != CUDA_SUCCESS) return call.done(f);
        return call.done(error);
      }
      open_busy_span(session, stream->stream);
      // Counted in session.launches once it went out; errors reported by flush as the eager
      // launch reports them.
      if (batch.add(req.stream, launch, wire_args, stream_was_idle)) {
        return call.done(batch.flush(session));
      }
      return call.done();
    }
  }

  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  open_busy_span(session, stream->stream);

  // The arguments sit after the attributes at an 8-byte boundary; the driver reads them as
  // the kernel's parameter block, whose members may need 16-byte alignment.
  alignas(16) std::byte args[proto::kMaxArgsBytes];
  std::size_t args_size = req.args_bytes;
  if (args_size != 0) std::memcpy(args, wire_args.data(), args_size);
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args, CU_LAUNCH_PARAM_BUFFER_SIZE, &args_size,
                   CU_LAUNCH_PARAM_END};

  CUlaunchConfig config{};
  config.gridDimX = req.grid[0];
  config.gridDimY = req.grid[1];
  config.gridDimZ = req.grid[2];
  config.blockDimX = req.block[0];
  config.blockDimY = req.block[1];
  config.blockDimZ = req.block[2];
  config.sharedMemBytes = req.shared_bytes;
  config.hStream = stream->stream;
  config.attrs = attributes;
  config.numAttrs = req.attribute_count;
  CUresult r =
      call.cu.cuLaunchKernelEx(&config, function, nullptr, args_size != 0 ? extra : nullptr);
  if (answer_stamps_on()) session.stamps.launch_issued_ns = SessionStats::now_ns();
  if (r == CUDA_SUCCESS) ++session.launches;
  return finish_on_stream(call, *stream, r);
}

}  // namespace mpsshim::server
