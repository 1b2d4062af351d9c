// Per-kernel latency of one client among others (bench/harness.py's "mixed sizes" workload):
// launches spin kernels of --ns nanoseconds on --blocks x --threads, --batch at a time followed
// by one cuStreamSynchronize, for --duration-ms (or --kernels), and records each batch's
// launch-to-synchronized time. Run several copies at once, some with large kernels (many blocks,
// long --ns) and some with small ones, to see what the large ones do to the small ones' latency.
//
// Start barrier: with --wait-go the program initialises, prints "# ready" on stdout and reads one
// line from stdin holding a CLOCK_REALTIME instant in ns (0 = at once); its timed loop begins
// then. --start-at-ns does the same without stdin (as examples/small_kernels).
//
// Result line fields: kernels, batches, seconds, kernels_per_s, p50_us/p90_us/p99_us/max_us
// (per batch, launch to synchronized), start_ns/end_ns (CLOCK_REALTIME of the timed loop).
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <ctime>
#include <vector>

#include "bench/bench_output.hpp"
#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/host_data.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;
namespace bench = mpsshim::bench;

namespace {

void sleep_until_wall_clock(std::int64_t deadline_ns) {
  const timespec deadline{static_cast<time_t>(deadline_ns / 1000000000LL),
                          static_cast<long>(deadline_ns % 1000000000LL)};
  while (clock_nanosleep(CLOCK_REALTIME, TIMER_ABSTIME, &deadline, nullptr) != 0) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report("kernel_latency");
  ex::Cli cli(argc, argv,
              "[--ns SPIN_NS (10000)] [--blocks B (2)] [--threads T (32)] [--batch K (1)] "
              "[--duration-ms D (2000)] [--kernels N (0 = until the duration is over)] "
              "[--wait-go | --start-at-ns REALTIME_NS] [--device ORDINAL]");
  const long long spin_ns = cli.integer("--ns", 10000, 0, 10000000000LL);
  const auto blocks = static_cast<unsigned>(cli.integer("--blocks", 2, 1, 1 << 20));
  const auto threads = static_cast<unsigned>(cli.integer("--threads", 32, 1, 1024));
  const auto batch = cli.integer("--batch", 1, 1, 1000000);
  const auto duration_ms = cli.integer("--duration-ms", 2000, 1, 3600000);
  const auto max_kernels = cli.integer("--kernels", 0, 0, 1000000000);
  const bool wait_go = cli.flag("--wait-go");
  auto start_at_ns = cli.integer("--start-at-ns", 0, 0, INT64_MAX);
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  cli.finish();

  const ex::Device device = ex::open_device(ordinal);
  CUmodule module = ex::load_image_module();
  CUfunction spin = ex::get_function(module, "spin_kernel");
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  for (int i = 0; i < 3; ++i)
    CU_CHECK(ex::launch_kernel(spin, {blocks}, {threads}, stream, spin_ns));
  CU_CHECK(cuStreamSynchronize(stream));

  if (wait_go) {
    std::printf("# ready\n");
    std::fflush(stdout);
    long long go = 0;
    if (std::scanf("%lld", &go) != 1) ex::fail_reason("no_go_line", __FILE__, __LINE__);
    start_at_ns = go;
  }
  double late_ms = 0;
  if (start_at_ns > 0) {
    const std::int64_t now = ex::wall_clock_ns();
    if (now < start_at_ns) {
      sleep_until_wall_clock(start_at_ns);
    } else {
      late_ms = 1e-6 * static_cast<double>(now - start_at_ns);
    }
  }

  std::vector<double> batch_us;
  batch_us.reserve(1 << 16);
  long long kernels = 0;
  const double duration_s = 1e-3 * static_cast<double>(duration_ms);
  const std::int64_t start_ns = ex::wall_clock_ns();
  const auto start = ex::Clock::now();
  while ((max_kernels == 0 || kernels < max_kernels) && ex::seconds_since(start) < duration_s) {
    const auto t0 = ex::Clock::now();
    for (long long i = 0; i < batch; ++i) {
      CU_CHECK(ex::launch_kernel(spin, {blocks}, {threads}, stream, spin_ns));
    }
    CU_CHECK(cuStreamSynchronize(stream));
    batch_us.push_back(1e6 * ex::seconds_since(t0));
    kernels += batch;
  }
  const double seconds = ex::seconds_since(start);
  const std::int64_t end_ns = ex::wall_clock_ns();

  const double p50 = bench::quantile(batch_us, 0.50);
  const double p90 = bench::quantile(batch_us, 0.90);
  const double p99 = bench::quantile(batch_us, 0.99);
  const double max_us = bench::quantile(batch_us, 1.0);
  // Each batch's kernels run one after another on one stream: a batch faster than its spin
  // time means launches were dropped or did not spin.
  const double min_batch_us = 0.9e-3 * static_cast<double>(batch) * static_cast<double>(spin_ns);

  report.add("kernels", kernels);
  report.add("batches", static_cast<long long>(batch_us.size()));
  report.add("ns", spin_ns);
  report.add("blocks", blocks);
  report.add("threads", threads);
  report.add("batch", batch);
  report.add_fixed("seconds", seconds, 4);
  report.add_fixed("kernels_per_s", static_cast<double>(kernels) / seconds, 1);
  report.add_fixed("p50_us", p50, 2);
  report.add_fixed("p90_us", p90, 2);
  report.add_fixed("p99_us", p99, 2);
  report.add_fixed("max_us", max_us, 2);
  report.add_fixed("late_ms", late_ms, 1);
  report.add("start_ns", start_ns);
  report.add("end_ns", end_ns);
  report.expect(!batch_us.empty() && bench::quantile(batch_us, 0.0) >= min_batch_us,
                "too_fast_for_spin");

  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuModuleUnload(module));
  ex::close_device(device);
  return report.finish();
}
