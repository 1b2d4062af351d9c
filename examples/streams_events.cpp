// Several non-blocking streams, each: sleep, copy in from pinned memory, y = a*x + y, record an
// event; then each stream waits on the NEXT stream's event and computes w = b*y_next + y from
// the other stream's result, and copies w out to pinned memory.
//
// Stream s sleeps (s+1) * sleep_us before its first phase, so the next stream's y is always
// later than this stream's own work: if cuStreamWaitEvent were ignored, w would be built from a
// y_next that is not there yet (zeros) and the exact check fails. Events also time each phase
// (cuEventElapsedTime must cover the sleep) and cuStreamQuery must say NOT_READY while the
// sleeps run and SUCCESS after cuEventSynchronize.
#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/host_data.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;

namespace {

constexpr unsigned kThreads = 256;
constexpr float kBeta = 0.5f;

float alpha_of(int s) {
  return 1.0f + 0.25f * static_cast<float>(s);
}

struct StreamWork {
  CUstream stream = nullptr;
  CUevent start = nullptr;
  CUevent phase1_done = nullptr;
  CUevent done = nullptr;
  float* host_x = nullptr;  // pinned (cuMemAllocHost)
  float* host_y = nullptr;
  float* host_w = nullptr;
  CUdeviceptr x = 0, y = 0, w = 0;
};

}  // namespace

int main(int argc, char** argv) {
  ex::Report report("streams_events");
  ex::Cli cli(argc, argv,
              "[--n ELEMENTS (256K)] [--streams S (4)] [--sleep-us US (500)] [--device ORDINAL]");
  const auto n = static_cast<int>(cli.integer("--n", 1 << 18, 1, 1 << 26));
  const auto count = static_cast<int>(cli.integer("--streams", 4, 2, 64));
  const auto sleep_us = static_cast<int>(cli.integer("--sleep-us", 500, 1, 1000000));
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  cli.finish();

  const ex::Device device = ex::open_device(ordinal);
  CUmodule module = ex::load_image_module();
  CUfunction scale_add = ex::get_function(module, "scale_add");
  CUfunction sleep_kernel = ex::get_function(module, "sleep_kernel");
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>(n);
  const unsigned blocks = ex::blocks_for(n, kThreads);

  std::vector<StreamWork> work(count);
  for (int s = 0; s < count; ++s) {
    auto& w = work[s];
    CU_CHECK(cuStreamCreate(&w.stream, CU_STREAM_NON_BLOCKING));
    CU_CHECK(cuEventCreate(&w.start, CU_EVENT_DEFAULT));
    CU_CHECK(cuEventCreate(&w.phase1_done, CU_EVENT_DEFAULT));
    CU_CHECK(cuEventCreate(&w.done, CU_EVENT_DEFAULT));
    CU_CHECK(cuMemAllocHost(reinterpret_cast<void**>(&w.host_x), bytes));
    CU_CHECK(cuMemAllocHost(reinterpret_cast<void**>(&w.host_y), bytes));
    CU_CHECK(cuMemAllocHost(reinterpret_cast<void**>(&w.host_w), bytes));
    ex::fill_random_floats(w.host_x, n, 100 + 2 * s);
    ex::fill_random_floats(w.host_y, n, 101 + 2 * s);
    CU_CHECK(cuMemAlloc(&w.x, bytes));
    CU_CHECK(cuMemAlloc(&w.y, bytes));
    CU_CHECK(cuMemAlloc(&w.w, bytes));
    CU_CHECK(cuMemsetD32(w.y, 0, n));  // what an ignored wait would read
  }
  CU_CHECK(cuCtxSynchronize());

  for (int s = 0; s < count; ++s) {
    auto& w = work[s];
    CU_CHECK(cuEventRecord(w.start, w.stream));
    CU_CHECK(ex::launch_kernel(sleep_kernel, {1}, {1}, w.stream, sleep_us * (s + 1)));
    CU_CHECK(cuMemcpyHtoDAsync(w.x, w.host_x, bytes, w.stream));
    CU_CHECK(cuMemcpyHtoDAsync(w.y, w.host_y, bytes, w.stream));
    CU_CHECK(
        ex::launch_kernel(scale_add, {blocks}, {kThreads}, w.stream, w.y, w.x, alpha_of(s), n));
    CU_CHECK(cuEventRecord(w.phase1_done, w.stream));
  }
  // The last stream is still sleeping: both queries must say NOT_READY on a GPU.
  const CUresult query_stream_early = cuStreamQuery(work.back().stream);
  const CUresult query_event_early = cuEventQuery(work.back().phase1_done);

  for (int s = 0; s < count; ++s) {
    auto& w = work[s];
    const auto& next = work[(s + 1) % count];
    CU_CHECK(cuStreamWaitEvent(w.stream, next.phase1_done, 0));
    CU_CHECK(cuMemcpyDtoDAsync(w.w, w.y, bytes, w.stream));
    CU_CHECK(ex::launch_kernel(scale_add, {blocks}, {kThreads}, w.stream, w.w, next.y, kBeta, n));
    CU_CHECK(cuMemcpyDtoHAsync(w.host_w, w.w, bytes, w.stream));
    CU_CHECK(cuEventRecord(w.done, w.stream));
  }
  for (auto& w : work) CU_CHECK(cuEventSynchronize(w.done));

  long long mismatches = 0;
  long long not_idle = 0;
  double min_phase1_ms = 1e30;
  double max_total_ms = 0;
  bool elapsed_ok = true;
  std::string combined;
  for (int s = 0; s < count; ++s) {
    auto& w = work[s];
    const auto& next = work[(s + 1) % count];
    if (cuStreamQuery(w.stream) != CUDA_SUCCESS) ++not_idle;
    if (cuEventQuery(w.done) != CUDA_SUCCESS) ++not_idle;
    float phase1_ms = 0, total_ms = 0;
    CU_CHECK(cuEventElapsedTime(&phase1_ms, w.start, w.phase1_done));
    CU_CHECK(cuEventElapsedTime(&total_ms, w.start, w.done));
    // Half the requested sleep at least: lenient about timer granularity, but a sleep that did
    // not happen or an event recorded out of order cannot pass.
    const double slept_ms = 1e-3 * sleep_us * (s + 1);
    if (phase1_ms < 0.5 * slept_ms || total_ms < phase1_ms) {
      std::fprintf(stderr,
                   "streams_events: stream %d phase1 %.3f ms total %.3f ms, slept %.3f ms\n", s,
                   phase1_ms, total_ms, slept_ms);
      elapsed_ok = false;
    }
    min_phase1_ms = std::min(min_phase1_ms, static_cast<double>(phase1_ms));
    max_total_ms = std::max(max_total_ms, static_cast<double>(total_ms));

    // The exact CPU result: scale_add is one fused multiply-add per element.
    for (int i = 0; i < n; ++i) {
      const float y_self = std::fma(alpha_of(s), w.host_x[i], w.host_y[i]);
      const float y_next = std::fma(alpha_of((s + 1) % count), next.host_x[i], next.host_y[i]);
      const float expected = std::fma(kBeta, y_next, y_self);
      if (w.host_w[i] != expected) {
        if (mismatches == 0) {
          std::fprintf(stderr, "streams_events: stream %d w[%d] = %g, expected %g\n", s, i,
                       w.host_w[i], expected);
        }
        ++mismatches;
      }
    }
    combined += ex::checksum(w.host_w, bytes);
  }

  report.add("streams", count);
  report.add("n", n);
  report.add("sleep_us", sleep_us);
  report.add("mismatches", mismatches);
  report.add("query_stream_early", ex::error_name(query_stream_early));
  report.add("query_event_early", ex::error_name(query_event_early));
  report.add("not_idle_after_sync", not_idle);
  report.add("checksum", ex::checksum(combined.data(), combined.size()));
  report.add_fixed("min_phase1_ms", min_phase1_ms, 3);
  report.add_fixed("max_total_ms", max_total_ms, 3);
  report.expect(mismatches == 0, "mismatches");
  report.expect(query_stream_early == CUDA_SUCCESS || query_stream_early == CUDA_ERROR_NOT_READY,
                "query_stream_early");
  report.expect(query_event_early == CUDA_SUCCESS || query_event_early == CUDA_ERROR_NOT_READY,
                "query_event_early");
  report.expect(not_idle == 0, "not_idle_after_sync");
  report.expect(elapsed_ok, "event_elapsed");

  for (auto& w : work) {
    CU_CHECK(cuEventDestroy(w.start));
    CU_CHECK(cuEventDestroy(w.phase1_done));
    CU_CHECK(cuEventDestroy(w.done));
    CU_CHECK(cuStreamDestroy(w.stream));
    CU_CHECK(cuMemFreeHost(w.host_x));
    CU_CHECK(cuMemFreeHost(w.host_y));
    CU_CHECK(cuMemFreeHost(w.host_w));
    CU_CHECK(cuMemFree(w.x));
    CU_CHECK(cuMemFree(w.y));
    CU_CHECK(cuMemFree(w.w));
  }
  CU_CHECK(cuModuleUnload(module));
  ex::close_device(device);
  return report.finish();
}
