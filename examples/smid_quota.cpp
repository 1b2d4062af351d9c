// Which SMs does this process's work run on? Launches record_smid over many blocks (each stays
// resident ~20 us, so the grid spreads over every SM it may use) and counts the distinct %smid
// values. The device attribute MULTIPROCESSOR_COUNT is this client's SM quota under MPS and
// under the shim (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE); the work must stay within it.
//
// --rounds R (default 1): before each round after the first it prints "WAITING round=K pid=P"
// and waits for a line on stdin, so an operator can change the running client's quota
// (mpsshimctl set_active_thread_percentage) in between; round K's distinct SMs are reported as
// distinct_sms_rK (tests/gpu/live_quota_check.sh). sm_ids lists the first round's SMs.
#include <cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/host_data.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;

namespace {
constexpr unsigned kUnwritten = 0xFFFFFFFFu;
// Enough blocks to cover a full H100/H200 several times over even when the quota is small, so a
// quota that does not confine shows up as more SMs than reported.
constexpr long long kMinimumBlocks = 1024;
}  // namespace

int main(int argc, char** argv) {
  ex::Report report("smid_quota");
  ex::Cli cli(argc, argv,
              "[--blocks B (max(8 x reported SMs, 1024))] [--threads T (64)] [--device ORDINAL] "
              "[--rounds R (1)]");
  const auto requested_blocks = cli.integer("--blocks", 0, 0, 1 << 20);
  const auto threads = static_cast<unsigned>(cli.integer("--threads", 64, 1, 1024));
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  const auto rounds = cli.integer("--rounds", 1, 1, 16);
  cli.finish();

  const ex::Device device = ex::open_device(ordinal);
  const int reported_sms = ex::device_attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  const auto blocks = static_cast<unsigned>(
      requested_blocks > 0 ? requested_blocks : std::max(8LL * reported_sms, kMinimumBlocks));

  CUmodule module = ex::load_image_module();
  CUfunction record_smid = ex::get_function(module, "record_smid");
  CUdeviceptr out = 0;
  CU_CHECK(cuMemAlloc(&out, sizeof(unsigned) * blocks));
  std::set<unsigned> distinct;
  long long unwritten = 0;
  for (long long round = 1; round <= rounds; ++round) {
    if (round > 1) {
      std::printf("WAITING round=%lld pid=%d\n", round, static_cast<int>(::getpid()));
      std::fflush(stdout);
      std::string line;
      std::getline(std::cin, line);
    }
    CU_CHECK(cuMemsetD32(out, kUnwritten, blocks));
    CU_CHECK(ex::launch_kernel(record_smid, {blocks}, {threads}, nullptr, out));
    std::vector<unsigned> sm_of_block(blocks);
    CU_CHECK(cuMemcpyDtoH(sm_of_block.data(), out, sizeof(unsigned) * blocks));
    std::set<unsigned> seen;
    for (unsigned sm : sm_of_block) {
      if (sm == kUnwritten) {
        ++unwritten;
      } else {
        seen.insert(sm);
      }
    }
    if (round == 1) {
      distinct = seen;
    } else {
      report.add("distinct_sms_r" + std::to_string(round), seen.size());
    }
  }
  const char* quota_env = std::getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");

  report.add("blocks", blocks);
  report.add("unwritten_blocks", unwritten);
  report.add("distinct_sms", distinct.size());
  report.add("reported_sms", reported_sms);
  report.add("max_smid", distinct.empty() ? -1 : static_cast<long long>(*distinct.rbegin()));
  report.add("quota_percent", quota_env != nullptr && *quota_env != '\0' ? quota_env : "none");
  // The SM ids themselves, for checks that two clients never share one
  // (tests/gpu/partition_check.sh: static SM partitions).
  std::string ids;
  for (unsigned sm : distinct) ids += (ids.empty() ? "" : ",") + std::to_string(sm);
  if (ids.empty()) ids = "none";
  report.add("sm_ids", std::string_view(ids));
  report.expect(unwritten == 0, "unwritten_blocks");
  report.expect(reported_sms > 0, "reported_sms");
  report.expect(distinct.size() <= static_cast<std::size_t>(reported_sms), "distinct_sms");

  CU_CHECK(cuMemFree(out));
  CU_CHECK(cuModuleUnload(module));
  ex::close_device(device);
  return report.finish();
}
