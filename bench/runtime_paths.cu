// Runtime paths the shim serves for the CUDA runtime, timed from the application's side: the CPU
// cost of cudaStreamIsCapturing (PyTorch's caching allocator asks on every allocation), the rate
// of cudaGraphLaunch for a graph of small kernels, and the round trip of cudaLaunchHostFunc (the
// callback runs in this process; under mpsshim the server waits for it). Prints
// "benchmark,metric,size_bytes,value,unit" CSV lines like the other benchmarks and a result line
// "runtime_paths: ... PASS|FAIL" (FAIL only when a call fails or a result is wrong).
//
// usage: runtime_paths [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      std::printf("runtime_paths: %s failed: %s FAIL\n", #call, cudaGetErrorName(err_)); \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

__global__ void add_one(int* counter) {
  if (threadIdx.x == 0 && blockIdx.x == 0) ++*counter;
}

namespace {

using Clock = std::chrono::steady_clock;

double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

void callback(void* data) {
  static_cast<std::atomic<int>*>(data)->fetch_add(1);
}

// Median of `samples`.
double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int queries = quick ? 20000 : 200000;
  const int launches = quick ? 200 : 2000;
  const int round_trips = quick ? 200 : 2000;
  constexpr int kKernelsPerGraph = 10;

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int* counter = nullptr;
  CHECK(cudaMalloc(&counter, sizeof(int)));
  CHECK(cudaMemset(counter, 0, sizeof(int)));
  CHECK(cudaDeviceSynchronize());

  // 1. cudaStreamIsCapturing, nothing capturing.
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  auto start = Clock::now();
  for (int i = 0; i < queries; ++i) CHECK(cudaStreamIsCapturing(stream, &status));
  const double is_capturing_ns = 1000.0 * micros_since(start) / queries;

  // 2. cudaGraphLaunch of a graph of kKernelsPerGraph small kernels.
  cudaGraph_t graph = nullptr;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int k = 0; k < kKernelsPerGraph; ++k) add_one<<<1, 32, 0, stream>>>(counter);
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  CHECK(cudaGraphLaunch(exec, stream));  // warm up
  CHECK(cudaStreamSynchronize(stream));
  start = Clock::now();
  for (int i = 0; i < launches; ++i) CHECK(cudaGraphLaunch(exec, stream));
  const double issue_us = micros_since(start) / launches;
  CHECK(cudaStreamSynchronize(stream));
  const double graph_us = micros_since(start) / launches;

  // 3. cudaLaunchHostFunc + cudaStreamSynchronize, one at a time.
  std::atomic<int> calls{0};
  std::vector<double> trips;
  trips.reserve(round_trips);
  for (int i = 0; i < round_trips; ++i) {
    start = Clock::now();
    CHECK(cudaLaunchHostFunc(stream, callback, &calls));
    CHECK(cudaStreamSynchronize(stream));
    trips.push_back(micros_since(start));
  }

  int kernels = 0;
  CHECK(cudaMemcpy(&kernels, counter, sizeof(int), cudaMemcpyDeviceToHost));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaFree(counter));
  CHECK(cudaStreamDestroy(stream));

  std::printf("runtime_paths,is_capturing_cpu,0,%.1f,ns\n", is_capturing_ns);
  std::printf("runtime_paths,graph_launch_issue_cpu,0,%.2f,us\n", issue_us);
  std::printf("runtime_paths,graph_launch_10_kernels,0,%.2f,us\n", graph_us);
  std::printf("runtime_paths,host_func_round_trip_median,0,%.2f,us\n", median(trips));
  const int expected_kernels = kKernelsPerGraph * (launches + 1);
  const bool ok = status == cudaStreamCaptureStatusNone && kernels == expected_kernels &&
                  calls.load() == round_trips;
  std::printf(
      "runtime_paths: is_capturing_ns=%.1f graph_issue_us=%.2f graph_us=%.2f "
      "host_func_us=%.2f kernels=%d/%d callbacks=%d %s\n",
      is_capturing_ns, issue_us, graph_us, median(trips), kernels, expected_kernels, calls.load(),
      ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
