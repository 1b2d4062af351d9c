// For the e2e client programs (run under the shim by the e2e tests): CHECK(call) ends the program
// with a "FAIL <call> -> <error> at line N" line that the test shows, when the call failed.
#pragma once

#include <cuda.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(call)                                                                              \
  do {                                                                                           \
    CUresult rc_ = (call);                                                                       \
    if (rc_ != CUDA_SUCCESS) {                                                                   \
      const char* name_ = nullptr;                                                               \
      cuGetErrorName(rc_, &name_);                                                               \
      std::printf("FAIL %s -> %s (%d) at line %d\n", #call, name_ ? name_ : "?", rc_, __LINE__); \
      std::fflush(stdout);                                                                       \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// EXPECT(call, expected): a call that must answer `expected` (an error the driver gives, say);
// otherwise the mode fails with a FAIL line naming both.
#define EXPECT(call, expected)                                             \
  do {                                                                     \
    CUresult got_ = (call);                                                \
    if (got_ != (expected)) {                                              \
      std::printf("FAIL %s -> %d, expected %s\n", #call, got_, #expected); \
      return 1;                                                            \
    }                                                                      \
  } while (0)

// A FAIL line for a wrong result; the mode's exit status.
inline int fail(const char* what) {
  std::printf("FAIL %s\n", what);
  return 1;
}
