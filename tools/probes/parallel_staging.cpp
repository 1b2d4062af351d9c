// Black-box probe of the host and the real driver: does splitting each staged piece of a pageable
// copy among several CPU threads make it faster? A pageable copy through the shim moves every byte
// through the CPU once (into or out of a registered staging chunk), and one core's copy bandwidth
// is far below PCIe's on a server CPU: the shim's pageable copies run at native speed only
// because the driver's own staging has the same limit. Prints native pageable cuMemcpyHtoD /
// cuMemcpyDtoH, then the staged pipeline (H2D: 2 MiB chunks, 8 in flight; D2H: pieces of
// 512 KiB / 2 MiB, 4 in flight) with 1-4 threads copying each piece, in GB/s, median of 7.
//
// Build and run on the GPU machine:
//   g++ -O2 -std=c++20 -pthread -I/usr/local/cuda/include -o /tmp/ps parallel_staging.cpp -lcuda
//   /tmp/ps            (in tools/probes/)
#include <cuda.h>
#include <emmintrin.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "must.hpp"
#include "staging_probe.hpp"

namespace {

// Helpers spin on a job counter (a probe: the shim's pool parks when idle).
class Pool {
 public:
  explicit Pool(int helpers) {
    for (int i = 0; i < helpers; ++i) threads_.emplace_back([this, i] { loop(i + 1); });
  }
  ~Pool() {
    stop_.store(true);
    for (auto& t : threads_) t.join();
  }
  void copy(std::byte* dst, const std::byte* src, std::size_t bytes) {
    const int ways = static_cast<int>(threads_.size()) + 1;
    dst_ = dst;
    src_ = src;
    bytes_ = bytes;
    ways_ = ways;
    done_.store(0, std::memory_order_relaxed);
    job_.fetch_add(1, std::memory_order_release);
    part(0);
    while (done_.load(std::memory_order_acquire) != ways - 1) {
    }
  }

 private:
  void part(int index) {
    std::size_t each = (bytes_ / ways_ + 63) & ~std::size_t{63};
    std::size_t begin = std::min(bytes_, each * index);
    std::size_t end = std::min(bytes_, begin + each);
    if (end > begin) copy_streaming(dst_ + begin, src_ + begin, end - begin);
  }
  void loop(int index) {
    std::uint64_t seen = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
      std::uint64_t job = job_.load(std::memory_order_acquire);
      if (job == seen) continue;
      seen = job;
      part(index);
      done_.fetch_add(1, std::memory_order_release);
    }
  }
  std::vector<std::thread> threads_;
  std::atomic<std::uint64_t> job_{0};
  std::atomic<int> done_{0};
  std::atomic<bool> stop_{false};
  std::byte* dst_ = nullptr;
  const std::byte* src_ = nullptr;
  std::size_t bytes_ = 0;
  int ways_ = 1;
};

}  // namespace

int main() {
  MUST(cuInit(0));
  CUdevice dev;
  MUST(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
  MUST(cuCtxSetCurrent(ctx));
  CUstream stream;
  MUST(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const std::size_t kStaging = 32u << 20;
  int fd = memfd_create("staging", MFD_CLOEXEC);
  if (ftruncate(fd, kStaging) != 0) return 1;
  auto* staging =
      static_cast<std::byte*>(mmap(nullptr, kStaging, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  std::memset(staging, 0, kStaging);
  MUST(cuMemHostRegister(staging, kStaging, 0));
  std::vector<CUevent> events(16);
  for (auto& e : events) MUST(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  std::printf("hardware threads %u\n", std::thread::hardware_concurrency());

  for (std::size_t n : {std::size_t{4} << 20, std::size_t{16} << 20, std::size_t{64} << 20,
                        std::size_t{256} << 20}) {
    CUdeviceptr dev_buf;
    MUST(cuMemAlloc(&dev_buf, n));
    MUST(cuMemsetD8(dev_buf, 7, n));
    auto* host = static_cast<std::byte*>(std::aligned_alloc(4096, n));
    std::memset(host, 1, n);
    const double native_h2d = gbps(n, [&] { MUST(cuMemcpyHtoD(dev_buf, host, n)); });
    const double native_d2h = gbps(n, [&] { MUST(cuMemcpyDtoH(host, dev_buf, n)); });
    std::printf("%4zu MiB native pageable H2D %.2f GB/s D2H %.2f GB/s\n", n >> 20, native_h2d,
                native_d2h);
    for (int threads = 1; threads <= 4; ++threads) {
      Pool pool(threads - 1);
      // H2D: 2 MiB chunks, 8 in flight; a chunk is refilled once its DMA's event fired.
      const std::size_t chunk = 2u << 20;
      const int depth = 8;
      auto h2d = [&] {
        int slot = 0;
        for (std::size_t off = 0; off < n; off += chunk, slot = (slot + 1) % depth) {
          while (cuEventQuery(events[slot]) == CUDA_ERROR_NOT_READY) {
          }
          std::size_t bytes = std::min(chunk, n - off);
          pool.copy(staging + slot * chunk, host + off, bytes);
          MUST(cuMemcpyHtoDAsync(dev_buf + off, staging + slot * chunk, bytes, stream));
          MUST(cuEventRecord(events[slot], stream));
        }
        MUST(cuStreamSynchronize(stream));
      };
      double v = gbps(n, h2d);
      std::printf("%4zu MiB H2D threads %d %.2f GB/s (%.2fx)\n", n >> 20, threads, v,
                  v / native_h2d);
      for (std::size_t piece : {std::size_t{512} << 10, std::size_t{2} << 20}) {
        const int d2h_depth = 4;
        auto d2h = [&] {
          std::size_t posted = 0, copied = 0;
          int head = 0, tail = 0;
          while (copied < n) {
            while (posted < n && head - tail < d2h_depth) {
              std::size_t bytes = std::min(piece, n - posted);
              int s = head % d2h_depth;
              MUST(cuMemcpyDtoHAsync(staging + s * piece, dev_buf + posted, bytes, stream));
              MUST(cuEventRecord(events[s], stream));
              posted += bytes;
              ++head;
            }
            int s = tail % d2h_depth;
            while (cuEventQuery(events[s]) == CUDA_ERROR_NOT_READY) {
            }
            std::size_t bytes = std::min(piece, n - copied);
            pool.copy(host + copied, staging + s * piece, bytes);
            copied += bytes;
            ++tail;
          }
        };
        double w = gbps(n, d2h);
        std::printf("%4zu MiB D2H piece %4zu KiB threads %d %.2f GB/s (%.2fx)\n", n >> 20,
                    piece >> 10, threads, w, w / native_d2h);
      }
    }
    std::free(host);
    MUST(cuMemFree(dev_buf));
  }
  return 0;
}
