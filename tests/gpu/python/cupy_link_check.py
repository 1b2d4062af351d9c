"""Run-time linking through CuPy under the shim: two NVRTC-compiled relocatable PTX inputs (one
calls a device function the other defines) linked with the driver's JIT linker
(cupy.cuda.function.LinkState: cuLinkCreate, cuLinkAddData, cuLinkComplete), loaded and run; and a
cooperative RawKernel using grid.sync(), which CuPy links against libcudadevrt.a with the same
linker. Results checked against numpy. Exit 77 when cupy is not installed or sees no GPU.
"""
import hashlib
import sys

try:
    import cupy
    import numpy as np
    from cupy.cuda import function, nvrtc
except ImportError as error:
    print(f"cupy_link_check: {error}: skipped")
    sys.exit(77)

CALLEE = r'''
extern "C" __device__ float scale_add(float x, float y) { return 2.5f * x + y; }
'''
CALLER = r'''
extern "C" __device__ float scale_add(float x, float y);
extern "C" __global__ void apply(const float* x, float* y, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = scale_add(x[i], y[i]);
}
'''
COOPERATIVE = r'''
#include <cooperative_groups.h>
extern "C" __global__ void two_phase(float* data, float* sums, int n) {
  namespace cg = cooperative_groups;
  cg::grid_group grid = cg::this_grid();
  for (int i = grid.thread_rank(); i < n; i += grid.size()) data[i] = data[i] * 2.0f;
  grid.sync();
  if (grid.thread_rank() == 0) {
    float s = 0.0f;
    for (int i = 0; i < n; ++i) s += data[i];
    sums[0] = s;
  }
}
'''


def ptx_of(source: str, name: str, arch: str) -> bytes:
    program = nvrtc.createProgram(source, name, [], [])
    nvrtc.compileProgram(program, ["-rdc=true", f"--gpu-architecture={arch}"])
    ptx = nvrtc.getPTX(program)
    return ptx if isinstance(ptx, bytes) else ptx.encode()


def main() -> int:
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            raise RuntimeError("no device")
    except Exception as error:  # cupy raises its own CUDARuntimeError without a driver
        print(f"cupy_link_check: no CUDA device ({error}): skipped")
        return 77
    major, minor = cupy.cuda.Device().compute_capability
    arch = f"compute_{major}{minor}"
    link = function.LinkState()
    link.add_ptr_data(ptx_of(CALLER, "caller.cu", arch), "caller.ptx")
    link.add_ptr_data(ptx_of(CALLEE, "callee.cu", arch), "callee.ptx")
    module = function.Module()
    module.load(link.complete())
    apply = module.get_function("apply")
    n = 1 << 16
    rng = np.random.RandomState(11)
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    dx, dy = cupy.asarray(x), cupy.asarray(y)
    apply((64,), (256,), (dx, dy, np.int32(n)))
    linked = cupy.asnumpy(dy)
    # NVRTC contracts 2.5f * x + y into one fma: the exact value rounded once to float32.
    want = (2.5 * x.astype(np.float64) + y.astype(np.float64)).astype(np.float32)
    linked_ok = bool(np.array_equal(linked, want))

    kernel = cupy.RawKernel(COOPERATIVE, "two_phase", enable_cooperative_groups=True)
    data = cupy.arange(4096, dtype=cupy.float32)
    sums = cupy.zeros(1, dtype=cupy.float32)
    kernel((8,), (128,), (data, sums, np.int32(4096)))
    coop_ok = bool(float(sums.get()[0]) == float(np.sum(np.arange(4096, dtype=np.float32) * 2)))

    digest = hashlib.sha256(linked.tobytes() + cupy.asnumpy(data).tobytes()).hexdigest()[:16]
    ok = linked_ok and coop_ok
    print(f"cupy_link_check: linked={int(linked_ok)} cooperative={int(coop_ok)} "
          f"digest={digest} {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
