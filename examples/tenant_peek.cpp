// Can one client's kernel read another client's memory? The GPU half of the isolation-group
// check (tests/gpu/isolation_check.sh, docs/isolation.md).
//
//   tenant_peek --hold     the tenant: fills a buffer with a secret word, prints
//                          "# address 0x..." and, after a line on stdin, checks that its buffer
//                          still holds the secret and that its context still runs a kernel.
//   tenant_peek --read A   the intruder: a kernel copies 1024 words at device address A (the
//                          tenant's) into a buffer of its own.
//
// The intruder's result fields say what happened: `launch` and `sync` (CUresult numbers), and
// `saw_secret` (1 when the words it copied are the tenant's). It passes whatever it saw: the check
// decides what each placement must show (same context: the secret; separate contexts: no secret,
// and the tenant unharmed). The tenant passes only when its memory and its context are intact.
#include <cuda.h>

#include <cinttypes>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;

namespace {

constexpr unsigned kSecret = 0x40490fdbu;  // the bits of pi as a float
constexpr int kWords = 1024;
constexpr std::size_t kBytes = sizeof(unsigned) * kWords;

int hold(ex::Report& report, CUmodule module) {
  // A spacer first, so that a fresh context's first allocation (the intruder's, in another
  // group) does not land at the secret's address by chance and read its own zeros as "not seen".
  CUdeviceptr spacer{}, secret{};
  CU_CHECK(cuMemAlloc(&spacer, std::size_t{64} << 20));
  CU_CHECK(cuMemAlloc(&secret, kBytes));
  CU_CHECK(ex::launch_kernel(ex::get_function(module, "fill_u32"), {4}, {256}, nullptr, secret,
                             kSecret, kWords));
  CU_CHECK(cuCtxSynchronize());
  std::printf("# address 0x%llx\n", static_cast<unsigned long long>(secret));
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);

  std::vector<unsigned> back(kWords);
  CU_CHECK(cuMemcpyDtoH(back.data(), secret, kBytes));
  int changed = 0;
  for (unsigned word : back) changed += word != kSecret;
  report.add("changed_words", changed);
  report.expect(changed == 0, "memory_intact");
  // Its context still runs work: a fill of the spacer, read back.
  const CUresult fill = ex::launch_kernel(ex::get_function(module, "fill_u32"), {4}, {256}, nullptr,
                                          spacer, 7u, kWords);
  const CUresult sync = cuCtxSynchronize();
  unsigned first = 0;
  if (fill == CUDA_SUCCESS && sync == CUDA_SUCCESS) {
    CU_CHECK(cuMemcpyDtoH(&first, spacer, sizeof first));
  }
  report.add("after_launch", static_cast<int>(fill));
  report.add("after_sync", static_cast<int>(sync));
  report.expect(first == 7u, "context_alive");
  CU_CHECK(cuMemFree(secret));
  CU_CHECK(cuMemFree(spacer));
  return report.finish();
}

int read_other(ex::Report& report, CUmodule module, CUdeviceptr theirs) {
  CUdeviceptr mine{};
  CU_CHECK(cuMemAlloc(&mine, kBytes));
  CU_CHECK(cuMemsetD32(mine, 0, kWords));
  CU_CHECK(cuCtxSynchronize());
  // y = 1 * x + y with y zero copies x's words (the secret is a finite float).
  const CUresult launch = ex::launch_kernel(ex::get_function(module, "scale_add"), {4}, {256},
                                            nullptr, mine, theirs, 1.0f, kWords);
  const CUresult sync = cuCtxSynchronize();
  int seen = 0;
  if (launch == CUDA_SUCCESS && sync == CUDA_SUCCESS) {
    std::vector<unsigned> words(kWords);
    CU_CHECK(cuMemcpyDtoH(words.data(), mine, kBytes));
    for (unsigned word : words) seen += word == kSecret;
  }
  report.add("launch", static_cast<int>(launch));
  report.add("sync", static_cast<int>(sync));
  report.add("saw_secret", seen == kWords ? 1 : 0);
  std::fprintf(stderr, "tenant_peek: %d of %d words read were the secret\n", seen, kWords);
  return report.finish();
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report("tenant_peek");
  ex::Cli cli(argc, argv, "--hold | --read DEVICE_ADDRESS");
  const bool holding = cli.flag("--hold");
  const auto address = static_cast<CUdeviceptr>(cli.integer("--read", 0, 0, INT64_MAX));
  cli.finish();
  if (holding == (address != 0)) {
    std::fprintf(stderr, "tenant_peek: give --hold or --read ADDRESS\n");
    return 2;
  }
  ex::open_device(0);
  CUmodule module = ex::load_image_module();
  return holding ? hold(report, module) : read_other(report, module, address);
}
