// For the CUDA-runtime GPU programs that also call the driver API directly: CU_CHECK(call) ends
// the program with a FAIL result line naming the call and its CUresult when the call failed.
// Include after defining kProgram, like rt_common.cuh.
#pragma once

#include <cuda.h>

#include "rt_common.cuh"

#define CU_CHECK(call)                                                                        \
  do {                                                                                        \
    CUresult r_ = (call);                                                                     \
    if (r_ != CUDA_SUCCESS) {                                                                 \
      std::printf("%s: %s failed at line %d: %d FAIL\n", kProgram, #call, __LINE__, int(r_)); \
      std::fflush(stdout);                                                                    \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
