// Host functions and stream callbacks: run on the stream's own thread, in stream order, so the
// work after one waits until it returns, as on the device. On a capturing stream they become host
// nodes that run again at every replay.
#include "tests/testdriver/state.hpp"

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLaunchHostFunc(CUstream hstream, CUhostFn fn,
                                                            void* userData) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (stream->capture) {
      capture_node(s, *stream, CU_GRAPH_NODE_TYPE_HOST, [fn, userData] { fn(userData); });
    } else {
      stream->queue->submit([fn, userData] { fn(userData); });
    }
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
