// Batched copies (cudaMemcpyBatchAsync -> cuMemcpyBatchAsync_v2, cudaMemcpy3DBatchAsync ->
// cuMemcpy3DBatchAsync_v2; serving engines swap KV-cache blocks this way): every other one of 64
// blocks of 64 KiB swapped out from device to pinned host memory and back in one batch each,
// pageable and stack sources with two attribute sets, a pointer -> CUDA array -> pointer round
// trip with a row pitch, and the answers to a batch on the legacy stream and an empty extent.
// Result fields: the wrong-block, wrong-source and wrong-row counts, a checksum of what arrived,
// the two refusals. Exit 77 without a GPU.
static const char* const kProgram = "rt_copy_batch";
#include <cstring>
#include <vector>

#include "rt_common.cuh"

constexpr int kBlocks = 64;
constexpr size_t kBlock = 64 << 10;

__global__ void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: no GPU SKIP\n", kProgram);
    return 77;
  }
  cudaStream_t s;
  RT_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned char *cache, *back, *host;
  RT_CHECK(cudaMalloc(&cache, kBlocks * kBlock));
  RT_CHECK(cudaMalloc(&back, kBlocks * kBlock));
  RT_CHECK(cudaMallocHost(&host, kBlocks * kBlock));
  fill<<<256, 256, 0, s>>>(cache, kBlocks * kBlock, 7);
  RT_CHECK_LAUNCH();

  // Swap out: every other block to host memory, in reverse order; then back in to `back`.
  std::vector<void*> dsts, srcs;
  std::vector<size_t> sizes;
  for (int b = 0; b < kBlocks; b += 2) {
    dsts.push_back(host + (kBlocks - 1 - b) * kBlock);
    srcs.push_back(cache + b * kBlock);
    sizes.push_back(kBlock);
  }
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t zero = 0;
  RT_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &zero,
                                1, s));
  for (size_t i = 0; i < dsts.size(); ++i) std::swap(dsts[i], srcs[i]);
  for (size_t i = 0; i < dsts.size(); ++i)
    dsts[i] = back + (static_cast<unsigned char*>(srcs[i]) - host);
  RT_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &zero,
                                1, s));
  RT_CHECK(cudaStreamSynchronize(s));
  std::vector<unsigned char> expect(kBlocks * kBlock), got(kBlocks * kBlock);
  RT_CHECK(cudaMemcpy(expect.data(), cache, expect.size(), cudaMemcpyDeviceToHost));
  RT_CHECK(cudaMemcpy(got.data(), back, got.size(), cudaMemcpyDeviceToHost));
  int wrong_blocks = 0;
  for (int b = 0; b < kBlocks; b += 2) {
    wrong_blocks += std::memcmp(got.data() + (kBlocks - 1 - b) * kBlock, expect.data() + b * kBlock,
                                kBlock) != 0;
  }

  // Pageable and stack sources in one batch, the stack one read during the call.
  std::vector<unsigned char> pageable(kBlock);
  for (size_t i = 0; i < kBlock; ++i) pageable[i] = static_cast<unsigned char>(i * 7 + 1);
  unsigned char on_stack[256];
  for (int i = 0; i < 256; ++i) on_stack[i] = static_cast<unsigned char>(255 - i);
  void* d2[] = {back, back + kBlock};
  const void* s2[] = {pageable.data(), on_stack};
  size_t n2[] = {kBlock, sizeof on_stack};
  cudaMemcpyAttributes attrs2[2]{};
  attrs2[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attrs2[1].srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
  size_t idx2[] = {0, 1};
  RT_CHECK(cudaMemcpyBatchAsync(d2, s2, n2, 2, attrs2, idx2, 2, s));
  std::memset(on_stack, 0, sizeof on_stack);
  RT_CHECK(cudaStreamSynchronize(s));
  RT_CHECK(cudaMemcpy(got.data(), back, kBlock + 256, cudaMemcpyDeviceToHost));
  int wrong_sources = std::memcmp(got.data(), pageable.data(), kBlock) != 0;
  for (int i = 0; i < 256; ++i) wrong_sources += got[kBlock + i] != 255 - i;

  // Pointer (rows of 1024 bytes, 512 used) -> 64x16 float2 array -> packed pointer.
  cudaChannelFormatDesc fmt = cudaCreateChannelDesc<float2>();
  cudaArray_t array;
  RT_CHECK(cudaMallocArray(&array, &fmt, 64, 16));
  cudaMemcpy3DBatchOp ops[2]{};
  ops[0].src.type = cudaMemcpyOperandTypePointer;
  ops[0].src.op.ptr.ptr = cache;
  ops[0].src.op.ptr.rowLength = 128;
  ops[0].dst.type = cudaMemcpyOperandTypeArray;
  ops[0].dst.op.array.array = array;
  ops[0].extent = make_cudaExtent(64, 16, 1);
  ops[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  ops[1].src.type = cudaMemcpyOperandTypeArray;
  ops[1].src.op.array.array = array;
  ops[1].dst.type = cudaMemcpyOperandTypePointer;
  ops[1].dst.op.ptr.ptr = back;
  ops[1].extent = make_cudaExtent(64, 16, 1);
  ops[1].srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  RT_CHECK(cudaMemcpy3DBatchAsync(1, &ops[0], 0, s));
  RT_CHECK(cudaMemcpy3DBatchAsync(1, &ops[1], 0, s));
  RT_CHECK(cudaStreamSynchronize(s));
  RT_CHECK(cudaMemcpy(got.data(), back, 64 * 16 * 8, cudaMemcpyDeviceToHost));
  int wrong_rows = 0;
  for (int row = 0; row < 16; ++row)
    wrong_rows += std::memcmp(got.data() + row * 512, expect.data() + row * 1024, 512) != 0;

  // What the driver answers to a batch on the legacy stream and to an empty extent.
  const int legacy_stream =
      static_cast<int>(cudaMemcpyBatchAsync(d2, s2, n2, 2, attrs2, idx2, 2, cudaStreamLegacy));
  (void)cudaGetLastError();
  ops[0].extent.width = 0;
  const int empty_extent = static_cast<int>(cudaMemcpy3DBatchAsync(1, ops, 0, s));
  (void)cudaGetLastError();
  RT_CHECK(cudaStreamSynchronize(s));

  const std::uint64_t sum = rt_checksum(got.data(), 64 * 16 * 8);
  RT_CHECK(cudaFreeArray(array));
  RT_CHECK(cudaFreeHost(host));
  RT_CHECK(cudaFree(back));
  RT_CHECK(cudaFree(cache));
  const bool ok = wrong_blocks == 0 && wrong_sources == 0 && wrong_rows == 0 &&
                  legacy_stream != 0 && empty_extent != 0;
  return RT_REPORT(ok,
                   "wrong_blocks=%d wrong_sources=%d wrong_rows=%d legacy_stream=%d "
                   "empty_extent=%d sum=%016llx",
                   wrong_blocks, wrong_sources, wrong_rows, legacy_stream, empty_extent,
                   static_cast<unsigned long long>(sum));
}
