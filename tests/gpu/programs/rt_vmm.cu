// Virtual memory management as an expandable allocator uses it (PyTorch's expandable segments,
// XLA): one large reservation, physical chunks created and mapped into it as it grows, kernels
// writing through the whole mapped range (across chunk boundaries), copies and a memset across
// boundaries, cuMemRetainAllocationHandle and cuMemGetAccess, then shrinking chunk by chunk.
// Also run on the CPU by the cudart suite (tests/cudart, on the host-memory test driver).
// The driver calls are fetched with cudaGetDriverEntryPointByVersion, as the runtime-based
// libraries fetch them (through the shim's cuGetProcAddress under mpsshim). Exit 77 without a GPU.
static const char* const kProgram = "rt_vmm";
#include <cuda.h>

#include <algorithm>
#include <vector>

#include "rt_driver.cuh"

namespace {

#define DRIVER_FUNCTIONS(X)        \
  X(cuMemGetAllocationGranularity) \
  X(cuMemCreate)                   \
  X(cuMemRelease)                  \
  X(cuMemAddressReserve)           \
  X(cuMemAddressFree)              \
  X(cuMemMap)                      \
  X(cuMemUnmap)                    \
  X(cuMemSetAccess)                \
  X(cuMemGetAccess)                \
  X(cuMemRetainAllocationHandle)   \
  X(cuMemGetAllocationPropertiesFromHandle)

struct Driver {
#define MEMBER(name) decltype(&::name) name = nullptr;
  DRIVER_FUNCTIONS(MEMBER)
#undef MEMBER
};

Driver load_driver() {
  Driver d;
  cudaDriverEntryPointQueryResult status;
#define LOAD(name)                                                                           \
  RT_CHECK(cudaGetDriverEntryPointByVersion(#name, reinterpret_cast<void**>(&d.name), 12000, \
                                            cudaEnableDefault, &status));                    \
  if (status != cudaDriverEntryPointSuccess || d.name == nullptr) {                          \
    std::printf("%s: driver entry point %s not found FAIL\n", kProgram, #name);              \
    std::exit(1);                                                                            \
  }
  DRIVER_FUNCTIONS(LOAD)
#undef LOAD
  return d;
}

}  // namespace

// extern "C", with the names and bodies the host-memory test driver models
// (tests/testdriver/kernels.cpp), so that the cudart suite runs this program on the CPU too.
extern "C" __global__ void fill_u32(unsigned* p, unsigned value, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = value;
}

extern "C" __global__ void increment_i32(int* p, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] += 1;
}

int main(int argc, char** argv) {
  // At least 4 chunks: the copies and the memset below each need a boundary of their own.
  const int max_chunks = std::max(4, argc > 1 ? std::atoi(argv[1]) : 8);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA device: skipped\n", kProgram);
    return 77;
  }
  RT_CHECK(cudaSetDevice(0));
  RT_CHECK(cudaFree(nullptr));  // the primary context, current
  const Driver cu = load_driver();

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  std::size_t granularity = 0;
  CU_CHECK(
      cu.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const std::size_t reserved = 64 * granularity;
  CUdeviceptr va = 0;
  CU_CHECK(cu.cuMemAddressReserve(&va, reserved, 0, 0, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  cudaStream_t stream;
  RT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<CUmemGenericAllocationHandle> handles;
  std::vector<unsigned> host;
  int wrong = 0;
  std::uint64_t checksum = 1469598103934665603ull;
  // Grow: one more chunk each round; everything mapped so far is written and checked.
  for (int chunk = 0; chunk < max_chunks; ++chunk) {
    CUmemGenericAllocationHandle handle;
    CU_CHECK(cu.cuMemCreate(&handle, granularity, &prop, 0));
    CU_CHECK(cu.cuMemMap(va + chunk * granularity, granularity, 0, handle, 0));
    CU_CHECK(cu.cuMemSetAccess(va + chunk * granularity, granularity, &access, 1));
    handles.push_back(handle);
    const int n = static_cast<int>((chunk + 1) * granularity / sizeof(unsigned));
    auto* p = reinterpret_cast<unsigned*>(va);
    const unsigned seed = 0x9e3779b9u * (chunk + 1);
    fill_u32<<<256, 256, 0, stream>>>(p, seed, n);
    RT_CHECK_LAUNCH();
    // Every round but the first adds one to the new chunk and the last old one, across their
    // boundary.
    const int tail = static_cast<int>(granularity / sizeof(unsigned));
    if (chunk > 0) {
      increment_i32<<<256, 256, 0, stream>>>(reinterpret_cast<int*>(p) + n - 2 * tail, 2 * tail);
      RT_CHECK_LAUNCH();
    }
    host.assign(n, 0);
    RT_CHECK(cudaMemcpyAsync(host.data(), p, n * sizeof(unsigned), cudaMemcpyDeviceToHost, stream));
    RT_CHECK(cudaStreamSynchronize(stream));
    for (int i = 0; i < n; ++i)
      wrong += host[i] != seed + (chunk > 0 && i >= n - 2 * tail ? 1u : 0u);
    checksum = rt_checksum(host.data(), n * sizeof(unsigned), checksum);
  }
  const std::size_t mapped = handles.size() * granularity;

  // Copies and a memset that straddle chunk boundaries.
  std::vector<unsigned> pattern(granularity / sizeof(unsigned));
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned>(i * 7919u);
  const CUdeviceptr straddle = va + granularity / 2;  // chunk 0 into chunk 1
  RT_CHECK(cudaMemcpy(reinterpret_cast<void*>(straddle), pattern.data(), granularity,
                      cudaMemcpyHostToDevice));
  RT_CHECK(cudaMemcpy(reinterpret_cast<void*>(va + mapped - granularity - 4096),
                      reinterpret_cast<void*>(straddle), granularity, cudaMemcpyDeviceToDevice));
  RT_CHECK(cudaMemset(reinterpret_cast<void*>(va + 2 * granularity - 256), 0xab, 512));
  std::vector<unsigned> back(pattern.size());
  RT_CHECK(cudaMemcpy(back.data(), reinterpret_cast<void*>(va + mapped - granularity - 4096),
                      granularity, cudaMemcpyDeviceToHost));
  int copy_wrong = back != pattern;
  unsigned char boundary[512];
  RT_CHECK(cudaMemcpy(boundary, reinterpret_cast<void*>(va + 2 * granularity - 256), 512,
                      cudaMemcpyDeviceToHost));
  for (unsigned char b : boundary) copy_wrong += b != 0xab;

  // The handle behind an address, the access of a mapping, the properties of a handle.
  CUmemGenericAllocationHandle retained;
  CU_CHECK(
      cu.cuMemRetainAllocationHandle(&retained, reinterpret_cast<void*>(va + granularity + 64)));
  const int retain_same = retained == handles[1];
  CU_CHECK(cu.cuMemRelease(retained));
  unsigned long long flags = 0;
  CU_CHECK(cu.cuMemGetAccess(&flags, &prop.location, va + granularity));
  CUmemAllocationProp back_prop{};
  CU_CHECK(cu.cuMemGetAllocationPropertiesFromHandle(&back_prop, handles[0]));
  const int prop_ok = back_prop.type == CU_MEM_ALLOCATION_TYPE_PINNED &&
                      back_prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
                      back_prop.location.id == 0;

  // Shrink chunk by chunk, then give everything back.
  for (std::size_t chunk = handles.size(); chunk-- > 0;) {
    CU_CHECK(cu.cuMemUnmap(va + chunk * granularity, granularity));
    CU_CHECK(cu.cuMemRelease(handles[chunk]));
  }
  CU_CHECK(cu.cuMemAddressFree(va, reserved));
  RT_CHECK(cudaStreamDestroy(stream));
  std::size_t free_bytes = 0, total_bytes = 0;
  RT_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));

  const bool ok = wrong == 0 && copy_wrong == 0 && retain_same && prop_ok &&
                  flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return RT_REPORT(ok,
                   "chunks=%zu granularity=%zu wrong=%d copy_wrong=%d retain_same=%d access=%llu "
                   "prop_ok=%d checksum=%016llx",
                   handles.size(), granularity, wrong, copy_wrong, retain_same, flags, prop_ok,
                   static_cast<unsigned long long>(checksum));
}
