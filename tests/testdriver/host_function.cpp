// Host functions and stream callbacks: run on the stream's own thread, in stream order, so the
// work after one waits until it returns, as on the device. Nothing is ever captured here.
#include "tests/testdriver/state.hpp"

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLaunchHostFunc(CUstream hstream, CUhostFn fn,
                                                            void* userData) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    stream->queue->submit([fn, userData] { fn(userData); });
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamAddCallback(CUstream hstream,
                                                               CUstreamCallback callback,
                                                               void* userData, unsigned int flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    // The callback gets the stream as the caller named it and the device's error, if any.
    stream->queue->submit(
        [&s, callback, hstream, userData] { callback(hstream, s.sticky.load(), userData); });
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuStreamIsCapturing(CUstream hstream,
                                                               CUstreamCaptureStatus* status) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  });
}
