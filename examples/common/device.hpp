// Device, context and device-image helpers. The programs use the device's primary context, as
// the CUDA runtime does, so natively and under the shim they exercise the same driver calls.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <type_traits>

namespace mpsshim::examples {

// The fatbin built from examples/kernels/ (SASS for sm_<device_arch> plus its PTX), embedded by
// examples/embed_image.py. It starts with the fatbin container magic 0xBA55ED50.
extern const unsigned char kDeviceImage[];
extern const std::size_t kDeviceImageSize;

struct Device {
  int ordinal = 0;
  CUdevice device = 0;
  CUcontext context = nullptr;
};

// cuInit, then retains device `ordinal`'s primary context and makes it current.
Device open_device(int ordinal);
// Releases the primary context retained by open_device.
void close_device(const Device& device);

int device_attribute(const Device& device, CUdevice_attribute attribute);

// cuModuleLoadData on kDeviceImage, in the current context.
CUmodule load_image_module();
CUfunction get_function(CUmodule module, const char* name);

struct Dim3 {
  unsigned x = 1;
  unsigned y = 1;
  unsigned z = 1;
};

// cuLaunchKernel with `args` as the kernel's parameters, in order. Each argument's type must have
// the size of the kernel's parameter: CUdeviceptr for pointers, int, unsigned, float, long long.
template <class... Args>
CUresult launch_kernel(CUfunction function, Dim3 grid, Dim3 block, CUstream stream, Args... args) {
  static_assert((std::is_trivially_copyable_v<Args> && ...));
  void* params[] = {static_cast<void*>(&args)..., nullptr};
  return cuLaunchKernel(function, grid.x, grid.y, grid.z, block.x, block.y, block.z, 0, stream,
                        params, nullptr);
}

// Blocks of `threads` giving one thread per element, as `if (i < n)` kernels (and the CPU test
// driver's models of them) need. n is an int, so this stays below gridDim.x's 2^31 - 1 limit.
inline unsigned blocks_for(int n, unsigned threads) {
  return n < 1 ? 1u : (static_cast<unsigned>(n) + threads - 1) / threads;
}

}  // namespace mpsshim::examples
