#include <algorithm>

#include "broker/server/ops/call.hpp"
#include "broker/server/ops/dispatch.hpp"
#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/capture.hpp"
#include "broker/server/session/streams.hpp"
#include "common/log.hpp"

namespace mpsshim::server {

void note_not_owned(Call& call, std::string_view what) {
  Session& session = call.session;
  const bool first = !session.refusals_logged.not_owned;
  session.refusals_logged.not_owned = true;
  log_at(first ? LogLevel::kWarn : LogLevel::kDebug,
         "{} named {} in a {} record, which is not one of its own; refused{}", session.who(), what,
         op_name(call.op()), first ? " (later ones are logged at debug level)" : "");
}

bool owns_memory(Call& call, std::uint64_t p, std::uint64_t n) {
  if (call.session.memory.contains(p, n)) return true;
  note_not_owned(call, fmt::format("device memory {:#x}+{}", p, n));
  return false;
}

StreamObj* use_stream(Call& call, proto::WireHandle id, bool queues_work, CUresult* error) {
  StreamObj* stream = call.session.objects.get<StreamObj>(id);
  if (stream == nullptr) {
    note_not_owned(call, fmt::format("stream {:#x}", id));
    *error = CUDA_ERROR_INVALID_HANDLE;
    return nullptr;
  }
  if (call.session.active_captures != 0) {
    // A capturing stream is ordered by its capture alone (its legacy joins were made before the
    // capture began), and what it queues is not work the legacy stream must wait for.
    if (capturing(call.session, *stream)) {
      *error = CUDA_SUCCESS;
      return stream;
    }
    if (stream->is_default && blocking_stream_capturing(call.session, stream->ctx)) {
      *error = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
      return nullptr;
    }
  }
  // A look at the stream (query, synchronize, capture): what the client then sees must not
  // wait for an end event recorded later (busy_time.hpp).
  if (!queues_work) close_busy_span(call.session, stream->stream);
  if (CUresult r = order_before(call.session, *stream); r != CUDA_SUCCESS) {
    *error = r;
    return nullptr;
  }
  if (queues_work) {
    note_work(call.session, *stream);
    ++stream->queued;
  }
  *error = CUDA_SUCCESS;
  return stream;
}

OpResult finish_on_stream(Call& call, StreamObj& stream, CUresult issued) {
  if (issued != CUDA_SUCCESS || !call.reply_when_done()) return call.done(issued);
  // A synchronous call on a capturing stream: the real driver refuses it and invalidates.
  if (capturing(call.session, stream)) return call.done(refuse_in_capture(call.session, stream));
  Completion completion;
  completion.slot = call.header.reply_slot;
  completion.op = call.op();
  if (CUresult r = call.session.complete_after(stream.stream, std::move(completion));
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return call.deferred();
}

CUresult resolve_function(Call& call, proto::WireHandle id, bool for_occupancy, CUfunction* out) {
  if (FunctionObj* f = call.session.objects.get<FunctionObj>(id)) {
    *out = f->function;
    return CUDA_SUCCESS;
  }
  KernelObj* k = call.session.objects.get<KernelObj>(id);
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (!for_occupancy) {
    *out = reinterpret_cast<CUfunction>(k->kernel);
    return CUDA_SUCCESS;
  }
  if (k->function == nullptr) {
    if (CUresult r = call.cu.cuKernelGetFunction(&k->function, k->kernel); r != CUDA_SUCCESS) {
      return r;
    }
  }
  *out = k->function;
  return CUDA_SUCCESS;
}

int effective_priority(const Session& session, int asked) {
  const proto::DeviceSnapshot& snap = session.gpu().snapshot;
  // Lower numbers are higher priorities: greatest <= least.
  int greatest = std::min(snap.stream_priority_greatest, snap.stream_priority_least);
  int least = std::max(snap.stream_priority_greatest, snap.stream_priority_least);
  long biased = static_cast<long>(std::clamp(asked, greatest, least)) + session.priority_bias -
                session.priority_boost;
  return static_cast<int>(std::clamp<long>(biased, greatest, least));
}

OpResult refuse_over_limit(Call& call, std::uint64_t asked, std::string_view what,
                           MemoryLimitHit hit) {
  const Session& s = call.session;
  if (hit == MemoryLimitHit::kAllocation) {
    const AllocationAccount& shared = *s.charge.allocation();
    log_warn(
        "{} asked for {} of {}; its allocation {} shares a limit of {} among all its clients on "
        "this GPU, which already use {} (set by the Kubernetes device plugin's sharing config; "
        "mpsshimctl list_allocations)",
        s.who(), format_bytes(asked), what, shared.id(), format_bytes(shared.limit()),
        format_bytes(shared.used()));
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  const char* source =
      s.charge.limit_source() == LimitSource::kOperator
          ? "set by the operator with mpsshimctl set_device_pinned_mem_limit; raise it the same "
            "way"
      : s.charge.limit_source() == LimitSource::kClient
          ? "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; raise it in the client's environment"
          : "the server's default; the operator changes it with mpsshimctl "
            "set_default_device_pinned_mem_limit, or for this client with mpsshimctl "
            "set_device_pinned_mem_limit";
  log_warn("{} asked for {} of {}; its limit is {} ({}) and it already uses {}", s.who(),
           format_bytes(asked), what, format_bytes(s.charge.limit()), source,
           format_bytes(s.charge.used()));
  return call.done(CUDA_ERROR_OUT_OF_MEMORY);
}

}  // namespace mpsshim::server
