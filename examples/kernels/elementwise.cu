// Element-wise kernels. The programs launch at least one thread per element; the grid-stride
// loops make a smaller grid correct too.

extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    c[i] = a[i] + b[i];
  }
}

// y = alpha * x + y as one fused multiply-add, spelled out rather than left to nvcc's
// contraction, so that CPU references (std::fma) and the test driver get the same bits.
extern "C" __global__ void scale_add(float* y, const float* x, float alpha, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    y[i] = fmaf(alpha, x[i], y[i]);
  }
}

extern "C" __global__ void fill_u32(unsigned int* p, unsigned int value, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = value;
  }
}

extern "C" __global__ void increment_i32(int* p, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] += 1;
  }
}

// A graph loop's step (conditional nodes): one thread counts down and tells the graph whether to
// go on.
extern "C" __global__ void countdown(cudaGraphConditionalHandle handle, int* counter) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *counter -= 1;
    cudaGraphSetConditional(handle, *counter > 0 ? 1u : 0u);
  }
}
