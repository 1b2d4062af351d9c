// Black-box probe of the real driver, two questions about green contexts the server depends on:
//
// 1. May several threads of one process build green contexts at the same time? The server's
//    workers each move their own sessions (a live quota change, leaving the SMs reserved for
//    normal-priority clients): on an H200 two of four below-normal clients moved at once failed
//    with CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION. Here T threads, released together, each
//    split the device's SMs (cuDevSmResourceSplitByCount, groups of 8), make a descriptor of all
//    but the last 3 groups plus the SMs left over (cuDevResourceGenerateDesc), create a green
//    context (cuGreenCtxCreate) and destroy it; rounds of that, counting which call failed how.
//    The same with the threads taking turns (a mutex around the build, as the server's
//    hold_green_builds) is the control; in both, each thread then creates a stream in its green
//    context and destroys both outside the mutex, as a session's life does in the server.
// 2. Does a launch into a green context's stream reach the GPU later than one into a
//    primary-context stream? Launch + cuStreamSynchronize of an empty kernel, primary context
//    current (as the server's workers run), on a primary-context stream, on a stream of a green
//    context of every SM and on one of 108 SMs; interleaved batches, medians.
//
// Build and run on the GPU machine:
//   nvcc -cubin -arch=sm_90 -o /tmp/probe_kernel.cubin tools/probes/probe_kernel.cu
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/green_concurrency.cpp -lcuda
//     -lpthread -o /tmp/green_concurrency   (one line)
//   /tmp/green_concurrency /tmp/probe_kernel.cubin serial 600     (each mode in a fresh process)
//   /tmp/green_concurrency /tmp/probe_kernel.cubin at-once 4 20
//   /tmp/green_concurrency /tmp/probe_kernel.cubin turns 4 20
//   /tmp/green_concurrency /tmp/probe_kernel.cubin round-trips
#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "must.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::string error_name(CUresult r) {
  const char* s = "?";
  cuGetErrorName(r, &s);
  return s;
}

// One green context of every split group but the last `reserve_groups`, plus what is left over;
// the name of the call that failed and its error, or "" when it worked.
std::string build_green(CUdevice device, const CUdevResource& sms, unsigned reserve_groups,
                        CUgreenCtx* out) {
  unsigned count = 64;
  std::vector<CUdevResource> groups(count);
  CUdevResource remaining{};
  CUresult r = cuDevSmResourceSplitByCount(groups.data(), &count, &sms, &remaining, 0, 8);
  if (r != CUDA_SUCCESS) return "split:" + error_name(r);
  groups.resize(count > reserve_groups ? count - reserve_groups : count);
  if (remaining.sm.smCount != 0) groups.push_back(remaining);
  CUdevResourceDesc desc = nullptr;
  r = cuDevResourceGenerateDesc(&desc, groups.data(), static_cast<unsigned>(groups.size()));
  if (r != CUDA_SUCCESS) return "desc:" + error_name(r);
  r = cuGreenCtxCreate(out, desc, device, CU_GREEN_CTX_DEFAULT_STREAM);
  if (r != CUDA_SUCCESS) return "create:" + error_name(r);
  return "";
}

void concurrent_builds(CUdevice device, CUcontext primary, const CUdevResource& sms,
                       unsigned threads, bool take_turns, int rounds) {
  std::map<std::string, int> outcomes;
  std::mutex outcomes_mutex, turns;
  for (int round = 0; round < rounds; ++round) {
    std::atomic<unsigned> ready{0};
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        MUST(cuCtxSetCurrent(primary));
        ready.fetch_add(1);
        while (ready.load() < threads) {
        }
        CUgreenCtx green = nullptr;
        std::string failed;
        if (take_turns) {
          std::lock_guard lock(turns);
          failed = build_green(device, sms, 3, &green);
        } else {
          failed = build_green(device, sms, 3, &green);
        }
        // As a session's life goes on in the server, outside the lock: a stream in the new
        // green context, then both destroyed, while other threads build.
        if (green != nullptr) {
          CUstream stream = nullptr;
          CUresult r = cuGreenCtxStreamCreate(&stream, green, CU_STREAM_NON_BLOCKING, 0);
          if (r != CUDA_SUCCESS) failed = "stream:" + error_name(r);
          if (stream != nullptr && (r = cuStreamDestroy(stream)) != CUDA_SUCCESS) {
            failed = "stream destroy:" + error_name(r);
          }
          if ((r = cuGreenCtxDestroy(green)) != CUDA_SUCCESS) failed = "destroy:" + error_name(r);
        }
        std::lock_guard lock(outcomes_mutex);
        ++outcomes[failed.empty() ? "ok" : failed];
      });
    }
    for (auto& t : pool) t.join();
  }
  std::printf("builds threads=%u %s:", threads, take_turns ? "taking turns" : "at once");
  for (const auto& [what, n] : outcomes) std::printf(" %s=%d", what.c_str(), n);
  std::printf(" (of %d)\n", rounds * static_cast<int>(threads));
}

double round_trip_us(CUfunction empty, CUstream stream, int trips) {
  std::vector<double> us;
  us.reserve(trips);
  for (int i = 0; i < trips; ++i) {
    const auto t0 = Clock::now();
    MUST(cuLaunchKernel(empty, 1, 1, 1, 32, 1, 1, 0, stream, nullptr, nullptr));
    MUST(cuStreamSynchronize(stream));
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::nth_element(us.begin(), us.begin() + trips / 2, us.end());
  return us[trips / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::printf(
        "usage: %s probe_kernel.cubin MODE\n"
        "  MODE: serial N (N builds in a row) | at-once T R | turns T R (R rounds of T threads)"
        " | round-trips\n",
        argv[0]);
    return 2;
  }
  const std::string mode = argv[2];
  MUST(cuInit(0));
  CUdevice device;
  MUST(cuDeviceGet(&device, 0));
  CUcontext primary;
  MUST(cuDevicePrimaryCtxRetain(&primary, device));
  MUST(cuCtxSetCurrent(primary));
  CUdevResource sms{};
  MUST(cuDeviceGetDevResource(device, &sms, CU_DEV_RESOURCE_TYPE_SM));

  if (mode == "serial" && argc > 3) {
    // Builds in a row, one thread: does the driver stop building after some number?
    const int builds = std::atoi(argv[3]);
    int first_failure = -1, failures = 0;
    std::string what;
    for (int i = 0; i < builds; ++i) {
      CUgreenCtx g = nullptr;
      std::string failed = build_green(device, sms, 3, &g);
      if (g != nullptr) MUST(cuGreenCtxDestroy(g));
      if (!failed.empty()) {
        if (first_failure < 0) first_failure = i, what = failed;
        ++failures;
      }
    }
    std::printf("serial builds=%d failures=%d first_failure=%d %s\n", builds, failures,
                first_failure, what.c_str());
    return 0;
  }
  if ((mode == "at-once" || mode == "turns") && argc > 4) {
    concurrent_builds(device, primary, sms, static_cast<unsigned>(std::atoi(argv[3])),
                      mode == "turns", std::atoi(argv[4]));
    // Whether the process can still build one afterwards.
    CUgreenCtx g = nullptr;
    std::string failed = build_green(device, sms, 3, &g);
    if (g != nullptr) MUST(cuGreenCtxDestroy(g));
    std::printf("one more build afterwards: %s\n", failed.empty() ? "ok" : failed.c_str());
    return 0;
  }
  if (mode != "round-trips") {
    std::printf("unknown mode %s\n", mode.c_str());
    return 2;
  }
  CUmodule module;
  MUST(cuModuleLoad(&module, argv[1]));
  CUfunction empty;
  MUST(cuModuleGetFunction(&empty, module, "empty"));
  CUstream on_primary;
  MUST(cuStreamCreate(&on_primary, CU_STREAM_NON_BLOCKING));
  CUgreenCtx whole = nullptr, most = nullptr;
  std::string failed = build_green(device, sms, 0, &whole);
  if (failed.empty()) failed = build_green(device, sms, 3, &most);
  if (!failed.empty()) {
    std::printf("green contexts for the round trips: %s\n", failed.c_str());
    return 1;
  }
  CUstream on_whole, on_most;
  MUST(cuGreenCtxStreamCreate(&on_whole, whole, CU_STREAM_NON_BLOCKING, 0));
  MUST(cuGreenCtxStreamCreate(&on_most, most, CU_STREAM_NON_BLOCKING, 0));
  MUST(cuCtxSetCurrent(primary));
  std::vector<double> p, w, m;
  round_trip_us(empty, on_primary, 2000);
  round_trip_us(empty, on_whole, 2000);
  round_trip_us(empty, on_most, 2000);
  for (int batch = 0; batch < 8; ++batch) {
    p.push_back(round_trip_us(empty, on_primary, 2000));
    w.push_back(round_trip_us(empty, on_whole, 2000));
    m.push_back(round_trip_us(empty, on_most, 2000));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf(
      "launch+sync empty kernel, median of 8 batches of 2000 (us): primary stream %.2f, green "
      "stream (all SMs) %.2f, green stream (all but 3 groups) %.2f\n",
      median(p), median(w), median(m));
  return 0;
}
