// A stand-in for libcuda.so.1 with private tables whose slots do known things, for testing
// darktrace on a machine without a driver. Its tables mimic the real ones' layouts: a sized
// table with a NULL slot and a data slot, a headerless one (like CONTEXT_LOCAL_STORAGE), and one
// with the runtime interface's UUID, which "all" must leave alone.
#include <cuda.h>

#include <cstdint>
#include <cstring>

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT std::uint64_t fake_sum8(std::uint64_t a0, std::uint64_t a1, std::uint64_t a2,
                               std::uint64_t a3, std::uint64_t a4, std::uint64_t a5,
                               std::uint64_t a6, std::uint64_t a7) {
  return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}
EXPORT int fake_fill(unsigned char* out, int byte, std::size_t n) {
  std::memset(out, byte, n);
  return 0;
}
EXPORT long fake_twice(long x) {
  return 2 * x;
}
EXPORT long fake_negate(long x) {
  return -x;
}

extern "C" __attribute__((visibility("default"))) std::uint64_t fake_data_word;
std::uint64_t fake_data_word = 0x5eed;

namespace {

// Sized: [size, sum8, NULL, fill, &data].
const std::uint64_t tools_module_table[] = {5 * 8, reinterpret_cast<std::uint64_t>(&fake_sum8), 0,
                                            reinterpret_cast<std::uint64_t>(&fake_fill),
                                            reinterpret_cast<std::uint64_t>(&fake_data_word)};
// Headerless: [twice, negate, NULL].
const std::uint64_t headerless_table[] = {reinterpret_cast<std::uint64_t>(&fake_twice),
                                          reinterpret_cast<std::uint64_t>(&fake_negate), 0};
const std::uint64_t runtime_table[] = {2 * 8, reinterpret_cast<std::uint64_t>(&fake_sum8)};

struct Known {
  const char* uuid;
  const void* table;
};
const Known known_tables[] = {
    {"6e163fbeb958444d835ce182aff1991e", tools_module_table},
    {"c693336e1121df11a8c368f355d89593", headerless_table},
    {"6bd5fb6c5bf4e74a8987d93912fd9df9", runtime_table},
};

bool same_uuid(const CUuuid* id, const char* hex) {
  for (int i = 0; i < 16; ++i) {
    unsigned byte = 0;
    for (int k = 0; k < 2; ++k) {
      const char c = hex[2 * i + k];
      byte = byte * 16 + unsigned(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    if (static_cast<unsigned char>(id->bytes[i]) != byte) return false;
  }
  return true;
}

}  // namespace

// The driver's table for a UUID given as hex, so that tests can tell a copy from the original.
EXPORT const void* fake_driver_table(const char* uuid_hex) {
  for (const Known& k : known_tables) {
    if (std::strcmp(k.uuid, uuid_hex) == 0) return k.table;
  }
  return nullptr;
}

EXPORT CUresult cuGetExportTable(const void** table, const CUuuid* id) {
  if (table == nullptr || id == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const Known& k : known_tables) {
    if (same_uuid(id, k.uuid)) {
      *table = k.table;
      return CUDA_SUCCESS;
    }
  }
  *table = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuDriverGetVersion(int* version) {
  *version = 13000;
  return CUDA_SUCCESS;
}

CUresult fake_get_proc_address_v2(
    const char* symbol, void** fn, int version, cuuint64_t,
    CUdriverProcAddressQueryResult* status) __asm__("cuGetProcAddress_v2")
    __attribute__((visibility("default")));
CUresult fake_get_proc_address_v1(const char* symbol, void** fn, int version,
                                  cuuint64_t flags) __asm__("cuGetProcAddress")
    __attribute__((visibility("default")));

// As the real driver: "cuGetProcAddress" at 12000 and later is the _v2 function.
CUresult fake_get_proc_address_v2(const char* symbol, void** fn, int version, cuuint64_t,
                                  CUdriverProcAddressQueryResult* status) {
  if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  if (std::strcmp(symbol, "cuGetExportTable") == 0) {
    *fn = reinterpret_cast<void*>(&cuGetExportTable);
  } else if (std::strcmp(symbol, "cuDriverGetVersion") == 0) {
    *fn = reinterpret_cast<void*>(&cuDriverGetVersion);
  } else if (std::strcmp(symbol, "cuGetProcAddress") == 0) {
    *fn = version >= 12000 ? reinterpret_cast<void*>(&fake_get_proc_address_v2)
                           : reinterpret_cast<void*>(&fake_get_proc_address_v1);
  } else {
    *fn = nullptr;
    if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  return CUDA_SUCCESS;
}

CUresult fake_get_proc_address_v1(const char* symbol, void** fn, int version, cuuint64_t flags) {
  return fake_get_proc_address_v2(symbol, fn, version, flags, nullptr);
}
