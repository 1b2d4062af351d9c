// A second translation unit: its container lands right behind saxpy.cu's in a linked object.
__device__ int scale_factor = 3;

__global__ void scale(int* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= scale_factor;
}
