// Shared by the CUDA-runtime test programs: checks that end the program with its FAIL result
// line. Each program defines kProgram (its name, the first word of its result line) before
// including this file.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

// A runtime call that must succeed; anywhere, also in threads and helpers (it exits).
#define CHECK(call)                                                                    \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess) {                                                         \
      std::printf("%s: line %d: %s failed: %s (%d) FAIL\n", kProgram, __LINE__, #call, \
                  cudaGetErrorName(err_), static_cast<int>(err_));                     \
      std::fflush(stdout);                                                             \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// A condition that must hold; the printf-style message says what was seen instead.
#define EXPECT(cond, ...)                               \
  do {                                                  \
    if (!(cond)) {                                      \
      std::printf("%s: line %d: ", kProgram, __LINE__); \
      std::printf(__VA_ARGS__);                         \
      std::printf(" (%s) FAIL\n", #cond);               \
      std::fflush(stdout);                              \
      std::exit(1);                                     \
    }                                                   \
  } while (0)
