// Copies between two GPUs through the Driver API, the figure a multi-GPU program's tensor moves
// and NCCL's peer transport depend on:
//   peer_copy_gbps      cuMemcpyPeerAsync of --bytes from GPU 0 to GPU 1, peer access on, median
//                       over repeats of bytes / wall time of --copies copies and one synchronize
//   peer_copy_back_gbps the same from GPU 1 to GPU 0
//   unified_copy_gbps   cuMemcpyAsync between the two GPUs' pointers (unified addressing)
// The first copy each way is checked byte for byte (a pattern written by cuMemsetD32).
#include <cuda.h>

#include <cstdio>
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

constexpr const char* kName = "peer_copy";

struct Side {
  ex::Device device;
  CUdeviceptr buffer = 0;
  CUstream stream = nullptr;
};

// Median GB/s (1e9 B/s) of `repeats` timed batches of `copies` copies each.
template <class Copy>
double time_batches(long long repeats, long long copies, std::size_t bytes, CUstream stream,
                    Copy copy) {
  std::vector<double> gbps;
  for (long long r = 0; r < repeats; ++r) {
    const auto start = ex::Clock::now();
    for (long long i = 0; i < copies; ++i) copy();
    CU_CHECK(cuStreamSynchronize(stream));
    gbps.push_back(static_cast<double>(bytes) * static_cast<double>(copies) /
                   ex::seconds_since(start) / 1e9);
  }
  return bench::median(gbps);
}

// Whether `buffer` (on the current context's GPU) holds `pattern` in every 32-bit word.
bool holds_pattern(CUdeviceptr buffer, std::size_t bytes, unsigned pattern) {
  std::vector<unsigned> host(bytes / sizeof(unsigned));
  CU_CHECK(cuMemcpyDtoH(host.data(), buffer, bytes));
  for (unsigned word : host) {
    if (word != pattern) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report(kName);
  ex::Cli cli(argc, argv,
              "[--quick] [--bytes B (256M)] [--copies N (10; quick 4)] [--repeats R (5; quick 3)]");
  const bool quick = cli.flag("--quick");
  const auto bytes = static_cast<std::size_t>(cli.integer("--bytes", 256 << 20, 4, 1LL << 34));
  const auto copies = cli.integer("--copies", quick ? 4 : 10, 1, 100000);
  const auto repeats = cli.integer("--repeats", quick ? 3 : 5, 1, 1000);
  cli.finish();

  CU_CHECK(cuInit(0));
  int count = 0;
  CU_CHECK(cuDeviceGetCount(&count));
  if (count < 2) ex::fail_reason("needs_two_gpus", __FILE__, __LINE__);
  Side side[2];
  for (int d = 0; d < 2; ++d) {
    side[d].device = ex::open_device(d);
    CU_CHECK(cuMemAlloc(&side[d].buffer, bytes));
    CU_CHECK(cuStreamCreate(&side[d].stream, CU_STREAM_NON_BLOCKING));
  }
  int can = 0;
  CU_CHECK(cuDeviceCanAccessPeer(&can, side[0].device.device, side[1].device.device));
  report.add_fixed("peer_access", can, 0);
  for (int d = 0; d < 2 && can; ++d) {
    CU_CHECK(cuCtxSetCurrent(side[d].device.context));
    CU_CHECK(cuCtxEnablePeerAccess(side[1 - d].device.context, 0));
  }

  // Checked first: GPU 0 -> GPU 1, then GPU 1 -> GPU 0, each with its own pattern.
  const unsigned patterns[2] = {0x5a5a0001u, 0xa5a50002u};
  for (int from = 0; from < 2; ++from) {
    const int to = 1 - from;
    CU_CHECK(cuCtxSetCurrent(side[from].device.context));
    CU_CHECK(cuMemsetD32(side[from].buffer, patterns[from], bytes / sizeof(unsigned)));
    CU_CHECK(cuMemcpyPeerAsync(side[to].buffer, side[to].device.context, side[from].buffer,
                               side[from].device.context, bytes, side[from].stream));
    CU_CHECK(cuStreamSynchronize(side[from].stream));
    CU_CHECK(cuCtxSetCurrent(side[to].device.context));
    report.expect(holds_pattern(side[to].buffer, bytes, patterns[from]),
                  from == 0 ? "copy_0_to_1" : "copy_1_to_0");
  }

  bench::csv_header();
  double gbps[3] = {};
  for (int from = 0; from < 2; ++from) {
    const int to = 1 - from;
    CU_CHECK(cuCtxSetCurrent(side[from].device.context));
    gbps[from] = time_batches(repeats, copies, bytes, side[from].stream, [&] {
      CU_CHECK(cuMemcpyPeerAsync(side[to].buffer, side[to].device.context, side[from].buffer,
                                 side[from].device.context, bytes, side[from].stream));
    });
  }
  CU_CHECK(cuCtxSetCurrent(side[0].device.context));
  gbps[2] = time_batches(repeats, copies, bytes, side[0].stream, [&] {
    CU_CHECK(cuMemcpyAsync(side[1].buffer, side[0].buffer, bytes, side[0].stream));
  });
  bench::csv(kName, "peer_copy_gbps", bytes, gbps[0], "GB/s");
  bench::csv(kName, "peer_copy_back_gbps", bytes, gbps[1], "GB/s");
  bench::csv(kName, "unified_copy_gbps", bytes, gbps[2], "GB/s");
  std::printf("# peer_copy %zu B: GPU 0 -> 1 %.1f GB/s, 1 -> 0 %.1f GB/s, unified %.1f GB/s\n",
              bytes, gbps[0], gbps[1], gbps[2]);
  report.add_fixed("gbps", gbps[0], 1);

  for (int d = 0; d < 2; ++d) {
    CU_CHECK(cuCtxSetCurrent(side[d].device.context));
    CU_CHECK(cuStreamDestroy(side[d].stream));
    CU_CHECK(cuMemFree(side[d].buffer));
    ex::close_device(side[d].device);
  }
  return report.finish();
}
