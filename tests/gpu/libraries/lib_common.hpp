// Shared by the CUDA-library programs of the GPU suite (tests/gpu/libraries.sh): the exit codes,
// a status check that names the failing call, and the digest of results that the suite compares
// between the native and the shim run. Each program prints one line
// "<name>: key=value ... PASS|FAIL" and exits 0 only on PASS, 77 without a GPU.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace libcheck {

inline constexpr int kSkipped = 77;  // meson: test skipped

// Exits 77 when no GPU is usable (natively: no driver or device; the shim would answer too).
inline int device_or_skip(const char* program) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || count == 0) {
    std::printf("%s: no CUDA device (%s): skipped\n", program, cudaGetErrorString(error));
    std::exit(kSkipped);
  }
  return count;
}

// FNV-1a over the bytes of results: the same GPU running the same kernels natively and under the
// shim must give the same bits, so any difference shows in this one field.
class Digest {
 public:
  void add(const void* data, std::size_t n) {
    const auto* bytes = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) hash_ = (hash_ ^ bytes[i]) * 0x100000001b3ULL;
  }
  template <typename T>
  void add(const std::vector<T>& values) {
    add(values.data(), values.size() * sizeof(T));
  }
  unsigned long long value() const { return hash_; }

 private:
  std::uint64_t hash_ = 0xcbf29ce484222325ULL;
};

// A fixed-seed generator of test inputs (the same numbers on every machine).
class Lcg {
 public:
  explicit Lcg(std::uint64_t seed) : state_(seed) {}
  std::uint32_t next() {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return std::uint32_t(state_ >> 33);
  }
  // Uniform in [-1, 1).
  float uniform() { return float(next() % 65536) / 32768.0f - 1.0f; }
  // A multiple of 1/8 in [-1, 1]: exact in bf16 and e4m3, so products sum exactly in fp32.
  float eighths() { return float(int(next() % 17) - 8) / 8.0f; }

 private:
  std::uint64_t state_;
};

}  // namespace libcheck

// Prints the failing call with its status and exits 1 (no result line: the suite shows the
// stderr line).
#define LIB_CHECK(call, ok_value)                                                \
  do {                                                                           \
    const auto lib_check_status = (call);                                        \
    if (lib_check_status != (ok_value)) {                                        \
      std::fprintf(stderr, "%s:%d: %s returned %d\n", __FILE__, __LINE__, #call, \
                   int(lib_check_status));                                       \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)
#define CUDA_OK(call) LIB_CHECK(call, cudaSuccess)
