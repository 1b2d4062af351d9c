// Private tables whose functions compute on the client's own memory and never touch a GPU, so
// the shim hands out the *real* driver's table, loaded into the client process beside the shim
// (docs/private-tables.md, "cuBLASLt's kernel table").
//
// cuBLASLt asks for 1734dc26… before it loads its nvjet kernels (the bf16/fp8 matmuls of
// Hopper): slot 4 makes two objects in host memory, slot 13 fills them, then cuBLASLt loads the
// result with the public cuLibraryLoadData. Measured on an H100 (driver 580): no public driver
// call happens between the slots, and cuBLASLt dies with SIGSEGV when the table is refused. Its
// slots' meaning is unknown, so they cannot be re-implemented; the real driver's code runs
// them instead. The real libcuda is opened by path (the shim owns the SONAME libcuda.so.1), with
// RTLD_DEEPBIND so that its own references resolve inside it rather than to the shim's exports,
// and never initialised (no cuInit): it opens no device.
//
// Where no real driver is present in the client's file system (a container given only the
// shim), the table is refused as before and the log says why.
#include <cuda.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/log.hpp"
#include "libshim/darkapi/tables.hpp"

namespace mpsshim::shim::darkapi {
namespace {

using GetExportTable = CUresult (*)(const void**, const CUuuid*);

bool same_file(const char* a, const char* b) noexcept {
  struct stat sa {
  }, sb{};
  return ::stat(a, &sa) == 0 && ::stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// Where the real driver may live: MPSSHIM_HOST_DRIVER, then LD_LIBRARY_PATH, then the places
// distributions and the NVIDIA container runtime put it.
std::vector<std::string> candidates() {
  std::vector<std::string> paths;
  if (const char* chosen = std::getenv("MPSSHIM_HOST_DRIVER"); chosen != nullptr && *chosen) {
    paths.emplace_back(chosen);
    return paths;
  }
  if (const char* search = std::getenv("LD_LIBRARY_PATH"); search != nullptr) {
    std::string_view rest(search);
    while (!rest.empty()) {
      std::size_t colon = rest.find(':');
      std::string_view dir = rest.substr(0, colon);
      if (!dir.empty()) paths.push_back(std::string(dir) + "/libcuda.so.1");
      rest = colon == std::string_view::npos ? std::string_view{} : rest.substr(colon + 1);
    }
  }
  for (const char* dir : {"/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64",
                          "/lib/x86_64-linux-gnu", "/lib64", "/usr/lib/aarch64-linux-gnu"}) {
    paths.push_back(std::string(dir) + "/libcuda.so.1");
  }
  return paths;
}

// The real driver's cuGetExportTable, or null. Opened once, on the first request.
GetExportTable host_get_export_table() noexcept {
  static std::once_flag once;
  static GetExportTable found = nullptr;
  std::call_once(once, [] {
    Dl_info self{};
    if (::dladdr(reinterpret_cast<const void*>(&host_get_export_table), &self) == 0) return;
    try {
      for (const std::string& path : candidates()) {
        if (::access(path.c_str(), R_OK) != 0) continue;
        if (self.dli_fname != nullptr && same_file(path.c_str(), self.dli_fname)) continue;
        void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
        if (handle == nullptr) continue;
        auto get = reinterpret_cast<GetExportTable>(::dlsym(handle, "cuGetExportTable"));
        Dl_info where{};
        // A library that answers cuGetExportTable from the shim itself is another copy of it.
        if (get == nullptr || ::dladdr(reinterpret_cast<const void*>(get), &where) == 0 ||
            (self.dli_fbase != nullptr && where.dli_fbase == self.dli_fbase)) {
          ::dlclose(handle);
          continue;
        }
        log_info("private tables of the host's driver come from {}", path);
        found = get;
        return;
      }
    } catch (...) {
    }
  });
  return found;
}

}  // namespace

const void* host_driver_table(const CUuuid& id) noexcept {
  GetExportTable get = host_get_export_table();
  if (get == nullptr) {
    static constinit std::atomic<bool> logged{false};
    log_once(logged, LogLevel::kWarn,
             "cuGetExportTable: no real libcuda.so.1 found in this process's file system to "
             "serve a host-side private table (set MPSSHIM_HOST_DRIVER to its path); refused");
    return nullptr;
  }
  const void* table = nullptr;
  if (get(&table, &id) != CUDA_SUCCESS) return nullptr;
  return table;
}

}  // namespace mpsshim::shim::darkapi
