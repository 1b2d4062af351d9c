// Black-box probe of the real driver's private table 6e163fbe… ("ToolsModule"): what slot 7,
// the one cuFFT calls after each cuModuleLoadData, takes and returns. A trace of cuFFT with
// its arguments logged (docs/private-tables.md) showed slot7(ctx, module, callback, user) calling
// callback(user, CUfunction, mangled name, 0) once per function of a one-function module and
// returning 1. This loads a module of several kernels and checks, against the public
// cuModuleEnumerateFunctions and cuFuncGetName: the order and handles the callback sees, the
// return value (a count, or a status?), whether a callback's return value stops the walk, and
// what a NULL context, a non-current context and a bad module give.
//
// Build and run on the GPU machine:
//   nvcc -cubin -arch=sm_90 -o /tmp/probe_kernel.cubin tools/probes/probe_kernel.cu
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/tools_module.cpp -lcuda -o /tmp/tm
//   /tmp/tm /tmp/probe_kernel.cubin
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "must.hpp"

namespace {

struct Seen {
  std::vector<CUfunction> functions;
  std::vector<std::string> names;
  std::vector<std::uint64_t> fourth;
  std::uint64_t stop_after = ~0ull;
  std::uint64_t callback_return = 0;
};

std::uint64_t record(void* user, CUfunction f, const char* name, std::uint64_t fourth) {
  auto* seen = static_cast<Seen*>(user);
  seen->functions.push_back(f);
  seen->names.emplace_back(name != nullptr ? name : "(null)");
  seen->fourth.push_back(fourth);
  return seen->functions.size() >= seen->stop_after ? seen->callback_return : 0;
}

using Slot7 = std::uint64_t (*)(CUcontext, CUmodule,
                                std::uint64_t (*)(void*, CUfunction, const char*, std::uint64_t),
                                void*);

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CUBIN\n", argv[0]);
    return 2;
  }
  MUST(cuInit(0));
  CUdevice dev;
  MUST(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  MUST(cuDevicePrimaryCtxRetain(&ctx, dev));
  MUST(cuCtxSetCurrent(ctx));
  CUmodule module;
  MUST(cuModuleLoad(&module, argv[1]));

  const CUuuid id{{0x6e, 0x16, 0x3f, static_cast<char>(0xbe), static_cast<char>(0xb9), 0x58, 0x44,
                   0x4d, static_cast<char>(0x83), 0x5c, static_cast<char>(0xe1),
                   static_cast<char>(0x82), static_cast<char>(0xaf), static_cast<char>(0xf1),
                   static_cast<char>(0x99), 0x1e}};
  const void* table = nullptr;
  MUST(cuGetExportTable(&table, &id));
  const auto* slots = static_cast<const std::uint64_t*>(table);
  std::printf("table size word %llu\n", static_cast<unsigned long long>(slots[0]));
  auto slot7 = reinterpret_cast<Slot7>(slots[7]);

  unsigned int count = 0;
  MUST(cuModuleGetFunctionCount(&count, module));
  std::vector<CUfunction> listed(count);
  MUST(cuModuleEnumerateFunctions(listed.data(), count, module));
  std::printf("public: %u functions\n", count);
  for (unsigned i = 0; i < count; ++i) {
    const char* name = nullptr;
    cuFuncGetName(&name, listed[i]);
    CUfunction by_name = nullptr;
    cuModuleGetFunction(&by_name, module, name);
    std::printf("  [%u] %p %s (cuModuleGetFunction %p)\n", i, static_cast<void*>(listed[i]), name,
                static_cast<void*>(by_name));
  }

  auto run = [&](const char* what, CUcontext c, CUmodule m, Seen& seen) {
    std::uint64_t r = slot7(c, m, &record, &seen);
    std::printf("%s: returned %llu, %zu callbacks\n", what, static_cast<unsigned long long>(r),
                seen.functions.size());
    for (std::size_t i = 0; i < seen.functions.size(); ++i) {
      bool same = i < listed.size() && seen.functions[i] == listed[i];
      std::printf("  cb %zu: %p %s fourth=%llu %s\n", i, static_cast<void*>(seen.functions[i]),
                  seen.names[i].c_str(), static_cast<unsigned long long>(seen.fourth[i]),
                  same ? "(= public order)" : "");
    }
  };
  Seen plain;
  run("current ctx", ctx, module, plain);
  Seen null_ctx;
  run("NULL ctx", nullptr, module, null_ctx);
  Seen stop1;
  stop1.stop_after = 1;
  stop1.callback_return = 1;
  run("callback returns 1 at the first", ctx, module, stop1);
  Seen stop_big;
  stop_big.stop_after = 1;
  stop_big.callback_return = 0x1234;
  run("callback returns 0x1234 at the first", ctx, module, stop_big);
  CUcontext other;
  CUctxCreateParams params{};
  if (cuCtxCreate_v4(&other, &params, 0, dev) == CUDA_SUCCESS) {
    cuCtxSetCurrent(other);
    Seen other_current;
    run("module's ctx passed, another ctx current", ctx, module, other_current);
    Seen other_passed;
    run("another ctx passed and current", other, module, other_passed);
    cuCtxSetCurrent(ctx);
    cuCtxDestroy(other);
  }
  // A forged or unloaded module is not tried: it crashes real drivers more often than not.
  return 0;
}
