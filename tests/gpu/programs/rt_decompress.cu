// cuMemBatchDecompressAsync: the device's decompression algorithms and maximum length, and what
// a Deflate and an LZ4 operation on device memory answer (on an H200, which has no engine, the
// driver refuses every call and leaves errorIndex alone; a Blackwell decompresses). Result
// fields equal natively and under mpsshim.
static const char* const kProgram = "rt_decompress";
#include <cuda.h>

#include "rt_common.cuh"

int main() {
  RT_CHECK(cudaFree(nullptr));
  CUdevice device{};
  if (cuCtxGetDevice(&device) != CUDA_SUCCESS) return RT_REPORT(false, "%s", "no context");
  int algorithms = -1, max_length = -1;
  cuDeviceGetAttribute(&algorithms, CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK, device);
  cuDeviceGetAttribute(&max_length, CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_MAXIMUM_LENGTH, device);
  unsigned char* memory = nullptr;
  RT_CHECK(cudaMalloc(&memory, 1 << 20));
  cudaStream_t stream{};
  RT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CUmemDecompressParams p{};
  p.srcNumBytes = 4096;
  p.dstNumBytes = 65536;
  p.src = memory;
  p.dst = memory + 65536;
  p.dstActBytes = reinterpret_cast<cuuint32_t*>(memory + (1 << 19));
  p.algo = CU_MEM_DECOMPRESS_ALGORITHM_DEFLATE;
  size_t index = 77;
  const CUresult deflate =
      cuMemBatchDecompressAsync(&p, 1, 0, &index, reinterpret_cast<CUstream>(stream));
  const size_t deflate_index = index;
  p.algo = CU_MEM_DECOMPRESS_ALGORITHM_LZ4;
  index = 77;
  const CUresult lz4 =
      cuMemBatchDecompressAsync(&p, 1, 0, &index, reinterpret_cast<CUstream>(stream));
  RT_CHECK(cudaStreamSynchronize(stream));
  // Without an engine the only right answer is the refusal; with one, the driver's own.
  const bool ok = algorithms != 0 || (deflate == CUDA_ERROR_NOT_SUPPORTED &&
                                      lz4 == CUDA_ERROR_NOT_SUPPORTED && deflate_index == 77);
  return RT_REPORT(ok, "algorithms=%d max_length=%d deflate=%d deflate_index=%zu lz4=%d",
                   algorithms, max_length, static_cast<int>(deflate), deflate_index,
                   static_cast<int>(lz4));
}
