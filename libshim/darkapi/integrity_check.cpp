// INTEGRITY_CHECK (d4082055…, docs/private-tables.md): cudart calls slot 1 at start-up (versions
// runtime+0, +1, +2) and fails with cudaErrorSoftwareValidityNotEstablished (103) unless the
// answer matches what it recomputes from the driver API. So the inputs gathered here are the
// ones the application sees: the advertised driver version, this shim's table addresses and
// the device snapshots behind cuDeviceGetUuid / cuDeviceGetAttribute.
#include <cuda.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/log.hpp"
#include "libshim/client_view.hpp"
#include "libshim/darkapi/integrity.hpp"
#include "libshim/darkapi/tables.hpp"
#include "libshim/darkapi/trap_slots.hpp"

namespace mpsshim::shim::darkapi {
namespace {

CUresult integrity_check(std::uint32_t version, std::uint64_t unix_seconds,
                         std::uint64_t* result) noexcept;

// One int; a NULL slot reportedly fails the CUDA 12.9 runtime.
CUresult set_enabled(int) noexcept {
  return CUDA_SUCCESS;
}

struct IntegrityCheckTable {
  std::size_t size;
  CUresult (*check)(std::uint32_t, std::uint64_t, std::uint64_t*) noexcept;
  CUresult (*set_enabled)(int) noexcept;
};
static_assert(sizeof(IntegrityCheckTable) == 3 * sizeof(void*));

constinit const IntegrityCheckTable kIntegrityCheck{table_size_word(3), &integrity_check,
                                                    &set_enabled};

std::uint64_t address(const void* p) noexcept {
  return reinterpret_cast<std::uintptr_t>(p);
}

// Device records in ordinal order, as cuDeviceGetUuid_v2 and cuDeviceGetAttribute report them.
bool gather_devices(std::vector<IntegrityDevice>& out) noexcept {
  try {
    const int count = visible_device_count();
    out.reserve(static_cast<std::size_t>(std::max(count, 0)));
    for (int ordinal = 0; ordinal < count; ++ordinal) {
      const proto::DeviceSnapshot* snap = device_snapshot(ordinal);
      if (snap == nullptr) {
        // cudart could not see this device either; hashing what it can see is all we can do.
        log_warn("integrity check: no snapshot of visible device {}", ordinal);
        continue;
      }
      IntegrityDevice d{};
      std::memcpy(d.uuid.data(), snap->uuid, d.uuid.size());
      d.pci_domain = snap->attributes[CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID];
      d.pci_bus = snap->attributes[CU_DEVICE_ATTRIBUTE_PCI_BUS_ID];
      d.pci_device = snap->attributes[CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID];
      out.push_back(d);
    }
    return true;
  } catch (...) {  // allocation failure
    return false;
  }
}

CUresult integrity_check(std::uint32_t version, std::uint64_t unix_seconds,
                         std::uint64_t* result) noexcept {
  if (result == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<IntegrityDevice> devices;
  if (!gather_devices(devices)) return CUDA_ERROR_OUT_OF_MEMORY;
  const IntegrityInputs inputs{
      .driver_version = static_cast<std::uint32_t>(advertised_driver_version()),
      .pid = static_cast<std::uint32_t>(::getpid()),
      // pthread_t is an address on glibc; the driver hashes its low half.
      .thread = static_cast<std::uint32_t>(static_cast<std::uintptr_t>(::pthread_self())),
      .cudart_table = address(cudart_interface_table()),
      .integrity_table = address(&kIntegrityCheck),
      // The function as the table holds it, not as this TU names it.
      .fn_address = reinterpret_cast<std::uintptr_t>(kIntegrityCheck.check),
      .devices = devices,
  };
  const Md2Digest digest = integrity_digest(inputs, version, unix_seconds);
  std::memcpy(result, digest.data(), digest.size());
  return CUDA_SUCCESS;
}

}  // namespace

const void* integrity_check_table() noexcept {
  return &kIntegrityCheck;
}

}  // namespace mpsshim::shim::darkapi
