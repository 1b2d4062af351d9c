// cuRAND under the shim, both APIs. Host API: the first N numbers of a Philox4x32-10 and an
// MRG32k3a generator on the device must equal those of the same generators run on the CPU
// (curandCreateGeneratorHost makes the same sequences). Device API: a kernel draws with
// curand_init(seed, thread, 0) + curand(); each thread's words must equal a CPU Philox4x32-10
// written from curand_philox4x32_x.h, and curand_uniform must lie in (0, 1].
#include <curand.h>
#include <curand_kernel.h>

#include <cstdint>
#include <vector>

#include "lib_common.hpp"

namespace {

#define RAND_OK(call) LIB_CHECK(call, CURAND_STATUS_SUCCESS)

constexpr std::size_t kCount = 1 << 16;
constexpr unsigned long long kSeed = 1234;
constexpr int kThreads = 256, kPerThread = 8;

std::vector<float> uniforms(curandRngType_t type, bool on_host) {
  curandGenerator_t generator;
  std::vector<float> out(kCount);
  float* target = out.data();
  if (on_host) {
    RAND_OK(curandCreateGeneratorHost(&generator, type));
  } else {
    RAND_OK(curandCreateGenerator(&generator, type));
    CUDA_OK(cudaMalloc(&target, kCount * sizeof(float)));
  }
  RAND_OK(curandSetPseudoRandomGeneratorSeed(generator, kSeed));
  RAND_OK(curandGenerateUniform(generator, target, kCount));
  if (!on_host) {
    CUDA_OK(cudaMemcpy(out.data(), target, kCount * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaFree(target));
  }
  RAND_OK(curandDestroyGenerator(generator));
  return out;
}

__global__ void draw(unsigned int* words, float* uniform) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  curandStatePhilox4_32_10_t state;
  curand_init(kSeed, t, 0, &state);
  for (int i = 0; i < kPerThread; ++i) words[t * kPerThread + i] = curand(&state);
  uniform[t] = curand_uniform(&state);
}

// Philox4x32-10 as curand_philox4x32_x.h computes it.
struct Words4 {
  std::uint32_t x, y, z, w;
};
Words4 philox(Words4 c, std::uint32_t k0, std::uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t(0xD2511F53u) * c.x;
    const std::uint64_t p1 = std::uint64_t(0xCD9E8D57u) * c.z;
    c = {std::uint32_t(p1 >> 32) ^ c.y ^ k0, std::uint32_t(p1), std::uint32_t(p0 >> 32) ^ c.w ^ k1,
         std::uint32_t(p0)};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

// curand_init(seed, subsequence, 0): counter (0, 0, subsequence lo, hi); curand() returns the
// block's x, y, z, w, then counts the low words up.
std::vector<std::uint32_t> cpu_words(unsigned long long subsequence, int n) {
  Words4 counter{0, 0, std::uint32_t(subsequence), std::uint32_t(subsequence >> 32)};
  std::vector<std::uint32_t> out;
  while (int(out.size()) < n) {
    const Words4 block = philox(counter, std::uint32_t(kSeed), std::uint32_t(kSeed >> 32));
    for (std::uint32_t word : {block.x, block.y, block.z, block.w}) out.push_back(word);
    if (++counter.x == 0 && ++counter.y == 0 && ++counter.z == 0) ++counter.w;
  }
  out.resize(n);
  return out;
}

}  // namespace

int main() {
  libcheck::device_or_skip("lib_curand");
  libcheck::Digest digest;
  int version = 0;
  RAND_OK(curandGetVersion(&version));

  int host_api_mismatches = 0;
  for (curandRngType_t type : {CURAND_RNG_PSEUDO_PHILOX4_32_10, CURAND_RNG_PSEUDO_MRG32K3A}) {
    const auto device = uniforms(type, false);
    const auto host = uniforms(type, true);
    for (std::size_t i = 0; i < kCount; ++i) host_api_mismatches += device[i] != host[i];
    digest.add(device);
  }

  unsigned int* d_words = nullptr;
  float* d_uniform = nullptr;
  CUDA_OK(cudaMalloc(&d_words, kThreads * kPerThread * sizeof(unsigned int)));
  CUDA_OK(cudaMalloc(&d_uniform, kThreads * sizeof(float)));
  draw<<<kThreads / 64, 64>>>(d_words, d_uniform);
  CUDA_OK(cudaGetLastError());
  std::vector<unsigned int> words(kThreads * kPerThread);
  std::vector<float> uniform(kThreads);
  CUDA_OK(cudaMemcpy(words.data(), d_words, words.size() * sizeof(unsigned int),
                     cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(uniform.data(), d_uniform, uniform.size() * sizeof(float),
                     cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(d_words));
  CUDA_OK(cudaFree(d_uniform));
  int device_api_mismatches = 0, out_of_range = 0;
  for (int t = 0; t < kThreads; ++t) {
    const auto want = cpu_words(t, kPerThread);
    for (int i = 0; i < kPerThread; ++i)
      device_api_mismatches += words[t * kPerThread + i] != want[i];
    out_of_range += !(uniform[t] > 0.0f && uniform[t] <= 1.0f);
  }
  digest.add(words);
  digest.add(uniform);

  const bool ok = host_api_mismatches == 0 && device_api_mismatches == 0 && out_of_range == 0;
  std::printf(
      "lib_curand: version=%d host_api_mismatches=%d device_api_mismatches=%d "
      "out_of_range=%d digest=%016llx %s\n",
      version, host_api_mismatches, device_api_mismatches, out_of_range, digest.value(),
      ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
