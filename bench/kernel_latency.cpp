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
// (per batch, launch to synchronized), start_ns/end_ns (CLOCK_REALTIME of the timed loop),
// stream_priority (the stream's priority as the driver gave it, --stream-priority clamped).
//
// --stamps (with --batch 1) splits each round trip where the time goes: the kernel records its
// start and end on the GPU (%globaltimer, spin_stamp_kernel) and the program its launch call and
// the synchronize's return (CLOCK_REALTIME), giving stamp_start (launch call to kernel start),
// stamp_run (kernel start to end) and stamp_answer (kernel end to the synchronize's return):
// min, p50, p99 and p50 - min each. The two clocks are offset (by tens of microseconds on an
// H200, and the offset moves between runs), so compare only p50 - min between runs, or the sum
// of start and answer; stamp_run does not depend on the offset. The kernel's end is block 0's,
// or with --stamps-last-block (implies --stamps) its last block's (spin_span_kernel): a kernel
// among others' whose last blocks waited for SM slots then shows it in stamp_run, where an
// answer that came late shows in stamp_answer.
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <utility>
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

// --stamps: where each round trip's time went (the header comment); with --stamps-csv FILE
// also every trip's four times, for tools/probes/stamp_tail.py.
void report_stamps(ex::Report& report, CUdeviceptr stamps_dev,
                   const std::vector<std::int64_t>& host_launch,
                   const std::vector<std::int64_t>& host_done, const std::string& csv_path) {
  std::vector<std::uint64_t> gpu(2 * host_launch.size());
  if (!gpu.empty()) CU_CHECK(cuMemcpyDtoH(gpu.data(), stamps_dev, sizeof(gpu[0]) * gpu.size()));
  if (!csv_path.empty()) {
    std::FILE* csv = std::fopen(csv_path.c_str(), "w");
    if (csv == nullptr) ex::fail_reason("stamps_csv_not_writable", __FILE__, __LINE__);
    std::fprintf(csv, "launch_ns,gpu_start_ns,gpu_end_ns,done_ns\n");
    for (std::size_t i = 0; i < host_launch.size(); ++i) {
      std::fprintf(csv, "%lld,%llu,%llu,%lld\n", static_cast<long long>(host_launch[i]),
                   static_cast<unsigned long long>(gpu[2 * i]),
                   static_cast<unsigned long long>(gpu[2 * i + 1]),
                   static_cast<long long>(host_done[i]));
    }
    std::fclose(csv);
  }
  std::vector<double> start_us, run_us, answer_us;
  for (std::size_t i = 0; i < host_launch.size(); ++i) {
    const auto gpu_start = static_cast<std::int64_t>(gpu[2 * i]);
    const auto gpu_end = static_cast<std::int64_t>(gpu[2 * i + 1]);
    start_us.push_back(1e-3 * static_cast<double>(gpu_start - host_launch[i]));
    run_us.push_back(1e-3 * static_cast<double>(gpu_end - gpu_start));
    answer_us.push_back(1e-3 * static_cast<double>(host_done[i] - gpu_end));
  }
  report.add("stamped", static_cast<long long>(start_us.size()));
  for (auto [name, values] : {std::pair{"stamp_start", &start_us}, std::pair{"stamp_run", &run_us},
                              std::pair{"stamp_answer", &answer_us}}) {
    // Over the run's fastest trip as well: the clocks' offset cancels out of p50 - min.
    const double least = bench::quantile(*values, 0.0);
    report.add_fixed(std::string(name) + "_min_us", least, 2);
    report.add_fixed(std::string(name) + "_p50_us", bench::quantile(*values, 0.50), 2);
    report.add_fixed(std::string(name) + "_p99_us", bench::quantile(*values, 0.99), 2);
    report.add_fixed(std::string(name) + "_p50_over_min_us", bench::quantile(*values, 0.50) - least,
                     2);
  }
  CU_CHECK(cuMemFree(stamps_dev));
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report("kernel_latency");
  ex::Cli cli(argc, argv,
              "[--ns SPIN_NS (10000)] [--blocks B (2)] [--threads T (32)] [--batch K (1)] "
              "[--duration-ms D (2000)] [--kernels N (0 = until the duration is over)] "
              "[--wait-go | --start-at-ns REALTIME_NS] [--stamps [--stamps-csv FILE]] "
              "[--stamps-last-block] "
              "[--device ORDINAL] "
              "[--stream-priority P (0; lower is higher, as cuStreamCreateWithPriority)]");
  const long long spin_ns = cli.integer("--ns", 10000, 0, 10000000000LL);
  const auto blocks = static_cast<unsigned>(cli.integer("--blocks", 2, 1, 1 << 20));
  const auto threads = static_cast<unsigned>(cli.integer("--threads", 32, 1, 1024));
  const auto batch = cli.integer("--batch", 1, 1, 1000000);
  const auto duration_ms = cli.integer("--duration-ms", 2000, 1, 3600000);
  const auto max_kernels = cli.integer("--kernels", 0, 0, 1000000000);
  const bool wait_go = cli.flag("--wait-go");
  // The stamped end is the last block's instead of block 0's (spin_span_kernel).
  const bool last_block = cli.flag("--stamps-last-block");
  const bool stamps = cli.flag("--stamps") || last_block;
  const std::string stamps_csv = cli.text("--stamps-csv", "");
  auto start_at_ns = cli.integer("--start-at-ns", 0, 0, INT64_MAX);
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  const auto stream_priority = static_cast<int>(cli.integer("--stream-priority", 0, -1024, 1024));
  cli.finish();
  if (stamps && batch != 1) ex::fail_reason("stamps_need_batch_1", __FILE__, __LINE__);

  const ex::Device device = ex::open_device(ordinal);
  CUmodule module = ex::load_image_module();
  CUfunction spin = ex::get_function(module, "spin_kernel");
  CUfunction spin_stamp =
      ex::get_function(module, last_block ? "spin_span_kernel" : "spin_stamp_kernel");
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, stream_priority));
  int priority_given = 0;  // the driver clamps it to its range
  CU_CHECK(cuStreamGetPriority(stream, &priority_given));
  // --stamps: the first kStampCap round trips are split; later ones stamp into a spare pair.
  constexpr int kStampCap = 1 << 18;
  CUdeviceptr stamps_dev = 0;
  if (stamps) {
    CU_CHECK(cuMemAlloc(&stamps_dev, sizeof(std::uint64_t) * 2 * (kStampCap + 1)));
    // spin_span_kernel raises each end from 0. On the kernels' own stream: a non-blocking
    // stream does not wait for a memset on the NULL stream.
    CU_CHECK(cuMemsetD8Async(stamps_dev, 0, sizeof(std::uint64_t) * 2 * (kStampCap + 1), stream));
  }
  std::vector<std::int64_t> host_launch, host_done;
  auto launch_one = [&](long long index) {
    if (!stamps) return ex::launch_kernel(spin, {blocks}, {threads}, stream, spin_ns);
    auto* out = reinterpret_cast<unsigned long long*>(stamps_dev);
    const int slot = static_cast<int>(index < kStampCap ? index : kStampCap);
    return ex::launch_kernel(spin_stamp, {blocks}, {threads}, stream, spin_ns, out, slot);
  };
  for (int i = 0; i < 3; ++i) CU_CHECK(launch_one(kStampCap));
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
  // Room for every round trip (none is faster than 5 us): a reallocation in the timed loop
  // would be one of the trips.
  batch_us.reserve(static_cast<std::size_t>(
      std::min<long long>((max_kernels != 0 ? max_kernels : duration_ms * 200) + 1, 1LL << 24)));
  long long kernels = 0;
  const double duration_s = 1e-3 * static_cast<double>(duration_ms);
  const std::int64_t start_ns = ex::wall_clock_ns();
  const auto start = ex::Clock::now();
  if (stamps) {
    host_launch.reserve(kStampCap);
    host_done.reserve(kStampCap);
  }
  while ((max_kernels == 0 || kernels < max_kernels) && ex::seconds_since(start) < duration_s) {
    const bool stamped = stamps && kernels < kStampCap;
    if (stamped) host_launch.push_back(ex::wall_clock_ns());
    const auto t0 = ex::Clock::now();
    for (long long i = 0; i < batch; ++i) CU_CHECK(launch_one(kernels + i));
    CU_CHECK(cuStreamSynchronize(stream));
    batch_us.push_back(1e6 * ex::seconds_since(t0));
    if (stamped) host_done.push_back(ex::wall_clock_ns());
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
  report.add("stream_priority", priority_given);
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
  if (stamps) report_stamps(report, stamps_dev, host_launch, host_done, stamps_csv);

  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuModuleUnload(module));
  ex::close_device(device);
  return report.finish();
}
