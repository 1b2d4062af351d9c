// Probe (GPU machine, real driver): H2D bandwidth of host memory pinned in different ways, to
// choose how mpsshim backs cuMemAllocHost. Build: g++ -O2 -std=c++20 -I/usr/local/cuda/include
// pinned_probe.cpp -o pinned_probe -ldl
#include <cuda.h>
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define F(name) auto name = reinterpret_cast<decltype(&::name)>(dlsym(lib, #name))
int main() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  F(cuInit);
  F(cuDeviceGet);
  F(cuDevicePrimaryCtxRetain);
  F(cuCtxSetCurrent);
  auto alloc = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(dlsym(lib, "cuMemAlloc_v2"));
  auto reg =
      reinterpret_cast<CUresult (*)(void*, size_t, unsigned)>(dlsym(lib, "cuMemHostRegister_v2"));
  auto allochost = reinterpret_cast<CUresult (*)(void**, size_t)>(dlsym(lib, "cuMemAllocHost_v2"));
  auto copy = reinterpret_cast<CUresult (*)(CUdeviceptr, const void*, size_t, CUstream)>(
      dlsym(lib, "cuMemcpyHtoDAsync_v2"));
  F(cuStreamCreate);
  F(cuStreamSynchronize);
  cuInit(0);
  CUdevice d;
  cuDeviceGet(&d, 0);
  CUcontext c;
  cuDevicePrimaryCtxRetain(&c, d);
  cuCtxSetCurrent(c);
  const size_t n = 64ull << 20;
  CUdeviceptr dst;
  alloc(&dst, n);
  CUstream s;
  cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
  auto bw = [&](const char* what, void* p) {
    memset(p, 1, n);
    copy(dst, p, n, s);
    cuStreamSynchronize(s);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 20; ++i) copy(dst, p, n, s);
    cuStreamSynchronize(s);
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-40s %.1f GB/s\n", what, 20.0 * n / sec / 1e9);
  };
  void* h;
  allochost(&h, n);
  bw("cuMemAllocHost", h);
  void* a = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  reg(a, n, CU_MEMHOSTREGISTER_PORTABLE);
  bw("anonymous + register", a);
  void* a2 = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  madvise(a2, n, MADV_HUGEPAGE);
  memset(a2, 0, n);
  reg(a2, n, CU_MEMHOSTREGISTER_PORTABLE);
  bw("anonymous THP + register", a2);
  for (int huge = 0; huge < 2; ++huge) {
    int fd = memfd_create("probe", MFD_CLOEXEC);
    ftruncate(fd, n);
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (huge) madvise(m, n, MADV_HUGEPAGE);
    memset(m, 0, n);
    reg(m, n, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    bw(huge ? "memfd THP + register" : "memfd + register", m);
  }
  int fd = memfd_create("probe-hugetlb", MFD_CLOEXEC | MFD_HUGETLB);
  if (fd >= 0 && ftruncate(fd, n) == 0) {
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
      reg(m, n, CU_MEMHOSTREGISTER_PORTABLE);
      bw("memfd HUGETLB + register", m);
    } else
      std::printf("memfd HUGETLB: mmap failed\n");
  } else
    std::printf("memfd HUGETLB: unavailable\n");
  std::system(
      "cat /sys/kernel/mm/transparent_hugepage/shmem_enabled "
      "/sys/kernel/mm/transparent_hugepage/enabled; grep -i huge /proc/meminfo");
}
