// Black-box probe of the real driver: what cuMemBatchDecompressAsync answers on a GPU without a
// decompression engine (an H200), so that mpsshim's test driver answers the same. The device's
// decompression attributes; one Deflate operation on device memory; the argument errors
// (count 0, flags 1, NULL params) and the errorIndex each leaves.
//
// Build and run on the GPU machine (one line):
//   g++ -O2 -std=c++20 -I/usr/local/cuda/include tools/probes/decompress_answer.cpp -lcuda
//     -o /tmp/decompress_answer && /tmp/decompress_answer
#include <cuda.h>

#include <cstdint>
#include <cstdio>

#include "must.hpp"

namespace {

void attempt(const char* what, CUmemDecompressParams* params, size_t count, unsigned flags,
             CUstream stream) {
  size_t index = 12345;
  CUresult r = cuMemBatchDecompressAsync(params, count, flags, &index, stream);
  std::printf("%s: %s (%d), errorIndex %s%zu\n", what, name(r), int(r),
              index == SIZE_MAX ? "SIZE_MAX " : "", index == SIZE_MAX ? 0 : index);
}

}  // namespace

int main() {
  const CUdevice dev = start_on_gpu0();
  int mask = -1, max_length = -1;
  CUresult r = cuDeviceGetAttribute(&mask, CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_ALGORITHM_MASK, dev);
  std::printf("MEM_DECOMPRESS_ALGORITHM_MASK: %s %d\n", name(r), mask);
  r = cuDeviceGetAttribute(&max_length, CU_DEVICE_ATTRIBUTE_MEM_DECOMPRESS_MAXIMUM_LENGTH, dev);
  std::printf("MEM_DECOMPRESS_MAXIMUM_LENGTH: %s %d\n", name(r), max_length);
  CUdeviceptr src, dst, act;
  MUST(cuMemAlloc(&src, 1 << 16));
  MUST(cuMemAlloc(&dst, 1 << 16));
  MUST(cuMemAlloc(&act, 256));
  CUstream stream;
  MUST(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  CUmemDecompressParams p{};
  p.srcNumBytes = 1024;
  p.dstNumBytes = 4096;
  p.dstActBytes = reinterpret_cast<cuuint32_t*>(act);
  p.src = reinterpret_cast<const void*>(src);
  p.dst = reinterpret_cast<void*>(dst);
  p.algo = CU_MEM_DECOMPRESS_ALGORITHM_DEFLATE;
  attempt("one deflate", &p, 1, 0, stream);
  p.algo = CU_MEM_DECOMPRESS_ALGORITHM_LZ4;
  attempt("one lz4", &p, 1, 0, stream);
  attempt("count 0", &p, 0, 0, stream);
  attempt("flags 1", &p, 1, 1, stream);
  attempt("NULL params", nullptr, 1, 0, stream);
  r = cuStreamSynchronize(stream);
  std::printf("stream after: %s\n", name(r));
  return 0;
}
