// The MPS anchor workload: many tiny kernels (2 blocks of 32 threads spinning ~10 us each) with a
// stream synchronization every 64, the pattern of inference servers that MPS speeds up by letting
// several processes' kernels share the GPU. Prints the seconds the launch loop took.
//
// For runs of several copies, --start-at-ns makes every copy begin its loop at the same
// CLOCK_REALTIME instant after its (slow, variable) initialisation; the start_ns/end_ns fields
// let the harness measure the span all copies took together.
#include <cuda.h>

#include <cstdint>
#include <ctime>

#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/host_data.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;

namespace {

void sleep_until_wall_clock(std::int64_t deadline_ns) {
  const timespec deadline{static_cast<time_t>(deadline_ns / 1000000000LL),
                          static_cast<long>(deadline_ns % 1000000000LL)};
  while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &deadline, nullptr) != 0) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report("small_kernels");
  ex::Cli cli(argc, argv,
              "[--kernels K (5000)] [--ns SPIN_NS (10000)] [--blocks B (2)] [--threads T (32)] "
              "[--sync-every S (64)] [--null-stream] [--start-at-ns REALTIME_NS] "
              "[--device ORDINAL]");
  const auto kernels = cli.integer("--kernels", 5000, 1, 100000000);
  const long long spin_ns = cli.integer("--ns", 10000, 0, 10000000000LL);
  const auto blocks = static_cast<unsigned>(cli.integer("--blocks", 2, 1, 1 << 20));
  const auto threads = static_cast<unsigned>(cli.integer("--threads", 32, 1, 1024));
  const auto sync_every = cli.integer("--sync-every", 64, 1, 100000000);
  const bool null_stream = cli.flag("--null-stream");
  const auto start_at_ns = cli.integer("--start-at-ns", 0, 0, INT64_MAX);
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  cli.finish();

  const ex::Device device = ex::open_device(ordinal);
  CUmodule module = ex::load_image_module();
  CUfunction spin = ex::get_function(module, "spin_kernel");
  CUstream stream = nullptr;
  if (!null_stream) CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  // Warm up outside the timed loop: first launches pay for lazy module and stream setup.
  CU_CHECK(ex::launch_kernel(spin, {blocks}, {threads}, stream, spin_ns));
  CU_CHECK(cuStreamSynchronize(stream));

  double late_ms = 0;
  if (start_at_ns > 0) {
    const std::int64_t now = ex::wall_clock_ns();
    if (now < start_at_ns) {
      sleep_until_wall_clock(start_at_ns);
    } else {
      late_ms = 1e-6 * static_cast<double>(now - start_at_ns);
    }
  }

  const std::int64_t start_ns = ex::wall_clock_ns();
  const auto start = ex::Clock::now();
  for (long long i = 0; i < kernels; ++i) {
    CU_CHECK(ex::launch_kernel(spin, {blocks}, {threads}, stream, spin_ns));
    if ((i + 1) % sync_every == 0) CU_CHECK(cuStreamSynchronize(stream));
  }
  CU_CHECK(cuStreamSynchronize(stream));
  const double seconds = ex::seconds_since(start);
  const std::int64_t end_ns = ex::wall_clock_ns();

  // The kernels of one stream run one after another, each spinning spin_ns: a faster loop means
  // launches were dropped or did not spin.
  const double minimum_seconds =
      0.9e-9 * static_cast<double>(kernels) * static_cast<double>(spin_ns);

  report.add("kernels", kernels);
  report.add("ns", spin_ns);
  report.add("blocks", blocks);
  report.add("threads", threads);
  report.add("sync_every", sync_every);
  report.add("stream", null_stream ? "null" : "created");
  report.add_fixed("seconds", seconds, 4);
  report.add_fixed("per_kernel_us", 1e6 * seconds / static_cast<double>(kernels), 2);
  report.add_fixed("late_ms", late_ms, 1);
  report.add("start_ns", start_ns);
  report.add("end_ns", end_ns);
  report.expect(seconds >= minimum_seconds, "too_fast_for_spin");

  if (stream != nullptr) CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuModuleUnload(module));
  ex::close_device(device);
  return report.finish();
}
