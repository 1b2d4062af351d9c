// Virtual memory management: physical allocations (memfds), address reservations and the
// mappings between them, with the driver's rules on granularity, access and teardown
// (virtual_memory.hpp). A shareable handle is the allocation's memfd (a POSIX fd, as the real
// driver's is an fd): another process imports it and maps the same bytes.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>

#include "tests/testdriver/device_memory.hpp"
#include "tests/testdriver/fault_injection.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

bool aligned(std::uint64_t v) {
  return v % kVmmGranularity == 0;
}

bool wraps(std::uintptr_t address, std::size_t bytes) {
  return address + bytes < address;
}

std::byte* map_none(void* hint, std::size_t size, int extra_flags) {
  void* p =
      mmap(hint, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra_flags, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<std::byte*>(p);
}

// Where reservations without a wish go, as the real driver places them: from the same address in
// every process (two H200 servers each got 0x4a20000000 for their first 16 GiB reservation), so
// two processes' reservations collide.
constexpr std::uintptr_t kFirstReservation = 0x7c0000000000;
std::uintptr_t next_reservation = kFirstReservation;  // under State::mutex

// `size` bytes of PROT_NONE addresses aligned to `alignment`, at `wish` when that is free.
std::byte* reserve_aligned(std::size_t size, std::size_t alignment, std::uintptr_t wish) {
  if (wish == 0) {
    const std::uintptr_t at = (next_reservation + alignment - 1) / alignment * alignment;
    if (std::byte* p = reserve_exactly(at, size)) {
      next_reservation = at + size;
      return p;
    }
  }
  if (wish != 0 && wish % alignment == 0) {
    if (std::byte* p = reserve_exactly(wish, size)) return p;
  }
  std::byte* raw = map_none(nullptr, size + alignment, 0);
  if (raw == nullptr) return nullptr;
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t start = (base + alignment - 1) / alignment * alignment;
  if (start > base) munmap(raw, start - base);
  const std::size_t tail = base + size + alignment - (start + size);
  if (tail > 0) munmap(reinterpret_cast<void*>(start + size), tail);
  return reinterpret_cast<std::byte*>(start);
}

// The properties the test device can back: pinned device memory of a device that exists.
CUresult check_prop(State& s, const CUmemAllocationProp* prop) {
  if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
  if (!valid_device(s, prop->location.id) || prop->location.id >= kVmmMaxDevices) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  constexpr unsigned kHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if ((prop->requestedHandleTypes & ~kHandleTypes) != 0) return CUDA_ERROR_NOT_SUPPORTED;
  if (prop->win32HandleMetaData != nullptr) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}

// The reservation [address, address + bytes) lies in, or end().
auto reservation_holding(State& s, std::uintptr_t address, std::size_t bytes) {
  auto& reservations = s.vmm.reservations;
  auto after = reservations.upper_bound(address);
  if (after == reservations.begin() || wraps(address, bytes)) return reservations.end();
  auto it = std::prev(after);
  if (address + bytes > it->first + it->second.size) return reservations.end();
  return it;
}

bool overlaps_mapping(const State& s, std::uintptr_t address, std::size_t bytes) {
  const auto& mappings = s.vmm.mappings;
  auto next = mappings.lower_bound(address);
  if (next != mappings.end() && next->first < address + bytes) return true;
  if (next == mappings.begin()) return false;
  auto prev = std::prev(next);
  return prev->first + prev->second.size > address;
}

// The bases of the mappings that exactly make up [address, address + bytes); empty when the
// range is not a run of whole, back-to-back mappings.
std::vector<std::uintptr_t> whole_mappings(const State& s, std::uintptr_t address,
                                           std::size_t bytes) {
  std::vector<std::uintptr_t> bases;
  if (bytes == 0 || wraps(address, bytes)) return bases;
  std::uintptr_t at = address;
  for (auto it = s.vmm.mappings.find(address); at < address + bytes; ++it) {
    if (it == s.vmm.mappings.end() || it->first != at) return {};
    bases.push_back(at);
    at += it->second.size;
  }
  if (at != address + bytes) return {};
  return bases;
}

// Takes the memfd out of the shadow again, leaving a hole that faults (locked, memory_use held
// exclusively).
void unmap_locked(State& s, std::uintptr_t base) {
  auto it = s.vmm.mappings.find(base);
  const VaReservation& reservation = s.vmm.reservations.at(it->second.reservation);
  std::byte* view = reservation.shadow + (base - it->second.reservation);
  map_none(view, it->second.size, MAP_FIXED);
  auto physical = s.vmm.physical.find(it->second.handle);
  --physical->second.mappings;
  if (physical->second.refs == 0 && physical->second.mappings == 0) {
    destroy_physical(s, it->second.handle);
  }
  s.vmm.mappings.erase(it);
}

}  // namespace

void destroy_physical(State& s, CUmemGenericAllocationHandle handle) {
  auto it = s.vmm.physical.find(handle);
  close(it->second.memfd);
  if (!it->second.imported) {
    s.vmm.physical_bytes[static_cast<std::size_t>(it->second.device)] -= it->second.size;
  }
  s.vmm.physical.erase(it);
}

std::byte* resolve_mapped_locked(State& s, std::uintptr_t addr, std::size_t bytes) {
  if (s.vmm.mappings.empty() || wraps(addr, bytes)) return nullptr;
  auto reservation = reservation_holding(s, addr, std::max<std::size_t>(bytes, 1));
  if (reservation == s.vmm.reservations.end()) return nullptr;
  // Every byte must be in a mapping its own device may read and write.
  auto after = s.vmm.mappings.upper_bound(addr);
  if (after == s.vmm.mappings.begin()) return nullptr;
  auto it = std::prev(after);
  std::uintptr_t covered = it->first;
  for (; covered < addr + std::max<std::size_t>(bytes, 1); ++it) {
    if (it == s.vmm.mappings.end() || it->first != covered) return nullptr;
    const PhysicalAllocation& physical = s.vmm.physical.at(it->second.handle);
    // Another process's memory (imported) is this process's device's through a peer mapping:
    // it must be read-write for some device here.
    const auto& access = it->second.access;
    const bool writable = physical.imported
                              ? std::any_of(access.begin(), access.end(),
                                            [](unsigned long long a) {
                                              return a == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                                            })
                              : access[static_cast<std::size_t>(physical.device)] ==
                                    CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (!writable) return nullptr;
    covered += it->second.size;
  }
  return reservation->second.shadow + (addr - reservation->first);
}

int live_vmm_objects(const State& s) {
  return static_cast<int>(s.vmm.physical.size() + s.vmm.reservations.size());
}

}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemGetAllocationGranularity(
    size_t* granularity, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags option) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (granularity == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
        option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult r = check_prop(s, prop); r != CUDA_SUCCESS) return r;
    *granularity = kVmmGranularity;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle* handle,
                                                       size_t size, const CUmemAllocationProp* prop,
                                                       unsigned long long flags) {
  return entry([&](State& s) {
    if (inject_failure("cuMemCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    if (handle == nullptr || size == 0 || !aligned(size) || flags != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (CUresult r = check_prop(s, prop); r != CUDA_SUCCESS) return r;
    Device& dev = *s.devices[static_cast<std::size_t>(prop->location.id)];
    std::size_t& physical = s.vmm.physical_bytes[static_cast<std::size_t>(dev.ordinal)];
    if (size > dev.memory.size() - std::min(dev.memory.size(), dev.memory.used() + physical)) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    const int fd = memfd_create("mpsshim-testdriver-vmm", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
      close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    const CUmemGenericAllocationHandle h = s.vmm.next_handle++;
    s.vmm.physical.emplace(h, PhysicalAllocation{dev.ordinal, size, fd, *prop, 1, 0});
    physical += size;
    *handle = h;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                             CUmemAllocationHandleType type, unsigned long long flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (shareable == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    auto it = s.vmm.physical.find(handle);
    if (it == s.vmm.physical.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    // Only what was created asking for that handle type, as the driver requires.
    if ((it->second.prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const int fd = fcntl(it->second.memfd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *static_cast<int*>(shareable) = fd;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(
    CUmemGenericAllocationHandle* handle, void* shareable, CUmemAllocationHandleType type) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    const int given = static_cast<int>(reinterpret_cast<std::intptr_t>(shareable));
    struct stat st {};
    if (fstat(given, &st) != 0 || st.st_size <= 0 ||
        !aligned(static_cast<std::size_t>(st.st_size))) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    // The caller keeps its fd, as with the driver.
    const int fd = fcntl(given, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    const CUmemGenericAllocationHandle h = s.vmm.next_handle++;
    PhysicalAllocation imported{0, static_cast<std::size_t>(st.st_size), fd, prop, 1, 0};
    imported.imported = true;
    s.vmm.physical.emplace(h, imported);
    *handle = h;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    auto it = s.vmm.physical.find(handle);
    if (it == s.vmm.physical.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
    // Mapped memory stays until its last mapping goes (cuMemUnmap frees it then).
    if (--it->second.refs == 0 && it->second.mappings == 0) destroy_physical(s, handle);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr* ptr, size_t size,
                                                               size_t alignment, CUdeviceptr addr,
                                                               unsigned long long flags) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (ptr == nullptr || size == 0 || !aligned(size) || flags != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (alignment == 0) alignment = kVmmGranularity;
    if ((alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
    alignment = std::max(alignment, kVmmGranularity);
    std::byte* device_range = reserve_aligned(size, alignment, addr);
    std::byte* shadow = map_none(nullptr, size, 0);
    if (device_range == nullptr || shadow == nullptr) {
      if (device_range != nullptr) munmap(device_range, size);
      if (shadow != nullptr) munmap(shadow, size);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    const auto base = reinterpret_cast<std::uintptr_t>(device_range);
    s.vmm.reservations.emplace(base, VaReservation{size, device_range, shadow});
    *ptr = base;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    auto it = s.vmm.reservations.find(ptr);
    if (it == s.vmm.reservations.end() || it->second.size != size) return CUDA_ERROR_INVALID_VALUE;
    if (overlaps_mapping(s, ptr, size)) return CUDA_ERROR_INVALID_VALUE;  // unmap first
    munmap(it->second.device_range, size);
    munmap(it->second.shadow, size);
    s.vmm.reservations.erase(it);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                                                    CUmemGenericAllocationHandle handle,
                                                    unsigned long long flags) {
  return entry([&](State& s) {
    if (inject_failure("cuMemMap")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    if (size == 0 || flags != 0 || !aligned(ptr) || !aligned(size) || !aligned(offset)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto physical = s.vmm.physical.find(handle);
    if (physical == s.vmm.physical.end() || physical->second.refs == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (offset > physical->second.size || size > physical->second.size - offset) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    auto reservation = reservation_holding(s, ptr, size);
    if (reservation == s.vmm.reservations.end() || overlaps_mapping(s, ptr, size)) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    std::byte* view = reservation->second.shadow + (ptr - reservation->first);
    // The access flags start at none: the bytes are reached only once cuMemSetAccess allows it.
    void* mapped = mmap(view, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                        physical->second.memfd, static_cast<off_t>(offset));
    if (mapped == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    s.vmm.mappings.emplace(ptr, VaMapping{size, handle, reservation->first, {}});
    ++physical->second.mappings;
    return CUDA_SUCCESS;
  });
}

// Like the driver, waits for the device's queued work first: nothing running may still use it.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return entry([&](State& s) {
    {
      std::lock_guard lock(s.mutex);
      if (whole_mappings(s, ptr, size).empty()) return CUDA_ERROR_INVALID_VALUE;
    }
    drain(s, -1);
    std::unique_lock use(s.memory_use);
    std::lock_guard lock(s.mutex);
    std::vector<std::uintptr_t> bases = whole_mappings(s, ptr, size);
    if (bases.empty()) return CUDA_ERROR_INVALID_VALUE;
    for (std::uintptr_t base : bases) unmap_locked(s, base);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size,
                                                          const CUmemAccessDesc* desc,
                                                          size_t count) {
  return entry([&](State& s) {
    if (inject_failure("cuMemSetAccess")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; ++i) {
      if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
      if (!valid_device(s, desc[i].location.id) || desc[i].location.id >= kVmmMaxDevices) {
        return CUDA_ERROR_INVALID_DEVICE;
      }
      const unsigned flags = desc[i].flags;
      if (flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
    }
    // "A fully mapped address range containing all allocations" it names: whole mappings.
    std::vector<std::uintptr_t> bases = whole_mappings(s, ptr, size);
    if (bases.empty()) return CUDA_ERROR_INVALID_VALUE;
    for (std::uintptr_t base : bases) {
      VaMapping& mapping = s.vmm.mappings.at(base);
      for (size_t i = 0; i < count; ++i) {
        mapping.access[static_cast<std::size_t>(desc[i].location.id)] = desc[i].flags;
      }
    }
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemGetAccess(unsigned long long* flags,
                                                          const CUmemLocation* location,
                                                          CUdeviceptr ptr) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (flags == nullptr || location == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (location->type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
    if (!valid_device(s, location->id) || location->id >= kVmmMaxDevices) {
      return CUDA_ERROR_INVALID_DEVICE;
    }
    auto after = s.vmm.mappings.upper_bound(ptr);
    if (after == s.vmm.mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
    auto it = std::prev(after);
    if (ptr - it->first >= it->second.size) return CUDA_ERROR_INVALID_VALUE;
    *flags = it->second.access[static_cast<std::size_t>(location->id)];
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(
    CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    auto it = s.vmm.physical.find(handle);
    if (prop == nullptr || it == s.vmm.physical.end() || it->second.refs == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    *prop = it->second.prop;
    return CUDA_SUCCESS;
  });
}

// The handle that maps `addr`, with one more reference the caller releases again.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI
cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    const auto ptr = reinterpret_cast<std::uintptr_t>(addr);
    auto after = s.vmm.mappings.upper_bound(ptr);
    if (handle == nullptr || after == s.vmm.mappings.begin()) return CUDA_ERROR_INVALID_VALUE;
    auto it = std::prev(after);
    if (ptr - it->first >= it->second.size) return CUDA_ERROR_INVALID_VALUE;
    ++s.vmm.physical.at(it->second.handle).refs;
    *handle = it->second.handle;
    return CUDA_SUCCESS;
  });
}
