// The kernels the test driver can run, looked up by name whatever image was loaded. Each models an
// `extern "C" __global__` function of the same name and signature that the examples and benchmarks
// compile for the GPU; kernels.cpp holds the table and the device source each body models.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

namespace mpsshim::testdriver {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  std::uint64_t volume() const { return std::uint64_t{x} * y * z; }
};

// Thrown by a kernel body for what would be a device-side fault; the launch path turns it into the
// process-wide sticky error of the real driver. Never crosses the C ABI.
struct DeviceFault {
  CUresult error;
};

// Host view of device memory: `bytes` at device address `addr`, or nullptr when that range is not
// inside one live allocation or registered host range.
using DeviceResolver = std::byte* (*)(std::uintptr_t addr, std::size_t bytes);

// What a kernel body sees of its launch.
class KernelContext {
 public:
  KernelContext(Dim3 grid, Dim3 block, std::span<const std::uint16_t> sms, DeviceResolver resolve)
      : grid(grid), block(block), sms(sms), resolve_(resolve) {}

  Dim3 grid;
  Dim3 block;
  std::span<const std::uint16_t> sms;  // SMs of the stream's (green) context, increasing ids

  // The elements a grid-stride loop over [0, n) visits: all of them, whatever the grid.
  static std::size_t elements(int n) { return n > 0 ? static_cast<std::size_t>(n) : 0; }

  // The host view of `count` elements at device pointer p; faults as the GPU would when the range
  // is not device-accessible memory or p is misaligned for T.
  template <class T>
  T* device(T* p, std::size_t count) const {
    if (count == 0) return p;
    const auto addr = reinterpret_cast<std::uintptr_t>(p);
    if (addr % alignof(T) != 0) throw DeviceFault{CUDA_ERROR_MISALIGNED_ADDRESS};
    if (count > std::numeric_limits<std::size_t>::max() / sizeof(T))
      throw DeviceFault{CUDA_ERROR_ILLEGAL_ADDRESS};
    std::byte* host = resolve_(addr, count * sizeof(T));
    if (host == nullptr) throw DeviceFault{CUDA_ERROR_ILLEGAL_ADDRESS};
    return reinterpret_cast<T*>(host);
  }

 private:
  DeviceResolver resolve_;
};

struct ParamInfo {
  std::size_t offset;
  std::size_t size;
};

struct KernelDef {
  std::string_view name;
  std::span<const ParamInfo> params;
  std::size_t args_size;  // bytes of the packed argument buffer (end of the last parameter)
  void (*run)(const KernelContext&, const std::byte* args);
};

std::span<const KernelDef> kernel_table();

// cudaGraphSetConditional (graph_control_nodes.cpp): false for a handle that is not live.
bool set_graph_conditional(std::uint64_t handle, unsigned value);
const KernelDef* find_kernel(std::string_view name);

}  // namespace mpsshim::testdriver
