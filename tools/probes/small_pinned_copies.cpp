// Black-box probe of the real driver: why a small synchronous copy to pinned memory is slower
// under the shim than natively (D2H 64 KiB and 1 MiB at ~0.75x native, H2D at ~0.9-1.0x).
// The shim differs in two ways, and this times each alone, without the shim:
//   - the memory: the client's cuMemAllocHost is a memfd the server maps (MAP_SHARED) at the same
//     address and registers with cuMemHostRegister; natively the driver allocates it itself;
//   - the wait: the server issues cuMemcpy*Async on the client's stream and learns of its end
//     from a host fence (a word the stream writes, cuStreamWriteValue32) or an event; natively the
//     calling thread waits inside the synchronous copy.
// For each size, direction and backing: median and p90 of the synchronous copy, of the async copy
// + cuStreamSynchronize, and of the async copy + cuStreamWriteValue32 of a ticket that the host
// spins on.
//
// Build and run on the GPU machine:
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/small_pinned_copies.cpp
//     -lcuda -o /tmp/small_pinned && /tmp/small_pinned
#include <cuda.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "must.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kRegion = std::size_t{64} << 20;
constexpr int kIters = 3000;

enum class Backing { kDriver, kMemfd, kMemfdHuge, kAnonymous };
const char* backing_name(Backing b) {
  switch (b) {
    case Backing::kDriver:
      return "cuMemAllocHost";
    case Backing::kMemfd:
      return "memfd, registered";
    case Backing::kMemfdHuge:
      return "memfd + MADV_HUGEPAGE";
    case Backing::kAnonymous:
      return "anonymous, registered";
  }
  return "?";
}

// Host memory of one backing, touched and page-locked for the GPU.
void* host_memory(Backing b) {
  if (b == Backing::kDriver) {
    void* p = nullptr;
    MUST(cuMemAllocHost(&p, kRegion));
    std::memset(p, 1, kRegion);
    return p;
  }
  int fd = -1;
  int flags = MAP_SHARED;
  if (b == Backing::kAnonymous) {
    flags = MAP_PRIVATE | MAP_ANONYMOUS;
  } else {
    fd = ::memfd_create("small-pinned-probe", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, kRegion) != 0) {
      std::perror("memfd");
      std::exit(1);
    }
  }
  void* p = ::mmap(nullptr, kRegion, PROT_READ | PROT_WRITE, flags, fd, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  if (b == Backing::kMemfdHuge) ::madvise(p, kRegion, MADV_HUGEPAGE);
  std::memset(p, 1, kRegion);
  MUST(cuMemHostRegister(p, kRegion, CU_MEMHOSTREGISTER_PORTABLE));
  return p;
}

enum class Wait { kSynchronous, kStreamSync, kHostFence };
const char* wait_name(Wait w) {
  switch (w) {
    case Wait::kSynchronous:
      return "synchronous copy";
    case Wait::kStreamSync:
      return "async + cuStreamSynchronize";
    case Wait::kHostFence:
      return "async + fence word spin";
  }
  return "?";
}

struct Gpu {
  CUstream stream;
  CUdeviceptr device;
  volatile std::uint32_t* fence;  // registered host memory the stream writes
  CUdeviceptr fence_device;
};

void copy(const Gpu& g, void* host, std::size_t bytes, bool to_device, Wait wait,
          std::uint32_t ticket) {
  if (wait == Wait::kSynchronous) {
    MUST(to_device ? cuMemcpyHtoD(g.device, host, bytes) : cuMemcpyDtoH(host, g.device, bytes));
    return;
  }
  MUST(to_device ? cuMemcpyHtoDAsync(g.device, host, bytes, g.stream)
                 : cuMemcpyDtoHAsync(host, g.device, bytes, g.stream));
  if (wait == Wait::kStreamSync) {
    MUST(cuStreamSynchronize(g.stream));
    return;
  }
  MUST(cuStreamWriteValue32(g.stream, g.fence_device, ticket, CU_STREAM_WRITE_VALUE_DEFAULT));
  while (*g.fence != ticket) {
  }
}

// Median and p90 of kIters copies, µs, after a warm-up.
std::pair<double, double> time_copies(const Gpu& g, void* host, std::size_t bytes, bool to_device,
                                      Wait wait) {
  static std::uint32_t ticket = 0;
  for (int i = 0; i < 200; ++i) copy(g, host, bytes, to_device, wait, ++ticket);
  std::vector<double> us(kIters);
  for (int i = 0; i < kIters; ++i) {
    const auto t0 = Clock::now();
    copy(g, host, bytes, to_device, wait, ++ticket);
    us[i] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
  }
  std::sort(us.begin(), us.end());
  return {us[kIters / 2], us[kIters * 9 / 10]};
}

}  // namespace

int main() {
  start_on_gpu0();
  Gpu g{};
  MUST(cuStreamCreate(&g.stream, CU_STREAM_NON_BLOCKING));
  MUST(cuMemAlloc(&g.device, kRegion));
  void* fence = nullptr;
  MUST(cuMemHostAlloc(&fence, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  g.fence = static_cast<volatile std::uint32_t*>(fence);
  *g.fence = 0;
  MUST(cuMemHostGetDevicePointer(&g.fence_device, fence, 0));

  std::printf("%-24s %-4s %-30s %8s %10s %8s %8s\n", "backing", "dir", "wait", "bytes",
              "median_us", "p90_us", "GB/s");
  const Backing backings[] = {Backing::kDriver, Backing::kMemfd, Backing::kMemfdHuge,
                              Backing::kAnonymous};
  for (Backing b : backings) {
    void* host = host_memory(b);
    for (std::size_t bytes : {std::size_t{4} << 10, std::size_t{64} << 10, std::size_t{1} << 20}) {
      for (bool to_device : {false, true}) {
        for (Wait w : {Wait::kSynchronous, Wait::kStreamSync, Wait::kHostFence}) {
          const auto [median, p90] = time_copies(g, host, bytes, to_device, w);
          std::printf("%-24s %-4s %-30s %8zu %10.2f %8.2f %8.2f\n", backing_name(b),
                      to_device ? "H2D" : "D2H", wait_name(w), bytes, median, p90,
                      static_cast<double>(bytes) / median / 1e3);
        }
      }
    }
  }
  return 0;
}
