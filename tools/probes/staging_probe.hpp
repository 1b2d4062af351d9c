// What the staging probes share (staged_dtoh.cpp, parallel_staging.cpp): the streaming-store
// copy the shim uses for large pieces (libshim/staging_copy.cpp, without its alignment head), and
// a throughput in GB/s, the median of 7 timed runs after a warm one. Found next to the probes.
#pragma once

#include <emmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

inline void copy_streaming(std::byte* dst, const std::byte* src, std::size_t bytes) {
  for (; bytes >= 64; bytes -= 64, dst += 64, src += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  }
  std::memcpy(dst, src, bytes);
  _mm_sfence();
}

template <typename F>
double gbps(std::size_t bytes, F&& run) {
  using Clock = std::chrono::steady_clock;
  std::vector<double> v;
  run();  // warm
  for (int i = 0; i < 7; ++i) {
    auto t0 = Clock::now();
    run();
    v.push_back(bytes / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
