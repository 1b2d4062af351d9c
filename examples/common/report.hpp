// The one result line a program prints: "<program>: key=value ... PASS|FAIL".
//
// Field names say what is measured. `seconds` and fields whose names end in _s, _ms, _us, _ns or
// _gbps are measurements that vary from run to run; every other field is a result that must come
// out the same natively and under the shim (tests/gpu/gpu_suite.sh compares them).
#pragma once

#include <concepts>
#include <string>
#include <string_view>

namespace mpsshim::examples {

class Report {
 public:
  explicit Report(const char* program);

  void add(std::string_view key, std::string_view value);
  void add(std::string_view key, const char* value) { add(key, std::string_view(value)); }
  template <std::integral T>
  void add(std::string_view key, T value) {
    add(key, std::string_view(std::to_string(value)));
  }
  // Fixed-point with `decimals` digits: "%.{decimals}f".
  void add_fixed(std::string_view key, double value, int decimals);
  // Shortest exact-enough form for comparisons across runs: "%.6g".
  void add_real(std::string_view key, double value);

  // Records a failed expectation. `tag` is one word (no spaces) naming it: the line will say FAIL
  // with the first failed tag in a `failed=` field; callers print details on stderr.
  void expect(bool ok, std::string_view tag);
  bool passed() const { return first_failure_.empty(); }

  // Prints the line; returns the process exit code (0 on PASS).
  [[nodiscard]] int finish();

 private:
  std::string program_;
  std::string fields_;
  std::string first_failure_;
};

}  // namespace mpsshim::examples
