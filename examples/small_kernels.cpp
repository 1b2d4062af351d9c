// The MPS anchor workload: many tiny kernels (2 blocks of 32 threads spinning ~10 us each) with a
// stream synchronization every 64, the pattern of inference servers that MPS speeds up by letting
// several processes' kernels share the GPU. Prints the seconds the launch loop took.
//
// --gaps launches spin_stamp_kernel instead, which records when each kernel ran on the GPU, and
// reports where the stream sat idle between kernels: inside a synchronization's run of launches
// (how fast the launches were fed) and across a synchronization (the round trip). It tells a
// slow run's lost time apart without a profiler.
//
// For runs of several copies, --start-at-ns makes every copy begin its loop at the same
// CLOCK_REALTIME instant after its (slow, variable) initialisation; the start_ns/end_ns fields
// let the harness measure the span all copies took together.
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/host_data.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;

namespace {

struct GapSummary {
  double run_us = 0;        // mean time a kernel ran (block 0)
  double gap_us = 0;        // mean idle time before a kernel inside a synchronization's run
  double gap_p50_us = 0;    // ... its median
  double gap_p99_us = 0;    // ... its 99th percentile
  double sync_gap_us = 0;   // mean idle time before the first kernel after a synchronization
  std::string by_position;  // mean gap before kernels 1-7, 8-15, ... of each run, '/'-joined
  std::string head;         // mean gap before each of kernels 1-16 of each run, '/'-joined
};

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  const auto at = static_cast<std::size_t>(p * static_cast<double>(values.size() - 1));
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(at), values.end());
  return values[at];
}

// Mean gaps of groups of positions: one sum and count per group, written as "1.25/0.93/...";
// groups without a gap are left out.
struct GapMeans {
  explicit GapMeans(std::size_t groups) : sum(groups, 0), n(groups, 0) {}
  void add(std::size_t group, double gap) {
    sum[group] += gap;
    ++n[group];
  }
  std::string text() const {
    std::string out;
    for (std::size_t g = 0; g < sum.size(); ++g) {
      if (n[g] == 0) continue;
      char value[32];
      std::snprintf(value, sizeof value, "%s%.2f", out.empty() ? "" : "/",
                    sum[g] / static_cast<double>(n[g]));
      out += value;
    }
    return out;
  }
  std::vector<double> sum;
  std::vector<std::size_t> n;
};

// stamps: start and end (ns) of each kernel in launch order.
GapSummary summarize_gaps(const std::vector<std::uint64_t>& stamps, long long sync_every) {
  GapSummary out;
  const std::size_t kernels = stamps.size() / 2;
  std::vector<double> inside;
  double run_sum = 0, sync_sum = 0;
  std::size_t syncs = 0;
  constexpr std::size_t kBuckets = 8;
  const std::size_t width =
      std::max<std::size_t>(1, static_cast<std::size_t>(sync_every) / kBuckets);
  GapMeans buckets(kBuckets);
  constexpr std::size_t kHead = 16;
  GapMeans head(kHead);
  for (std::size_t i = 0; i < kernels; ++i) {
    run_sum += 1e-3 * static_cast<double>(stamps[2 * i + 1] - stamps[2 * i]);
    if (i == 0) continue;
    // Signed: a kernel of the same stream never starts before the previous one ends, but the
    // two stamps come from different reads of the clock.
    const double gap =
        1e-3 * (static_cast<double>(stamps[2 * i]) - static_cast<double>(stamps[2 * i - 1]));
    const std::size_t position = i % static_cast<std::size_t>(sync_every);
    if (position == 0) {
      sync_sum += gap;
      ++syncs;
      continue;
    }
    inside.push_back(gap);
    if (position <= kHead) head.add(position - 1, gap);
    buckets.add(std::min(kBuckets - 1, position / width), gap);
  }
  out.run_us = kernels == 0 ? 0 : run_sum / static_cast<double>(kernels);
  double inside_sum = 0;
  for (double g : inside) inside_sum += g;
  out.gap_us = inside.empty() ? 0 : inside_sum / static_cast<double>(inside.size());
  out.gap_p50_us = percentile(inside, 0.5);
  out.gap_p99_us = percentile(inside, 0.99);
  out.sync_gap_us = syncs == 0 ? 0 : sync_sum / static_cast<double>(syncs);
  out.by_position = buckets.text();
  out.head = head.text();
  return out;
}

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
              "[--device ORDINAL] [--gaps]");
  const auto kernels = cli.integer("--kernels", 5000, 1, 100000000);
  const long long spin_ns = cli.integer("--ns", 10000, 0, 10000000000LL);
  const auto blocks = static_cast<unsigned>(cli.integer("--blocks", 2, 1, 1 << 20));
  const auto threads = static_cast<unsigned>(cli.integer("--threads", 32, 1, 1024));
  const auto sync_every = cli.integer("--sync-every", 64, 1, 100000000);
  const bool null_stream = cli.flag("--null-stream");
  const auto start_at_ns = cli.integer("--start-at-ns", 0, 0, INT64_MAX);
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  const bool gaps = cli.flag("--gaps");
  cli.finish();

  const ex::Device device = ex::open_device(ordinal);
  CUmodule module = ex::load_image_module();
  CUfunction spin = ex::get_function(module, gaps ? "spin_stamp_kernel" : "spin_kernel");
  CUstream stream = nullptr;
  if (!null_stream) CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUdeviceptr stamps = 0;
  if (gaps)
    CU_CHECK(cuMemAlloc(&stamps, 2 * sizeof(std::uint64_t) * static_cast<std::size_t>(kernels)));
  auto launch = [&](long long index) {
    if (!gaps) return ex::launch_kernel(spin, {blocks}, {threads}, stream, spin_ns);
    return ex::launch_kernel(spin, {blocks}, {threads}, stream, spin_ns, stamps,
                             static_cast<int>(index));
  };

  // Warm up outside the timed loop: first launches pay for lazy module and stream setup.
  CU_CHECK(launch(0));
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
    CU_CHECK(launch(i));
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
  if (gaps) {
    std::vector<std::uint64_t> host(2 * static_cast<std::size_t>(kernels));
    CU_CHECK(cuMemcpyDtoH(host.data(), stamps, host.size() * sizeof(std::uint64_t)));
    CU_CHECK(cuMemFree(stamps));
    const GapSummary g = summarize_gaps(host, sync_every);
    report.add_fixed("run_us", g.run_us, 2);
    report.add_fixed("gap_us", g.gap_us, 2);
    report.add_fixed("gap_p50_us", g.gap_p50_us, 2);
    report.add_fixed("gap_p99_us", g.gap_p99_us, 2);
    report.add_fixed("sync_gap_us", g.sync_gap_us, 2);
    report.add("gap_by_position_us", g.by_position);
    report.add("gap_head_us", g.head);
    // Every kernel ran at least its spin (a stamp left unwritten reads as a huge or negative time).
    report.expect(g.run_us >= 1e-3 * static_cast<double>(spin_ns) && g.gap_us >= 0,
                  "stamps_inconsistent");
  }

  if (stream != nullptr) CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuModuleUnload(module));
  ex::close_device(device);
  return report.finish();
}
