// For the e2e client programs whose modes check many results and report them all: expect() and
// expect_true() print a "mismatch" line and count it, and finish() prints the mode's one result
// line ("PASS <mode> failures=0" or "FAIL ...") and gives its exit status. One client per
// process, so the count is the process's.
#pragma once

#include <cuda.h>

#include <cstdio>

namespace e2e_expect {
inline int failures = 0;
}  // namespace e2e_expect

inline void expect(CUresult got, CUresult want, const char* what) {
  if (got == want) return;
  std::printf("mismatch: %s gave %d, expected %d\n", what, got, want);
  ++e2e_expect::failures;
}

inline void expect_true(bool ok, const char* what) {
  if (ok) return;
  std::printf("mismatch: %s\n", what);
  ++e2e_expect::failures;
}

inline int finish(const char* mode) {
  const int failures = e2e_expect::failures;
  std::printf("%s %s failures=%d\n", failures == 0 ? "PASS" : "FAIL", mode, failures);
  return failures == 0 ? 0 : 1;
}
