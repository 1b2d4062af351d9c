// An idle client (bench/harness.py's memory-per-client and client-scaling workloads): opens the
// device (primary context), loads the examples' module, allocates --alloc-bytes of device memory
// and writes it (cuMemsetD8, so the pages are really backed), then prints
//   "# ready free_bytes=F total_bytes=T"
// on stdout and holds all of it until stdin reaches end of file (or --hold-s passes), then frees
// everything and prints its result line. A client the GPU (or MPS, or mpsshim) refuses fails at
// the call that refused it, with the usual FAIL line and the error on stderr.
#include <cuda.h>
#include <poll.h>
#include <unistd.h>

#include <cstdio>

#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/host_data.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;

int main(int argc, char** argv) {
  ex::Report report("idle_client");
  ex::Cli cli(argc, argv,
              "[--alloc-bytes B (256M; 0 = none)] [--hold-s S (600)] [--device ORDINAL]");
  const auto alloc_bytes = cli.integer("--alloc-bytes", 256LL << 20, 0, 1LL << 40);
  const auto hold_s = cli.integer("--hold-s", 600, 0, 86400);
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  cli.finish();

  const auto start = ex::Clock::now();
  const ex::Device device = ex::open_device(ordinal);
  CUmodule module = ex::load_image_module();
  CUdeviceptr memory = 0;
  if (alloc_bytes > 0) {
    CU_CHECK(cuMemAlloc(&memory, static_cast<std::size_t>(alloc_bytes)));
    CU_CHECK(cuMemsetD8(memory, 0x5a, static_cast<std::size_t>(alloc_bytes)));
  }
  CU_CHECK(cuCtxSynchronize());
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CU_CHECK(cuMemGetInfo(&free_bytes, &total_bytes));
  const double init_s = ex::seconds_since(start);
  std::printf("# ready free_bytes=%zu total_bytes=%zu init_s=%.3f\n", free_bytes, total_bytes,
              init_s);
  std::fflush(stdout);

  // Hold until stdin closes (the harness closes our pipe) or the hold time passes.
  const auto held = ex::Clock::now();
  char buffer[256];
  while (ex::seconds_since(held) < static_cast<double>(hold_s)) {
    pollfd fd{STDIN_FILENO, POLLIN, 0};
    const int ready = poll(&fd, 1, 200);
    if (ready > 0) {
      const ssize_t got = read(STDIN_FILENO, buffer, sizeof buffer);
      if (got <= 0) break;  // end of file (or an error): release
    } else if (ready < 0) {
      break;
    }
  }

  if (memory != 0) CU_CHECK(cuMemFree(memory));
  CU_CHECK(cuModuleUnload(module));
  ex::close_device(device);
  report.add("alloc_bytes", alloc_bytes);
  report.add_fixed("init_s", init_s, 3);
  return report.finish();
}
