// Opening and closing another client's allocation by its proto::IpcHandle (ipc.cpp): shared by
// cuIpcOpenMemHandle and cuMemPoolImportPointer (memory_pool_ipc.cpp), whose export data is the
// same handle.
#pragma once

#include <cuda.h>

#include "libshim/client.hpp"
#include "proto/ops_ipc.hpp"

namespace mpsshim::shim {

// Opens the allocation `wire` names for `ctx` (on the issuing GPU's server, mapped into ctx's
// GPU's when they differ); `pool` marks it as a pool import of that pool.
CUresult ipc_open_memory(Context* ctx, CUdeviceptr* out, const proto::IpcHandle& wire,
                         unsigned flags, CUmemoryPool pool);
// Closes one open of the opened allocation `range` (its base); the last close forgets it.
CUresult ipc_close_memory(const DeviceRange& range);

// Marks a pool created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR as exportable, with the
// random id its exports carry (memory_pool_ipc.cpp).
void make_exportable(MemPool& pool);

}  // namespace mpsshim::shim
