// Black-box probe of the real driver: what does a second session's copy of the same libraries
// cost, and what would sharing one CUlibrary between sessions save? The server loads every image
// a client sends with its own cuLibraryLoadData, so N PyTorch clients hold N copies of PyTorch's
// libraries (docs/benchmarks.md, "The soak's memory"). This loads every fat-binary container of a
// real library (the .nv_fatbin section of, e.g., libcublasLt.so), gets functions of a share of
// its kernels in the primary context, then in a green context through the SAME libraries, then
// in another green context through a SECOND load of the libraries, and prints the process's RSS
// and the GPU memory in use after each step.
//
// With `lookups` as the third argument it asks instead what the server's answer to a client's
// cuLibraryGetKernel costs: every kernel of the libraries, loaded once, looked up by name
// (cuLibraryGetKernel) and its parameters read (cuKernelGetParamInfo), as the server does for
// each session, with the primary context current, then with one green context and another
// current (the sessions' own). PyTorch's cudart looks up every kernel it registers, ~16,700 per
// process (2026-11-28: the server's heap grew ~600 MiB in those handlers per session).
//
// Build and run on the GPU machine:
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include -o /tmp/ls library_sharing.cpp -lcuda
//   /tmp/ls /path/to/libcublasLt.so.13 [every-nth-kernel | lookups]     (in tools/probes/)
#include <cuda.h>
#include <elf.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "must.hpp"

namespace {

long rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

double gpu_used_mib() {
  size_t free = 0, total = 0;
  MUST(cuMemGetInfo(&free, &total));
  return static_cast<double>(total - free) / (1 << 20);
}

void report(const char* step, long& last_rss, double& last_gpu) {
  long rss = rss_kib();
  double gpu = gpu_used_mib();
  std::printf("%-58s rss %8ld KiB (%+8ld)  gpu %8.1f MiB (%+7.1f)\n", step, rss, rss - last_rss,
              gpu, gpu - last_gpu);
  std::fflush(stdout);
  last_rss = rss;
  last_gpu = gpu;
}

// The fat-binary containers of an ELF file's .nv_fatbin section.
std::vector<std::vector<char>> containers_of(const char* path) {
  std::ifstream file(path, std::ios::binary);
  std::vector<char> elf((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(elf.data());
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(elf.data() + eh->e_shoff);
  const char* names = elf.data() + sh[eh->e_shstrndx].sh_offset;
  std::vector<std::vector<char>> out;
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (std::strcmp(names + sh[i].sh_name, ".nv_fatbin") != 0) continue;
    const char* p = elf.data() + sh[i].sh_offset;
    const char* end = p + sh[i].sh_size;
    while (p + 16 <= end) {
      std::uint32_t magic;
      std::memcpy(&magic, p, 4);
      if (magic != 0xBA55ED50u) {
        p += 8;  // padding between containers
        continue;
      }
      std::uint16_t header;
      std::uint64_t size;
      std::memcpy(&header, p + 6, 2);
      std::memcpy(&size, p + 8, 8);
      out.emplace_back(p, p + header + size);
      p += header + size;
    }
  }
  return out;
}

std::vector<CUlibrary> load_all(const std::vector<std::vector<char>>& containers) {
  std::vector<CUlibrary> libraries;
  for (const auto& c : containers) {
    CUlibrary library = nullptr;
    if (cuLibraryLoadData(&library, c.data(), nullptr, nullptr, 0, nullptr, nullptr, 0) ==
        CUDA_SUCCESS) {
      libraries.push_back(library);
    }
  }
  return libraries;
}

// Functions, in the current context, of every nth kernel of each library.
int get_functions(const std::vector<CUlibrary>& libraries, int nth) {
  int got = 0;
  for (CUlibrary library : libraries) {
    unsigned int count = 0;
    if (cuLibraryGetKernelCount(&count, library) != CUDA_SUCCESS || count == 0) continue;
    std::vector<CUkernel> kernels(count);
    MUST(cuLibraryEnumerateKernels(kernels.data(), count, library));
    for (unsigned int k = 0; k < count; k += nth) {
      CUfunction function = nullptr;
      if (cuKernelGetFunction(&function, kernels[k]) == CUDA_SUCCESS) {
        // Loading is lazy until the function is used: an attribute query loads it.
        int regs = 0;
        cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, function);
        ++got;
      }
    }
  }
  return got;
}

// What the server does for each cuLibraryGetKernel of a client: the kernel by its name, then its
// parameter layout. Returns the kernels looked up.
int look_up_kernels(const std::vector<CUlibrary>& libraries) {
  int looked_up = 0;
  for (CUlibrary library : libraries) {
    unsigned int count = 0;
    if (cuLibraryGetKernelCount(&count, library) != CUDA_SUCCESS || count == 0) continue;
    std::vector<CUkernel> kernels(count);
    MUST(cuLibraryEnumerateKernels(kernels.data(), count, library));
    for (CUkernel listed : kernels) {
      const char* name = nullptr;
      if (cuKernelGetName(&name, listed) != CUDA_SUCCESS) continue;
      CUkernel kernel = nullptr;
      if (cuLibraryGetKernel(&kernel, library, name) != CUDA_SUCCESS) continue;
      std::size_t offset = 0, size = 0;
      for (std::size_t i = 0; cuKernelGetParamInfo(kernel, i, &offset, &size) == CUDA_SUCCESS;
           ++i) {
      }
      ++looked_up;
    }
  }
  return looked_up;
}

CUcontext green_context(CUdevice device) {
  CUdevResource sms{};
  MUST(cuDeviceGetDevResource(device, &sms, CU_DEV_RESOURCE_TYPE_SM));
  CUdevResourceDesc desc{};
  MUST(cuDevResourceGenerateDesc(&desc, &sms, 1));
  CUgreenCtx green = nullptr;
  MUST(cuGreenCtxCreate(&green, desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
  CUcontext context = nullptr;
  MUST(cuCtxFromGreenCtx(&context, green));
  return context;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s LIBRARY_WITH_NV_FATBIN [every-nth-kernel]\n", argv[0]);
    return 2;
  }
  const bool lookups = argc > 2 && std::strcmp(argv[2], "lookups") == 0;
  const int nth = argc > 2 && !lookups ? std::atoi(argv[2]) : 20;
  long rss = 0;
  double gpu = 0;
  MUST(cuInit(0));
  CUdevice device;
  MUST(cuDeviceGet(&device, 0));
  CUcontext primary;
  MUST(cuDevicePrimaryCtxRetain(&primary, device));
  MUST(cuCtxSetCurrent(primary));
  report("primary context", rss, gpu);
  const auto containers = containers_of(argv[1]);
  std::size_t bytes = 0;
  for (const auto& c : containers) bytes += c.size();
  std::printf("%zu containers, %.1f MiB\n", containers.size(), bytes / 1048576.0);
  report("containers read into this process", rss, gpu);

  const auto first = load_all(containers);
  report(("libraries loaded once (" + std::to_string(first.size()) + ")").c_str(), rss, gpu);
  if (lookups) {
    int k = look_up_kernels(first);
    report(("primary ctx: " + std::to_string(k) + " kernels looked up").c_str(), rss, gpu);
    k = look_up_kernels(first);
    report("primary ctx: the same again", rss, gpu);
    for (int g = 1; g <= 2; ++g) {
      MUST(cuCtxSetCurrent(green_context(device)));
      report(("green context " + std::to_string(g) + " created").c_str(), rss, gpu);
      k = look_up_kernels(first);
      report(("green " + std::to_string(g) + ": the same lookups").c_str(), rss, gpu);
    }
    return 0;
  }
  int n = get_functions(first, nth);
  report(("primary ctx: " + std::to_string(n) + " functions of them").c_str(), rss, gpu);

  CUcontext g1 = green_context(device);
  MUST(cuCtxSetCurrent(g1));
  report("green context 1 created", rss, gpu);
  n = get_functions(first, nth);
  report(("green 1: same functions, SAME libraries (" + std::to_string(n) + ")").c_str(), rss, gpu);

  CUcontext g2 = green_context(device);
  MUST(cuCtxSetCurrent(g2));
  report("green context 2 created", rss, gpu);
  const auto second = load_all(containers);
  report("libraries loaded a second time", rss, gpu);
  n = get_functions(second, nth);
  report(("green 2: same functions, SECOND libraries (" + std::to_string(n) + ")").c_str(), rss,
         gpu);

  for (CUlibrary library : second) MUST(cuLibraryUnload(library));
  report("second libraries unloaded", rss, gpu);
  return 0;
}
