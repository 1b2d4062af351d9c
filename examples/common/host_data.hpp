// Deterministic host data, checksums and clocks shared by the programs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mpsshim::examples {

// Floats in [-1, 1) from a fixed-seed generator: the same inputs on every run and machine, so
// result checksums can be compared between a native and a shimmed run.
std::vector<float> random_floats(std::size_t n, std::uint64_t seed);
void fill_random_floats(float* out, std::size_t n, std::uint64_t seed);

// FNV-1a 64 of the bytes, as 16 hex digits.
std::string checksum(const void* data, std::size_t bytes);

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CLOCK_REALTIME in nanoseconds: comparable between processes (start barriers, overlap spans).
std::int64_t wall_clock_ns();

}  // namespace mpsshim::examples
