// cuGetProcAddress and cuGetProcAddress_v2, answered from the real driver's probed table
// (docs/private-tables.md, "cuGetProcAddress"). Needs no connection, so cudart may call it before
// cuInit.
#include <algorithm>
#include <iterator>
#include <string_view>
#include <tuple>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/driver_version.hpp"
#include "libshim/entry/proc_address_table.hpp"

namespace mpsshim::shim::entry {
namespace {

// Every flag combination above this is refused with INVALID_VALUE [V].
constexpr cuuint64_t kMaxFlags =
    CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

struct Lookup {
  EntryPoint function;  // nullptr unless status is SUCCESS
  CUdriverProcAddressQueryResult status;
};

Lookup find(std::string_view name, std::uint8_t flags, int version) noexcept {
  const auto rows = proc_address_rows();
  const auto key = std::tie(name, flags, version);
  // The first row past (name, flags, version); the row before it, if of the same (name, flags),
  // is the newest variant the caller's version admits.
  const auto next =
      std::upper_bound(rows.begin(), rows.end(), key, [](const auto& k, const ProcAddressRow& row) {
        return k < std::tie(row.name, row.flags, row.min_version);
      });
  if (next != rows.begin()) {
    const ProcAddressRow& row = *std::prev(next);
    if (row.name == name && row.flags == flags) return {row.function, CU_GET_PROC_ADDRESS_SUCCESS};
  }
  // Otherwise rows of (name, flags), if any, all start above `version` and begin at `next`.
  if (next != rows.end() && next->name == name && next->flags == flags) {
    return {nullptr, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT};
  }
  return {nullptr, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND};
}

// The checks both entries share; INVALID_VALUE leaves *pfn and the status untouched [V].
CUresult lookup(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                Lookup& out) noexcept {
  // The real driver crashes on a NULL pfn [V]; refusing is kinder.
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (flags > kMaxFlags || cuda_version > advertised_driver_version()) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Flags 3 (legacy | per-thread) returns the per-thread variants on 580.159.04, e.g.
  // cuMemcpyAsync_ptsz and cuMemcpy_ptds [V, probed for this file];
  // flags 1 and 0 give identical results.
  const std::uint8_t table_flags = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0
                                       ? std::uint8_t{CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM}
                                       : static_cast<std::uint8_t>(flags);
  out = find(symbol, table_flags, cuda_version);
  log_trace("cuGetProcAddress({}, {}, {}) -> {}{}", symbol, cuda_version, flags,
            static_cast<int>(out.status), out.function != nullptr ? "" : " (NULL)");
  return CUDA_SUCCESS;
}

void* as_pointer(EntryPoint function) noexcept {
  return reinterpret_cast<void*>(function);
}

}  // namespace
}  // namespace mpsshim::shim::entry

// Since CUDA 12.0. Unknown and too-old names succeed with a NULL pointer and say why in
// *symbolStatus (which may be NULL), as the real driver does.
MPSSHIM_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                                    cuuint64_t flags,
                                                    CUdriverProcAddressQueryResult* symbolStatus) {
  using namespace mpsshim::shim::entry;
  Lookup found{};
  if (const CUresult rc = lookup(symbol, pfn, cudaVersion, flags, found); rc != CUDA_SUCCESS) {
    return rc;
  }
  *pfn = as_pointer(found.function);
  if (symbolStatus != nullptr) *symbolStatus = found.status;
  return CUDA_SUCCESS;
}

// CUDA 11.3's entry has no status to report through, so any miss is CUDA_ERROR_NOT_FOUND and
// *pfn is left untouched [V].
MPSSHIM_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                                 cuuint64_t flags) {
  using namespace mpsshim::shim::entry;
  Lookup found{};
  if (const CUresult rc = lookup(symbol, pfn, cudaVersion, flags, found); rc != CUDA_SUCCESS) {
    return rc;
  }
  if (found.function == nullptr) return CUDA_ERROR_NOT_FOUND;
  *pfn = as_pointer(found.function);
  return CUDA_SUCCESS;
}
