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
