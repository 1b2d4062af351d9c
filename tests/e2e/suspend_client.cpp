// A client holding one of each kind of object a suspend must carry (suspend_test.cpp): cuMemAlloc
// memory, a memory pool's allocation and per-round stream-ordered allocations, a module, streams,
// events, an instantiated graph, and VMM memory (a physical allocation mapped twice, one of its
// granules read-only at a third range (its access is checked), and a second allocation holding
// bytes while unmapped). Two threads compute for a fixed number of rounds while the test suspends
// and resumes it; then every byte is checked against what the rounds must have made, and a checksum
// of all of them is printed ("RESULT <hex>"), which must equal an uninterrupted run's.
//
//   suspend_client mixed ROUNDS   prints READY once both threads run, RESULT once they are done,
//                                 PASS once its stdin has closed
#include <cuda.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "client_check.hpp"

namespace {

constexpr char kModuleImage[] = "// mpsshim e2e suspend module\n.version 8.0\n.target sm_90\n";

// What each piece of memory starts with: distinct per piece and position.
int initial(int seed, std::size_t i) {
  return static_cast<int>(seed * 1'000'003 + i * 7 + (i >> 10));
}

std::vector<int> pattern(int seed, std::size_t count) {
  std::vector<int> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = initial(seed, i);
  return v;
}

std::vector<int> read(CUdeviceptr p, std::size_t count) {
  std::vector<int> v(count);
  CHECK(cuMemcpyDtoH(v.data(), p, count * sizeof(int)));
  return v;
}

// FNV-1a over the words, as one running hash.
void mix(std::uint64_t& hash, const std::vector<int>& words) {
  for (int w : words) {
    for (int b = 0; b < 4; ++b) {
      hash ^= static_cast<std::uint64_t>((static_cast<unsigned>(w) >> (8 * b)) & 0xff);
      hash *= 1099511628211ull;
    }
  }
}

// Each round's kernels add 1 to this many words at the start of what they are given: enough to
// show every round ran, few enough that the test driver runs thousands of rounds in a second.
constexpr int kTouched = 4096;

// Counts the words of `got` that are not `seed`'s pattern, plus `added` where `touched(i)`.
template <typename Touched>
long wrong(const std::vector<int>& got, int seed, int added, Touched&& touched) {
  long bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    bad += got[i] != initial(seed, i) + (touched(i) ? added : 0);
  }
  return bad;
}

CUmemAllocationProp vmm_prop(CUdevice device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // as PyTorch asks
  return prop;
}

void set_access(CUdeviceptr p, std::size_t bytes, CUdevice device, CUmemAccess_flags flags) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = flags;
  CHECK(cuMemSetAccess(p, bytes, &access, 1));
}

void launch(CUfunction f, CUstream stream, void** args, unsigned threads) {
  CHECK(cuLaunchKernel(f, (threads + 255) / 256, 1, 1, 256, 1, 1, 0, stream, args, nullptr));
}

int mixed(int rounds) {
  CHECK(cuInit(0));
  CUdevice device{};
  CHECK(cuDeviceGet(&device, 0));
  CUcontext ctx{};
  CHECK(cuDevicePrimaryCtxRetain(&ctx, device));
  CHECK(cuCtxSetCurrent(ctx));
  CUmodule module{};
  CHECK(cuModuleLoadData(&module, kModuleImage));
  CUfunction increment{}, sleeper{};
  CHECK(cuModuleGetFunction(&increment, module, "increment_i32"));
  CHECK(cuModuleGetFunction(&sleeper, module, "sleep_kernel"));

  // cuMemAlloc memory of each thread.
  constexpr std::size_t kPlainWords = std::size_t{2} << 20;  // 8 MiB
  CUdeviceptr plain1{}, plain2{};
  CHECK(cuMemAlloc(&plain1, kPlainWords * sizeof(int)));
  CHECK(cuMemAlloc(&plain2, kPlainWords * sizeof(int)));
  CHECK(cuMemcpyHtoD(plain1, pattern(1, kPlainWords).data(), kPlainWords * sizeof(int)));
  CHECK(cuMemcpyHtoD(plain2, pattern(2, kPlainWords).data(), kPlainWords * sizeof(int)));

  // A pool's allocation kept for the whole run.
  CUmemPoolProps pool_props{};
  pool_props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  pool_props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  pool_props.location.id = device;
  CUmemoryPool pool{};
  CHECK(cuMemPoolCreate(&pool, &pool_props));
  CUstream s1{}, s2{}, s2b{};
  CHECK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s2b, CU_STREAM_NON_BLOCKING));
  constexpr std::size_t kPooledWords = std::size_t{1} << 20;  // 4 MiB
  CUdeviceptr pooled{};
  CHECK(cuMemAllocFromPoolAsync(&pooled, kPooledWords * sizeof(int), pool, s2));
  CHECK(cuMemcpyHtoDAsync(pooled, pattern(3, kPooledWords).data(), kPooledWords * sizeof(int), s2));
  CHECK(cuStreamSynchronize(s2));

  // VMM: allocation A (3 granules) mapped whole at `whole`, its middle granule again at `alias`
  // and its first read-only at `readonly`; allocation B (1 granule) written, then unmapped.
  const CUmemAllocationProp prop = vmm_prop(device);
  std::size_t granule = 0;
  CHECK(cuMemGetAllocationGranularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const std::size_t a_bytes = 3 * granule, a_words = a_bytes / sizeof(int);
  const std::size_t granule_words = granule / sizeof(int);
  CUmemGenericAllocationHandle a{}, b{};
  CHECK(cuMemCreate(&a, a_bytes, &prop, 0));
  CHECK(cuMemCreate(&b, granule, &prop, 0));
  CUdeviceptr range{};
  CHECK(cuMemAddressReserve(&range, 6 * granule, 0, 0, 0));
  const CUdeviceptr whole = range, alias = range + 3 * granule, readonly = range + 4 * granule;
  const CUdeviceptr b_at = range + 5 * granule;
  CHECK(cuMemMap(whole, a_bytes, 0, a, 0));
  CHECK(cuMemMap(alias, granule, granule, a, 0));
  CHECK(cuMemMap(readonly, granule, 0, a, 0));
  CHECK(cuMemMap(b_at, granule, 0, b, 0));
  set_access(whole, a_bytes, device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  set_access(alias, granule, device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  set_access(readonly, granule, device, CU_MEM_ACCESS_FLAGS_PROT_READ);
  set_access(b_at, granule, device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  CHECK(cuMemcpyHtoD(whole, pattern(4, a_words).data(), a_bytes));
  CHECK(cuMemcpyHtoD(b_at, pattern(5, granule_words).data(), granule));
  CHECK(cuMemUnmap(b_at, granule));

  // A graph of thread 1: A (through both of its read-write ranges) and plain1 incremented.
  int touched = kTouched;
  CUdeviceptr whole_arg = whole, alias_arg = alias, plain1_arg = plain1;
  void* whole_args[] = {&whole_arg, &touched};
  void* alias_args[] = {&alias_arg, &touched};
  void* plain1_args[] = {&plain1_arg, &touched};
  CHECK(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  launch(increment, s1, whole_args, kTouched);
  launch(increment, s1, alias_args, kTouched);
  launch(increment, s1, plain1_args, kTouched);
  CUgraph graph{};
  CHECK(cuStreamEndCapture(s1, &graph));
  CUgraphExec exec{};
  CHECK(cuGraphInstantiate(&exec, graph, 0));

  CUevent handoff{};
  CHECK(cuEventCreate(&handoff, CU_EVENT_DISABLE_TIMING));
  std::atomic<int> started{0};
  std::thread first([&] {
    CHECK(cuCtxSetCurrent(ctx));
    ++started;
    int us = 300;
    void* sleep_args[] = {&us};
    for (int round = 0; round < rounds; ++round) {
      launch(sleeper, s1, sleep_args, 1);
      CHECK(cuGraphLaunch(exec, s1));
      if (round % 16 == 15) CHECK(cuStreamSynchronize(s1));
    }
    CHECK(cuStreamSynchronize(s1));
  });
  std::thread second([&] {
    CHECK(cuCtxSetCurrent(ctx));
    ++started;
    CUdeviceptr pooled_arg = pooled, plain2_arg = plain2;
    void* pooled_args[] = {&pooled_arg, &touched};
    void* plain2_args[] = {&plain2_arg, &touched};
    for (int round = 0; round < rounds; ++round) {
      // A stream-ordered scratch allocation each round, written and freed.
      CUdeviceptr scratch{};
      CHECK(cuMemAllocFromPoolAsync(&scratch, 1 << 20, pool, s2));
      CHECK(cuMemsetD32Async(scratch, static_cast<unsigned>(round), (1 << 20) / 4, s2));
      launch(increment, s2, pooled_args, kTouched);
      CHECK(cuEventRecord(handoff, s2));
      CHECK(cuStreamWaitEvent(s2b, handoff, 0));
      launch(increment, s2b, plain2_args, kTouched);
      CHECK(cuMemFreeAsync(scratch, s2));
      if (round % 16 == 15) CHECK(cuStreamSynchronize(s2b));
    }
    CHECK(cuStreamSynchronize(s2));
    CHECK(cuStreamSynchronize(s2b));
  });
  while (started.load() < 2) std::this_thread::yield();
  std::printf("READY\n");
  std::fflush(stdout);
  first.join();
  second.join();

  // Every byte against what the rounds made, and B, unmapped throughout, mapped again.
  CHECK(cuMemMap(b_at, granule, 0, b, 0));
  set_access(b_at, granule, device, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  unsigned long long access = 0;
  CUmemLocation here{CU_MEM_LOCATION_TYPE_DEVICE, device};
  CHECK(cuMemGetAccess(&access, &here, readonly));
  const std::vector<int> got_plain1 = read(plain1, kPlainWords),
                         got_plain2 = read(plain2, kPlainWords),
                         got_pooled = read(pooled, kPooledWords), got_a = read(whole, a_words),
                         got_alias = read(alias, granule_words), got_b = read(b_at, granule_words);
  auto head = [](std::size_t i) { return i < kTouched; };
  auto heads_of_two_granules = [&](std::size_t i) {
    return i < kTouched || (i >= granule_words && i < granule_words + kTouched);
  };
  long bad = wrong(got_plain1, 1, rounds, head) + wrong(got_plain2, 2, rounds, head) +
             wrong(got_pooled, 3, rounds, head) + wrong(got_a, 4, rounds, heads_of_two_granules) +
             wrong(got_b, 5, 0, head);
  for (std::size_t i = 0; i < granule_words; ++i) bad += got_alias[i] != got_a[granule_words + i];
  std::uint64_t hash = 1469598103934665603ull;
  for (const auto* words : {&got_plain1, &got_plain2, &got_pooled, &got_a, &got_b}) {
    mix(hash, *words);
  }
  std::printf("RESULT %016llx\n", static_cast<unsigned long long>(hash));
  std::fflush(stdout);
  // Held until stdin closes, so that a suspend the test sends late still finds it.
  char ignored[64];
  while (::read(0, ignored, sizeof ignored) > 0) {
  }
  if (access != CU_MEM_ACCESS_FLAGS_PROT_READ) {
    std::printf("FAIL the read-only range's access is %llu\n", access);
    return 1;
  }
  if (bad != 0) {
    std::printf("FAIL %ld words differ from what %d rounds make\n", bad, rounds);
    return 1;
  }
  CHECK(cuMemUnmap(range, 6 * granule));
  CHECK(cuMemRelease(a));
  CHECK(cuMemRelease(b));
  CHECK(cuMemAddressFree(range, 6 * granule));
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(graph));
  CHECK(cuMemFreeAsync(pooled, s2));
  CHECK(cuStreamSynchronize(s2));
  CHECK(cuMemPoolDestroy(pool));
  std::printf("PASS mixed\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "mixed" && argc > 2) return mixed(std::atoi(argv[2]));
  std::fprintf(stderr, "usage: suspend_client mixed ROUNDS\n");
  return 2;
}
