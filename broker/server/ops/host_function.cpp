// cuLaunchHostFunc / cuStreamAddCallback: a server host function on the client's real stream
// that has the client run its callback (host_callbacks.hpp).
#include <memory>

#include "broker/server/ops/ops.hpp"
#include "broker/server/session/busy_time.hpp"
#include "broker/server/session/host_callbacks.hpp"
#include "broker/server/session/limit_check.hpp"

namespace mpsshim::server {

OpResult op_host_func(Call& call) {
  auto req = call.request<proto::HostFuncReq>();
  Session& session = call.session;
  if (req.callback_id == 0) return call.malformed("sent a host function without a callback id");
  if (req.kind != proto::HostFuncKind::kLaunchHostFunc &&
      req.kind != proto::HostFuncKind::kStreamAddCallback) {
    return call.malformed(fmt::format("sent a host function of unknown kind {}",
                                      static_cast<std::uint32_t>(req.kind)));
  }
  if (!session.callbacks) return call.done(CUDA_ERROR_NOT_SUPPORTED);
  if (!within_client_limit(session, ClientLimit::kHostFunctions,
                           held_of(session, ClientLimit::kHostFunctions))) {
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);
  close_busy_span(session, stream->stream);  // the stream waits for the client: not busy time
  // Captured into a graph, the driver runs it at every replay: the call must stay.
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (call.cu.cuStreamIsCapturing(stream->stream, &capture) != CUDA_SUCCESS) {
    capture = CU_STREAM_CAPTURE_STATUS_NONE;
  }
  // Read before the launch: once the driver has it, a one-shot call may run and free itself
  // on the driver's thread before cuLaunchHostFunc returns.
  const bool one_shot = capture == CU_STREAM_CAPTURE_STATUS_NONE;
  auto host_call = std::make_unique<HostCallbackChannel::Call>();
  host_call->channel = session.callbacks;
  host_call->callback_id = req.callback_id;
  host_call->one_shot = one_shot;
  // Counted before the driver has it: its callback thread may run it and count it off at once.
  if (one_shot) session.callbacks->queued();
  CUresult r =
      req.kind == proto::HostFuncKind::kLaunchHostFunc
          ? call.cu.cuLaunchHostFunc(stream->stream, run_host_function, host_call.get())
          : call.cu.cuStreamAddCallback(stream->stream, run_stream_callback, host_call.get(), 0);
  if (r == CUDA_SUCCESS) {
    if (one_shot) {
      host_call.release();  // the driver's callback owns it now and frees it after running it
    } else {
      session.callbacks->keep(std::move(host_call));
    }
  } else if (one_shot) {
    session.callbacks->ran_one_shot();  // never queued
  }
  return finish_on_stream(call, *stream, r);
}

}  // namespace mpsshim::server
