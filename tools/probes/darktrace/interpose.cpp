// Where darktrace meets the program: it stands in front of the driver's cuGetExportTable
// however a library reaches it. Libraries find driver entry points three ways:
//   - linked against libcuda.so.1: the dynamic linker binds cuGetExportTable to ours
//     (LD_PRELOAD comes first in the search order);
//   - dlopen("libcuda.so.1") + dlsym(h, "cuGetExportTable"): our dlsym answers ours;
//   - dlsym(h, "cuGetProcAddress_v2") then cuGetProcAddress("cuGetExportTable") (cudart, and so
//     every library that embeds it): our dlsym answers our cuGetProcAddress, which answers ours.
// Every other entry point is the driver's own, untouched.
#include <cuda.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "trace_log.hpp"
#include "traced_tables.hpp"

namespace {

using GetExportTableFn = CUresult (*)(const void**, const CUuuid*);
using GetProcAddressV1Fn = CUresult (*)(const char*, void**, int, cuuint64_t);
using GetProcAddressV2Fn = CUresult (*)(const char*, void**, int, cuuint64_t,
                                        CUdriverProcAddressQueryResult*);
using DlsymFn = void* (*)(void*, const char*);

// The driver's own entry points, learned from the first lookup that returns one of them.
std::atomic<GetExportTableFn> driver_get_export_table{nullptr};
std::atomic<GetProcAddressV1Fn> driver_get_proc_address_v1{nullptr};
std::atomic<GetProcAddressV2Fn> driver_get_proc_address_v2{nullptr};

DlsymFn real_dlsym() {
  static const DlsymFn fn = [] {
    auto f = reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34"));
    return f != nullptr ? f : reinterpret_cast<DlsymFn>(dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5"));
  }();
  return fn;
}

}  // namespace

// Ours, exported under the driver's names (asm labels: cuda.h #defines cuGetProcAddress to
// cuGetProcAddress_v2).
extern "C" CUresult darktrace_get_export_table(const void** table,
                                               const CUuuid* id) __asm__("cuGetExportTable")
    __attribute__((visibility("default")));
extern "C" CUresult darktrace_get_proc_address_v1(const char* symbol, void** fn, int version,
                                                  cuuint64_t flags) __asm__("cuGetProcAddress")
    __attribute__((visibility("default")));
extern "C" CUresult darktrace_get_proc_address_v2(
    const char* symbol, void** fn, int version, cuuint64_t flags,
    CUdriverProcAddressQueryResult* status) __asm__("cuGetProcAddress_v2")
    __attribute__((visibility("default")));

namespace {

void* ours(const char* name) {
  if (std::strcmp(name, "cuGetExportTable") == 0) {
    return reinterpret_cast<void*>(&darktrace_get_export_table);
  }
  if (std::strcmp(name, "cuGetProcAddress") == 0) {
    return reinterpret_cast<void*>(&darktrace_get_proc_address_v1);
  }
  if (std::strcmp(name, "cuGetProcAddress_v2") == 0) {
    return reinterpret_cast<void*>(&darktrace_get_proc_address_v2);
  }
  return nullptr;
}

// Learns the driver's three lookup functions from any one of its functions `seen` (the driver
// is whatever library holds it), once.
void learn_driver(const void* seen) {
  if (driver_get_export_table.load() != nullptr) return;
  Dl_info info{};
  if (dladdr(seen, &info) == 0 || info.dli_fname == nullptr) return;
  void* handle = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) return;
  driver_get_proc_address_v1.store(
      reinterpret_cast<GetProcAddressV1Fn>(real_dlsym()(handle, "cuGetProcAddress")));
  driver_get_proc_address_v2.store(
      reinterpret_cast<GetProcAddressV2Fn>(real_dlsym()(handle, "cuGetProcAddress_v2")));
  driver_get_export_table.store(
      reinterpret_cast<GetExportTableFn>(real_dlsym()(handle, "cuGetExportTable")));
  darktrace::write_line(darktrace::format("driver %s", info.dli_fname));
  dlclose(handle);  // NOLOAD took a reference of its own; the driver stays loaded
}

// For a program that calls our exports before any lookup showed us the driver: the next
// definition after us (a program linked against libcuda), else $DARKTRACE_DRIVER or
// libcuda.so.1 loaded by name.
void find_driver() {
  if (driver_get_export_table.load() != nullptr) return;
  if (void* next = real_dlsym()(RTLD_NEXT, "cuGetExportTable")) {
    learn_driver(next);
    return;
  }
  const char* name = std::getenv("DARKTRACE_DRIVER");
  void* handle = dlopen(name != nullptr && *name != '\0' ? name : "libcuda.so.1", RTLD_NOW);
  if (handle == nullptr) return;
  if (void* fn = real_dlsym()(handle, "cuGetExportTable")) learn_driver(fn);
}

// What a lookup of `name` that found the driver's `fn` hands out: ours for the three, else fn.
void* substitute(const char* name, void* fn) {
  if (fn == nullptr || name == nullptr) return fn;
  void* mine = ours(name);
  if (mine == nullptr || fn == mine) return fn;
  learn_driver(fn);
  // cuGetProcAddress("cuGetProcAddress", 12000+) answers the _v2 function: match by address.
  if (fn == reinterpret_cast<void*>(driver_get_proc_address_v2.load())) {
    return ours("cuGetProcAddress_v2");
  }
  if (fn == reinterpret_cast<void*>(driver_get_proc_address_v1.load())) {
    return ours("cuGetProcAddress");
  }
  if (fn == reinterpret_cast<void*>(driver_get_export_table.load())) {
    return ours("cuGetExportTable");
  }
  return fn;
}

}  // namespace

extern "C" CUresult darktrace_get_export_table(const void** table, const CUuuid* id) {
  find_driver();
  const GetExportTableFn driver = driver_get_export_table.load();
  if (driver == nullptr) {
    darktrace::write_line("error: the driver's cuGetExportTable was not found");
    return CUDA_ERROR_NOT_INITIALIZED;
  }
  const CUresult result = driver(table, id);
  if (table == nullptr || id == nullptr) return result;
  *table = darktrace::table_for_caller(reinterpret_cast<const unsigned char*>(id->bytes),
                                       result == CUDA_SUCCESS ? *table : nullptr, int(result),
                                       __builtin_return_address(0));
  return result;
}

extern "C" CUresult darktrace_get_proc_address_v1(const char* symbol, void** fn, int version,
                                                  cuuint64_t flags) {
  find_driver();
  const GetProcAddressV1Fn driver = driver_get_proc_address_v1.load();
  if (driver == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult result = driver(symbol, fn, version, flags);
  if (result == CUDA_SUCCESS && fn != nullptr) *fn = substitute(symbol, *fn);
  return result;
}

extern "C" CUresult darktrace_get_proc_address_v2(const char* symbol, void** fn, int version,
                                                  cuuint64_t flags,
                                                  CUdriverProcAddressQueryResult* status) {
  find_driver();
  const GetProcAddressV2Fn driver = driver_get_proc_address_v2.load();
  if (driver == nullptr) return CUDA_ERROR_NOT_INITIALIZED;
  const CUresult result = driver(symbol, fn, version, flags, status);
  if (result == CUDA_SUCCESS && fn != nullptr) *fn = substitute(symbol, *fn);
  return result;
}

// dlsym(RTLD_NEXT, ...) by a caller is answered from darktrace's place in the search order,
// not the caller's: the usual answer, since darktrace comes first.
extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  return substitute(name, real_dlsym()(handle, name));
}
