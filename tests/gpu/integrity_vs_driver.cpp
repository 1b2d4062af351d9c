// The integrity check (docs/private-tables.md) proven against the REAL driver: calls slot 1 of the
// driver's INTEGRITY_CHECK table with several versions (HMAC path and the constant special
// cases 10 and 21) and unix times, from the main thread and from a second thread, and computes
// mpsshim's integrity_digest (libshim/darkapi/integrity.cpp, the code the shim runs) on the
// driver's own inputs: its driver version, getpid, pthread_self, its table and function
// addresses, and per device the UUID and PCI domain/bus/device. PASS only when every case
// matches byte for byte. Prints one line per case, then
//   integrity_vs_driver: cases=N mismatches=M devices=D driver_version=V PASS|FAIL
// Exits 77 (skipped) without a driver or a GPU. Must not run under LD_PRELOAD=libmpsshim.so
// (the shim would answer dlopen("libcuda.so.1")): it refuses to.
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "libshim/darkapi/integrity.hpp"
#include "libshim/darkapi/uuids.hpp"

namespace {

using mpsshim::shim::IntegrityDevice;
using mpsshim::shim::IntegrityInputs;
using mpsshim::shim::Md2Digest;
namespace darkapi = mpsshim::shim::darkapi;

constexpr int kSkip = 77;
constexpr const char* kName = "integrity_vs_driver";

using IntegrityFn = CUresult (*)(std::uint32_t, std::uint64_t, std::uint64_t*);

struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetUuid_v2)(CUuuid*, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, CUdevice_attribute, CUdevice);
  CUresult (*cuGetExportTable)(const void**, const CUuuid*);
};

template <typename Fn>
bool bind(void* lib, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (out == nullptr) std::printf("%s: the driver has no %s\n", kName, name);
  return out != nullptr;
}

std::string hex(const std::uint8_t* bytes, std::size_t n) {
  std::string out;
  char two[3];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(two, sizeof two, "%02x", bytes[i]);
    out += two;
  }
  return out;
}

const void* export_table(const Driver& cu, const darkapi::Uuid& id) {
  CUuuid uuid;
  std::memcpy(uuid.bytes, id.data(), sizeof uuid.bytes);
  const void* table = nullptr;
  if (cu.cuGetExportTable(&table, &uuid) != CUDA_SUCCESS) return nullptr;
  return table;
}

struct Case {
  std::uint32_t version;
  std::uint64_t unix_seconds;
};

struct Tally {
  int cases = 0;
  int mismatches = 0;
};

// Runs every case on the calling thread.
void run_cases(const char* thread_name, IntegrityFn fn, IntegrityInputs inputs,
               const std::vector<Case>& cases, Tally& tally) {
  inputs.thread = static_cast<std::uint32_t>(static_cast<std::uintptr_t>(::pthread_self()));
  for (const Case& c : cases) {
    std::uint64_t real[2] = {0, 0};
    const CUresult rc = fn(c.version, c.unix_seconds, real);
    const Md2Digest ours = mpsshim::shim::integrity_digest(inputs, c.version, c.unix_seconds);
    const bool match = rc == CUDA_SUCCESS && std::memcmp(real, ours.data(), ours.size()) == 0;
    ++tally.cases;
    tally.mismatches += match ? 0 : 1;
    std::printf("case thread=%s version=%u unix_seconds=%llu rc=%d driver=%s mpsshim=%s %s\n",
                thread_name, c.version, static_cast<unsigned long long>(c.unix_seconds),
                static_cast<int>(rc), hex(reinterpret_cast<const std::uint8_t*>(real), 16).c_str(),
                hex(ours.data(), ours.size()).c_str(), match ? "match" : "MISMATCH");
  }
}

}  // namespace

int main() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("%s: no CUDA driver (%s): skipped\n", kName, dlerror());
    return kSkip;
  }
  Driver cu{};
  if (!bind(lib, "cuInit", cu.cuInit) || !bind(lib, "cuDriverGetVersion", cu.cuDriverGetVersion) ||
      !bind(lib, "cuDeviceGetCount", cu.cuDeviceGetCount) ||
      !bind(lib, "cuDeviceGet", cu.cuDeviceGet) ||
      !bind(lib, "cuDeviceGetUuid_v2", cu.cuDeviceGetUuid_v2) ||
      !bind(lib, "cuDeviceGetAttribute", cu.cuDeviceGetAttribute) ||
      !bind(lib, "cuGetExportTable", cu.cuGetExportTable)) {
    std::printf("%s: incomplete driver FAIL\n", kName);
    return 1;
  }
  Dl_info where{};
  if (dladdr(reinterpret_cast<void*>(cu.cuGetExportTable), &where) != 0 &&
      where.dli_fname != nullptr && std::strstr(where.dli_fname, "mpsshim") != nullptr) {
    std::printf("%s: libcuda.so.1 is %s, not the real driver (unset LD_PRELOAD) FAIL\n", kName,
                where.dli_fname);
    return 1;
  }
  if (CUresult rc = cu.cuInit(0); rc != CUDA_SUCCESS) {
    std::printf("%s: cuInit failed (%d): no usable GPU: skipped\n", kName, static_cast<int>(rc));
    return kSkip;
  }
  int driver_version = 0, count = 0;
  cu.cuDriverGetVersion(&driver_version);
  if (cu.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
    std::printf("%s: no devices: skipped\n", kName);
    return kSkip;
  }
  std::vector<IntegrityDevice> devices;
  for (int i = 0; i < count; ++i) {
    CUdevice dev{};
    CUuuid uuid{};
    IntegrityDevice d{};
    if (cu.cuDeviceGet(&dev, i) != CUDA_SUCCESS ||
        cu.cuDeviceGetUuid_v2(&uuid, dev) != CUDA_SUCCESS ||
        cu.cuDeviceGetAttribute(&d.pci_domain, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev) != 0 ||
        cu.cuDeviceGetAttribute(&d.pci_bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev) != 0 ||
        cu.cuDeviceGetAttribute(&d.pci_device, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev) != 0) {
      std::printf("%s: device %d queries failed FAIL\n", kName, i);
      return 1;
    }
    std::memcpy(d.uuid.data(), uuid.bytes, d.uuid.size());
    std::printf("device %d uuid=%s pci=%04x:%02x:%02x\n", i, hex(d.uuid.data(), 16).c_str(),
                d.pci_domain, d.pci_bus, d.pci_device);
    devices.push_back(d);
  }
  const void* cudart_table = export_table(cu, darkapi::kCudartInterfaceId);
  const void* integrity_table = export_table(cu, darkapi::kIntegrityCheckId);
  if (cudart_table == nullptr || integrity_table == nullptr) {
    std::printf("%s: the driver serves no CUDART_INTERFACE or INTEGRITY_CHECK table FAIL\n", kName);
    return 1;
  }
  const auto fn = reinterpret_cast<IntegrityFn>(static_cast<void* const*>(integrity_table)[1]);
  IntegrityInputs inputs{
      .driver_version = static_cast<std::uint32_t>(driver_version),
      .pid = static_cast<std::uint32_t>(::getpid()),
      .thread = 0,  // per calling thread, in run_cases
      .cudart_table = reinterpret_cast<std::uintptr_t>(cudart_table),
      .integrity_table = reinterpret_cast<std::uintptr_t>(integrity_table),
      .fn_address = reinterpret_cast<std::uintptr_t>(fn),
      .devices = devices,
  };
  const auto now = static_cast<std::uint64_t>(std::time(nullptr));
  std::vector<Case> cases;
  // 13000..13002 as the CUDA 13.0 runtime calls it; 12082 as a 12.8 runtime did; 10 and 21 are
  // the constant special cases.
  for (std::uint32_t version : {2u, 3u, 7u, 12082u, 13002u, 10u, 21u, 13000u, 13001u}) {
    for (std::uint64_t t : {now, std::uint64_t{0}, std::uint64_t{1700000000},
                            std::uint64_t{0xffffffffull}, std::uint64_t{1} << 40}) {
      cases.push_back({version, t});
    }
  }
  Tally main_tally, second_tally;
  run_cases("main", fn, inputs, cases, main_tally);
  std::thread second([&] { run_cases("second", fn, inputs, cases, second_tally); });
  second.join();
  const int total = main_tally.cases + second_tally.cases;
  const int mismatches = main_tally.mismatches + second_tally.mismatches;
  std::printf("%s: cases=%d mismatches=%d devices=%d driver_version=%d %s\n", kName, total,
              mismatches, count, driver_version, mismatches == 0 ? "PASS" : "FAIL");
  return mismatches == 0 ? 0 : 1;
}
