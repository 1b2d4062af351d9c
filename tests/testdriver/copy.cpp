// Asynchronous copies and memsets: validated when enqueued, run in stream order. Pageable host
// memory behaves as with the real driver: a host-to-device source is captured before the call
// returns, and a device-to-host copy into it completes before the call returns.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

std::uintptr_t addr_of(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

// The range's host view when the work runs; freed or unregistered meanwhile is a device fault.
std::byte* at_run(std::uintptr_t addr, std::size_t bytes) {
  std::byte* p = resolve_range(addr, bytes);
  if (p == nullptr) throw DeviceFault{CUDA_ERROR_ILLEGAL_ADDRESS};
  return p;
}

bool registered(State& s, const void* p, std::size_t bytes) {
  auto it = s.registrations.upper_bound(addr_of(p));
  if (it == s.registrations.begin()) return false;
  --it;
  return addr_of(p) + bytes <= it->first + it->second.size;
}

// Validates and enqueues a fill of `height` rows of `width` elements of type T, `pitch` apart.
template <class T>
CUresult memset2d(CUdeviceptr dst, std::size_t pitch, T value, std::size_t width,
                  std::size_t height, CUstream hstream) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (width == 0 || height == 0) return CUDA_SUCCESS;
    if (dst % sizeof(T) != 0 || pitch % sizeof(T) != 0) return CUDA_ERROR_INVALID_VALUE;
    if (width > SIZE_MAX / sizeof(T)) return CUDA_ERROR_INVALID_VALUE;
    const std::size_t row = width * sizeof(T);
    if (height > 1 && pitch < row) return CUDA_ERROR_INVALID_VALUE;
    if (height - 1 > (SIZE_MAX - row) / std::max<std::size_t>(pitch, 1))
      return CUDA_ERROR_INVALID_VALUE;
    const std::size_t extent = (height - 1) * pitch + row;
    if (resolve_range_locked(s, dst, extent) == nullptr) return CUDA_ERROR_INVALID_VALUE;
    submit_work(
        s, *stream,
        [=] {
          std::byte* base = at_run(dst, extent);
          // Aligned: dst and pitch are multiples of sizeof(T), and host views keep page offsets.
          for (std::size_t y = 0; y < height; ++y)
            std::fill_n(reinterpret_cast<T*>(base + y * pitch), width, value);
        },
        CU_GRAPH_NODE_TYPE_MEMSET);
    return CUDA_SUCCESS;
  });
}

}  // namespace
}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src,
                                                                size_t bytes, CUstream hstream) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (bytes == 0) return CUDA_SUCCESS;
    if (src == nullptr || resolve_range_locked(s, dst, bytes) == nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    if (registered(s, src, bytes)) {
      const std::uintptr_t from = addr_of(src);
      submit_work(
          s, *stream, [=] { std::memmove(at_run(dst, bytes), at_run(from, bytes), bytes); },
          CU_GRAPH_NODE_TYPE_MEMCPY);
    } else {
      // A pageable source cannot be captured: the graph would copy from memory it does not own.
      if (CUresult r = forbid_in_capture(s, *stream); r != CUDA_SUCCESS) return r;
      const auto* first = static_cast<const std::byte*>(src);
      auto staged = std::make_shared<std::vector<std::byte>>(first, first + bytes);
      submit_work(s, *stream, [=] { std::memcpy(at_run(dst, bytes), staged->data(), bytes); });
    }
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src,
                                                                size_t bytes, CUstream hstream) {
  return entry([&](State& s) {
    std::unique_lock lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (bytes == 0) return CUDA_SUCCESS;
    if (dst == nullptr || resolve_range_locked(s, src, bytes) == nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    if (registered(s, dst, bytes)) {
      const std::uintptr_t to = addr_of(dst);
      submit_work(
          s, *stream, [=] { std::memmove(at_run(to, bytes), at_run(src, bytes), bytes); },
          CU_GRAPH_NODE_TYPE_MEMCPY);
      return CUDA_SUCCESS;
    }
    if (CUresult r = forbid_in_capture(s, *stream); r != CUDA_SUCCESS) return r;
    const WorkQueue::Ticket ticket =
        submit_work(s, *stream, [=] { std::memcpy(dst, at_run(src, bytes), bytes); });
    std::shared_ptr<WorkQueue> queue = stream->queue;
    lock.unlock();
    queue->wait(ticket);
    return s.sticky.load();
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src,
                                                                size_t bytes, CUstream hstream) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Stream* stream = nullptr;
    if (CUresult r = resolve_stream(s, hstream, stream); r != CUDA_SUCCESS) return r;
    if (bytes == 0) return CUDA_SUCCESS;
    if (resolve_range_locked(s, dst, bytes) == nullptr ||
        resolve_range_locked(s, src, bytes) == nullptr)
      return CUDA_ERROR_INVALID_VALUE;
    submit_work(
        s, *stream, [=] { std::memmove(at_run(dst, bytes), at_run(src, bytes), bytes); },
        CU_GRAPH_NODE_TYPE_MEMCPY);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dst, unsigned char value,
                                                           size_t n, CUstream hstream) {
  return memset2d(dst, n, value, n, 1, hstream);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemsetD16Async(CUdeviceptr dst, unsigned short value,
                                                            size_t n, CUstream hstream) {
  return memset2d(dst, n * sizeof(value), value, n, 1, hstream);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int value,
                                                            size_t n, CUstream hstream) {
  return memset2d(dst, n * sizeof(value), value, n, 1, hstream);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemsetD2D8Async(CUdeviceptr dst, size_t pitch,
                                                             unsigned char value, size_t width,
                                                             size_t height, CUstream hstream) {
  return memset2d(dst, pitch, value, width, height, hstream);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemsetD2D16Async(CUdeviceptr dst, size_t pitch,
                                                              unsigned short value, size_t width,
                                                              size_t height, CUstream hstream) {
  return memset2d(dst, pitch, value, width, height, hstream);
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemsetD2D32Async(CUdeviceptr dst, size_t pitch,
                                                              unsigned int value, size_t width,
                                                              size_t height, CUstream hstream) {
  return memset2d(dst, pitch, value, width, height, hstream);
}
