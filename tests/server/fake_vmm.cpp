// The fake driver's virtual memory management: handles, reservations and mappings counted, and
// the calls that give them back logged in order, for the server's session-end teardown.
#include "tests/server/fake_driver.hpp"

#include <sys/mman.h>

#include "proto/address_arenas.hpp"

namespace mpsshim::server::test {

void add_vmm_fakes(DriverTable& t) {
  constexpr std::size_t kGranule = std::size_t{2} << 20;
  t.cuMemGetAllocationGranularity = [](std::size_t* g, const CUmemAllocationProp*,
                                       CUmemAllocationGranularity_flags) {
    *g = kGranule;
    return CUDA_SUCCESS;
  };
  t.cuMemCreate = [](CUmemGenericAllocationHandle* h, std::size_t bytes, const CUmemAllocationProp*,
                     unsigned long long) {
    if (bytes == 0 || bytes % kGranule != 0) return CUDA_ERROR_INVALID_VALUE;
    *h = fake_gpu().next_vmm_handle++;
    fake_gpu().vmm_handles[*h] = bytes;
    return CUDA_SUCCESS;
  };
  t.cuMemRelease = [](CUmemGenericAllocationHandle h) {
    fake_gpu().vmm_teardown.push_back("release");
    return fake_gpu().vmm_handles.erase(h) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  };
  t.cuMemAddressReserve = [](CUdeviceptr* p, std::size_t bytes, std::size_t, CUdeviceptr want,
                             unsigned long long) {
    // No room for the server's window of arenas (kArenaWindowBytes at a fixed address): the
    // in-process server tests run the driver-placed path; device_heap_test and the e2e tests (on
    // the test driver) the arena's.
    if (proto::arena_holding(want) >= 0 && bytes >= proto::kArenaBytes) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *p = fake_gpu().next_reservation;
    fake_gpu().next_reservation += bytes + kGranule;  // a gap: reservations never touch
    fake_gpu().vmm_reservations[*p] = bytes;
    return CUDA_SUCCESS;
  };
  t.cuMemAddressFree = [](CUdeviceptr p, std::size_t) {
    fake_gpu().vmm_teardown.push_back("free");
    return fake_gpu().vmm_reservations.erase(p) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  };
  t.cuMemMap = [](CUdeviceptr p, std::size_t bytes, std::size_t, CUmemGenericAllocationHandle h,
                  unsigned long long) {
    if (fake_gpu().vmm_handles.count(h) == 0) return CUDA_ERROR_INVALID_VALUE;
    fake_gpu().vmm_mappings[p] = bytes;
    return CUDA_SUCCESS;
  };
  t.cuMemUnmap = [](CUdeviceptr p, std::size_t) {
    fake_gpu().vmm_teardown.push_back("unmap");
    return fake_gpu().vmm_mappings.erase(p) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  };
  t.cuMemSetAccess = [](CUdeviceptr, std::size_t, const CUmemAccessDesc*, std::size_t) {
    return CUDA_SUCCESS;
  };
  // One device: no peers. A physical allocation exports as an fd of a memfd of its own (what the
  // server hands on is all the tests look at); nothing imports.
  t.cuMemExportToShareableHandle = [](void* out, CUmemGenericAllocationHandle h,
                                      CUmemAllocationHandleType type, unsigned long long) {
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fake_gpu().vmm_handles.count(h) == 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    const int fd = ::memfd_create("fake-vmm-export", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
    *static_cast<int*>(out) = fd;
    ++fake_gpu().vmm_exports;
    return CUDA_SUCCESS;
  };
  t.cuMemImportFromShareableHandle = [](CUmemGenericAllocationHandle*, void*,
                                        CUmemAllocationHandleType) {
    return CUDA_ERROR_NOT_SUPPORTED;
  };
  t.cuDeviceCanAccessPeer = [](int* can, CUdevice, CUdevice) {
    *can = 0;
    return CUDA_SUCCESS;
  };
  t.cuDeviceGetP2PAttribute = [](int*, CUdevice_P2PAttribute, CUdevice, CUdevice) {
    return CUDA_ERROR_INVALID_DEVICE;
  };
}

}  // namespace mpsshim::server::test
