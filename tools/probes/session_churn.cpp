// Black-box probe of the real driver: which of the objects a server session creates and destroys
// are not given back? A GPU soak with the green-context pool (docs/benchmarks.md, "Where the
// soak's memory goes") still saw the server grow ~450 MiB of RSS a minute and the GPU's memory in
// use by hundreds of MiB while every session's objects were destroyed at its end. This repeats
// each kind of per-session object 200 times, alone, on one green context kept for the whole run
// (as the pool keeps it), the primary context retained, and prints the process's RSS and the
// device memory in use before and after, per round:
//
//   stream      cuGreenCtxStreamCreate + cuStreamDestroy (a client stream)
//   event       cuEventCreate + cuEventDestroy
//   staging     a 64 MiB MAP_SHARED memfd mapping registered PORTABLE, unregistered, unmapped
//               (a session's staging area, broker/server/core/admit.cpp)
//   fence_page  a 4 KiB anonymous page registered PORTABLE|DEVICEMAP, its device pointer taken,
//               one cuStreamWriteValue32 into it, unregistered
//               (broker/server/driver/host_fences.cpp)
//   module      cuModuleLoadData of a small PTX module + cuModuleUnload
//   graph       a 16-node kernel chain: create, instantiate, launch once, destroy (launch batching)
//   alloc       cuMemAlloc 64 MiB + cuMemFree
//   session     all of the above in one round, the way a session does them
//   library     with PROBE_FATBIN=FILE (a copy of a program's .nv_fatbin section, e.g.
//               `objcopy -O binary --only-section=.nv_fatbin libtorch_cuda.so F`): its first 64
//               fat-binary containers (PROBE_CONTAINERS=N for another count) each loaded with
//               cuLibraryLoadData, every kernel of each turned into a function of the green context
//               (what a launch does under lazy loading), then unloaded; 5 rounds, as a PyTorch
//               session loads its libraries
//
// Build and run on the GPU machine:
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/session_churn.cpp -lcuda -o /tmp/sc
//   /tmp/sc            # every kind in turn
//   /tmp/sc staging    # one kind
#include <cuda.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace {

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string l;
  while (std::getline(f, l))
    if (l.rfind("VmRSS:", 0) == 0) return std::atol(l.c_str() + 6);
  return -1;
}

long device_used_mib() {
  size_t free_bytes = 0, total = 0;
  cuMemGetInfo(&free_bytes, &total);
  return static_cast<long>((total - free_bytes) >> 20);
}

bool ok(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return true;
  const char* name = nullptr;
  cuGetErrorName(r, &name);
  std::printf("  %s failed: %s\n", what, name != nullptr ? name : "?");
  return false;
}
#define CHECK(x) \
  if (!ok((x), #x)) return false

const char* kPtx = R"(
.version 8.0
.target sm_90
.address_size 64
.visible .entry touch(.param .u64 p) {
  .reg .b64 %rd<2>;
  .reg .b32 %r<2>;
  ld.param.u64 %rd1, [p];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u32 %r1, 1;
  st.global.u32 [%rd1], %r1;
  ret;
}
)";

struct Probe {
  CUdevice device{};
  CUgreenCtx green{};
  CUcontext green_context{};
  CUstream stream{};
  CUmodule module{};
  CUfunction touch{};
  CUdeviceptr scratch{};

  bool stream_round() {
    CUstream s;
    CHECK(cuGreenCtxStreamCreate(&s, green, CU_STREAM_NON_BLOCKING, 0));
    CHECK(cuStreamDestroy(s));
    return true;
  }
  bool event_round() {
    CUevent e;
    CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    CHECK(cuEventRecord(e, stream));
    CHECK(cuEventSynchronize(e));
    CHECK(cuEventDestroy(e));
    return true;
  }
  bool staging_round() {
    constexpr size_t kBytes = 64u << 20;
    int fd = memfd_create("session-churn", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, kBytes) != 0) return false;
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return false;
    CHECK(cuMemHostRegister(p, kBytes, CU_MEMHOSTREGISTER_PORTABLE));
    CHECK(cuMemcpyHtoDAsync(scratch, p, 1 << 20, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemHostUnregister(p));
    munmap(p, kBytes);
    return true;
  }
  bool fence_page_round() {
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    CHECK(cuMemHostRegister(p, 4096, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    CUdeviceptr d;
    CHECK(cuMemHostGetDevicePointer(&d, p, 0));
    CHECK(cuStreamWriteValue32(stream, d, 7, CU_STREAM_WRITE_VALUE_DEFAULT));
    CHECK(cuStreamSynchronize(stream));
    if (*static_cast<volatile unsigned*>(p) != 7) std::printf("  fence word not written\n");
    CHECK(cuMemHostUnregister(p));
    munmap(p, 4096);
    return true;
  }
  bool module_round() {
    CUmodule m;
    CHECK(cuModuleLoadData(&m, kPtx));
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, m, "touch"));
    void* args[] = {&scratch};
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, args, nullptr));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuModuleUnload(m));
    return true;
  }
  bool graph_round() {
    CUgraph g;
    CHECK(cuGraphCreate(&g, 0));
    CUgraphNode prev{};
    void* args[] = {&scratch};
    for (int i = 0; i < 16; ++i) {
      CUDA_KERNEL_NODE_PARAMS p{};
      p.func = touch;
      p.gridDimX = p.gridDimY = p.gridDimZ = 1;
      p.blockDimX = p.blockDimY = p.blockDimZ = 1;
      p.kernelParams = args;
      CUgraphNode n;
      CHECK(cuGraphAddKernelNode(&n, g, i == 0 ? nullptr : &prev, i == 0 ? 0 : 1, &p));
      prev = n;
    }
    CUgraphExec e;
    CHECK(cuGraphInstantiate(&e, g, 0));
    CHECK(cuGraphLaunch(e, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
    return true;
  }
  bool alloc_round() {
    CUdeviceptr p;
    CHECK(cuMemAlloc(&p, 64u << 20));
    CHECK(cuMemsetD8Async(p, 0, 64u << 20, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuMemFree(p));
    return true;
  }
  // Fat-binary containers of a .nv_fatbin section: a 16-byte header (magic 0xba55ed50, version,
  // header size, payload size), each container 8-byte aligned after the last.
  std::vector<std::vector<char>> containers;
  bool load_containers(const char* path, size_t most) {
    std::ifstream f(path, std::ios::binary | std::ios::ate);
    std::vector<char> all(static_cast<size_t>(f.tellg()));
    f.seekg(0);
    f.read(all.data(), static_cast<std::streamsize>(all.size()));
    size_t at = 0;
    while (at + 16 <= all.size() && containers.size() < most) {
      unsigned magic, header;
      unsigned long long payload;
      std::memcpy(&magic, &all[at], 4);
      std::memcpy(&header, &all[at + 4], 4);
      header >>= 16;
      std::memcpy(&payload, &all[at + 8], 8);
      if (magic != 0xba55ed50u) {
        at += 8;
        continue;
      }
      const size_t size = header + payload;
      if (at + size > all.size()) break;
      containers.emplace_back(all.begin() + at, all.begin() + at + size);
      at += (size + 7) & ~size_t{7};
    }
    size_t bytes = 0;
    for (auto& c : containers) bytes += c.size();
    std::printf("library: %zu containers, %zu KiB, from %s\n", containers.size(), bytes >> 10,
                path);
    return !containers.empty();
  }
  bool library_round() {
    for (auto& c : containers) {
      CUlibrary l;
      CHECK(cuLibraryLoadData(&l, c.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
      unsigned count = 0;
      CHECK(cuLibraryGetKernelCount(&count, l));
      std::vector<CUkernel> kernels(count);
      if (count != 0) CHECK(cuLibraryEnumerateKernels(kernels.data(), count, l));
      for (CUkernel k : kernels) {
        CUfunction f;
        CHECK(cuKernelGetFunction(&f, k));
      }
      CHECK(cuLibraryUnload(l));
    }
    return true;
  }

  // The same libraries loaded, used and unloaded in one new green context after another (kept),
  // then again in the first ones: does each green context keep what its loads cost?
  bool library_contexts() {
    CUdevResource all;
    CHECK(cuDeviceGetDevResource(device, &all, CU_DEV_RESOURCE_TYPE_SM));
    CUdevResourceDesc desc;
    CHECK(cuDevResourceGenerateDesc(&desc, &all, 1));
    std::vector<CUcontext> contexts;
    for (int i = 0; i < 4; ++i) {
      CUgreenCtx g;
      CHECK(cuGreenCtxCreate(&g, desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
      CUcontext c;
      CHECK(cuCtxFromGreenCtx(&c, g));
      contexts.push_back(c);
    }
    const int order[] = {0, 1, 2, 3, 0, 1};
    for (int i : order) {
      CHECK(cuCtxSetCurrent(contexts[i]));
      if (!library_round()) return false;
      std::printf("  libraries used in green context %d: rss %ld KiB, device %ld MiB\n", i,
                  rss_kib(), device_used_mib());
    }
    CHECK(cuCtxSetCurrent(green_context));
    return true;
  }

  bool session_round() {
    return stream_round() && event_round() && staging_round() && fence_page_round() &&
           module_round() && graph_round() && alloc_round();
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (cuInit(0) != CUDA_SUCCESS) return 77;
  Probe p;
  if (!ok(cuDeviceGet(&p.device, 0), "cuDeviceGet")) return 1;
  CUcontext primary;
  if (!ok(cuDevicePrimaryCtxRetain(&primary, p.device), "retain")) return 1;
  cuCtxSetCurrent(primary);
  CUdevResource all;
  cuDeviceGetDevResource(p.device, &all, CU_DEV_RESOURCE_TYPE_SM);
  CUdevResourceDesc desc;
  cuDevResourceGenerateDesc(&desc, &all, 1);
  if (!ok(cuGreenCtxCreate(&p.green, desc, p.device, CU_GREEN_CTX_DEFAULT_STREAM), "green"))
    return 1;
  cuCtxFromGreenCtx(&p.green_context, p.green);
  cuCtxSetCurrent(p.green_context);
  cuGreenCtxStreamCreate(&p.stream, p.green, CU_STREAM_NON_BLOCKING, 0);
  cuMemAlloc(&p.scratch, 1 << 20);
  if (!ok(cuModuleLoadData(&p.module, kPtx), "module")) return 1;
  cuModuleGetFunction(&p.touch, p.module, "touch");

  struct Kind {
    const char* name;
    bool (Probe::*round)();
  };
  const std::vector<Kind> kinds = {
      {"stream", &Probe::stream_round},   {"event", &Probe::event_round},
      {"staging", &Probe::staging_round}, {"fence_page", &Probe::fence_page_round},
      {"module", &Probe::module_round},   {"graph", &Probe::graph_round},
      {"alloc", &Probe::alloc_round},     {"session", &Probe::session_round},
  };
  const char* fatbin = std::getenv("PROBE_FATBIN");
  const char* most = std::getenv("PROBE_CONTAINERS");
  if (fatbin != nullptr && !p.load_containers(fatbin, most != nullptr ? std::atoi(most) : 64))
    return 1;
  constexpr int kRounds = 200;
  std::printf("%-11s %9s %9s %9s %9s %12s %12s\n", "kind", "rss0 KiB", "rss1 KiB", "dev0 MiB",
              "dev1 MiB", "KiB/round", "KiB dev/rnd");
  std::vector<Kind> run = kinds;
  if (fatbin != nullptr) {
    run.push_back({"library", &Probe::library_round});
    if (argc > 1 && std::strcmp(argv[1], "library_contexts") == 0) {
      std::printf("library_contexts: rss %ld KiB, device %ld MiB\n", rss_kib(), device_used_mib());
      return p.library_contexts() ? 0 : 1;
    }
  }
  for (const Kind& k : run) {
    const int rounds = std::strcmp(k.name, "library") == 0 ? 5 : kRounds;
    if (argc > 1 && std::strcmp(argv[1], k.name) != 0) continue;
    // One warm-up round so first-use costs (a pool, a code cache) are not counted as a leak.
    if (!(p.*k.round)()) return 1;
    const long rss0 = rss_kib();
    const long dev0 = device_used_mib();
    for (int i = 0; i < rounds; ++i)
      if (!(p.*k.round)()) return 1;
    const long rss1 = rss_kib();
    const long dev1 = device_used_mib();
    std::printf("%-11s %9ld %9ld %9ld %9ld %12.1f %12.1f\n", k.name, rss0, rss1, dev0, dev1,
                double(rss1 - rss0) / rounds, double(dev1 - dev0) * 1024.0 / rounds);
  }
  return 0;
}
