// Output of the micro-benchmarks: machine-readable CSV lines
//   benchmark,metric,size_bytes,value,unit
// preceded by that header line, then a human-readable summary ("# ..." lines) and the usual
// one-line result "<benchmark>: key=value ... PASS|FAIL" (examples/common/report.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <vector>

namespace mpsshim::bench {

inline double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  if (values.size() % 2 == 1) return *middle;
  const double upper = *middle;
  const double lower = *std::max_element(values.begin(), middle);
  return 0.5 * (lower + upper);
}

// The q-quantile (0..1) by nearest rank.
inline double quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  const auto rank = static_cast<std::size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(rank),
                   values.end());
  return values[rank];
}

inline void csv_header() {
  std::printf("benchmark,metric,size_bytes,value,unit\n");
}

inline void csv(const char* benchmark, const char* metric, std::size_t size_bytes, double value,
                const char* unit) {
  std::printf("%s,%s,%zu,%.4f,%s\n", benchmark, metric, size_bytes, value, unit);
  std::fflush(stdout);
}

}  // namespace mpsshim::bench
