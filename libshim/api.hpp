// Included by every file that defines driver entry points. The build defines
// __CUDA_API_VERSION_INTERNAL, so cuda.h declares every exported variant (cuMemAlloc_v2,
// cuMemcpyHtoD_v2_ptds, the old 32-bit cuMemAlloc, ...) under its own name with its exact
// signature; a definition that does not match cuda.h fails to compile.
#pragma once

#include <cuda.h>

// Entry points are exported; everything else in the shim is hidden (-fvisibility=hidden).
#define MPSSHIM_EXPORT extern "C" __attribute__((visibility("default")))
