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

// The driver's name of a result ("CUDA_ERROR_INVALID_VALUE"), for the probes' report lines.
inline const char* name(CUresult r) {
  const char* s = "?";
  cuGetErrorName(r, &s);
  return s;
}

// cuInit, then GPU 0's primary context retained and made current: the probes' usual start.
inline CUdevice start_on_gpu0(CUcontext* context = nullptr) {
  MUST(cuInit(0));
  CUdevice device;
  MUST(cuDeviceGet(&device, 0));
  CUcontext primary;
  MUST(cuDevicePrimaryCtxRetain(&primary, device));
  MUST(cuCtxSetCurrent(primary));
  if (context != nullptr) *context = primary;
  return device;
}
