#include "examples/common/host_data.hpp"

#include <cstdio>
#include <ctime>

namespace mpsshim::examples {

void fill_random_floats(float* out, std::size_t n, std::uint64_t seed) {
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (std::size_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;  // Knuth's MMIX LCG
    // The top 24 bits: every value is exactly representable, in [-1, 1).
    const auto top = static_cast<std::int32_t>(state >> 40);
    out[i] = static_cast<float>(top - (1 << 23)) / static_cast<float>(1 << 23);
  }
}

std::vector<float> random_floats(std::size_t n, std::uint64_t seed) {
  std::vector<float> values(n);
  fill_random_floats(values.data(), n, seed);
  return values;
}

std::string checksum(const void* data, std::size_t bytes) {
  std::uint64_t hash = 0xCBF29CE484222325ULL;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 0x100000001B3ULL;
  }
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::int64_t wall_clock_ns() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1000000000LL + now.tv_nsec;
}

}  // namespace mpsshim::examples
