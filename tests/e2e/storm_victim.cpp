// A client for the crash storm (crash_storm_test.cpp), run under LD_PRELOAD=libmpsshim.so: it
// attaches, prepares one kind of work, prints "PHASE <phase>" once it is really doing that work
// and then does it forever, until the test SIGKILLs it. The phases are the points where a
// client's death leaves the server the most to clean up:
//
//   launch  bursts of kernel launches on a stream of its own (records in the ring, kernels queued)
//   copy    staged copies of 8 MiB each way from pageable memory (staging chunks in flight)
//   alloc   device allocations of varied sizes made and freed (up to 16 held)
//   hostfn  host functions that take 20 ms each (the server's callback thread waits on us);
//           PHASE is printed from inside the first one
//   graph   launches of an executable graph of 16 kernels and a memset, made by stream capture
//   pinned  64 MiB of pinned host memory held, asynchronous copies from and to it
//   stall   one host function that never returns (PHASE from inside it): not a storm phase,
//           the test of a client killed while the device waits for its callback
//
// A failed call prints "FAIL ..." and exits 1 (client_check.hpp): the test requires every victim
// to end by its SIGKILL, so a victim that fails before it is killed fails the test.
#include <cuda.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client_check.hpp"

namespace {

// The test driver resolves kernels by name from any image; this PTX-like text is one.
constexpr char kModuleImage[] = "// mpsshim storm victim module\n.version 8.0\n.target sm_90\n";
constexpr int kElements = 1 << 16;
constexpr size_t kBytes = sizeof(int) * kElements;

struct Client {
  CUcontext ctx{};
  CUmodule module{};
  CUfunction increment{};
  CUstream stream{};
};

Client attach() {
  Client c;
  CUdevice device{};
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&c.ctx, device));
  CHECK(cuCtxSetCurrent(c.ctx));
  CHECK(cuModuleLoadData(&c.module, kModuleImage));
  CHECK(cuModuleGetFunction(&c.increment, c.module, "increment_i32"));
  CHECK(cuStreamCreate(&c.stream, CU_STREAM_NON_BLOCKING));
  return c;
}

// write(2), not stdio: the host function's thread prints it too.
void announce(const char* phase) {
  const std::string line = std::string("PHASE ") + phase + "\n";
  [[maybe_unused]] ssize_t n = ::write(1, line.data(), line.size());
}

[[noreturn]] void launches(Client& c) {
  CUdeviceptr data;
  CHECK(cuMemAlloc(&data, kBytes));
  int n = kElements;
  void* args[] = {&data, &n};
  announce("launch");
  for (;;) {
    for (int i = 0; i < 256; ++i) {
      CHECK(cuLaunchKernel(c.increment, n / 256, 1, 1, 256, 1, 1, 0, c.stream, args, nullptr));
    }
    CHECK(cuStreamSynchronize(c.stream));
  }
}

[[noreturn]] void copies(Client&) {
  constexpr size_t kCopy = 8 << 20;
  CUdeviceptr data;
  CHECK(cuMemAlloc(&data, kCopy));
  std::vector<char> host(kCopy, 7);
  announce("copy");
  for (;;) {
    CHECK(cuMemcpyHtoD(data, host.data(), kCopy));
    CHECK(cuMemcpyDtoH(host.data(), data, kCopy));
  }
}

[[noreturn]] void allocations(Client&) {
  std::mt19937 random(static_cast<unsigned>(::getpid()));
  std::vector<CUdeviceptr> held;
  announce("alloc");
  for (;;) {
    if (held.size() < 16 && random() % 3 != 0) {
      CUdeviceptr p;
      CHECK(cuMemAlloc(&p, 4096 + random() % (4 << 20)));
      held.push_back(p);
    } else if (!held.empty()) {
      const size_t victim = random() % held.size();
      CHECK(cuMemFree(held[victim]));
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(victim));
    }
  }
}

void slow_host_function(void* first) {
  if (*static_cast<bool*>(first)) {
    *static_cast<bool*>(first) = false;
    announce("hostfn");
  }
  ::usleep(20000);
}

[[noreturn]] void host_functions(Client& c) {
  bool first = true;
  for (;;) {
    CHECK(cuLaunchHostFunc(c.stream, slow_host_function, &first));
    CHECK(cuStreamSynchronize(c.stream));
  }
}

void stalled_host_function(void*) {
  announce("stall");
  for (;;) ::pause();
}

[[noreturn]] void stall(Client& c) {
  CHECK(cuLaunchHostFunc(c.stream, stalled_host_function, nullptr));
  CHECK(cuStreamSynchronize(c.stream));
  std::printf("FAIL the stalled host function returned\n");
  std::exit(1);
}

[[noreturn]] void graph_launches(Client& c) {
  CUdeviceptr data;
  CHECK(cuMemAlloc(&data, kBytes));
  int n = kElements;
  void* args[] = {&data, &n};
  CHECK(cuStreamBeginCapture(c.stream, CU_STREAM_CAPTURE_MODE_RELAXED));
  CHECK(cuMemsetD32Async(data, 0, kElements, c.stream));
  for (int i = 0; i < 16; ++i) {
    CHECK(cuLaunchKernel(c.increment, n / 256, 1, 1, 256, 1, 1, 0, c.stream, args, nullptr));
  }
  CUgraph graph{};
  CHECK(cuStreamEndCapture(c.stream, &graph));
  CUgraphExec exec{};
  CHECK(cuGraphInstantiateWithFlags(&exec, graph, 0));
  announce("graph");
  for (;;) {
    for (int i = 0; i < 8; ++i) CHECK(cuGraphLaunch(exec, c.stream));
    CHECK(cuStreamSynchronize(c.stream));
  }
}

[[noreturn]] void pinned(Client& c) {
  constexpr size_t kPinned = 32 << 20;
  void* in = nullptr;
  void* out = nullptr;
  CHECK(cuMemAllocHost(&in, kPinned));
  CHECK(cuMemAllocHost(&out, kPinned));
  std::memset(in, 3, kPinned);
  CUdeviceptr data;
  CHECK(cuMemAlloc(&data, kPinned));
  announce("pinned");
  for (;;) {
    CHECK(cuMemcpyHtoDAsync(data, in, kPinned, c.stream));
    CHECK(cuMemcpyDtoHAsync(out, data, kPinned, c.stream));
    CHECK(cuStreamSynchronize(c.stream));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string phase = argc > 1 ? argv[1] : "";
  using Phase = void (*)(Client&);
  const std::pair<const char*, Phase> phases[] = {
      {"launch", launches},       {"copy", copies},          {"alloc", allocations},
      {"hostfn", host_functions}, {"graph", graph_launches}, {"pinned", pinned},
      {"stall", stall},
  };
  for (const auto& [name, run] : phases) {
    if (phase != name) continue;
    Client c = attach();
    run(c);
  }
  std::printf("FAIL unknown phase '%s'\n", phase.c_str());
  return 2;
}
