// The INTEGRITY_CHECK algorithm (docs/private-tables.md) as a pure function of its inputs. cudart
// recomputes the same value from what the driver API shows it, so every input must be what the
// application sees through the shim; integrity_check.cpp gathers them.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "libshim/darkapi/md2.hpp"

namespace mpsshim::shim {

// One 28-byte device record: cuDeviceGetUuid_v2, then attributes 50, 33, 34.
struct IntegrityDevice {
  std::array<std::uint8_t, 16> uuid;
  std::int32_t pci_domain;  // CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID (50)
  std::int32_t pci_bus;     // CU_DEVICE_ATTRIBUTE_PCI_BUS_ID (33)
  std::int32_t pci_device;  // CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID (34)
};

struct IntegrityInputs {
  std::uint32_t driver_version;  // what cuDriverGetVersion reports
  std::uint32_t pid;
  std::uint32_t thread;           // low 32 bits of pthread_self() of the calling thread
  std::uint64_t cudart_table;     // address of CUDART_INTERFACE as cuGetExportTable gives it
  std::uint64_t integrity_table;  // address of INTEGRITY_CHECK
  std::uint64_t fn_address;       // INTEGRITY_CHECK slot 1
  std::span<const IntegrityDevice> devices;  // in ordinal order
};

inline constexpr std::array<std::uint8_t, 16> kIntegrityKey{
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F};

using IntegrityHeader = std::array<std::uint8_t, 48>;
using IntegrityRecord = std::array<std::uint8_t, 28>;

// The little-endian message pieces: the header, then one record per device, no padding.
IntegrityHeader integrity_header(const IntegrityInputs& in, std::uint32_t version,
                                 std::uint64_t unix_seconds) noexcept;
IntegrityRecord integrity_record(const IntegrityDevice& device) noexcept;

// MD2((K ^ 0x36..) || message), the HMAC's inner hash (a test-vector intermediate).
Md2Digest integrity_inner_digest(const IntegrityInputs& in, std::uint32_t version,
                                 std::uint64_t unix_seconds) noexcept;

// The 16 bytes the driver writes to `result`: fixed constants when version % 10 is 0 or 1,
// otherwise HMAC-MD2 of the message under kIntegrityKey.
Md2Digest integrity_digest(const IntegrityInputs& in, std::uint32_t version,
                           std::uint64_t unix_seconds) noexcept;

}  // namespace mpsshim::shim
