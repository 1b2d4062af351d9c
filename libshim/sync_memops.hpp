// CU_POINTER_ATTRIBUTE_SYNC_MEMOPS (cuPointerSetAttribute): synchronous copies and memsets into an
// allocation so marked return only once they completed, as the driver guarantees for it. The
// server cannot set the attribute on its memory (its arena is VMM memory, for which the driver
// answers CUDA_ERROR_NOT_SUPPORTED: H200, driver 580), so the shim keeps the mark and waits itself
// (sync_memops.cpp; copy.cpp's synchronous entry points ask it).
#pragma once

#include <cuda.h>

#include "libshim/client.hpp"

namespace mpsshim::shim {

// Marks or unmarks the allocation holding `address` (the client's device memory).
CUresult set_sync_memops(CUdeviceptr address, bool on);
// `rc`, after waiting for `mode`'s default stream when `dst` lies in a marked allocation.
CUresult finish_sync_memop(CUdeviceptr dst, DefaultStream mode, CUresult rc);

}  // namespace mpsshim::shim
