// The probes' one check: a driver call that fails ends the probe with its name, error and line.
// (Each probe is one file built with plain g++ or nvcc on the GPU machine; this is found next to
// it.)
#pragma once

#include <cuda.h>

#include <cstdio>
#include <cstdlib>

#define MUST(x)                                                      \
  do {                                                               \
    CUresult r_ = (x);                                               \
    if (r_ != CUDA_SUCCESS) {                                        \
      const char* s_ = "?";                                          \
      cuGetErrorName(r_, &s_);                                       \
      std::printf("failed: %s -> %s (line %d)\n", #x, s_, __LINE__); \
      std::exit(1);                                                  \
    }                                                                \
  } while (0)
