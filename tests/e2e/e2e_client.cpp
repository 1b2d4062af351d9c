// A driver-API client for the CPU end-to-end tests: run under LD_PRELOAD=libmpsshim.so against
// mpsshimd and the host-memory test driver. Each mode prints one result line and exits 0 only
// when what it checked held.
#include <cuda.h>
#include <cudaProfiler.h>
#include <sys/mman.h>

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "client_check.hpp"
#include "proto/address_arenas.hpp"

namespace {

// The test driver resolves kernels by name from any image; this PTX-like text is one.
constexpr char kModuleImage[] = "// mpsshim e2e test module\n.version 8.0\n.target sm_90\n";

struct Setup {
  CUcontext ctx{};
  CUmodule module{};
  CUdevice device{};
};

Setup setup() {
  Setup s;
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&s.device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&s.ctx, s.device));
  CHECK(cuCtxSetCurrent(s.ctx));
  CHECK(cuModuleLoadData(&s.module, kModuleImage));
  return s;
}

// cuModuleGetFunctionCount / cuModuleEnumerateFunctions and the ToolsModule private table's
// walk (slot 7, what cuFFT uses): the same functions in the same order, the handles
// cuModuleGetFunction gives, and a launch through an enumerated handle computes.
int functions() {
  Setup s = setup();
  unsigned int count = 0;
  CHECK(cuModuleGetFunctionCount(&count, s.module));
  std::vector<CUfunction> listed(count);
  CHECK(cuModuleEnumerateFunctions(listed.data(), count, s.module));
  std::vector<std::string> names;
  CUfunction add = nullptr;
  for (CUfunction f : listed) {
    const char* name = nullptr;
    CHECK(cuFuncGetName(&name, f));
    CUfunction by_name = nullptr;
    CHECK(cuModuleGetFunction(&by_name, s.module, name));
    if (by_name != f) {
      std::printf("FAIL %s: enumerated %p, cuModuleGetFunction %p\n", name, static_cast<void*>(f),
                  static_cast<void*>(by_name));
      return 1;
    }
    if (std::strcmp(name, "vector_add") == 0) add = f;
    names.emplace_back(name);
  }
  if (count < 2 || add == nullptr) {
    std::printf("FAIL %u functions, vector_add %s\n", count, add ? "found" : "missing");
    return 1;
  }
  const CUuuid tools_module{
      {0x6e, 0x16, 0x3f, static_cast<char>(0xbe), static_cast<char>(0xb9), 0x58, 0x44, 0x4d,
       static_cast<char>(0x83), 0x5c, static_cast<char>(0xe1), static_cast<char>(0x82),
       static_cast<char>(0xaf), static_cast<char>(0xf1), static_cast<char>(0x99), 0x1e}};
  const void* table = nullptr;
  CHECK(cuGetExportTable(&table, &tools_module));
  struct Walked {
    std::vector<CUfunction> functions;
    std::vector<std::string> names;
  } walked;
  using Visit = void (*)(void*, CUfunction, const char*);
  using Walk = std::size_t (*)(CUcontext, CUmodule, Visit, void*);
  const Visit visit = [](void* user, CUfunction f, const char* name) {
    auto* w = static_cast<Walked*>(user);
    w->functions.push_back(f);
    w->names.emplace_back(name);
  };
  const auto walk = reinterpret_cast<Walk>(static_cast<const std::uintptr_t*>(table)[7]);
  const std::size_t walked_count = walk(nullptr, s.module, visit, &walked);
  if (walked_count != count || walked.functions != listed || walked.names != names) {
    std::printf("FAIL the walk gave %zu functions, the public API %u\n", walked_count, count);
    return 1;
  }
  int n = 1000;
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 0.0f);
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  CUdeviceptr da, db, dc;
  CHECK(cuMemAlloc(&da, bytes));
  CHECK(cuMemAlloc(&db, bytes));
  CHECK(cuMemAlloc(&dc, bytes));
  CHECK(cuMemcpyHtoD(da, a.data(), bytes));
  CHECK(cuMemcpyHtoD(db, b.data(), bytes));
  void* args[] = {&da, &db, &dc, &n};
  CHECK(cuLaunchKernel(walked.functions[static_cast<std::size_t>(
                           std::find(names.begin(), names.end(), "vector_add") - names.begin())],
                       (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  CHECK(cuMemcpyDtoH(c.data(), dc, bytes));
  if (std::any_of(c.begin(), c.end(), [](float v) { return v != 3.0f; })) {
    std::printf("FAIL vector_add through an enumerated handle\n");
    return 1;
  }
  // A thread with no current context loads a library and gets a kernel from it, as cuBLASLt
  // does on PyTorch's autograd thread: the real driver answers without a context.
  CUresult on_thread = CUDA_ERROR_UNKNOWN;
  std::thread([&] {
    CUcontext none = nullptr;
    if (cuCtxGetCurrent(&none) != CUDA_SUCCESS || none != nullptr) return;
    CUlibrary library = nullptr;
    CUkernel kernel = nullptr;
    on_thread = cuLibraryLoadData(&library, kModuleImage, nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (on_thread == CUDA_SUCCESS) on_thread = cuLibraryGetKernel(&kernel, library, "vector_add");
  }).join();
  if (on_thread != CUDA_SUCCESS) {
    std::printf("FAIL cuLibraryGetKernel with no current context: %d\n", on_thread);
    return 1;
  }
  std::printf("PASS functions %u\n", count);
  return 0;
}

bool loaded(CUkernel kernel) {
  CUfunctionLoadingState state{};
  CHECK(cuFuncIsLoaded(&state, reinterpret_cast<CUfunction>(kernel)));
  return state == CU_FUNCTION_LOADING_STATE_LOADED;
}

// A library's kernels (libshim/kernel_lookup.hpp). `lazy`: handed out from the names its load
// listed and looked up on the server at their first use: the handles are cuLibraryGetKernel's and
// cuLibraryEnumerateKernels' alike, a kernel is not loaded until used, eight threads that first
// launch one kernel together all get right results, and an unlisted name is not found. Eager
// (MPSSHIM_KERNEL_LOOKUP=eager): every kernel handed out is loaded, and the listing calls say
// they are not supported.
int library_kernels(bool lazy) {
  Setup s = setup();
  CUlibrary library = nullptr;
  CHECK(cuLibraryLoadData(&library, kModuleImage, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel missing = nullptr;
  if (cuLibraryGetKernel(&missing, library, "no_such_kernel") != CUDA_ERROR_NOT_FOUND) {
    std::printf("FAIL an unlisted name was found\n");
    return 1;
  }
  unsigned int count = 0;
  const CUresult counted = cuLibraryGetKernelCount(&count, library);
  if (!lazy) {
    CUkernel add = nullptr;
    CHECK(cuLibraryGetKernel(&add, library, "vector_add"));
    if (counted != CUDA_ERROR_NOT_SUPPORTED || !loaded(add)) {
      std::printf("FAIL eager lookups: count %d, vector_add %s\n", counted,
                  loaded(add) ? "loaded" : "not loaded");
      return 1;
    }
    std::printf("PASS library_kernels eager\n");
    return 0;
  }
  CHECK(counted);
  unsigned int module_count = 0;
  CHECK(cuModuleGetFunctionCount(&module_count, s.module));
  if (count != module_count || count < 4) {
    std::printf("FAIL the library lists %u kernels, the same image as a module %u\n", count,
                module_count);
    return 1;
  }
  std::vector<CUkernel> listed(count);
  CHECK(cuLibraryEnumerateKernels(listed.data(), count, library));
  std::map<std::string, CUkernel> by_name;
  for (CUkernel k : listed) {
    const char* name = nullptr;
    CHECK(cuKernelGetName(&name, k));
    CUkernel again = nullptr;
    CHECK(cuLibraryGetKernel(&again, library, name));
    if (again != k || loaded(k)) {
      std::printf("FAIL %s: enumerated %p, by name %p, %s before any use\n", name,
                  static_cast<void*>(k), static_cast<void*>(again),
                  loaded(k) ? "loaded" : "not loaded");
      return 1;
    }
    by_name[name] = k;
  }
  // Eight threads launch vector_add for the first time at once: one lookup, eight right results.
  const CUkernel add = by_name.at("vector_add");
  constexpr int kThreads = 8, n = 4096;
  const size_t bytes = sizeof(float) * n;
  std::vector<CUresult> results(kThreads, CUDA_ERROR_UNKNOWN);
  std::vector<int> wrong(kThreads, -1);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      CUresult& rc = results[static_cast<std::size_t>(t)];
      if ((rc = cuCtxSetCurrent(s.ctx)) != CUDA_SUCCESS) return;
      std::vector<float> a(n, static_cast<float>(t)), b(n, 1.0f), c(n, 0.0f);
      CUdeviceptr da = 0, db = 0, dc = 0;
      if ((rc = cuMemAlloc(&da, bytes)) != CUDA_SUCCESS || (rc = cuMemAlloc(&db, bytes)) ||
          (rc = cuMemAlloc(&dc, bytes)) || (rc = cuMemcpyHtoD(da, a.data(), bytes)) ||
          (rc = cuMemcpyHtoD(db, b.data(), bytes))) {
        return;
      }
      int elements = n;
      void* args[] = {&da, &db, &dc, &elements};
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      if ((rc = cuLaunchKernel(reinterpret_cast<CUfunction>(add), n / 256, 1, 1, 256, 1, 1, 0,
                               nullptr, args, nullptr)) ||
          (rc = cuMemcpyDtoH(c.data(), dc, bytes))) {
        return;
      }
      wrong[static_cast<std::size_t>(t)] = static_cast<int>(std::count_if(
          c.begin(), c.end(), [t](float v) { return v != static_cast<float>(t) + 1.0f; }));
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    if (results[static_cast<std::size_t>(t)] != CUDA_SUCCESS ||
        wrong[static_cast<std::size_t>(t)]) {
      std::printf("FAIL thread %d: %d, %d wrong elements\n", t,
                  results[static_cast<std::size_t>(t)], wrong[static_cast<std::size_t>(t)]);
      return 1;
    }
  }
  // Its first use looked it up; the others stay unloaded until theirs: a parameter query, an
  // attribute, cuFuncLoad.
  const CUkernel scale = by_name.at("scale_add"), fill = by_name.at("fill_u32"),
                 empty = by_name.at("empty_kernel");
  size_t offset = 0, size = 0;
  int registers = -1;
  if (!loaded(add) || loaded(scale) || loaded(fill) || loaded(empty)) {
    std::printf("FAIL after the launch: vector_add %d, the others %d %d %d\n", loaded(add),
                loaded(scale), loaded(fill), loaded(empty));
    return 1;
  }
  CHECK(cuKernelGetParamInfo(scale, 0, &offset, &size));
  CHECK(cuKernelGetAttribute(&registers, CU_FUNC_ATTRIBUTE_NUM_REGS, fill, s.device));
  CHECK(cuFuncLoad(reinterpret_cast<CUfunction>(empty)));
  if (!loaded(scale) || !loaded(fill) || !loaded(empty) || size == 0) {
    std::printf("FAIL a first use did not look the kernel up\n");
    return 1;
  }
  // A library that lists no kernels (as cuDNN's do on the real driver) still finds them by name,
  // looked up at once.
  constexpr char kListsNothing[] = "// mpsshim-testdriver: lists no kernels\n.version 8.0\n";
  CUlibrary quiet = nullptr;
  CHECK(cuLibraryLoadData(&quiet, kListsNothing, nullptr, nullptr, 0, nullptr, nullptr, 0));
  unsigned int none = 1;
  CHECK(cuLibraryGetKernelCount(&none, quiet));
  CUkernel found = nullptr;
  CHECK(cuLibraryGetKernel(&found, quiet, "vector_add"));
  if (none != 0 || !loaded(found) ||
      cuLibraryGetKernel(&missing, quiet, "no_such_kernel") != CUDA_ERROR_NOT_FOUND) {
    std::printf("FAIL a library listing no kernels: count %u, vector_add %s\n", none,
                loaded(found) ? "loaded" : "not loaded");
    return 1;
  }
  // Unloaded, its kernels are gone, looked up or not.
  const CUkernel unused = by_name.at("increment_i32");
  CHECK(cuLibraryUnload(library));
  CUfunctionLoadingState state{};
  if (cuFuncIsLoaded(&state, reinterpret_cast<CUfunction>(unused)) != CUDA_ERROR_INVALID_HANDLE ||
      cuFuncLoad(reinterpret_cast<CUfunction>(add)) != CUDA_ERROR_INVALID_HANDLE) {
    std::printf("FAIL a kernel of an unloaded library is still usable\n");
    return 1;
  }
  std::printf("PASS library_kernels lazy %u\n", count);
  return 0;
}

// Occupancy answers are remembered per function (libshim/launch.cpp) and forgotten when any
// function's settings change: 100 repeated questions, then a dynamic shared memory size over the
// default limit (48 KiB on the test driver: 0 blocks) asked of a kernel's CUfunction, then the
// limit raised on the CUkernel: the CUfunction's answer must follow. The test reads the server's
// record count of OccupancyMaxActiveBlocks: one per distinct question and setting.
int occupancy() {
  setup();
  CUlibrary library = nullptr;
  CHECK(cuLibraryLoadData(&library, kModuleImage, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel = nullptr;
  CHECK(cuLibraryGetKernel(&kernel, library, "vector_add"));
  CUfunction function = nullptr;
  CHECK(cuKernelGetFunction(&function, kernel));
  int first = -1;
  CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&first, function, 256, 0));
  for (int i = 0; i < 100; ++i) {
    int again = -1;
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&again, function, 256, 0));
    if (again != first) {
      std::printf("FAIL a repeated occupancy question answered %d, first %d\n", again, first);
      return 1;
    }
  }
  constexpr size_t kLarge = 64 << 10;
  int before = -1, after = -1, kernel_after = -1;
  CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&before, function, 256, kLarge));
  CHECK(cuFuncSetAttribute(reinterpret_cast<CUfunction>(kernel),
                           CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 96 << 10));
  CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&after, function, 256, kLarge));
  CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(
      &kernel_after, reinterpret_cast<CUfunction>(kernel), 256, kLarge));
  if (first <= 0 || before != 0 || after <= 0 || kernel_after != after) {
    std::printf(
        "FAIL occupancy: %d blocks; 64 KiB: %d before the limit was raised, %d after "
        "(the kernel: %d)\n",
        first, before, after, kernel_after);
    return 1;
  }
  std::printf("PASS occupancy %d %d\n", first, after);
  return 0;
}

int basic(int n) {
  Setup s = setup();
  CUfunction add{};
  CHECK(cuModuleGetFunction(&add, s.module, "vector_add"));
  std::vector<float> a(n), b(n), c(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 2.0f * static_cast<float>(i);
  }
  CUdeviceptr da, db, dc;
  size_t bytes = sizeof(float) * static_cast<size_t>(n);
  CHECK(cuMemAlloc(&da, bytes));
  CHECK(cuMemAlloc(&db, bytes));
  CHECK(cuMemAlloc(&dc, bytes));
  CHECK(cuMemsetD32(dc, 0xffffffffu, static_cast<size_t>(n)));
  CHECK(cuMemcpyHtoD(da, a.data(), bytes));
  CHECK(cuMemcpyHtoD(db, b.data(), bytes));
  void* args[] = {&da, &db, &dc, &n};
  CHECK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  CHECK(cuMemcpyDtoH(c.data(), dc, bytes));
  for (int i = 0; i < n; ++i) {
    if (c[i] != 3.0f * static_cast<float>(i)) {
      std::printf("FAIL c[%d]=%f expected %f\n", i, c[i], 3.0 * i);
      return 1;
    }
  }
  // Pinned memory, async copies and a stream of the client's own.
  float* pinned = nullptr;
  CHECK(cuMemAllocHost(reinterpret_cast<void**>(&pinned), bytes));
  CUstream stream{};
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemcpyDtoHAsync(pinned, dc, bytes, stream));
  CHECK(cuStreamSynchronize(stream));
  if (std::memcmp(pinned, c.data(), bytes) != 0) {
    std::printf("FAIL pinned copy differs\n");
    return 1;
  }
  CHECK(cuMemFreeHost(pinned));
  CHECK(cuStreamDestroy(stream));
  CHECK(cuMemFree(da));
  CHECK(cuMemFree(db));
  CHECK(cuMemFree(dc));
  std::printf("PASS basic n=%d\n", n);
  return 0;
}

// True once stdin reached its end (the test closed its pipe); with `block`, waits for that.
bool stdin_closed(bool block) {
  pollfd in{0, POLLIN, 0};
  if (::poll(&in, 1, block ? -1 : 0) <= 0) return false;
  char buffer[64];
  for (;;) {
    ssize_t n = ::read(0, buffer, sizeof buffer);
    if (n == 0) return true;
    if (n < 0 || !block) return false;
  }
}

// cuCtxSynchronize of a context that sent nothing since its last synchronize succeeded is
// answered in the shim (libshim/context.cpp); anything sent since, from any thread, sends it to
// the server again. The test counts the records the server ran for the client: under 100, where
// the 300 idle synchronizes alone would be 300 more. Then READY, and once stdin closes (the test
// killed the server meanwhile) an idle synchronize must fail, as every call does once the server is
// gone.
int idle_sync() {
  Setup s = setup();
  CUfunction sleeper{}, fill{};
  CHECK(cuModuleGetFunction(&sleeper, s.module, "sleep_kernel"));
  CHECK(cuModuleGetFunction(&fill, s.module, "fill_u32"));
  CUdeviceptr out;
  constexpr int kWords = 256;
  CHECK(cuMemAlloc(&out, kWords * sizeof(unsigned)));
  CHECK(cuCtxSynchronize());                                // 1: work was sent (the allocation)
  for (int i = 0; i < 100; ++i) CHECK(cuCtxSynchronize());  // idle: none reaches the server
  // A launch sends it to the server again, and it waits for the kernel.
  int us = 20'000;
  void* sleep_args[] = {&us};
  CHECK(cuLaunchKernel(sleeper, 1, 1, 1, 1, 1, 1, 0, nullptr, sleep_args, nullptr));
  auto t0 = std::chrono::steady_clock::now();
  CHECK(cuCtxSynchronize());  // 2
  const auto waited = std::chrono::steady_clock::now() - t0;
  for (int i = 0; i < 100; ++i) CHECK(cuCtxSynchronize());
  // Work sent from another thread counts as well; the result is there after the synchronize.
  unsigned value = 0x5eed;
  int n = kWords;
  std::thread other([&] {
    CHECK(cuCtxSetCurrent(s.ctx));
    void* fill_args[] = {&out, &value, &n};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, kWords, 1, 1, 0, nullptr, fill_args, nullptr));
  });
  other.join();
  CHECK(cuCtxSynchronize());  // 3
  for (int i = 0; i < 100; ++i) CHECK(cuCtxSynchronize());
  std::vector<unsigned> words(kWords);
  CHECK(cuMemcpyDtoH(words.data(), out, kWords * sizeof(unsigned)));
  CHECK(cuCtxSynchronize());  // 4: the copy was sent
  if (waited < std::chrono::milliseconds(20) ||
      std::count(words.begin(), words.end(), value) != kWords) {
    std::printf("FAIL the synchronize after a 20 ms kernel took %lld us; %ld of %d words filled\n",
                static_cast<long long>(
                    std::chrono::duration_cast<std::chrono::microseconds>(waited).count()),
                static_cast<long>(std::count(words.begin(), words.end(), value)), kWords);
    return 1;
  }
  std::printf("READY\n");
  std::fflush(stdout);
  stdin_closed(true);
  CUresult after = cuCtxSynchronize();
  std::printf("%s idle_sync after the server went: %d\n", after != CUDA_SUCCESS ? "PASS" : "FAIL",
              static_cast<int>(after));
  return after != CUDA_SUCCESS ? 0 : 1;
}

// `rounds` kernels of `us` microseconds (30 ms by default) on a stream, each followed by a
// synchronize that must wait for it and then see its result (the worker may sleep through the
// wait: fence_watch.hpp). Prints READY, then waits for stdin to close so the test can read the
// server's figures meanwhile.
int watched_sync(unsigned rounds, int kernel_us) {
  Setup s = setup();
  CUfunction sleeper{}, fill{};
  CHECK(cuModuleGetFunction(&sleeper, s.module, "sleep_kernel"));
  CHECK(cuModuleGetFunction(&fill, s.module, "fill_u32"));
  CUstream stream{};
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  constexpr int kWords = 64;
  CUdeviceptr out;
  CHECK(cuMemAlloc(&out, kWords * sizeof(unsigned)));
  for (unsigned round = 1; round <= rounds; ++round) {
    int us = kernel_us;
    int n = kWords;
    void* sleep_args[] = {&us};
    void* fill_args[] = {&out, &round, &n};
    // From before the launch: the kernel may run while this thread is kept off its CPU between
    // the launch and the synchronize, but cannot end before it was launched.
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(cuLaunchKernel(sleeper, 1, 1, 1, 1, 1, 1, 0, stream, sleep_args, nullptr));
    CHECK(cuLaunchKernel(fill, 1, 1, 1, kWords, 1, 1, 0, stream, fill_args, nullptr));
    CHECK(cuStreamSynchronize(stream));
    const auto waited = std::chrono::steady_clock::now() - t0;
    std::vector<unsigned> words(kWords);
    CHECK(cuMemcpyDtoH(words.data(), out, kWords * sizeof(unsigned)));
    const auto filled = std::count(words.begin(), words.end(), round);
    if (waited < std::chrono::microseconds(kernel_us) || filled != kWords) {
      std::printf("FAIL round %u: launch and synchronize took %lld us; %ld of %d words filled\n",
                  round,
                  static_cast<long long>(
                      std::chrono::duration_cast<std::chrono::microseconds>(waited).count()),
                  static_cast<long>(filled), kWords);
      return 1;
    }
  }
  std::printf("READY\n");
  std::fflush(stdout);
  stdin_closed(true);
  CHECK(cuMemFree(out));
  CHECK(cuStreamDestroy(stream));
  std::printf("PASS watched_sync\n");
  return 0;
}

// A client whose worker dozes (MPSSHIM_SERVER_DOZE): `launches` one-way kernel launches with
// 30 us of host work between them, then copies of 64 MiB through the 32 MiB staging area both
// ways, whose later pieces wait for chunks no call of the client asks for, then the results
// checked. Prints READY elapsed_us=<from the first launch to the checked results>, then waits
// for stdin to close (the test reads `stats` meanwhile).
int trickle(unsigned launches) {
  Setup s = setup();
  CUfunction fill{};
  CHECK(cuModuleGetFunction(&fill, s.module, "fill_u32"));
  constexpr int kWords = 64;
  CUdeviceptr out;
  CHECK(cuMemAlloc(&out, kWords * sizeof(unsigned)));
  constexpr std::size_t kBigWords = std::size_t{16} << 20;  // 64 MiB
  std::vector<unsigned> big(kBigWords), back(kBigWords);
  for (std::size_t i = 0; i < kBigWords; ++i) big[i] = static_cast<unsigned>(i * 2654435761u);
  CUdeviceptr device_big;
  CHECK(cuMemAlloc(&device_big, kBigWords * sizeof(unsigned)));
  CHECK(cuCtxSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (unsigned i = 1; i <= launches; ++i) {
    unsigned value = i;
    int n = kWords;
    void* args[] = {&out, &value, &n};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, kWords, 1, 1, 0, nullptr, args, nullptr));
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(30);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  CHECK(cuMemcpyHtoD(device_big, big.data(), kBigWords * sizeof(unsigned)));
  CHECK(cuMemcpyDtoH(back.data(), device_big, kBigWords * sizeof(unsigned)));
  std::vector<unsigned> words(kWords);
  CHECK(cuMemcpyDtoH(words.data(), out, kWords * sizeof(unsigned)));
  const auto elapsed =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  if (std::count(words.begin(), words.end(), launches) != kWords || back != big) {
    std::printf(
        "FAIL trickle: %ld of %d words hold the last launch's value; the 64 MiB came "
        "back %s\n",
        static_cast<long>(std::count(words.begin(), words.end(), launches)), kWords,
        back == big ? "intact" : "changed");
    return 1;
  }
  std::printf("READY elapsed_us=%lld\n", static_cast<long long>(elapsed));
  std::fflush(stdout);
  stdin_closed(true);
  CHECK(cuMemFree(device_big));
  CHECK(cuMemFree(out));
  std::printf("PASS trickle\n");
  return 0;
}

// Many iterations of work, each checked: three fresh allocations, copies in (synchronous from
// pageable memory, or asynchronous from pinned memory on a stream of its own, alternately), a
// vector_add launch, the copy back and every element compared, the allocations freed. Prints
// READY once attached and set up. `gate`: waits for stdin to close before the first iteration.
// iterations 0: goes on until stdin closes (at least one iteration).
int stress(int iterations, bool gate) {
  Setup s = setup();
  CUfunction add{};
  CHECK(cuModuleGetFunction(&add, s.module, "vector_add"));
  CUstream stream{};
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  int n = 1 << 14;
  const size_t bytes = sizeof(float) * static_cast<size_t>(n);
  float* pinned = nullptr;
  CHECK(cuMemAllocHost(reinterpret_cast<void**>(&pinned), 3 * bytes));
  std::vector<float> a(n), b(n), c(n);
  const int salt = static_cast<int>(::getpid() % 1000);
  std::printf("READY pid=%d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
  if (gate) stdin_closed(true);
  int done = 0;
  for (; iterations == 0 ? done == 0 || !stdin_closed(false) : done < iterations; ++done) {
    const bool async = done % 2 == 1;
    float* ha = async ? pinned : a.data();
    float* hb = async ? pinned + n : b.data();
    float* hc = async ? pinned + 2 * n : c.data();
    for (int i = 0; i < n; ++i) {
      ha[i] = static_cast<float>(salt + done + i);
      hb[i] = static_cast<float>(2 * i);
      hc[i] = -1.0f;
    }
    CUdeviceptr da, db, dc;
    CHECK(cuMemAlloc(&da, bytes));
    CHECK(cuMemAlloc(&db, bytes));
    CHECK(cuMemAlloc(&dc, bytes));
    void* args[] = {&da, &db, &dc, &n};
    if (async) {
      CHECK(cuMemcpyHtoDAsync(da, ha, bytes, stream));
      CHECK(cuMemcpyHtoDAsync(db, hb, bytes, stream));
      CHECK(cuLaunchKernel(add, n / 256, 1, 1, 256, 1, 1, 0, stream, args, nullptr));
      CHECK(cuMemcpyDtoHAsync(hc, dc, bytes, stream));
      CHECK(cuStreamSynchronize(stream));
    } else {
      CHECK(cuMemcpyHtoD(da, ha, bytes));
      CHECK(cuMemcpyHtoD(db, hb, bytes));
      CHECK(cuLaunchKernel(add, n / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
      CHECK(cuMemcpyDtoH(hc, dc, bytes));
    }
    for (int i = 0; i < n; ++i) {
      if (hc[i] != static_cast<float>(salt + done + 3 * i)) {
        std::printf("FAIL stress iteration %d: c[%d]=%f expected %d\n", done, i, hc[i],
                    salt + done + 3 * i);
        return 1;
      }
    }
    CHECK(cuMemFree(da));
    CHECK(cuMemFree(db));
    CHECK(cuMemFree(dc));
  }
  CHECK(cuMemFreeHost(pinned));
  CHECK(cuStreamDestroy(stream));
  std::printf("PASS stress iterations=%d\n", done);
  return 0;
}

// Memory that must outlive a suspension (suspend_test.cpp): `megabytes` in one allocation and
// 64 small ones of 64 KiB (the heap's shared chunks), each filled with its own pattern, a stream
// and an event. READY, then a second thread keeps running the stress loop (allocate, copy in,
// add, copy back, check, free) until stdin closes, while the test suspends and resumes the
// client. Then every byte of the first allocations is checked at its address, and PASS.
int resident(std::size_t megabytes) {
  Setup s = setup();
  CUfunction add{};
  CHECK(cuModuleGetFunction(&add, s.module, "vector_add"));
  CUstream stream{};
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUevent event{};
  CHECK(cuEventCreate(&event, CU_EVENT_DEFAULT));
  struct Held {
    CUdeviceptr address = 0;
    std::size_t bytes = 0;
    unsigned char seed = 0;
  };
  std::vector<Held> held;
  held.push_back({0, megabytes << 20, 1});
  for (int i = 0; i < 64; ++i) held.push_back({0, 64 << 10, static_cast<unsigned char>(i + 2)});
  auto pattern = [](const Held& h, std::size_t i) {
    return static_cast<unsigned char>(h.seed * 31 + i * 7 + (i >> 12));
  };
  for (Held& h : held) {
    CHECK(cuMemAlloc(&h.address, h.bytes));
    std::vector<unsigned char> bytes(h.bytes);
    for (std::size_t i = 0; i < h.bytes; ++i) bytes[i] = pattern(h, i);
    CHECK(cuMemcpyHtoDAsync(h.address, bytes.data(), h.bytes, stream));
    CHECK(cuStreamSynchronize(stream));
  }
  CHECK(cuEventRecord(event, stream));
  std::atomic<bool> stop{false};
  std::atomic<long> iterations{0};
  std::atomic<int> failures{0};
  std::thread busy([&] {
    CHECK(cuCtxSetCurrent(s.ctx));
    const int n = 1 << 12;
    const std::size_t bytes = sizeof(float) * n;
    std::vector<float> a(n), b(n), c(n);
    for (long round = 0; !stop.load(); ++round) {
      for (int i = 0; i < n; ++i) {
        a[i] = static_cast<float>(round + i);
        b[i] = static_cast<float>(2 * i);
      }
      CUdeviceptr da, db, dc;
      CHECK(cuMemAlloc(&da, bytes));
      CHECK(cuMemAlloc(&db, bytes));
      CHECK(cuMemAlloc(&dc, bytes));
      int count = n;
      void* args[] = {&da, &db, &dc, &count};
      CHECK(cuMemcpyHtoDAsync(da, a.data(), bytes, stream));
      CHECK(cuMemcpyHtoDAsync(db, b.data(), bytes, stream));
      CHECK(cuLaunchKernel(add, n / 256, 1, 1, 256, 1, 1, 0, stream, args, nullptr));
      CHECK(cuMemcpyDtoHAsync(c.data(), dc, bytes, stream));
      CHECK(cuStreamSynchronize(stream));
      for (int i = 0; i < n; ++i) {
        if (c[i] != static_cast<float>(round + 3 * i)) {
          ++failures;
          break;
        }
      }
      CHECK(cuMemFree(da));
      CHECK(cuMemFree(db));
      CHECK(cuMemFree(dc));
      ++iterations;
    }
  });
  std::printf("READY pid=%d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
  stdin_closed(true);
  stop = true;
  busy.join();
  CHECK(cuEventSynchronize(event));
  for (const Held& h : held) {
    std::vector<unsigned char> bytes(h.bytes);
    CHECK(cuMemcpyDtoH(bytes.data(), h.address, h.bytes));
    for (std::size_t i = 0; i < h.bytes; ++i) {
      if (bytes[i] != pattern(h, i)) {
        std::printf("FAIL allocation %#llx of %zu bytes: byte %zu is %d, expected %d\n",
                    static_cast<unsigned long long>(h.address), h.bytes, i, bytes[i],
                    pattern(h, i));
        return 1;
      }
    }
    CHECK(cuMemFree(h.address));
  }
  if (failures.load() != 0) {
    std::printf("FAIL %d of %ld stress iterations computed wrong sums\n", failures.load(),
                iterations.load());
    return 1;
  }
  CHECK(cuEventDestroy(event));
  CHECK(cuStreamDestroy(stream));
  std::printf("PASS resident iterations=%ld\n", iterations.load());
  return 0;
}

// holder MB: one cuMemAlloc of MB MiB, its result printed (ALLOC <CUresult>) whether it fit or
// not; when it fit, whether it came cleared (FRESH zero, or the first byte that is not), and a
// known pattern is written into it. Then READY, nothing more until stdin
// closes (an idle client), and then the bytes are checked: PASS holder, or FAIL naming the first
// wrong byte. For the memory policies (memory_policy_test.cpp), under which the allocation may
// wait and the client may be suspended and resumed while idle.
// pitch_holder MB: the same with cuMemAllocPitch of rows of 1000 bytes, which the driver pads to
// a pitch of 1024 (printed: PITCH <bytes>), so the allocation is MB MiB whole.
// async_holder MB: the same with cuMemAllocAsync on a stream of its own (freed with
// cuMemFreeAsync).
enum class HolderCall { kAlloc, kPitch, kAsync };
int holder(std::size_t megabytes, HolderCall call) {
  setup();
  const std::size_t bytes = megabytes << 20;
  const bool pitched = call == HolderCall::kPitch;
  CUdeviceptr address = 0;
  std::size_t pitch = 0;
  CUstream stream = nullptr;
  CUresult r = CUDA_SUCCESS;
  if (pitched) {
    r = cuMemAllocPitch(&address, &pitch, 1000, bytes / 1024, 4);
  } else if (call == HolderCall::kAsync) {
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    if (r = cuMemAllocAsync(&address, bytes, stream); r == CUDA_SUCCESS) {
      CHECK(cuStreamSynchronize(stream));
    }
  } else {
    r = cuMemAlloc(&address, bytes);
  }
  std::printf("ALLOC %d\n", static_cast<int>(r));
  if (pitched) std::printf("PITCH %zu\n", pitch);
  auto pattern = [](std::size_t i) { return static_cast<unsigned char>(i * 13 + (i >> 16)); };
  std::vector<unsigned char> host(r == CUDA_SUCCESS ? bytes : 0);
  if (r == CUDA_SUCCESS) {
    // New memory holds no other client's bytes, even when it was a preempted client's.
    CHECK(cuMemcpyDtoH(host.data(), address, bytes));
    const auto dirty = std::find_if(host.begin(), host.end(), [](unsigned char b) { return b; });
    if (dirty == host.end()) {
      std::printf("FRESH zero\n");
    } else {
      std::printf("FRESH byte %td is %d\n", dirty - host.begin(), *dirty);
    }
    for (std::size_t i = 0; i < bytes; ++i) host[i] = pattern(i);
    CHECK(cuMemcpyHtoD(address, host.data(), bytes));
  }
  std::printf("READY pid=%d\n", static_cast<int>(::getpid()));
  std::fflush(stdout);
  stdin_closed(true);
  if (r != CUDA_SUCCESS) {
    std::printf("PASS holder, nothing held\n");
    return 0;
  }
  std::fill(host.begin(), host.end(), 0);
  CHECK(cuMemcpyDtoH(host.data(), address, bytes));
  for (std::size_t i = 0; i < bytes; ++i) {
    if (host[i] != pattern(i)) {
      std::printf("FAIL byte %zu of %zu is %d, expected %d\n", i, bytes, host[i], pattern(i));
      return 1;
    }
  }
  if (stream != nullptr) {
    CHECK(cuMemFreeAsync(address, stream));
    CHECK(cuStreamSynchronize(stream));
    CHECK(cuStreamDestroy(stream));
  } else {
    CHECK(cuMemFree(address));
  }
  std::printf("PASS holder\n");
  return 0;
}

// peer_holder MB: one cuMemAlloc of MB MiB on GPU 0 (which may wait for a memory policy), a
// pattern written into it, then copied whole to GPU 1 with cuMemcpyPeer and read back there: GPU
// 1's server must map every physical allocation the block is made of (memory handed over by
// preempted clients is several: libshim/peer.cpp). PASS peer_holder, or FAIL naming the first
// wrong byte.
int peer_holder(std::size_t megabytes) {
  setup();
  const std::size_t bytes = megabytes << 20;
  CUcontext ctx[2]{};
  for (int d = 0; d < 2; ++d) CHECK(cuDevicePrimaryCtxRetain(&ctx[d], d));
  CHECK(cuCtxSetCurrent(ctx[0]));
  CUdeviceptr on0 = 0, on1 = 0;
  CHECK(cuMemAlloc(&on0, bytes));
  auto pattern = [](std::size_t i) { return static_cast<unsigned char>(i * 7 + (i >> 20)); };
  std::vector<unsigned char> host(bytes);
  for (std::size_t i = 0; i < bytes; ++i) host[i] = pattern(i);
  CHECK(cuMemcpyHtoD(on0, host.data(), bytes));
  CHECK(cuCtxSetCurrent(ctx[1]));
  CHECK(cuMemAlloc(&on1, bytes));
  CHECK(cuMemcpyPeer(on1, ctx[1], on0, ctx[0], bytes));
  std::fill(host.begin(), host.end(), 0);
  CHECK(cuMemcpyDtoH(host.data(), on1, bytes));
  for (std::size_t i = 0; i < bytes; ++i) {
    if (host[i] != pattern(i)) {
      std::printf("FAIL byte %zu of %zu copied to GPU 1 is %d, expected %d\n", i, bytes, host[i],
                  pattern(i));
      return 1;
    }
  }
  CHECK(cuMemFree(on1));
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemFree(on0));
  std::printf("PASS peer_holder\n");
  return 0;
}

int hog(std::size_t megabytes) {
  Setup s = setup();
  CUfunction sleeper{};
  CHECK(cuModuleGetFunction(&sleeper, s.module, "sleep_kernel"));
  CUdeviceptr big;
  CHECK(cuMemAlloc(&big, megabytes << 20));
  size_t free_bytes = 0, total = 0;
  CHECK(cuMemGetInfo(&free_bytes, &total));
  std::printf("READY free=%zu\n", free_bytes);
  std::fflush(stdout);
  int us = 2000;
  void* args[] = {&us};
  for (;;) {
    for (int i = 0; i < 8; ++i) {
      CHECK(cuLaunchKernel(sleeper, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
    }
    CHECK(cuCtxSynchronize());
  }
}

// Known work for the accounting test (e2e_test.cpp, "ps accounts"): 3 MiB and 1 MiB allocated
// and the 1 MiB freed again, 1 000 003 bytes copied in from pageable memory (staged), 500 000 bytes
// device to device, 250 001 bytes back, 64 KiB of pinned host memory held, `launches` sleep_kernel
// launches of 10 ms each and a synchronize. Then READY, and it holds everything until stdin closes,
// so that `ps` sees it alive.
int account(int launches) {
  constexpr std::size_t kIn = 1'000'003, kAcross = 500'000, kBack = 250'001;
  constexpr int kSleepUs = 10'000;
  Setup s = setup();
  CUfunction sleeper{};
  CHECK(cuModuleGetFunction(&sleeper, s.module, "sleep_kernel"));
  CUdeviceptr big, small;
  CHECK(cuMemAlloc(&big, 3 << 20));
  CHECK(cuMemAlloc(&small, 1 << 20));
  CHECK(cuMemFree(small));
  std::vector<unsigned char> host(kIn, 0x42);
  CHECK(cuMemcpyHtoD(big, host.data(), kIn));
  CHECK(cuMemcpyDtoD(big + (2 << 20), big, kAcross));
  std::vector<unsigned char> back(kBack, 0);
  CHECK(cuMemcpyDtoH(back.data(), big + (2 << 20), kBack));
  if (back[0] != 0x42 || back[kBack - 1] != 0x42) {
    std::printf("FAIL the bytes copied back are not the bytes copied in\n");
    return 1;
  }
  void* pinned = nullptr;
  CHECK(cuMemAllocHost(&pinned, 64 << 10));
  int us = kSleepUs;
  void* args[] = {&us};
  for (int i = 0; i < launches; ++i) {
    CHECK(cuLaunchKernel(sleeper, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
  }
  CHECK(cuCtxSynchronize());
  std::printf("READY\n");
  std::fflush(stdout);
  stdin_closed(true);
  CHECK(cuMemFreeHost(pinned));
  std::printf("PASS account\n");
  return 0;
}

int meminfo() {
  setup();
  size_t free_bytes = 0, total = 0;
  CHECK(cuMemGetInfo(&free_bytes, &total));
  std::printf("PASS free=%zu total=%zu\n", free_bytes, total);
  return 0;
}

// A client must not reach memory it does not own: ranges past its allocation and another
// client's pointer are refused, and the session (and the server) go on working.
int forge(unsigned long long foreign) {
  setup();
  CUdeviceptr mine;
  CHECK(cuMemAlloc(&mine, 4096));
  std::vector<char> host(8192, 1);
  CUresult past_end = cuMemcpyHtoD(mine + 4096 - 16, host.data(), 64);
  CUresult synced = cuCtxSynchronize();
  CUresult other = CUDA_SUCCESS;
  if (foreign != 0) {
    other = cuMemcpyDtoH(host.data(), foreign, 16);
    if (other == CUDA_SUCCESS) other = cuCtxSynchronize();
  }
  CUresult bad_free = cuMemFree(mine + 64);
  // Still usable afterwards.
  CHECK(cuMemcpyHtoD(mine, host.data(), 4096));
  CHECK(cuMemcpyDtoH(host.data() + 4096, mine, 4096));
  CHECK(cuCtxSynchronize());
  bool ok = (past_end != CUDA_SUCCESS || synced != CUDA_SUCCESS) &&
            (foreign == 0 || other != CUDA_SUCCESS) && bad_free != CUDA_SUCCESS &&
            std::memcmp(host.data(), host.data() + 4096, 4096) == 0;
  std::printf("%s forge past_end=%d/%d foreign=%d bad_free=%d\n", ok ? "PASS" : "FAIL", past_end,
              synced, other, bad_free);
  return ok ? 0 : 1;
}

// Another client's pointer through every API that could name or reveal it: cuPointerGetAttribute,
// cuMemGetAddressRange, an IPC handle forged from it, VMM export and import. All must fail. (The
// IPC export of one's own memory works: docs/ipc.md.)
int foreign(unsigned long long p) {
  setup();
  std::map<std::string, CUresult> results;
  CUcontext ctx = nullptr;
  results["cuPointerGetAttribute"] = cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p);
  CUdeviceptr base = 0;
  size_t size = 0;
  results["cuMemGetAddressRange"] = cuMemGetAddressRange(&base, &size, p);
  CUipcMemHandle handle{};
  std::memcpy(handle.reserved, &p, sizeof p);
  CUdeviceptr opened = 0;
  results["cuIpcOpenMemHandle"] =
      cuIpcOpenMemHandle(&opened, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  CUdeviceptr mine;
  CHECK(cuMemAlloc(&mine, 4096));
  CHECK(cuIpcGetMemHandle(&handle, mine));
  int shared_fd = -1;
  results["cuMemExportToShareableHandle"] =
      cuMemExportToShareableHandle(&shared_fd, static_cast<CUmemGenericAllocationHandle>(p),
                                   CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  CUmemGenericAllocationHandle imported = 0;
  int own_fd = ::memfd_create("forged", 0);
  results["cuMemImportFromShareableHandle"] = cuMemImportFromShareableHandle(
      &imported, reinterpret_cast<void*>(static_cast<std::intptr_t>(own_fd)),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  bool ok = true;
  for (const auto& [api, r] : results) {
    std::printf("RESULT %s=%d\n", api.c_str(), r);
    ok &= r != CUDA_SUCCESS;
  }
  CHECK(cuMemFree(mine));
  std::printf("%s foreign\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

// Isolation groups (isolation_test.cpp). The victim fills a buffer with the bits of pi, says where
// it is (after a spacer, so that a fresh server's first allocation does not land there too) and,
// once stdin closes, checks that nothing touched it and that its GPU still runs its work.
constexpr unsigned kVictimSecret = 0x40490fdbu;

int victim() {
  Setup s = setup();
  constexpr int kCount = 1024;
  constexpr std::size_t kBytes = sizeof(float) * kCount;
  CUdeviceptr spacer{}, secret{};
  CHECK(cuMemAlloc(&spacer, std::size_t{64} << 20));
  CHECK(cuMemAlloc(&secret, kBytes));
  CHECK(cuMemsetD32(secret, kVictimSecret, kCount));
  CHECK(cuCtxSynchronize());
  std::printf("VICTIM %llu END\n", static_cast<unsigned long long>(secret));
  std::fflush(stdout);
  stdin_closed(true);
  std::vector<unsigned> back(kCount);
  CHECK(cuMemcpyDtoH(back.data(), secret, kBytes));
  for (unsigned word : back) {
    if (word != kVictimSecret) {
      std::printf("FAIL victim: its buffer holds %#x\n", word);
      return 1;
    }
  }
  // Its GPU still runs its work: y = 1 * secret + y, with y zero, is the secret again.
  CUfunction scale{};
  CHECK(cuModuleGetFunction(&scale, s.module, "scale_add"));
  CHECK(cuMemsetD32(spacer, 0, kCount));
  float alpha = 1.0f;
  int n = kCount;
  void* args[] = {&spacer, &secret, &alpha, &n};
  CHECK(cuLaunchKernel(scale, 4, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  CHECK(cuCtxSynchronize());
  CHECK(cuMemcpyDtoH(back.data(), spacer, kBytes));
  if (back[kCount - 1] != kVictimSecret) {
    std::printf("FAIL victim: its kernel computed %#x\n", back[kCount - 1]);
    return 1;
  }
  CHECK(cuMemFree(secret));
  CHECK(cuMemFree(spacer));
  std::printf("PASS victim\n");
  return 0;
}

// READY once attached; when stdin closes, a kernel reads `address` (another client's, handed
// over by the test) into a buffer of its own: PEEK with the launch's and the synchronize's
// results and the first word read.
int peek(unsigned long long address) {
  Setup s = setup();
  constexpr int kCount = 1024;
  CUfunction scale{};
  CHECK(cuModuleGetFunction(&scale, s.module, "scale_add"));
  CUdeviceptr mine{};
  CHECK(cuMemAlloc(&mine, sizeof(float) * kCount));
  CHECK(cuMemsetD32(mine, 0, kCount));
  CHECK(cuCtxSynchronize());
  std::printf("READY\n");
  std::fflush(stdout);
  stdin_closed(true);
  CUdeviceptr theirs = address;
  float alpha = 1.0f;
  int n = kCount;
  void* args[] = {&mine, &theirs, &alpha, &n};
  const CUresult launched = cuLaunchKernel(scale, 4, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr);
  const CUresult synced = cuCtxSynchronize();
  unsigned first = 0;
  if (launched == CUDA_SUCCESS && synced == CUDA_SUCCESS) {
    CHECK(cuMemcpyDtoH(&first, mine, sizeof first));
  }
  std::printf("PEEK launch=%d sync=%d read=%#x\n", launched, synced, first);
  return 0;
}

int pointer() {
  setup();
  CUdeviceptr p;
  CHECK(cuMemAlloc(&p, 1 << 20));
  std::printf("POINTER %llu\n", static_cast<unsigned long long>(p));
  std::fflush(stdout);
  // Keep the allocation alive until the test kills us.
  for (;;) pause();
}

// Pointer attributes libraries ask before they choose a path (JAX asks ALLOWED_HANDLE_TYPES,
// PyTorch and NCCL IS_LEGACY_CUDA_IPC_CAPABLE): answered from what the shim knows, each
// checked against what is true under mpsshim.
int attributes() {
  setup();
  int failures = 0;
  auto expect = [&](const char* what, unsigned long long got, unsigned long long want) {
    if (got != want) {
      std::printf("attributes: %s = %#llx, expected %#llx\n", what, got, want);
      ++failures;
    }
  };
  constexpr std::size_t kBytes = 1 << 20;
  CUdeviceptr a{}, b{};
  CHECK(cuMemAlloc(&a, kBytes));
  CHECK(cuMemAlloc(&b, kBytes));
  unsigned long long id_a = 0, id_b = 0;
  CHECK(cuPointerGetAttribute(&id_a, CU_POINTER_ATTRIBUTE_BUFFER_ID, a + 100));
  CHECK(cuPointerGetAttribute(&id_b, CU_POINTER_ATTRIBUTE_BUFFER_ID, b));
  expect("two allocations have different buffer ids", id_a != id_b, 1);
  // An id is never reused, even when the same address comes back.
  CHECK(cuMemFree(a));
  CUdeviceptr again{};
  CHECK(cuMemAlloc(&again, kBytes));
  unsigned long long id_again = 0, block = 0;
  CHECK(cuPointerGetAttribute(&id_again, CU_POINTER_ATTRIBUTE_BUFFER_ID, again));
  CHECK(cuPointerGetAttribute(&block, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, again));
  expect("a new allocation's id is new", id_again != id_a && id_again != id_b, 1);
  expect("memory block id is the buffer id", block, id_again);

  int flag = -1;
  CHECK(cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, b));
  expect("cuMemAlloc memory is legacy IPC capable", static_cast<unsigned long long>(flag), 1);
  CHECK(cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, b));
  expect("GPUDirect RDMA capable", static_cast<unsigned long long>(flag), 0);
  CHECK(cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_ACCESS_FLAGS, b));
  expect("access flags", static_cast<unsigned long long>(flag),
         CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE);
  unsigned handle_types = 0xffu;
  CHECK(cuPointerGetAttribute(&handle_types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, b));
  expect("allowed handle types of cuMemAlloc memory", handle_types, 0);
  void* mapping_base = nullptr;
  size_t mapping_size = 0;
  CHECK(cuPointerGetAttribute(&mapping_base, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, b + 4096));
  CHECK(cuPointerGetAttribute(&mapping_size, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, b + 4096));
  expect("mapping base", reinterpret_cast<unsigned long long>(mapping_base), b);
  expect("mapping size", mapping_size, kBytes);
  CUmemoryPool pool = reinterpret_cast<CUmemoryPool>(1);
  CHECK(cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, b));
  expect("cuMemAlloc memory has no pool", reinterpret_cast<unsigned long long>(pool), 0);

  // Stream-ordered memory names its pool.
  CUmemoryPool default_pool{};
  CHECK(cuDeviceGetDefaultMemPool(&default_pool, 0));
  CUdeviceptr pooled{};
  CHECK(cuMemAllocAsync(&pooled, kBytes, nullptr));
  CHECK(cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, pooled + 8));
  CHECK(cuPointerGetAttribute(&flag, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, pooled));
  expect("pool memory is not legacy IPC capable", static_cast<unsigned long long>(flag), 0);
  expect("a pool allocation's pool", reinterpret_cast<unsigned long long>(pool),
         reinterpret_cast<unsigned long long>(default_pool));

  // Several at once, as cudaPointerGetAttributes asks them.
  CUpointer_attribute which[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                 CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
                                 CU_POINTER_ATTRIBUTE_MAPPING_SIZE};
  unsigned memory_type = 0;
  handle_types = 0xffu;
  mapping_size = 0;
  void* data[] = {&memory_type, &handle_types, &mapping_size};
  CHECK(cuPointerGetAttributes(3, which, data, pooled));
  expect("memory type (several)", memory_type, CU_MEMORYTYPE_DEVICE);
  expect("allowed handle types (several)", handle_types, 0);
  expect("mapping size (several)", mapping_size, kBytes);
  CHECK(cuMemFreeAsync(pooled, nullptr));
  CHECK(cuCtxSynchronize());
  CHECK(cuMemFree(b));
  CHECK(cuMemFree(again));
  // Profiler control succeeds as with no profiler attached, and needs a current context.
  expect("cuProfilerStart", cuProfilerStart(), CUDA_SUCCESS);
  expect("cuProfilerStop", cuProfilerStop(), CUDA_SUCCESS);
  CUcontext was{};
  CHECK(cuCtxGetCurrent(&was));
  CHECK(cuCtxSetCurrent(nullptr));
  expect("cuProfilerStart without a context", cuProfilerStart(), CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuCtxSetCurrent(was));
  std::printf("%s attributes\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}

// vector_add(a, b) through `add` in the current context: how many sums came back wrong.
int wrong_sums(CUfunction add, const std::vector<float>& a, const std::vector<float>& b) {
  int n = static_cast<int>(a.size());
  std::vector<float> c(a.size(), -1.0f);
  const size_t bytes = sizeof(float) * a.size();
  CUdeviceptr da{}, db{}, dc{};
  CHECK(cuMemAlloc(&da, bytes));
  CHECK(cuMemAlloc(&db, bytes));
  CHECK(cuMemAlloc(&dc, bytes));
  CHECK(cuMemcpyHtoD(da, a.data(), bytes));
  CHECK(cuMemcpyHtoD(db, b.data(), bytes));
  void* args[] = {&da, &db, &dc, &n};
  CHECK(cuLaunchKernel(add, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  CHECK(cuMemcpyDtoH(c.data(), dc, bytes));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += c[i] != a[i] + b[i];
  CHECK(cuMemFree(da));
  CHECK(cuMemFree(db));
  CHECK(cuMemFree(dc));
  return wrong;
}

// vector_add of n elements on `device`'s primary context, checked; made current first.
bool add_on(CUdevice device, int n) {
  CUcontext ctx{};
  CHECK(cuDevicePrimaryCtxRetain(&ctx, device));
  CHECK(cuCtxSetCurrent(ctx));
  CUmodule module{};
  CHECK(cuModuleLoadData(&module, kModuleImage));
  CUfunction add{};
  CHECK(cuModuleGetFunction(&add, module, "vector_add"));
  std::vector<float> a(n), b(n);
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i + device);
    b[i] = 0.5f * static_cast<float>(i);
  }
  const int wrong = wrong_sums(add, a, b);
  CHECK(cuModuleUnload(module));
  if (wrong != 0) std::printf("device %d: %d wrong elements\n", device, wrong);
  return wrong == 0;
}

// One client on two GPUs: a session with each GPU's server, work on both checked,
// and what is not served across GPUs said honestly. With `fault`, a kernel faults on GPU 0:
// GPU 0's work reports it, GPU 1's work goes on.
// Every kind of device address the servers place, on both GPUs at once: small and large
// cuMemAlloc, pitch and VMM reservations. Each lies in its GPU's arena (so no two GPUs' overlap),
// reads back its own GPU's data, and the client's host memory cannot take the window.
bool one_address_space() {
  constexpr std::size_t kSmall = 1 << 16, kLarge = std::size_t{6} << 20, kReserve = 64u << 20;
  bool ok = true;
  CUcontext ctx[2]{};
  CUdeviceptr small[2]{}, large[2]{}, pitched[2]{}, reserved[2]{};
  // Stream-ordered: small and large from the device's default pool, and from a pool of its own.
  CUdeviceptr pooled_small[2]{}, pooled_large[2]{}, from_pool[2]{};
  CUmemoryPool pool[2]{};
  std::size_t pitch[2]{};
  for (int d = 0; d < 2; ++d) {
    CHECK(cuDevicePrimaryCtxRetain(&ctx[d], d));
    CHECK(cuCtxSetCurrent(ctx[d]));
    CHECK(cuMemAlloc(&small[d], kSmall));
    CHECK(cuMemAlloc(&large[d], kLarge));
    CHECK(cuMemAllocPitch(&pitched[d], &pitch[d], 1000, 8, 4));
    CHECK(cuMemAddressReserve(&reserved[d], kReserve, 0, 0, 0));
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = d;
    CHECK(cuMemPoolCreate(&pool[d], &props));
    CHECK(cuMemAllocAsync(&pooled_small[d], kSmall, nullptr));
    CHECK(cuMemAllocAsync(&pooled_large[d], kLarge, nullptr));
    CHECK(cuMemAllocFromPoolAsync(&from_pool[d], kSmall, pool[d], nullptr));
    CHECK(cuMemsetD8Async(pooled_large[d], static_cast<unsigned char>(0x30 + d), kLarge, nullptr));
    CHECK(cuMemsetD8(small[d], static_cast<unsigned char>(0x10 + d), kSmall));
    CHECK(cuMemsetD8(large[d], static_cast<unsigned char>(0x20 + d), kLarge));
  }
  for (int d = 0; d < 2; ++d) {
    const CUdeviceptr mine[] = {small[d],        large[d],        pitched[d],  reserved[d],
                                pooled_small[d], pooled_large[d], from_pool[d]};
    for (CUdeviceptr address : mine) {
      if (mpsshim::proto::arena_holding(address) != d) {
        std::printf("two_gpus: GPU %d handed out %#llx, outside its arena (%#llx)\n", d, address,
                    static_cast<unsigned long long>(mpsshim::proto::arena_base(d)));
        ok = false;
      }
    }
    if (pitch[d] < 1000 || pitch[d] % 512 != 0) {
      std::printf("two_gpus: GPU %d: pitch %zu for rows of 1000 bytes\n", d, pitch[d]);
      ok = false;
    }
    CHECK(cuCtxSetCurrent(ctx[d]));
    int ordinal = -1;
    CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, small[d]));
    int pooled_ordinal = -1;
    CHECK(cuPointerGetAttribute(&pooled_ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                pooled_large[d]));
    unsigned char bytes[3] = {};
    CHECK(cuMemcpyDtoH(&bytes[0], small[d] + 7, 1));
    CHECK(cuMemcpyDtoH(&bytes[1], large[d] + kLarge - 1, 1));
    CHECK(cuMemcpyDtoH(&bytes[2], pooled_large[d] + 5, 1));
    if (ordinal != d || pooled_ordinal != d || bytes[0] != 0x10 + d || bytes[1] != 0x20 + d ||
        bytes[2] != 0x30 + d) {
      std::printf("two_gpus: GPU %d's allocations read as GPU %d's / %d's (bytes %#x %#x %#x)\n", d,
                  ordinal, pooled_ordinal, bytes[0], bytes[1], bytes[2]);
      ok = false;
    }
  }
  // The window is the client's too: no host mapping may land on a device address.
  void* host = mmap(reinterpret_cast<void*>(small[0]), 4096, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (host != MAP_FAILED) {
    std::printf("two_gpus: the host mapped %p, GPU 0's device address\n", host);
    munmap(host, 4096);
    ok = false;
  }
  for (int d = 0; d < 2; ++d) {
    CHECK(cuCtxSetCurrent(ctx[d]));
    CHECK(cuMemFree(small[d]));
    CHECK(cuMemFree(large[d]));
    CHECK(cuMemFree(pitched[d]));
    CHECK(cuMemAddressFree(reserved[d], kReserve));
    CHECK(cuMemFreeAsync(pooled_small[d], nullptr));
    CHECK(cuMemFreeAsync(pooled_large[d], nullptr));
    CHECK(cuMemFreeAsync(from_pool[d], nullptr));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemPoolDestroy(pool[d]));
  }
  return ok;
}

// cuMemcpyPeer is serialized with the pending work of its source context, also on another GPU
// (another server): GPU 0 sleeps 50 ms, then fills a buffer; GPU 1's cuMemcpyPeer of that buffer,
// sent at once, must copy the filled bytes, and GPU 0's later refill must not reach the copy.
bool peer_copy_serialized() {
  constexpr std::size_t kBytes = 1 << 16;
  CUcontext ctx[2]{};
  for (int d = 0; d < 2; ++d) CHECK(cuDevicePrimaryCtxRetain(&ctx[d], d));
  CHECK(cuCtxSetCurrent(ctx[0]));
  CUmodule module{};
  CHECK(cuModuleLoadData(&module, kModuleImage));
  CUfunction sleeper{};
  CHECK(cuModuleGetFunction(&sleeper, module, "sleep_kernel"));
  CUdeviceptr on0{}, on1{};
  CHECK(cuMemAlloc(&on0, kBytes));
  CHECK(cuMemsetD8(on0, 0x11, kBytes));
  CHECK(cuCtxSynchronize());
  int us = 50'000;
  void* args[] = {&us};
  CHECK(cuLaunchKernel(sleeper, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
  CHECK(cuMemsetD8(on0, 0x77, kBytes));  // queued behind the sleep
  CHECK(cuCtxSetCurrent(ctx[1]));
  CHECK(cuMemAlloc(&on1, kBytes));
  CHECK(cuMemcpyPeer(on1, ctx[1], on0, ctx[0], kBytes));
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemsetD8(on0, 0x22, kBytes));  // after the copy
  CHECK(cuCtxSynchronize());
  CHECK(cuCtxSetCurrent(ctx[1]));
  std::vector<unsigned char> copied(kBytes);
  CHECK(cuMemcpyDtoH(copied.data(), on1, kBytes));
  const auto filled = std::count(copied.begin(), copied.end(), 0x77);
  bool ok = filled == static_cast<long>(kBytes);
  if (!ok) {
    std::printf(
        "two_gpus: cuMemcpyPeer copied %ld of %zu bytes GPU 0 filled before it (byte 0: "
        "0x%02x)\n",
        static_cast<long>(filled), kBytes, copied[0]);
  }
  CHECK(cuMemFree(on1));
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemFree(on0));
  CHECK(cuModuleUnload(module));
  return ok;
}

// Copies between the GPUs (cuMemcpyPeer, a unified-address copy issued on the other GPU's
// stream, a copy to the host of the other GPU's memory) and a kernel on GPU 1 that reads GPU 0's
// memory once peer access is on; then GPU 0's memory is freed while GPU 1's server maps it.
bool peer_copies_and_access() {
  constexpr int kCount = 50'000;
  constexpr std::size_t kBytes = sizeof(float) * kCount;
  bool ok = true;
  CUcontext ctx[2]{};
  for (int d = 0; d < 2; ++d) CHECK(cuDevicePrimaryCtxRetain(&ctx[d], d));
  std::vector<float> a(kCount), b(kCount), out(kCount);
  for (int i = 0; i < kCount; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 0.25f * static_cast<float>(i);
  }
  CUdeviceptr on0 = 0, on1 = 0, back = 0, sum = 0;
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemAlloc(&on0, kBytes));
  CHECK(cuMemAlloc(&back, kBytes));
  CHECK(cuMemcpyHtoD(on0, a.data(), kBytes));
  CHECK(cuCtxSynchronize());  // GPU 1's copies below are not ordered after GPU 0's stream
  CHECK(cuCtxSetCurrent(ctx[1]));
  CHECK(cuMemAlloc(&on1, kBytes));
  CHECK(cuMemAlloc(&sum, kBytes));
  CHECK(cuMemcpyHtoD(on1, b.data(), kBytes));
  // GPU 0 -> GPU 1, on GPU 1's legacy stream; then back with a unified copy on GPU 0's.
  CUdeviceptr copied = 0;
  CHECK(cuMemAlloc(&copied, kBytes));
  CHECK(cuMemcpyPeer(copied, ctx[1], on0, ctx[0], kBytes));
  CHECK(cuMemcpyDtoH(out.data(), copied, kBytes));
  if (out != a) {
    std::printf("two_gpus: cuMemcpyPeer from GPU 0 to GPU 1 did not copy the data\n");
    ok = false;
  }
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemcpy(back, on1, kBytes));
  CHECK(cuMemcpyDtoH(out.data(), back, kBytes));
  if (out != b) {
    std::printf("two_gpus: a unified copy from GPU 1 to GPU 0 did not copy the data\n");
    ok = false;
  }
  // GPU 1's memory read to the host while GPU 0's context is current (unified addressing).
  std::fill(out.begin(), out.end(), -1.0f);
  CHECK(cuMemcpyDtoH(out.data(), on1, kBytes));
  if (out != b) {
    std::printf("two_gpus: GPU 1's memory read through GPU 0's context came back wrong\n");
    ok = false;
  }
  // A kernel on GPU 1 adds GPU 0's vector to its own.
  CHECK(cuCtxSetCurrent(ctx[1]));
  CHECK(cuCtxEnablePeerAccess(ctx[0], 0));
  if (cuCtxEnablePeerAccess(ctx[0], 0) != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
    std::printf("two_gpus: enabling peer access twice did not say it already was\n");
    ok = false;
  }
  CUmodule module{};
  CHECK(cuModuleLoadData(&module, kModuleImage));
  CUfunction add{};
  CHECK(cuModuleGetFunction(&add, module, "vector_add"));
  int n = kCount;
  void* args[] = {&on0, &on1, &sum, &n};
  CHECK(cuLaunchKernel(add, (kCount + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  CHECK(cuMemcpyDtoH(out.data(), sum, kBytes));
  int wrong = 0;
  for (int i = 0; i < kCount; ++i) wrong += out[i] != a[i] + b[i];
  if (wrong != 0) {
    std::printf("two_gpus: a kernel on GPU 1 reading GPU 0's memory got %d wrong sums\n", wrong);
    ok = false;
  }
  // `back` shares its 2 MiB chunk with `on0` (both small, both GPU 0's): freeing it must leave
  // the chunk mapped in GPU 1's server, where the next kernel still reads `on0`.
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemFree(back));
  CHECK(cuCtxSetCurrent(ctx[1]));
  CHECK(cuMemsetD32(sum, 0, kCount));
  CHECK(cuLaunchKernel(add, (kCount + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  if (cuMemcpyDtoH(out.data(), sum, kBytes) != CUDA_SUCCESS ||
      out[kCount - 1] != a.back() + b.back()) {
    std::printf(
        "two_gpus: after a neighbour's free, GPU 1's kernel no longer read GPU 0's memory\n");
    ok = false;
  }
  // A copy from inside an allocation of GPU 0 that GPU 1's server has not mapped yet.
  CUdeviceptr fresh = 0;
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemAlloc(&fresh, kBytes));
  CHECK(cuMemcpyHtoD(fresh, a.data(), kBytes));
  CHECK(cuCtxSynchronize());  // a pageable copy may return before the device has the data
  CHECK(cuCtxSetCurrent(ctx[1]));
  std::fill(out.begin(), out.end(), -1.0f);
  CHECK(cuMemcpyPeer(copied, ctx[1], fresh + 4096, ctx[0], kBytes - 4096));
  CHECK(cuMemcpyDtoH(out.data(), copied, kBytes - 4096));
  if (!std::equal(a.begin() + 1024, a.end(), out.begin())) {
    std::printf("two_gpus: a peer copy from inside GPU 0's allocation came back wrong\n");
    ok = false;
  }
  // Stream-ordered memory of GPU 0 copied to GPU 1 (it lies in GPU 0's arena too).
  CUdeviceptr pooled = 0;
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemAllocAsync(&pooled, kBytes, nullptr));
  CHECK(cuMemcpyHtoDAsync(pooled, b.data(), kBytes, nullptr));
  CHECK(cuCtxSynchronize());
  CHECK(cuCtxSetCurrent(ctx[1]));
  std::fill(out.begin(), out.end(), -1.0f);
  CHECK(cuMemcpyPeer(copied, ctx[1], pooled, ctx[0], kBytes));
  CHECK(cuMemcpyDtoH(out.data(), copied, kBytes));
  if (out != b) {
    std::printf("two_gpus: a peer copy of GPU 0's cuMemAllocAsync memory came back wrong\n");
    ok = false;
  }
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemFreeAsync(pooled, nullptr));
  CHECK(cuCtxSetCurrent(ctx[1]));
  CHECK(cuModuleUnload(module));
  CHECK(cuCtxDisablePeerAccess(ctx[0]));
  // With peer access off again, a pool of GPU 0 given to GPU 1 (cuMemPoolSetAccess, as PyTorch's
  // stream-ordered allocator does): its allocations are mapped into GPU 1's server, whose kernel
  // then reads one.
  {
    CHECK(cuCtxSetCurrent(ctx[0]));
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 0;
    CUmemoryPool pool{};
    CHECK(cuMemPoolCreate(&pool, &props));
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 1;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemPoolSetAccess(pool, &access, 1));
    CUmemAccess_flags granted{};
    CHECK(cuMemPoolGetAccess(&granted, pool, &access.location));
    CUdeviceptr from_pool = 0;
    CHECK(cuMemAllocFromPoolAsync(&from_pool, kBytes, pool, nullptr));
    CHECK(cuMemcpyHtoDAsync(from_pool, a.data(), kBytes, nullptr));
    CHECK(cuCtxSynchronize());
    CHECK(cuCtxSetCurrent(ctx[1]));
    CUmodule again{};
    CHECK(cuModuleLoadData(&again, kModuleImage));
    CUfunction add_again{};
    CHECK(cuModuleGetFunction(&add_again, again, "vector_add"));
    void* pool_args[] = {&from_pool, &on1, &sum, &n};
    CHECK(cuLaunchKernel(add_again, (kCount + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, pool_args,
                         nullptr));
    CHECK(cuMemcpyDtoH(out.data(), sum, kBytes));
    int wrong_pool = 0;
    for (int i = 0; i < kCount; ++i) wrong_pool += out[i] != a[i] + b[i];
    if (granted != CU_MEM_ACCESS_FLAGS_PROT_READWRITE || wrong_pool != 0) {
      std::printf("two_gpus: a pool given to GPU 1: access %d, %d wrong sums\n", granted,
                  wrong_pool);
      ok = false;
    }
    CHECK(cuModuleUnload(again));
    CHECK(cuCtxSetCurrent(ctx[0]));
    CHECK(cuMemFreeAsync(from_pool, nullptr));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemPoolDestroy(pool));
  }
  // GPU 0's memory goes while GPU 1's server maps it: it lets go first.
  CHECK(cuCtxSetCurrent(ctx[0]));
  CHECK(cuMemFree(on0));
  CHECK(cuMemFree(fresh));
  CHECK(cuCtxSetCurrent(ctx[1]));
  CHECK(cuMemFree(on1));
  CHECK(cuMemFree(sum));
  CHECK(cuMemFree(copied));
  CHECK(cuCtxSynchronize());
  return ok;
}

// One library's kernel (a CUkernel, context-independent, as the CUDA runtime uses them) launched
// on both GPUs: loaded with no context current, first used on GPU 0, then launched on GPU 1,
// whose server has never seen the library.
bool library_kernel_on_both() {
  CHECK(cuCtxSetCurrent(nullptr));
  CUlibrary library{};
  CHECK(cuLibraryLoadData(&library, kModuleImage, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel{};
  CHECK(cuLibraryGetKernel(&kernel, library, "vector_add"));
  bool ok = true;
  int threads_on_0 = 0;
  for (int d = 0; d < 2; ++d) {
    CUcontext ctx{};
    CHECK(cuDevicePrimaryCtxRetain(&ctx, d));
    CHECK(cuCtxSetCurrent(ctx));
    // A CUkernel is device-independent: its attributes answer for the device named, or, passed
    // as a CUfunction, for the current context's (cuBLAS sets its kernels up so on each GPU).
    int threads = 0, as_function = 0;
    CHECK(cuKernelGetAttribute(&threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, kernel, d));
    CHECK(cuFuncGetAttribute(&as_function, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                             reinterpret_cast<CUfunction>(kernel)));
    CHECK(cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 1024, kernel, d));
    int blocks = 0;
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<CUfunction>(kernel),
                                                      256, 0));
    if (d == 0) threads_on_0 = threads;
    if (threads <= 0 || threads != as_function || threads != threads_on_0 || blocks <= 0) {
      std::printf(
          "two_gpus: the library's kernel on GPU %d: %d threads per block (as a function "
          "%d, on GPU 0 %d), %d blocks per SM\n",
          d, threads, as_function, threads_on_0, blocks);
      ok = false;
    }
    const int n = 10'000 + d;
    // On GPU 1 through the function cuKernelGetFunction gives in its context, as NCCL does.
    CUfunction function = reinterpret_cast<CUfunction>(kernel);
    if (d == 1) CHECK(cuKernelGetFunction(&function, kernel));
    const int wrong =
        wrong_sums(function, std::vector<float>(n, 1.0f + d), std::vector<float>(n, 2.0f));
    if (wrong != 0) {
      std::printf("two_gpus: the library's kernel on GPU %d got %d wrong sums\n", d, wrong);
      ok = false;
    }
  }
  CHECK(cuLibraryUnload(library));
  return ok;
}

// Pinned memory allocated while GPU 0's context was current, then used by copies on GPU 1's
// stream (PyTorch's pinned host cache hands a block from one GPU to another's .item()): under
// unified addressing pinned memory is every GPU's.
bool pinned_on_both() {
  CUcontext ctx0{}, ctx1{};
  CHECK(cuDevicePrimaryCtxRetain(&ctx0, 0));
  CHECK(cuDevicePrimaryCtxRetain(&ctx1, 1));
  CHECK(cuCtxSetCurrent(ctx0));
  constexpr int n = 4096 + 3;
  const std::size_t bytes = sizeof(int) * n;
  void* p = nullptr;
  CHECK(cuMemHostAlloc(&p, bytes, 0));
  auto* host = static_cast<int*>(p);
  for (int i = 0; i < n; ++i) host[i] = 7 * i + 1;
  CHECK(cuCtxSetCurrent(ctx1));
  CUdeviceptr on1{};
  CHECK(cuMemAlloc(&on1, bytes));
  CUstream stream{};
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CHECK(cuMemcpyHtoDAsync(on1, host, bytes, stream));
  CHECK(cuStreamSynchronize(stream));
  std::memset(host, 0, bytes);
  CHECK(cuMemcpyDtoHAsync(host, on1, bytes, stream));
  CHECK(cuStreamSynchronize(stream));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += host[i] != 7 * i + 1;
  if (wrong != 0) std::printf("two_gpus: %d elements wrong through GPU 0's pinned memory\n", wrong);
  CHECK(cuStreamDestroy(stream));
  CHECK(cuMemFree(on1));
  CHECK(cuMemFreeHost(p));
  return wrong == 0;
}

int two_gpus(bool fault) {
  CHECK(cuInit(0));
  int count = 0;
  CHECK(cuDeviceGetCount(&count));
  if (count != 2) {
    std::printf("FAIL two_gpus: %d devices visible, expected 2\n", count);
    return 1;
  }
  bool ok = add_on(0, 100'003) && add_on(1, 70'001);
  int can = -1;
  CHECK(cuDeviceCanAccessPeer(&can, 0, 1));
  if (can != 1) {
    std::printf(
        "two_gpus: cuDeviceCanAccessPeer(0, 1) = %d, expected 1 (the test devices are "
        "peers)\n",
        can);
    ok = false;
  }
  // Allocations held on both GPUs at once. The two servers are two processes whose drivers
  // (the test driver, like the real one) hand out the same addresses; every device address must
  // still be its own GPU's: in that GPU's arena, apart from the other GPU's, with its data.
  ok = one_address_space() && ok;
  ok = peer_copies_and_access() && ok;
  ok = peer_copy_serialized() && ok;
  ok = library_kernel_on_both() && ok;
  ok = pinned_on_both() && ok;
  if (fault) {
    CUcontext ctx0{}, ctx1{};
    CHECK(cuDevicePrimaryCtxRetain(&ctx0, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx1, 1));
    // Memory of GPU 0 that GPU 1's server maps (a peer copy on GPU 1 named it) when GPU 0 faults.
    CHECK(cuCtxSetCurrent(ctx0));
    constexpr std::size_t kPeerBytes = 1 << 20;
    CUdeviceptr on0{}, on1{};
    CHECK(cuMemAlloc(&on0, kPeerBytes));
    CHECK(cuMemsetD8(on0, 0x5a, kPeerBytes));
    CHECK(cuCtxSetCurrent(ctx1));
    CHECK(cuMemAlloc(&on1, kPeerBytes));
    CHECK(cuMemcpyPeer(on1, ctx1, on0, ctx0, kPeerBytes));
    CHECK(cuCtxSetCurrent(ctx0));
    CUmodule module{};
    CHECK(cuModuleLoadData(&module, kModuleImage));
    CUfunction trigger{};
    CHECK(cuModuleGetFunction(&trigger, module, "trigger_fault"));
    CUdeviceptr null_pointer = 0;
    void* args[] = {&null_pointer};
    CHECK(cuLaunchKernel(trigger, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
    const CUresult synced = cuCtxSynchronize();
    if (synced != CUDA_ERROR_ILLEGAL_ADDRESS) {
      std::printf("two_gpus: GPU 0's fault synchronized as %d, expected %d\n", synced,
                  CUDA_ERROR_ILLEGAL_ADDRESS);
      ok = false;
    }
    CUdeviceptr p{};
    const CUresult again = cuMemAlloc(&p, 4096);
    if (again != CUDA_ERROR_ILLEGAL_ADDRESS) {
      std::printf("two_gpus: GPU 0 after its fault answered %d, expected the fault\n", again);
      ok = false;
    }
    // GPU 1 never faulted: its work goes on, in this client, on its own server.
    ok = ok && add_on(1, 50'021);
    // GPU 0's memory, which GPU 1's server maps, goes: freeing it answers GPU 0's fault (never a
    // hang), and what GPU 1 copied from it and GPU 1's further work are untouched.
    const CUresult freed = cuMemFree(on0);
    if (freed != CUDA_ERROR_ILLEGAL_ADDRESS) {
      std::printf("two_gpus: freeing GPU 0's memory after its fault answered %d\n", freed);
      ok = false;
    }
    CHECK(cuCtxSetCurrent(ctx1));
    std::vector<unsigned char> copied(kPeerBytes);
    CHECK(cuMemcpyDtoH(copied.data(), on1, kPeerBytes));
    if (std::count(copied.begin(), copied.end(), 0x5a) != static_cast<long>(kPeerBytes)) {
      std::printf("two_gpus: GPU 1's copy of GPU 0's memory changed after GPU 0's fault\n");
      ok = false;
    }
    CHECK(cuMemFree(on1));
    ok = ok && add_on(1, 20'011);
  }
  std::printf("%s two_gpus%s\n", ok ? "PASS" : "FAIL", fault ? " fault" : "");
  return ok ? 0 : 1;
}

int overlimit(std::size_t megabytes) {
  setup();
  CUdeviceptr p;
  CUresult rc = cuMemAlloc(&p, megabytes << 20);
  size_t free_bytes = 0, total = 0;
  CHECK(cuMemGetInfo(&free_bytes, &total));
  bool ok = rc == CUDA_ERROR_OUT_OF_MEMORY;
  std::printf("%s overlimit rc=%d total=%zu\n", ok ? "PASS" : "FAIL", rc, total);
  return ok ? 0 : 1;
}

int quota() {
  Setup s = setup();
  int sms = 0;
  CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, s.device));
  CUfunction record{};
  CHECK(cuModuleGetFunction(&record, s.module, "record_smid"));
  int blocks = 4 * 132;
  CUdeviceptr out;
  CHECK(cuMemAlloc(&out, sizeof(unsigned) * blocks));
  void* args[] = {&out};
  CHECK(cuLaunchKernel(record, blocks, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr));
  std::vector<unsigned> ids(blocks);
  CHECK(cuMemcpyDtoH(ids.data(), out, sizeof(unsigned) * blocks));
  std::vector<bool> seen(1024);
  int distinct = 0;
  unsigned lowest = ~0u;
  for (unsigned id : ids) {
    if (id < seen.size() && !seen[id]) {
      seen[id] = true;
      ++distinct;
      lowest = std::min(lowest, id);
    }
  }
  std::printf("PASS sms=%d distinct=%d lowest=%u\n", sms, distinct, lowest);
  return 0;
}

// Host-memory decisions (docs/host-memory.md). The attributes that advertise device access to
// pageable or registered memory read 0; cuMemHostRegister of malloc'd memory records the range,
// copies through it give correct results (staged), the misuse errors are the driver's, and the
// device pointer of such a range is refused.
int hostmem(int n) {
  Setup s = setup();
  int failures = 0;
  auto expect = [&](const char* what, long long got, long long want) {
    if (got != want) {
      std::printf("hostmem: %s = %lld, expected %lld\n", what, got, want);
      ++failures;
    }
  };

  // ---- attributes (managed memory itself: managed_client.cpp) ----
  for (CUdevice_attribute a : {CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
                               CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES,
                               CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST,
                               CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM}) {
    int value = -1;
    CHECK(cuDeviceGetAttribute(&value, a, s.device));
    expect("pageable/registered-memory attribute", value, 0);
  }
  int can_map = 0;
  CHECK(cuDeviceGetAttribute(&can_map, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, s.device));
  expect("CAN_MAP_HOST_MEMORY (pinned allocations stay mappable)", can_map, 1);
  CUdeviceptr dev;
  CHECK(cuMemAlloc(&dev, sizeof(int) * static_cast<size_t>(n)));
  std::vector<int> plain(16);
  unsigned memory_type = 0;
  expect("cuPointerGetAttribute(malloc'd, never registered)",
         cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                               reinterpret_cast<CUdeviceptr>(plain.data())),
         CUDA_ERROR_INVALID_VALUE);

  // ---- cuMemHostRegister of malloc'd memory ----
  const size_t bytes = sizeof(int) * static_cast<size_t>(n);
  int* host = static_cast<int*>(std::malloc(bytes + 64));
  for (int i = 0; i < n; ++i) host[i] = 3 * i - 7;
  CHECK(cuMemHostRegister(host, bytes, CU_MEMHOSTREGISTER_PORTABLE));
  expect("register again", cuMemHostRegister(host + 1, 64, 0),
         CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  expect("register with an unknown flag", cuMemHostRegister(host + n, 16, 0x100),
         CUDA_ERROR_INVALID_VALUE);
  expect("register 0 bytes", cuMemHostRegister(host + n, 0, 0), CUDA_ERROR_INVALID_VALUE);
  expect("unregister inside the range", cuMemHostUnregister(host + 1),
         CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  unsigned flags = 0;
  CHECK(cuMemHostGetFlags(&flags, host));
  expect("cuMemHostGetFlags", flags, CU_MEMHOSTREGISTER_PORTABLE);
  CHECK(cuPointerGetAttribute(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                              reinterpret_cast<CUdeviceptr>(host + 5)));
  expect("memory type of registered memory", memory_type, CU_MEMORYTYPE_HOST);
  CUdeviceptr mapped = 0;
  expect("cuMemHostGetDevicePointer(registered)", cuMemHostGetDevicePointer(&mapped, host, 0),
         CUDA_ERROR_NOT_SUPPORTED);

  // Copies through the registered range: HtoD, a kernel, DtoH async on a stream.
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  CHECK(cuMemcpyHtoD(dev, host, bytes));
  std::memset(host, 0, bytes);  // the copy above must not read the buffer later
  void* args[] = {&dev, &n};
  CHECK(cuLaunchKernel(increment, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
  CUstream stream{};
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CHECK(cuCtxSynchronize());
  CHECK(cuMemcpyDtoHAsync(host, dev, bytes, stream));
  CHECK(cuStreamSynchronize(stream));
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += host[i] != 3 * i - 7 + 1;
  expect("wrong elements after HtoD, kernel, DtoH through registered memory", wrong, 0);

  CHECK(cuMemHostUnregister(host));
  expect("unregister twice", cuMemHostUnregister(host), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  // DEVICEMAP is accepted (the driver defers the failure to cuMemHostGetDevicePointer).
  CHECK(cuMemHostRegister(host, bytes, CU_MEMHOSTREGISTER_DEVICEMAP));
  expect("cuMemHostGetDevicePointer(DEVICEMAP)", cuMemHostGetDevicePointer(&mapped, host + 8, 0),
         CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuMemHostUnregister(host));

  // Pinned memory of our own is already registered.
  void* pinned = nullptr;
  CHECK(cuMemAllocHost(&pinned, 4096));
  expect("register cuMemAllocHost memory", cuMemHostRegister(pinned, 4096, 0),
         CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  expect("unregister cuMemAllocHost memory", cuMemHostUnregister(pinned),
         CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  CHECK(cuMemFreeHost(pinned));
  CHECK(cuStreamDestroy(stream));
  CHECK(cuMemFree(dev));
  std::free(host);
  std::printf("%s hostmem n=%d failures=%d\n", failures == 0 ? "PASS" : "FAIL", n, failures);
  return failures == 0 ? 0 : 1;
}

// cuMemHostAlloc memory under unified addressing: its device pointer is its host pointer, and
// a kernel handed the host pointer itself reaches it, as XLA's semaphores and flags are used.
// Two rounds, so that the second reuses addresses the first gave back.
int pinned_kernel(int buffers) {
  Setup s = setup();
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  int failures = 0;
  for (int round = 0; round < 2; ++round) {
    std::vector<std::pair<int*, int>> pinned;
    for (int i = 0; i < buffers; ++i) {
      int n = (1024 << (i % 6)) + 3 * i;
      void* p = nullptr;
      CHECK(cuMemHostAlloc(&p, sizeof(int) * static_cast<size_t>(n),
                           CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
      int* host = static_cast<int*>(p);
      for (int j = 0; j < n; ++j) host[j] = j - i;
      CUdeviceptr device = 0;
      CHECK(cuMemHostGetDevicePointer(&device, p, 0));
      if (device != reinterpret_cast<CUdeviceptr>(p)) {
        std::printf("pinned_kernel: buffer %d at %p has device pointer %#llx\n", i, p,
                    static_cast<unsigned long long>(device));
        ++failures;
      }
      CUdeviceptr through_host = reinterpret_cast<CUdeviceptr>(p);
      void* args[] = {&through_host, &n};
      CHECK(cuLaunchKernel(increment, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
      pinned.emplace_back(host, n);
    }
    CHECK(cuCtxSynchronize());
    for (int i = 0; i < buffers; ++i) {
      auto [host, n] = pinned[static_cast<size_t>(i)];
      int wrong = 0;
      for (int j = 0; j < n; ++j) wrong += host[j] != j - i + 1;
      if (wrong != 0) {
        std::printf("pinned_kernel: buffer %d: %d of %d elements not incremented\n", i, wrong, n);
        ++failures;
      }
      CHECK(cuMemFreeHost(host));
    }
  }
  std::printf("%s pinned_kernel buffers=%d failures=%d\n", failures == 0 ? "PASS" : "FAIL", buffers,
              failures);
  return failures == 0 ? 0 : 1;
}

// Batched copies: pageable, pinned and device sources in one cuMemcpyBatchAsync with two sets of
// attributes (a stack buffer read during the call), then a cuMemcpy3DBatchAsync through a CUDA
// array and back; bad batches are refused at once.
int copy_batch() {
  auto fail = [](const char* what) {
    std::printf("FAIL %s\n", what);
    return 1;
  };
  setup();
  CUstream stream{};
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  constexpr std::size_t kN = 1 << 16;
  std::vector<unsigned char> pageable(kN);
  for (std::size_t i = 0; i < kN; ++i) pageable[i] = static_cast<unsigned char>(i * 7 + 1);
  void* pinned = nullptr;
  CHECK(cuMemHostAlloc(&pinned, kN, 0));
  for (std::size_t i = 0; i < kN; ++i)
    static_cast<unsigned char*>(pinned)[i] = static_cast<unsigned char>(i * 3);
  unsigned char on_stack[256];
  for (int i = 0; i < 256; ++i) on_stack[i] = static_cast<unsigned char>(255 - i);
  CUdeviceptr a{}, b{}, c{}, d{};
  for (CUdeviceptr* p : {&a, &b, &c, &d}) CHECK(cuMemAlloc(p, kN));
  CHECK(cuMemsetD8(c, 0x5a, kN));
  CHECK(cuCtxSynchronize());  // a memset of device memory may still run; the stream does not wait
  CUdeviceptr dsts[] = {a, b, d, d + kN - 256};
  CUdeviceptr srcs[] = {reinterpret_cast<CUdeviceptr>(pageable.data()),
                        reinterpret_cast<CUdeviceptr>(pinned), c,
                        reinterpret_cast<CUdeviceptr>(on_stack)};
  size_t sizes[] = {kN, kN, kN - 256, 256};
  CUmemcpyAttributes attrs[2]{};
  attrs[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  attrs[1].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL;
  size_t idxs[] = {0, 3};
  CHECK(cuMemcpyBatchAsync(dsts, srcs, sizes, 4, attrs, idxs, 2, stream));
  std::memset(on_stack, 0, sizeof on_stack);  // read during the call: changing it now is fine
  CHECK(cuStreamSynchronize(stream));
  std::vector<unsigned char> got(kN);
  CHECK(cuMemcpyDtoH(got.data(), a, kN));
  if (got != pageable) return fail("the pageable source's copy");
  CHECK(cuMemcpyDtoH(got.data(), b, kN));
  if (std::memcmp(got.data(), pinned, kN) != 0) return fail("the pinned source's copy");
  CHECK(cuMemcpyDtoH(got.data(), d, kN));
  for (std::size_t i = 0; i < kN - 256; ++i)
    if (got[i] != 0x5a) return fail("the device source's copy");
  for (int i = 0; i < 256; ++i)
    if (got[kN - 256 + i] != 255 - i) return fail("the stack source's copy");
  size_t bad_idxs[] = {1};
  if (cuMemcpyBatchAsync(dsts, srcs, sizes, 4, attrs, bad_idxs, 1, stream) !=
      CUDA_ERROR_INVALID_VALUE) {
    return fail("attributes that do not start at copy 0 were taken");
  }
  if (cuMemcpyBatchAsync(dsts, srcs, sizes, 4, attrs, idxs, 2, nullptr) !=
      CUDA_ERROR_INVALID_VALUE) {
    return fail("a batch on the legacy NULL stream was taken");
  }

  // Pointer -> 64x16 float2 array (8-byte elements) -> pointer, with a row pitch on the way in.
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  desc.Width = 64;
  desc.Height = 16;
  desc.Format = CU_AD_FORMAT_FLOAT;
  desc.NumChannels = 2;
  CUarray array{};
  CHECK(cuArray3DCreate(&array, &desc));
  CUDA_MEMCPY3D_BATCH_OP ops[2]{};
  ops[0].src.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  ops[0].src.op.ptr.ptr = a;
  ops[0].src.op.ptr.rowLength = 128;  // elements: every other 512-byte row
  ops[0].dst.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
  ops[0].dst.op.array.array = array;
  ops[0].extent = {64, 16, 1};
  ops[0].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  CHECK(cuMemcpy3DBatchAsync(1, ops, 0, stream));
  ops[1].src.type = CU_MEMCPY_OPERAND_TYPE_ARRAY;
  ops[1].src.op.array.array = array;
  ops[1].dst.type = CU_MEMCPY_OPERAND_TYPE_POINTER;
  ops[1].dst.op.ptr.ptr = c;
  ops[1].extent = {64, 16, 1};
  ops[1].srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  CHECK(cuMemcpy3DBatchAsync(1, &ops[1], 0, stream));
  CHECK(cuStreamSynchronize(stream));
  CHECK(cuMemcpyDtoH(got.data(), c, 64 * 16 * 8));
  for (std::size_t row = 0; row < 16; ++row) {
    if (std::memcmp(got.data() + row * 512, pageable.data() + row * 1024, 512) != 0) {
      return fail("the 3D batch round trip through the array");
    }
  }
  ops[0].extent.width = 0;
  if (cuMemcpy3DBatchAsync(1, ops, 0, stream) != CUDA_ERROR_INVALID_VALUE) {
    return fail("an empty extent was taken");
  }
  CHECK(cuArrayDestroy(array));
  for (CUdeviceptr p : {a, b, c, d}) CHECK(cuMemFree(p));
  CHECK(cuMemFreeHost(pinned));
  std::printf("PASS copy_batch\n");
  return 0;
}

// Stream memory operations: a stream waits on a flag that another stream writes behind a slow
// kernel (32-bit, 64-bit through cuStreamBatchMemOp, and the AND condition), a write reaches
// pinned host memory, and wrong addresses and flags are refused at once.
int stream_mem_ops() {
  Setup s = setup();
  CUstream waiter{}, writer{};
  CHECK(cuStreamCreate(&waiter, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&writer, CU_STREAM_NON_BLOCKING));
  CUfunction sleeper{};
  CHECK(cuModuleGetFunction(&sleeper, s.module, "sleep_kernel"));
  CUdeviceptr flags{}, out{};
  CHECK(cuMemAlloc(&flags, 64));
  CHECK(cuMemAlloc(&out, 16));
  CHECK(cuMemsetD8(flags, 0, 64));
  CHECK(cuMemsetD8(out, 0, 16));
  // The memsets run on the NULL stream, which the non-blocking streams below do not wait for.
  CHECK(cuCtxSynchronize());
  bool ok = true;

  CHECK(cuStreamWaitValue32(waiter, flags, 1, CU_STREAM_WAIT_VALUE_GEQ));
  CHECK(cuMemsetD32Async(out, 7, 1, waiter));
  int us = 200000;
  void* sleep_args[] = {&us};
  CHECK(cuLaunchKernel(sleeper, 1, 1, 1, 1, 1, 1, 0, writer, sleep_args, nullptr));
  CHECK(cuStreamWriteValue32(writer, flags, 1, CU_STREAM_WRITE_VALUE_DEFAULT));
  const CUresult before = cuStreamQuery(waiter);  // still waiting for the writer's flag
  CHECK(cuStreamSynchronize(waiter));
  unsigned value = 0;
  CHECK(cuMemcpyDtoH(&value, out, 4));
  if (before != CUDA_ERROR_NOT_READY || value != 7) {
    std::printf("FAIL wait32: query before the write %d, value after %u\n", before, value);
    ok = false;
  }

  constexpr std::uint64_t kBig = 0x123456789aull;
  CHECK(cuStreamWaitValue64(waiter, flags + 8, kBig, CU_STREAM_WAIT_VALUE_EQ));
  CHECK(cuMemsetD32Async(out + 4, 9, 1, waiter));
  CHECK(cuStreamWaitValue32(waiter, flags + 16, 0x4, CU_STREAM_WAIT_VALUE_AND));
  CHECK(cuMemsetD32Async(out + 8, 11, 1, waiter));
  CUstreamBatchMemOpParams ops[3]{};
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  ops[0].writeValue.address = flags + 8;
  ops[0].writeValue.value64 = kBig;
  ops[1].memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
  ops[1].memoryBarrier.flags = CU_STREAM_MEMORY_BARRIER_TYPE_GPU;
  ops[2].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[2].writeValue.address = flags + 16;
  ops[2].writeValue.value = 0x6;
  CHECK(cuLaunchKernel(sleeper, 1, 1, 1, 1, 1, 1, 0, writer, sleep_args, nullptr));
  CHECK(cuStreamBatchMemOp(writer, 3, ops, 0));
  CHECK(cuStreamSynchronize(waiter));
  unsigned values[2] = {};
  CHECK(cuMemcpyDtoH(values, out + 4, 8));
  if (values[0] != 9 || values[1] != 11) {
    std::printf("FAIL wait64 / AND: %u %u\n", values[0], values[1]);
    ok = false;
  }

  void* host = nullptr;
  CHECK(cuMemHostAlloc(&host, 4096, CU_MEMHOSTALLOC_DEVICEMAP));
  CUdeviceptr host_device{};
  CHECK(cuMemHostGetDevicePointer(&host_device, host, 0));
  CHECK(cuStreamWriteValue64(writer, host_device + 8, kBig, 0));
  CHECK(cuStreamSynchronize(writer));
  if (static_cast<std::uint64_t*>(host)[1] != kBig) {
    std::printf("FAIL a 64-bit write to pinned host memory did not land\n");
    ok = false;
  }

  unsigned local = 0;
  const CUresult unaligned = cuStreamWriteValue32(writer, flags + 2, 1, 0);
  const CUresult unknown = cuStreamWaitValue32(writer, 0x1000, 1, 0);
  const CUresult pageable =
      cuStreamWriteValue32(writer, reinterpret_cast<CUdeviceptr>(&local), 1, 0);
  const CUresult bad_flags = cuStreamWaitValue32(writer, flags, 1, 0x10);
  const CUresult empty_batch = cuStreamBatchMemOp(writer, 0, ops, 0);
  if (unaligned != CUDA_ERROR_INVALID_VALUE || unknown != CUDA_ERROR_INVALID_VALUE ||
      pageable != CUDA_ERROR_INVALID_VALUE || bad_flags != CUDA_ERROR_INVALID_VALUE ||
      empty_batch != CUDA_ERROR_INVALID_VALUE) {
    std::printf("FAIL refusals: unaligned %d unknown %d pageable %d flags %d empty %d\n", unaligned,
                unknown, pageable, bad_flags, empty_batch);
    ok = false;
  }
  CHECK(cuStreamSynchronize(writer));  // the session is whole
  CHECK(cuMemFreeHost(host));
  CHECK(cuMemFree(flags));
  CHECK(cuMemFree(out));
  CHECK(cuStreamDestroy(waiter));
  CHECK(cuStreamDestroy(writer));
  std::printf("%s stream_mem_ops\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

// Small queries answered by the shim itself: a library kernel's cache preference on a device,
// the fixed shared-memory bank size, an executable graph's flags, a stream's green context.
int queries() {
  setup();
  bool ok = true;
  CUlibrary library{};
  CHECK(cuLibraryLoadData(&library, kModuleImage, nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel{};
  CHECK(cuLibraryGetKernel(&kernel, library, "vector_add"));
  const CUresult cache = cuKernelSetCacheConfig(kernel, CU_FUNC_CACHE_PREFER_SHARED, 0);
  const CUresult cache_bad_device = cuKernelSetCacheConfig(kernel, CU_FUNC_CACHE_PREFER_L1, 99);
  // Deprecated in CUDA 12's headers, still exported and still called by older programs.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  CUsharedconfig bank{};
  CHECK(cuCtxGetSharedMemConfig(&bank));
  const CUresult bank_bad = cuCtxSetSharedMemConfig(static_cast<CUsharedconfig>(7));
  CHECK(cuCtxSetSharedMemConfig(CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE));
#pragma GCC diagnostic pop
  CUgraph graph{};
  CHECK(cuGraphCreate(&graph, 0));
  CUgraphNode node{};
  CHECK(cuGraphAddEmptyNode(&node, graph, nullptr, 0));
  CUgraphExec exec{};
  CHECK(cuGraphInstantiateWithFlags(&exec, graph, CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY));
  cuuint64_t flags = 0;
  CHECK(cuGraphExecGetFlags(exec, &flags));
  CUstream stream{};
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUgreenCtx green = reinterpret_cast<CUgreenCtx>(1);
  CHECK(cuStreamGetGreenCtx(stream, &green));

  // Stream attributes: the window and the sync domain on the server, priority and sync policy
  // in the shim; copied to another stream; a window over memory that is not the client's and a
  // priority change refused.
  CUdeviceptr window_memory{};
  CHECK(cuMemAlloc(&window_memory, 1 << 16));
  CUstreamAttrValue value{};
  value.accessPolicyWindow.base_ptr = reinterpret_cast<void*>(window_memory);
  value.accessPolicyWindow.num_bytes = 1 << 16;
  value.accessPolicyWindow.hitRatio = 0.5f;
  value.accessPolicyWindow.hitProp = CU_ACCESS_PROPERTY_PERSISTING;
  value.accessPolicyWindow.missProp = CU_ACCESS_PROPERTY_STREAMING;
  CHECK(cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &value));
  CUstreamAttrValue domain{};
  domain.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
  CHECK(cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_MEM_SYNC_DOMAIN, &domain));
  CUstreamAttrValue policy{};
  policy.syncPolicy = CU_SYNC_POLICY_SPIN;
  CHECK(cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &policy));
  CUstreamAttrValue got{};
  CHECK(cuStreamGetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &got));
  const bool window_kept = got.accessPolicyWindow.base_ptr == value.accessPolicyWindow.base_ptr &&
                           got.accessPolicyWindow.num_bytes == (1u << 16) &&
                           got.accessPolicyWindow.hitRatio == 0.5f;
  CUstream copy{};
  CHECK(cuStreamCreate(&copy, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCopyAttributes(copy, stream));
  CUstreamAttrValue copied_domain{}, copied_policy{}, priority{};
  CHECK(cuStreamGetAttribute(copy, CU_STREAM_ATTRIBUTE_MEM_SYNC_DOMAIN, &copied_domain));
  CHECK(cuStreamGetAttribute(copy, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &copied_policy));
  CHECK(cuStreamGetAttribute(copy, CU_STREAM_ATTRIBUTE_PRIORITY, &priority));
  CUstreamAttrValue foreign = value;
  foreign.accessPolicyWindow.base_ptr = reinterpret_cast<void*>(0x1000);
  const CUresult foreign_window =
      cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW, &foreign);
  const CUresult priority_set =
      cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_PRIORITY, &priority);
  CUstreamAttrValue bad_policy{};
  bad_policy.syncPolicy = static_cast<CUsynchronizationPolicy>(9);
  const CUresult policy_bad =
      cuStreamSetAttribute(stream, CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY, &bad_policy);
  if (!window_kept || copied_domain.memSyncDomain != CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE ||
      copied_policy.syncPolicy != CU_SYNC_POLICY_SPIN || priority.priority != 0 ||
      foreign_window != CUDA_ERROR_INVALID_VALUE || priority_set != CUDA_ERROR_NOT_SUPPORTED ||
      policy_bad != CUDA_ERROR_INVALID_VALUE) {
    std::printf(
        "FAIL stream attributes: window %d domain %d policy %d priority %d foreign %d "
        "priority_set %d bad_policy %d\n",
        window_kept, copied_domain.memSyncDomain, copied_policy.syncPolicy, priority.priority,
        foreign_window, priority_set, policy_bad);
    ok = false;
  }
  // Decompression: an H200 (which the test driver is) has no engine; its driver refuses every
  // call before it reads an argument and leaves errorIndex alone (docs/cuda-runtime.md).
  int decompress_algorithms = -1;
  CHECK(cuDeviceGetAttribute(&decompress_algorithms,
                             CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK, 0));
  CUmemDecompressParams decompress{};
  decompress.srcNumBytes = 256;
  decompress.dstNumBytes = 1024;
  decompress.src = reinterpret_cast<const void*>(window_memory);
  decompress.dst = reinterpret_cast<void*>(window_memory + 4096);
  decompress.dstActBytes = reinterpret_cast<cuuint32_t*>(window_memory + 8192);
  decompress.algo = CU_MEM_DECOMPRESS_ALGORITHM_DEFLATE;
  size_t decompress_index = 77;
  const CUresult decompressed =
      cuMemBatchDecompressAsync(&decompress, 1, 0, &decompress_index, stream);
  if (decompress_algorithms != 0 || decompressed != CUDA_ERROR_NOT_SUPPORTED ||
      decompress_index != 77) {
    std::printf("FAIL decompression: algorithms %d answer %d errorIndex %zu\n",
                decompress_algorithms, decompressed, decompress_index);
    ok = false;
  }
  CHECK(cuStreamDestroy(copy));
  CHECK(cuMemFree(window_memory));
  CHECK(cuStreamDestroy(stream));
  const CUresult green_dead = cuStreamGetGreenCtx(stream, &green);
  if (cache != CUDA_SUCCESS || cache_bad_device != CUDA_ERROR_INVALID_DEVICE ||
      bank != CU_SHARED_MEM_CONFIG_FOUR_BYTE_BANK_SIZE || bank_bad != CUDA_ERROR_INVALID_VALUE ||
      flags != CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY || green != nullptr ||
      green_dead != CUDA_ERROR_INVALID_HANDLE) {
    std::printf("FAIL queries: cache %d/%d bank %d/%d flags %llu green %p/%d\n", cache,
                cache_bad_device, bank, bank_bad, static_cast<unsigned long long>(flags),
                static_cast<void*>(green), green_dead);
    ok = false;
  }
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(graph));
  CHECK(cuLibraryUnload(library));
  std::printf("%s queries\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

// Hopper's TMA descriptors: encoded with no context current, as the real driver allows; the
// same arguments give the same bytes, cuTensorMapReplaceAddress gives what encoding the new
// address gives, and each documented rule refuses what it must.
int tensor_map() {
  Setup s = setup();
  CUdeviceptr buffer{};
  CHECK(cuMemAlloc(&buffer, 1 << 20));
  CHECK(cuCtxSetCurrent(nullptr));
  int failures = 0;
  auto expect = [&](const char* what, CUresult got, CUresult want) {
    if (got != want) {
      std::printf("tensor_map: %s returned %d, expected %d\n", what, got, want);
      ++failures;
    }
  };
  const cuuint64_t dims[2] = {256, 64};
  const cuuint64_t strides[1] = {256 * sizeof(float)};
  const cuuint32_t box[2] = {32, 16};
  const cuuint32_t unit[5] = {1, 1, 1, 1, 1};
  auto tiled = [&](CUtensorMap* map, CUdeviceptr at, const cuuint32_t* b, cuuint32_t rank,
                   CUtensorMapSwizzle swizzle) {
    return cuTensorMapEncodeTiled(
        map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, rank, reinterpret_cast<void*>(at), dims, strides, b,
        unit, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  CUtensorMap first{}, again{}, moved{}, direct{};
  expect("encode, no context current", tiled(&first, buffer, box, 2, CU_TENSOR_MAP_SWIZZLE_128B),
         CUDA_SUCCESS);
  expect("encode again", tiled(&again, buffer, box, 2, CU_TENSOR_MAP_SWIZZLE_128B), CUDA_SUCCESS);
  if (std::memcmp(&first, &again, sizeof first) != 0) {
    std::printf("tensor_map: the same arguments encoded differently\n");
    ++failures;
  }
  const CUtensorMap zero{};
  if (std::memcmp(&first, &zero, sizeof first) == 0) {
    std::printf("tensor_map: the encoded descriptor is all zero\n");
    ++failures;
  }
  moved = first;
  expect("replace address",
         cuTensorMapReplaceAddress(&moved, reinterpret_cast<void*>(buffer + 4096)), CUDA_SUCCESS);
  expect("encode at the new address",
         tiled(&direct, buffer + 4096, box, 2, CU_TENSOR_MAP_SWIZZLE_128B), CUDA_SUCCESS);
  if (std::memcmp(&moved, &direct, sizeof moved) != 0) {
    std::printf("tensor_map: replacing the address differs from encoding it\n");
    ++failures;
  }
  CUtensorMap bad{};
  const cuuint32_t wide_box[2] = {64, 16};  // 256 bytes inner: over a 128-byte swizzle
  const cuuint32_t big_box[2] = {32, 300};
  expect("global address not 16-byte aligned",
         tiled(&bad, buffer + 8, box, 2, CU_TENSOR_MAP_SWIZZLE_128B), CUDA_ERROR_INVALID_VALUE);
  expect("rank 6", tiled(&bad, buffer, box, 6, CU_TENSOR_MAP_SWIZZLE_128B),
         CUDA_ERROR_INVALID_VALUE);
  expect("box over 256", tiled(&bad, buffer, big_box, 2, CU_TENSOR_MAP_SWIZZLE_NONE),
         CUDA_ERROR_INVALID_VALUE);
  expect("inner box wider than the swizzle",
         tiled(&bad, buffer, wide_box, 2, CU_TENSOR_MAP_SWIZZLE_128B), CUDA_ERROR_INVALID_VALUE);
  alignas(128) unsigned char storage[sizeof(CUtensorMap) + 64];
  auto* misplaced = reinterpret_cast<CUtensorMap*>(storage + 32);
  expect("tensor map not 64-byte aligned",
         tiled(misplaced, buffer, box, 2, CU_TENSOR_MAP_SWIZZLE_128B), CUDA_ERROR_INVALID_VALUE);
  expect("replace with a misaligned address",
         cuTensorMapReplaceAddress(&moved, reinterpret_cast<void*>(buffer + 4)),
         CUDA_ERROR_INVALID_VALUE);
  // Im2col on an NHWC tensor of 4 dimensions, and its wide variant.
  const cuuint64_t nhwc[4] = {64, 16, 16, 2};
  const cuuint64_t nhwc_strides[3] = {64 * 2, 64 * 2 * 16, 64 * 2 * 16 * 16};
  const int lower[2] = {-1, -1}, upper[2] = {-1, -1};
  CUtensorMap im2col{};
  expect(
      "im2col",
      cuTensorMapEncodeIm2col(&im2col, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                              reinterpret_cast<void*>(buffer), nhwc, nhwc_strides, lower, upper, 64,
                              128, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
      CUDA_SUCCESS);
  expect(
      "im2col of rank 2",
      cuTensorMapEncodeIm2col(&bad, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                              reinterpret_cast<void*>(buffer), nhwc, nhwc_strides, lower, upper, 64,
                              128, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
      CUDA_ERROR_INVALID_VALUE);
  expect("im2col wide",
         cuTensorMapEncodeIm2colWide(
             &im2col, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, reinterpret_cast<void*>(buffer), nhwc,
             nhwc_strides, -1, -1, 64, 128, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_IM2COL_WIDE_MODE_W, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
         CUDA_SUCCESS);
  CHECK(cuCtxSetCurrent(s.ctx));
  CHECK(cuMemFree(buffer));
  std::printf("%s tensor_map failures=%d\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}

// The private resident memory of this process in KiB (RssAnon of /proc/self/status): what the
// shim's own objects take. Not RSS: the session's ring and staging chunks are shared memory,
// whose pages count as they are first touched and would grow RSS without any leak.
// inject SEED: after stdin closes, 400 random operations of the kinds the real driver can fail for
// lack of memory (allocations of every kind, pinned memory, arrays, pools, VMM, modules, streams,
// graphs) on a server whose test driver fails some of them on purpose (MPSSHIM_TESTDRIVER_INJECT).
// Each call must answer success or CUDA_ERROR_OUT_OF_MEMORY, nothing else; every allocation that
// succeeded must hold what was written into it when it is freed; the session must stay whole.
int inject(unsigned seed, const std::string& armed) {
  Setup s = setup();
  // Admitted and set up before the test arms the injection; it says go by closing stdin.
  std::printf("READY\n");
  std::fflush(stdout);
  char ignored[16];
  while (::read(0, ignored, sizeof ignored) > 0) {
  }
  std::srand(seed);
  int ooms = 0, wrong = 0, unexpected = 0;
  auto allowed = [&](const char* what, CUresult rc) {
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) ++ooms;
    if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_OUT_OF_MEMORY) return rc == CUDA_SUCCESS;
    std::printf("FAIL inject: %s answered %d\n", what, rc);
    ++unexpected;
    return false;
  };
  struct Held {
    CUdeviceptr base;
    std::size_t bytes;
    unsigned value;
    int kind;  // 0 cuMemAlloc, 1 async, 2 VMM
    CUmemGenericAllocationHandle handle;
  };
  std::vector<Held> held;
  std::vector<CUarray> arrays;
  std::vector<CUmemoryPool> pools;
  std::vector<CUmodule> modules;
  std::vector<CUstream> streams;
  std::vector<void*> pinned;
  auto check_and_free = [&](const Held& h) {
    unsigned got = 0;
    if (cuMemcpyDtoH(&got, h.base + h.bytes - 4, 4) != CUDA_SUCCESS || got != h.value) ++wrong;
    if (h.kind == 0) CHECK(cuMemFree(h.base));
    if (h.kind == 1) CHECK(cuMemFreeAsync(h.base, nullptr));
    if (h.kind == 2) {
      CHECK(cuMemUnmap(h.base, h.bytes));
      CHECK(cuMemRelease(h.handle));
      CHECK(cuMemAddressFree(h.base, h.bytes));
    }
  };
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  std::size_t granule = 0;
  CHECK(cuMemGetAllocationGranularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  for (int i = 0; i < 400; ++i) {
    const unsigned value = 0x1000u + static_cast<unsigned>(i);
    const std::size_t bytes = (std::size_t{1} << (10 + std::rand() % 14)) + 4 * (std::rand() % 64);
    switch (std::rand() % 10) {
      case 0:
      case 1: {
        CUdeviceptr p{};
        if (allowed("cuMemAlloc", cuMemAlloc(&p, bytes))) {
          CHECK(cuMemsetD32(p, value, bytes / 4));
          held.push_back({p, bytes / 4 * 4, value, 0, 0});
        }
        break;
      }
      case 2: {
        CUdeviceptr p{};
        if (allowed("cuMemAllocAsync", cuMemAllocAsync(&p, bytes, nullptr))) {
          CHECK(cuMemsetD32Async(p, value, bytes / 4, nullptr));
          held.push_back({p, bytes / 4 * 4, value, 1, 0});
        }
        break;
      }
      case 3: {
        const std::size_t size = granule * (1 + std::rand() % 3);
        CUmemGenericAllocationHandle handle{};
        if (!allowed("cuMemCreate", cuMemCreate(&handle, size, &prop, 0))) break;
        CUdeviceptr va{};
        CHECK(cuMemAddressReserve(&va, size, 0, 0, 0));
        if (!allowed("cuMemMap", cuMemMap(va, size, 0, handle, 0))) {
          CHECK(cuMemRelease(handle));
          CHECK(cuMemAddressFree(va, size));
          break;
        }
        CUmemAccessDesc access{};
        access.location = prop.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        if (!allowed("cuMemSetAccess", cuMemSetAccess(va, size, &access, 1))) {
          CHECK(cuMemUnmap(va, size));
          CHECK(cuMemRelease(handle));
          CHECK(cuMemAddressFree(va, size));
          break;
        }
        CHECK(cuMemsetD32(va, value, size / 4));
        held.push_back({va, size, value, 2, handle});
        break;
      }
      case 4: {
        CUarray array{};
        CUDA_ARRAY_DESCRIPTOR desc{};
        desc.Width = 256;
        desc.Height = 64;
        desc.Format = CU_AD_FORMAT_FLOAT;
        desc.NumChannels = 1;
        if (allowed("cuArrayCreate", cuArrayCreate(&array, &desc))) arrays.push_back(array);
        break;
      }
      case 5: {
        CUmemoryPool pool{};
        CUmemPoolProps props{};
        props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        if (allowed("cuMemPoolCreate", cuMemPoolCreate(&pool, &props))) pools.push_back(pool);
        break;
      }
      case 6: {
        CUmodule module{};
        if (allowed("cuModuleLoadData", cuModuleLoadData(&module, kModuleImage))) {
          modules.push_back(module);
        }
        break;
      }
      case 7: {
        CUstream stream{};
        if (allowed("cuStreamCreate", cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING))) {
          streams.push_back(stream);
        }
        void* host = nullptr;
        if (allowed("cuMemHostAlloc", cuMemHostAlloc(&host, 1 << 16, CU_MEMHOSTALLOC_DEVICEMAP))) {
          pinned.push_back(host);
        }
        break;
      }
      case 8: {
        CUgraph graph{};
        CHECK(cuGraphCreate(&graph, 0));
        CUgraphNode node{};
        CHECK(cuGraphAddEmptyNode(&node, graph, nullptr, 0));
        CUgraphExec exec{};
        if (allowed("cuGraphInstantiate", cuGraphInstantiate(&exec, graph, 0))) {
          CHECK(cuGraphLaunch(exec, nullptr));
          CHECK(cuGraphExecDestroy(exec));
        }
        CHECK(cuGraphDestroy(graph));
        break;
      }
      default:
        if (!held.empty()) {
          const std::size_t at = static_cast<std::size_t>(std::rand()) % held.size();
          check_and_free(held[at]);
          held.erase(held.begin() + static_cast<std::ptrdiff_t>(at));
        }
        break;
    }
  }
  for (const Held& h : held) check_and_free(h);
  for (CUarray a : arrays) CHECK(cuArrayDestroy(a));
  for (CUmemoryPool p : pools) CHECK(cuMemPoolDestroy(p));
  for (CUmodule m : modules) CHECK(cuModuleUnload(m));
  for (CUstream st : streams) CHECK(cuStreamDestroy(st));
  for (void* h : pinned) CHECK(cuMemFreeHost(h));
  CHECK(cuCtxSynchronize());
  // The session still computes, once the injection is off: which of the server's calls an
  // injection hits depends on every call the server made since, its own included.
  if (!armed.empty()) ::unlink(armed.c_str());
  const bool whole = add_on(s.device, 4096);
  const bool ok = unexpected == 0 && wrong == 0 && whole;
  std::printf("%s inject seed=%u ooms=%d wrong=%d unexpected=%d\n", ok ? "PASS" : "FAIL", seed,
              ooms, wrong, unexpected);
  return ok ? 0 : 1;
}

// bystander: memory and a stream made first, then, until stdin closes, a memset, a kernel and a
// copy back checked, again and again (none of them calls that fail for lack of memory).
int bystander() {
  Setup s = setup();
  CUfunction add{};
  CHECK(cuModuleGetFunction(&add, s.module, "vector_add"));
  constexpr int kCount = 4096;
  CUdeviceptr a{}, b{}, c{};
  CHECK(cuMemAlloc(&a, kCount * 4));
  CHECK(cuMemAlloc(&b, kCount * 4));
  CHECK(cuMemAlloc(&c, kCount * 4));
  CUstream stream{};
  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  std::vector<float> out(kCount);
  CHECK(cuMemcpyDtoH(out.data(), c, 16));
  {
    // A first kernel before READY: the server prepares its launch-batch graphs at a session's
    // first launch, and the test counts the driver's objects from READY on.
    int n = kCount;
    void* args[] = {&a, &b, &c, &n};
    CHECK(cuLaunchKernel(add, kCount / 256, 1, 1, 256, 1, 1, 0, stream, args, nullptr));
    CHECK(cuStreamSynchronize(stream));
  }
  std::printf("READY\n");
  std::fflush(stdout);
  long rounds = 0, wrong = 0;
  pollfd in{0, POLLIN, 0};
  while (::poll(&in, 1, 0) == 0) {
    const float x = static_cast<float>(rounds % 100);
    unsigned bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    CHECK(cuMemsetD32Async(a, bits, kCount, stream));
    CHECK(cuMemsetD32Async(b, 0x3f800000u, kCount, stream));  // 1.0f
    int n = kCount;
    void* args[] = {&a, &b, &c, &n};
    CHECK(cuLaunchKernel(add, kCount / 256, 1, 1, 256, 1, 1, 0, stream, args, nullptr));
    CHECK(cuMemcpyDtoHAsync(out.data(), c, kCount * 4, stream));
    CHECK(cuStreamSynchronize(stream));
    wrong += std::count_if(out.begin(), out.end(), [&](float v) { return v != x + 1.0f; });
    ++rounds;
  }
  const bool ok = wrong == 0 && rounds > 0;
  std::printf("%s bystander rounds=%ld wrong=%ld\n", ok ? "PASS" : "FAIL", rounds, wrong);
  return ok ? 0 : 1;
}

long resident_kib() {
  long kib = -1;
  if (std::FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::sscanf(line, "RssAnon: %ld kB", &kib) == 1) break;
    }
    std::fclose(f);
  }
  return kib;
}

// Events, streams, graphs with two nodes and their executable graphs created and destroyed
// `cycles` times each: the client's resident set after the first tenth and at the end must be
// within 1 MiB (the shim frees what the program destroys), and a destroyed handle answers
// CUDA_ERROR_INVALID_HANDLE, never a crash.
int churn(long cycles) {
  setup();
  int failures = 0;
  long rss_early = 0;
  for (long i = 0; i < cycles; ++i) {
    CUevent event{};
    CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
    CUstream stream{};
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventRecord(event, stream));
    CUgraph graph{};
    CHECK(cuGraphCreate(&graph, 0));
    CUgraphNode first{}, second{};
    CHECK(cuGraphAddEmptyNode(&first, graph, nullptr, 0));
    CHECK(cuGraphAddEmptyNode(&second, graph, &first, 1));
    CUgraphExec exec{};
    CHECK(cuGraphInstantiate(&exec, graph, 0));
    CHECK(cuGraphLaunch(exec, stream));
    CHECK(cuGraphExecDestroy(exec));
    CHECK(cuGraphDestroy(graph));
    CHECK(cuStreamDestroy(stream));
    CHECK(cuEventDestroy(event));
    CUarray array{};
    CUDA_ARRAY_DESCRIPTOR desc{};
    desc.Width = 64;
    desc.Height = 4;
    desc.Format = CU_AD_FORMAT_FLOAT;
    desc.NumChannels = 1;
    CHECK(cuArrayCreate(&array, &desc));
    CHECK(cuArrayDestroy(array));
    CUmemoryPool pool{};
    CUmemPoolProps props{};
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CHECK(cuMemPoolCreate(&pool, &props));
    CHECK(cuMemPoolDestroy(pool));
    if (i == 0) {
      CUDA_ARRAY3D_DESCRIPTOR described{};
      cuuint64_t threshold = 0;
      const CUresult array_after = cuArray3DGetDescriptor(&described, array);
      const CUresult pool_after =
          cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
      if (array_after != CUDA_ERROR_INVALID_HANDLE || pool_after != CUDA_ERROR_INVALID_VALUE) {
        std::printf("churn: a destroyed array answered %d, a destroyed pool %d\n", array_after,
                    pool_after);
        ++failures;
      }
      const CUresult queried = cuEventQuery(event);
      const CUresult synced = cuStreamSynchronize(stream);
      const CUresult launched = cuGraphLaunch(exec, nullptr);
      CUgraphNode nodes[2]{};
      size_t count = 2;
      const CUresult listed = cuGraphGetNodes(graph, nodes, &count);
      CUgraphNodeType type{};
      const CUresult typed = cuGraphNodeGetType(second, &type);
      for (CUresult got : {queried, synced, launched, listed, typed}) {
        if (got != CUDA_ERROR_INVALID_HANDLE) {
          std::printf(
              "churn: a destroyed object's handle answered %d (event %d, stream %d, exec "
              "%d, graph %d, node %d)\n",
              got, queried, synced, launched, listed, typed);
          ++failures;
          break;
        }
      }
    }
    if (i == cycles / 10) rss_early = resident_kib();
  }
  CHECK(cuCtxSynchronize());
  const long rss_end = resident_kib();
  if (rss_early <= 0 || rss_end - rss_early > 1024) {
    std::printf("churn: resident set %ld KiB after %ld cycles, %ld KiB after %ld\n", rss_early,
                cycles / 10, rss_end, cycles);
    ++failures;
  }
  std::printf("%s churn cycles=%ld rss_kib_early=%ld rss_kib_end=%ld failures=%d\n",
              failures == 0 ? "PASS" : "FAIL", cycles, rss_early, rss_end, failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "basic";
  unsigned long long arg = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : 0;
  if (mode == "basic") return basic(arg ? static_cast<int>(arg) : 1 << 20);
  if (mode == "functions") return functions();
  if (mode == "library_kernels") return library_kernels(arg != 0);
  if (mode == "occupancy") return occupancy();
  if (mode == "idle_sync") return idle_sync();
  if (mode == "watched_sync") {
    const int kernel_us = argc > 3 ? std::atoi(argv[3]) : 30'000;
    return watched_sync(arg ? static_cast<unsigned>(arg) : 3, kernel_us > 0 ? kernel_us : 30'000);
  }
  if (mode == "trickle") return trickle(static_cast<unsigned>(arg ? arg : 200));
  if (mode == "hog") return hog(arg ? arg : 256);
  if (mode == "resident") return resident(arg ? arg : 8);
  if (mode == "holder") return holder(arg ? arg : 8, HolderCall::kAlloc);
  if (mode == "pitch_holder") return holder(arg ? arg : 8, HolderCall::kPitch);
  if (mode == "async_holder") return holder(arg ? arg : 8, HolderCall::kAsync);
  if (mode == "peer_holder") return peer_holder(arg ? arg : 8);
  if (mode == "meminfo") return meminfo();
  if (mode == "account") return account(arg ? static_cast<int>(arg) : 8);
  if (mode == "forge") return forge(arg);
  if (mode == "pointer") return pointer();
  if (mode == "victim") return victim();
  if (mode == "peek") return peek(arg);
  if (mode == "attributes") return attributes();
  if (mode == "two_gpus") return two_gpus(false);
  if (mode == "two_gpus_fault") return two_gpus(true);
  if (mode == "foreign") return foreign(arg);
  if (mode == "overlimit") return overlimit(arg);
  if (mode == "quota") return quota();
  if (mode == "hostmem") return hostmem(arg ? static_cast<int>(arg) : 100000);
  if (mode == "tensor_map") return tensor_map();
  if (mode == "stream_mem_ops") return stream_mem_ops();
  if (mode == "copy_batch") return copy_batch();
  if (mode == "queries") return queries();
  if (mode == "inject") return inject(static_cast<unsigned>(arg), argc > 3 ? argv[3] : "");
  if (mode == "bystander") return bystander();
  if (mode == "churn") return churn(arg ? static_cast<long>(arg) : 200000);
  if (mode == "pinned_kernel") return pinned_kernel(arg ? static_cast<int>(arg) : 32);
  if (mode == "stress") {
    return stress(static_cast<int>(arg), argc > 3 && std::string(argv[3]) == "gate");
  }
  std::printf("FAIL unknown mode %s\n", mode.c_str());
  return 2;
}
