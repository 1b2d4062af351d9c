// Host<->device copy bandwidth through the Driver API: H2D and D2H, from pageable (malloc'd) and
// pinned (cuMemAllocHost) memory, with synchronous copies (cuMemcpyHtoD/DtoH) and with
// asynchronous copies on a stream followed by one cuStreamSynchronize. Each (size, direction,
// memory, mode) point is the median over repeats of bytes moved / wall time, in GB/s (1e9 B/s).
// The pinned round trip of the largest size is verified byte for byte first.
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <string>
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

constexpr const char* kName = "bandwidth";
constexpr long long kKiB = 1024;
constexpr long long kMiB = 1024 * kKiB;

struct Buffers {
  unsigned char* pageable = nullptr;
  unsigned char* pinned = nullptr;
  CUdeviceptr device = 0;
};

enum class Direction { kHtoD, kDtoH };

// Seconds for `iterations` copies of `bytes`.
double time_copies(const Buffers& b, Direction direction, bool pinned, bool async,
                   std::size_t bytes, long long iterations, CUstream stream) {
  unsigned char* host = pinned ? b.pinned : b.pageable;
  const auto start = ex::Clock::now();
  for (long long i = 0; i < iterations; ++i) {
    if (direction == Direction::kHtoD) {
      CU_CHECK(async ? cuMemcpyHtoDAsync(b.device, host, bytes, stream)
                     : cuMemcpyHtoD(b.device, host, bytes));
    } else {
      CU_CHECK(async ? cuMemcpyDtoHAsync(host, b.device, bytes, stream)
                     : cuMemcpyDtoH(host, b.device, bytes));
    }
  }
  if (async) CU_CHECK(cuStreamSynchronize(stream));
  return ex::seconds_since(start);
}

std::vector<long long> parse_sizes(const std::string& list) {
  std::vector<long long> sizes;
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const auto end = std::min(list.find(',', begin), list.size());
    long long size = 0;
    if (!ex::Cli::parse_integer(std::string_view(list).substr(begin, end - begin), size) ||
        size <= 0) {
      ex::fail_reason("bad_size_list", __FILE__, __LINE__);
    }
    sizes.push_back(size);
    begin = end + 1;
  }
  return sizes;
}

std::string size_label(long long bytes) {
  if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
  if (bytes >= kKiB && bytes % kKiB == 0) return std::to_string(bytes / kKiB) + " KiB";
  return std::to_string(bytes) + " B";
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report(kName);
  ex::Cli cli(argc, argv,
              "[--quick] [--sizes B,B,... (4K,16K,...,256M; quick 4K,64K,1M,16M,64M)] "
              "[--repeats R (5; quick 3)] [--bytes-per-repeat B (64M; quick 32M)] "
              "[--device ORDINAL]");
  const bool quick = cli.flag("--quick");
  const std::string default_sizes =
      quick ? "4K,64K,1M,16M,64M" : "4K,16K,64K,256K,1M,4M,16M,64M,256M";
  const auto sizes = parse_sizes(cli.text("--sizes", default_sizes));
  const auto repeats = cli.integer("--repeats", quick ? 3 : 5, 1, 1000);
  // Small copies repeat until about this many bytes moved, so each timing spans milliseconds.
  const auto bytes_per_repeat =
      cli.integer("--bytes-per-repeat", quick ? 32 * kMiB : 64 * kMiB, 1, 1LL << 36);
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  cli.finish();

  long long max_size = 0;
  for (long long size : sizes) max_size = std::max(max_size, size);
  const auto max_bytes = static_cast<std::size_t>(max_size);

  const ex::Device device = ex::open_device(ordinal);
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  Buffers buffers;
  // Page-aligned and touched: first-touch page faults must not count as copy time.
  std::unique_ptr<unsigned char, decltype(&std::free)> pageable(
      static_cast<unsigned char*>(std::aligned_alloc(4096, (max_bytes + 4095) / 4096 * 4096)),
      &std::free);
  if (!pageable) ex::fail_reason("host_allocation_failed", __FILE__, __LINE__);
  buffers.pageable = pageable.get();
  CU_CHECK(cuMemAllocHost(reinterpret_cast<void**>(&buffers.pinned), max_bytes));
  CU_CHECK(cuMemAlloc(&buffers.device, max_bytes));
  for (std::size_t i = 0; i < max_bytes; ++i) {
    buffers.pageable[i] = static_cast<unsigned char>(i * 7 + 1);
    buffers.pinned[i] = static_cast<unsigned char>(i * 13 + 5);
  }

  // Correctness first: pinned -> device -> pageable must give the pinned bytes back.
  CU_CHECK(cuMemcpyHtoD(buffers.device, buffers.pinned, max_bytes));
  CU_CHECK(cuMemcpyDtoH(buffers.pageable, buffers.device, max_bytes));
  const bool verified = std::memcmp(buffers.pageable, buffers.pinned, max_bytes) == 0;
  report.expect(verified, "round_trip_data");

  bench::csv_header();
  struct Series {
    const char* metric;
    Direction direction;
    bool pinned;
    bool async;
  };
  const Series series[] = {
      {"h2d_pinned_sync", Direction::kHtoD, true, false},
      {"h2d_pageable_sync", Direction::kHtoD, false, false},
      {"d2h_pinned_sync", Direction::kDtoH, true, false},
      {"d2h_pageable_sync", Direction::kDtoH, false, false},
      {"h2d_pinned_async", Direction::kHtoD, true, true},
      {"h2d_pageable_async", Direction::kHtoD, false, true},
      {"d2h_pinned_async", Direction::kDtoH, true, true},
      {"d2h_pageable_async", Direction::kDtoH, false, true},
  };
  constexpr std::size_t kSeries = sizeof(series) / sizeof(series[0]);
  std::vector<std::vector<double>> table(sizes.size(), std::vector<double>(kSeries));

  for (std::size_t si = 0; si < sizes.size(); ++si) {
    const auto bytes = static_cast<std::size_t>(sizes[si]);
    const long long iterations =
        std::max(1LL, std::min(1000LL, bytes_per_repeat / static_cast<long long>(bytes)));
    for (std::size_t k = 0; k < kSeries; ++k) {
      const Series& s = series[k];
      time_copies(buffers, s.direction, s.pinned, s.async, bytes, 1, stream);  // warm-up
      std::vector<double> gbps;
      for (long long r = 0; r < repeats; ++r) {
        const double seconds =
            time_copies(buffers, s.direction, s.pinned, s.async, bytes, iterations, stream);
        gbps.push_back(1e-9 * static_cast<double>(bytes) * static_cast<double>(iterations) /
                       seconds);
      }
      table[si][k] = bench::median(gbps);
      bench::csv(kName, s.metric, bytes, table[si][k], "GB/s");
    }
  }

  std::printf("# bandwidth, GB/s (median of %lld repeats)\n", repeats);
  std::printf("# %10s", "size");
  for (const auto& s : series) std::printf(" %18s", s.metric);
  std::printf("\n");
  for (std::size_t si = 0; si < sizes.size(); ++si) {
    std::printf("# %10s", size_label(sizes[si]).c_str());
    for (double value : table[si]) std::printf(" %18.2f", value);
    std::printf("\n");
  }

  // The result line names the largest size's figures (64 MiB in --quick).
  const auto& largest =
      table[std::distance(sizes.begin(), std::max_element(sizes.begin(), sizes.end()))];
  report.add("sizes", sizes.size());
  report.add("repeats", repeats);
  report.add("largest_bytes", max_size);
  report.add("verified", verified ? 1 : 0);
  report.add_fixed("h2d_pinned_gbps", largest[0], 2);
  report.add_fixed("h2d_pageable_gbps", largest[1], 2);
  report.add_fixed("d2h_pinned_gbps", largest[2], 2);
  report.add_fixed("d2h_pageable_gbps", largest[3], 2);

  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuMemFree(buffers.device));
  CU_CHECK(cuMemFreeHost(buffers.pinned));
  ex::close_device(device);
  return report.finish();
}
