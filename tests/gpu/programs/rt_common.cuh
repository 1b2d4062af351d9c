// Shared by the CUDA-runtime GPU programs: error checks that end the program with a FAIL result
// line, a checksum of result bytes, and a spin on the GPU's global timer. Each program defines
// kProgram (its name, the first word of its result line) before including this file.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define RT_CHECK(call)                                                                   \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      std::printf("%s: %s failed at line %d: %s (%d) FAIL\n", kProgram, #call, __LINE__, \
                  cudaGetErrorName(err_), static_cast<int>(err_));                       \
      std::fflush(stdout);                                                               \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

// Checks a kernel launch (configuration errors) right after it.
#define RT_CHECK_LAUNCH() RT_CHECK(cudaGetLastError())

// FNV-1a over bytes: equal results give equal checksums, natively and under the shim.
inline std::uint64_t rt_checksum(const void* data, std::size_t bytes,
                                 std::uint64_t seed = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = seed;
  for (std::size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Returns after `nanoseconds` of GPU time (the global timer), to make a kernel slow on purpose.
__device__ inline void rt_spin_ns(unsigned long long nanoseconds) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

// Prints the one result line; returns the exit status (0 only on PASS).
#define RT_REPORT(ok, format, ...)                                                    \
  (std::printf("%s: " format " %s\n", kProgram, __VA_ARGS__, (ok) ? "PASS" : "FAIL"), \
   std::fflush(stdout), (ok) ? 0 : 1)
