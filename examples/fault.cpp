// Crash containment probe: a kernel stores through an unmapped address. The context must then
// report a sticky error (CUDA_ERROR_ILLEGAL_ADDRESS on current GPUs) at the synchronization, and
// keep reporting it. PASS means the error arrived as CUDA reports it; under the shim the server
// that ran the kernel is poisoned and is replaced, which the GPU suite checks with a new client.
#include <cuda.h>

#include <cstdint>

#include "examples/common/check.hpp"
#include "examples/common/cli.hpp"
#include "examples/common/device.hpp"
#include "examples/common/report.hpp"

namespace ex = mpsshim::examples;

namespace {

// Errors after which a CUDA context is unusable ("sticky"): what a faulting kernel may produce.
bool is_sticky_kernel_error(CUresult result) {
  switch (result) {
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED:
      return true;
    default:
      return false;
  }
}

}  // namespace

int main(int argc, char** argv) {
  ex::Report report("fault");
  ex::Cli cli(argc, argv, "[--address DEVICE_ADDRESS (0x0)] [--spin-ns N (0)] [--device ORDINAL]");
  const auto address = static_cast<CUdeviceptr>(cli.integer("--address", 0, 0, INT64_MAX));
  // A kernel of this many nanoseconds runs first on the stream: the synchronize then waits that
  // long before the fault, as a long job's would (under the shim, past several fault checks).
  const long long spin_ns = cli.integer("--spin-ns", 0, 0, 10'000'000'000LL);
  const auto ordinal = static_cast<int>(cli.integer("--device", 0, 0, 1023));
  cli.finish();

  // Setup must succeed (CU_CHECK); from the launch on, errors are the result.
  ex::open_device(ordinal);
  CUmodule module = ex::load_image_module();
  CUfunction trigger_fault = ex::get_function(module, "trigger_fault");
  CUstream stream = nullptr;
  CU_CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  if (spin_ns != 0) {
    CU_CHECK(
        ex::launch_kernel(ex::get_function(module, "spin_kernel"), {1}, {32}, stream, spin_ns));
  }
  const CUresult launch = ex::launch_kernel(trigger_fault, {1}, {32}, stream, address);
  const CUresult sync = cuStreamSynchronize(stream);
  // A sticky error stays: later work in the context fails with it too.
  CUdeviceptr probe = 0;
  const CUresult after = cuMemAlloc(&probe, 4096);
  const CUresult ctx_sync = cuCtxSynchronize();

  // Natively the launch returns success and the sync the error; a driver may also report it at
  // the launch already.
  const CUresult fault = launch != CUDA_SUCCESS ? launch : sync;
  report.add("launch", ex::error_name(launch));
  report.add("sync", ex::error_name(sync));
  report.add("after_alloc", ex::error_name(after));
  report.add("after_ctx_sync", ex::error_name(ctx_sync));
  report.expect(is_sticky_kernel_error(fault), "no_sticky_error");
  // Deliberately no cleanup: the context is poisoned; process exit releases everything.
  return report.finish();
}
