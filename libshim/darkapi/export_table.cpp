// cuGetExportTable (docs/private-tables.md): hands out the private tables. Works before cuInit and
// without the broker (cudart asks for F8 first thing), and returns the same address for a UUID
// for the life of the process, because the integrity check hashes those addresses.
#include <cuda.h>
#include <dlfcn.h>

#include <array>
#include <cstring>
#include <string_view>
#include <tuple>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/darkapi/tables.hpp"
#include "libshim/darkapi/uuids.hpp"

namespace mpsshim::shim::darkapi {
namespace {

struct Served {
  Uuid id;
  const void* (*table)() noexcept;
};
constexpr std::array<Served, 8> kServed{{
    {kCudartInterfaceId, &cudart_interface_table},
    {kCallbackHooksId, &callback_hooks_table},
    {kToolsTlsId, &tools_tls_table},
    {kContextLocalStorageId, &context_local_storage_table},
    {kContextChecksId, &context_checks_table},
    {kIntegrityCheckId, &integrity_check_table},
    {kToolsContextId, &tools_context_table},
    {kToolsModuleId, &tools_module_table},
}};

struct Refused {
  Uuid id;
  const char* name;
};
constexpr std::array<Refused, 3> kRefused{{
    {kF8Id, "F8"},
    {kNvmlInterfaceId, "NVML interface"},
    {kNvrtcInterfaceId, "NVRTC interface"},
}};

bool same(const Uuid& known, const CUuuid& asked) noexcept {
  return std::memcmp(known.data(), asked.bytes, known.size()) == 0;
}

const void* find_table(const CUuuid& id) noexcept {
  for (const Served& s : kServed) {
    if (same(s.id, id)) return s.table();
  }
  if (same(kCublasLtKernelsId, id)) return host_driver_table(id);
  return nullptr;
}

// Once per UUID, naming the library that asked: the first thing to look at when a runtime or
// tool fails for want of a table.
void report_refusal(const CUuuid& id, const void* caller) noexcept {
  constexpr char kDigits[] = "0123456789abcdef";
  std::array<char, 32> hex{};
  for (std::size_t i = 0; i < sizeof id.bytes; ++i) {
    const auto byte = static_cast<unsigned char>(id.bytes[i]);
    hex[2 * i] = kDigits[byte >> 4];
    hex[2 * i + 1] = kDigits[byte & 0xF];
  }
  const std::string_view text(hex.data(), hex.size());

  Dl_info info{};
  const char* library =
      ::dladdr(caller, &info) != 0 && info.dli_fname != nullptr ? info.dli_fname : "?";

  constexpr std::string_view kPrefix = "cuGetExportTable:";
  std::array<char, kPrefix.size() + std::tuple_size_v<decltype(hex)>> key{};
  std::memcpy(key.data(), kPrefix.data(), kPrefix.size());
  std::memcpy(key.data() + kPrefix.size(), hex.data(), hex.size());
  const std::string_view once_key(key.data(), key.size());

  for (const Refused& r : kRefused) {
    if (same(r.id, id)) {
      log_once(once_key, LogLevel::kInfo, "cuGetExportTable: refusing {} table {} asked by {}",
               r.name, text, library);
      return;
    }
  }
  log_once(once_key, LogLevel::kWarn, "cuGetExportTable: unknown table {} asked by {}; refused",
           text, library);
}

}  // namespace
}  // namespace mpsshim::shim::darkapi

MPSSHIM_EXPORT CUresult CUDAAPI cuGetExportTable(const void** ppExportTable,
                                                 const CUuuid* pExportTableId) {
  using namespace mpsshim::shim::darkapi;
  if (ppExportTable == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *ppExportTable = nullptr;
  if (pExportTableId == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (const void* table = find_table(*pExportTableId)) {
    *ppExportTable = table;
    return CUDA_SUCCESS;
  }
  report_refusal(*pExportTableId, __builtin_return_address(0));
  return CUDA_ERROR_INVALID_VALUE;
}
