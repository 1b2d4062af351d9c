// Black-box probe of the real driver and the host: how fast can device -> pageable host copies
// go through registered staging memory, by piece size and pieces in flight? The shim stages a
// pageable cuMemcpyDtoH through 2 MiB chunks of its segment, up to 8 in flight, and reached
// 0.88x of native on an H100. If the DMA runs far ahead of the CPU's copy-out, each chunk has
// left the last-level cache by the time it is read; fewer, smaller pieces in flight keep it
// warm. Prints native pageable cuMemcpyDtoH, then the staged pipeline for each piece size,
// depth and store kind (memcpy / streaming stores), in GB/s, median of 7.
//
// Build and run on the GPU machine:
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/staged_dtoh.cpp -lcuda -o /tmp/sd
//   /tmp/sd
#include <cuda.h>
#include <emmintrin.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "must.hpp"
#include "staging_probe.hpp"

namespace {}  // namespace

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

  for (std::size_t n : {std::size_t{4} << 20, std::size_t{64} << 20, std::size_t{256} << 20}) {
    CUdeviceptr src;
    MUST(cuMemAlloc(&src, n));
    MUST(cuMemsetD8(src, 7, n));
    auto* dst = static_cast<std::byte*>(std::malloc(n));
    std::memset(dst, 0, n);
    double native = gbps(n, [&] { MUST(cuMemcpyDtoH(dst, src, n)); });
    std::printf("%4zu MiB native pageable cuMemcpyDtoH %.2f GB/s\n", n >> 20, native);
    for (std::size_t piece : {std::size_t{256} << 10, std::size_t{512} << 10, std::size_t{1} << 20,
                              std::size_t{2} << 20}) {
      for (int depth : {2, 3, 4, 8}) {
        if (piece * depth > kStaging) continue;
        for (int streaming = 0; streaming < 2; ++streaming) {
          auto run = [&] {
            std::size_t posted = 0, copied = 0;
            int head = 0, tail = 0;  // slots [tail, head) are in flight
            while (copied < n) {
              while (posted < n && head - tail < depth) {
                std::size_t bytes = std::min(piece, n - posted);
                int slot = head % depth;
                MUST(cuMemcpyDtoHAsync(staging + slot * piece, src + posted, bytes, stream));
                MUST(cuEventRecord(events[slot], stream));
                posted += bytes;
                ++head;
              }
              int slot = tail % depth;
              while (cuEventQuery(events[slot]) == CUDA_ERROR_NOT_READY) {
              }
              std::size_t bytes = std::min(piece, n - copied);
              if (streaming) {
                copy_streaming(dst + copied, staging + slot * piece, bytes);
              } else {
                std::memcpy(dst + copied, staging + slot * piece, bytes);
              }
              copied += bytes;
              ++tail;
            }
          };
          double v = gbps(n, run);
          std::printf("%4zu MiB piece %4zu KiB depth %d %-9s %.2f GB/s (%.2fx)\n", n >> 20,
                      piece >> 10, depth, streaming ? "streaming" : "memcpy", v, v / native);
        }
      }
    }
    std::free(dst);
    MUST(cuMemFree(src));
  }
  return 0;
}
