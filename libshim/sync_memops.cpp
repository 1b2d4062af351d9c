// The allocations marked CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, by their address book id (unique for
// the process's life, so a freed allocation's mark never applies to a new one at its address).
#include "libshim/sync_memops.hpp"

#include <mutex>
#include <unordered_set>

#include "libshim/api.hpp"

namespace mpsshim::shim {
namespace {

struct SyncMemopsBook {
  std::mutex mutex;
  std::unordered_set<std::uint64_t> marked;
};
SyncMemopsBook& book() {
  static auto* b = new SyncMemopsBook();
  return *b;
}

}  // namespace

CUresult set_sync_memops(CUdeviceptr address, bool on) {
  DeviceRange range{};
  if (!address_book().find_device(address, &range) || range.module_global) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard lock(book().mutex);
  if (on) {
    book().marked.insert(range.id);
  } else {
    book().marked.erase(range.id);
  }
  return CUDA_SUCCESS;
}

CUresult finish_sync_memop(CUdeviceptr dst, DefaultStream mode, CUresult rc) {
  if (rc != CUDA_SUCCESS) return rc;
  DeviceRange range{};
  if (!address_book().find_device(dst, &range)) return rc;
  {
    std::lock_guard lock(book().mutex);
    if (book().marked.empty() || !book().marked.contains(range.id)) return rc;
  }
  return cuStreamSynchronize(mode == DefaultStream::kPerThread ? CU_STREAM_PER_THREAD
                                                               : CU_STREAM_LEGACY);
}

}  // namespace mpsshim::shim
