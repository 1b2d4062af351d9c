// Green contexts the program makes itself (cuDeviceGetDevResource, cuDevSmResourceSplitByCount,
// cuDevResourceGenerateDesc, cuGreenCtxCreate and the rest): the device's SMs split into groups
// of 16, a green context of the first group, kernels on its stream and on a stream made while its
// context is current, counting the SMs they ran on (%smid), a vector computed there, its events,
// ids and stream; a split into pairs of SMs (more groups than one mpsshim answer holds). Under
// mpsshim the device is the client's quota (docs/green-contexts.md); at 100% that is the whole
// GPU, so the result fields equal the native ones.
static const char* const kProgram = "rt_green_ctx";
#include <cuda.h>

#include <cstring>
#include <set>
#include <vector>

#include "rt_driver.cuh"

__global__ void record_smid(unsigned* out) {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  rt_spin_ns(20000);  // long enough that the blocks spread over every SM the stream may use
  if (threadIdx.x == 0) out[blockIdx.x] = smid;
}

__global__ void axpy(const float* x, float* y, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

namespace {

constexpr int kBlocks = 4096;

std::set<unsigned> sms_seen(cudaStream_t stream, unsigned* buffer) {
  record_smid<<<kBlocks, 32, 0, stream>>>(buffer);
  RT_CHECK_LAUNCH();
  std::vector<unsigned> ids(kBlocks);
  RT_CHECK(cudaStreamSynchronize(stream));
  RT_CHECK(cudaMemcpy(ids.data(), buffer, sizeof(unsigned) * kBlocks, cudaMemcpyDeviceToHost));
  return {ids.begin(), ids.end()};
}

}  // namespace

int main() {
  RT_CHECK(cudaFree(nullptr));
  CUcontext primary{};
  CU_CHECK(cuCtxGetCurrent(&primary));
  CUdevice device{};
  CU_CHECK(cuCtxGetDevice(&device));
  unsigned* smids = nullptr;
  RT_CHECK(cudaMalloc(&smids, sizeof(unsigned) * kBlocks));
  sms_seen(nullptr, smids);  // loads the kernel

  CUdevResource all{};
  CU_CHECK(cuDeviceGetDevResource(device, &all, CU_DEV_RESOURCE_TYPE_SM));
  const std::set<unsigned> device_sms = sms_seen(nullptr, smids);
  unsigned groups = 0;
  CU_CHECK(cuDevSmResourceSplitByCount(nullptr, &groups, &all, nullptr, 0, 16));
  CUdevResource two[2]{}, rest{};
  unsigned made = 2;
  CU_CHECK(cuDevSmResourceSplitByCount(two, &made, &all, &rest, 0, 16));
  CUdevResourceDesc desc{};
  CU_CHECK(cuDevResourceGenerateDesc(&desc, &two[0], 1));
  CUgreenCtx green{};
  CU_CHECK(cuGreenCtxCreate(&green, desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
  CUdevResource own{};
  CU_CHECK(cuGreenCtxGetDevResource(green, &own, CU_DEV_RESOURCE_TYPE_SM));
  CUstream stream{};
  CU_CHECK(cuGreenCtxStreamCreate(&stream, green, CU_STREAM_NON_BLOCKING, 0));
  const auto green_stream = reinterpret_cast<cudaStream_t>(stream);
  const std::set<unsigned> green_sms = sms_seen(green_stream, smids);
  bool within = true;
  for (unsigned sm : green_sms) within = within && device_sms.count(sm) != 0;

  // A vector computed on the green context's stream.
  constexpr int n = 1 << 20;
  std::vector<float> x(n), y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i % 1000) * 0.5f;
    y[i] = static_cast<float>(i % 7);
  }
  float *dx = nullptr, *dy = nullptr;
  RT_CHECK(cudaMalloc(&dx, sizeof(float) * n));
  RT_CHECK(cudaMalloc(&dy, sizeof(float) * n));
  RT_CHECK(cudaMemcpyAsync(dx, x.data(), sizeof(float) * n, cudaMemcpyHostToDevice, green_stream));
  RT_CHECK(cudaMemcpyAsync(dy, y.data(), sizeof(float) * n, cudaMemcpyHostToDevice, green_stream));
  axpy<<<(n + 255) / 256, 256, 0, green_stream>>>(dx, dy, 3.0f, n);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaMemcpyAsync(y.data(), dy, sizeof(float) * n, cudaMemcpyDeviceToHost, green_stream));
  RT_CHECK(cudaStreamSynchronize(green_stream));
  const std::uint64_t checksum = rt_checksum(y.data(), sizeof(float) * n);

  // Its context current: a stream made then is the green context's.
  CUcontext green_ctx{};
  CU_CHECK(cuCtxFromGreenCtx(&green_ctx, green));
  CU_CHECK(cuCtxSetCurrent(green_ctx));
  CUstream made_current{};
  CU_CHECK(cuStreamCreate(&made_current, CU_STREAM_NON_BLOCKING));
  CUgreenCtx of_current{};
  CU_CHECK(cuStreamGetGreenCtx(made_current, &of_current));
  const std::set<unsigned> current_sms =
      sms_seen(reinterpret_cast<cudaStream_t>(made_current), smids);
  CUdevResource of_ctx{};
  CU_CHECK(cuCtxGetDevResource(green_ctx, &of_ctx, CU_DEV_RESOURCE_TYPE_SM));
  CU_CHECK(cuCtxSetCurrent(primary));
  unsigned long long green_id = 0, ctx_id = 0;
  CU_CHECK(cuGreenCtxGetId(green, &green_id));
  CU_CHECK(cuCtxGetId(green_ctx, &ctx_id));
  CUgreenCtx of_stream{};
  CU_CHECK(cuStreamGetGreenCtx(stream, &of_stream));
  // cuStreamGetCtx_v2: the green context and the device's primary context.
  CUcontext ctx_v2{};
  CUgreenCtx green_v2{};
  CU_CHECK(cuStreamGetCtx_v2(stream, &ctx_v2, &green_v2));
  const int stream_ctx_v2 = (ctx_v2 == primary ? 1 : 0) + (green_v2 == green ? 2 : 0);

  CUevent event{};
  CU_CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
  CU_CHECK(cuGreenCtxRecordEvent(green, event));
  CU_CHECK(cuEventSynchronize(event));
  CU_CHECK(cuGreenCtxWaitEvent(green, event));

  // Pairs of SMs, without co-scheduling.
  unsigned pairs = 0;
  CU_CHECK(cuDevSmResourceSplitByCount(nullptr, &pairs, &all, nullptr,
                                       CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING, 2));
  std::vector<CUdevResource> pair_groups(pairs);
  unsigned pairs_made = pairs;
  CU_CHECK(cuDevSmResourceSplitByCount(pair_groups.data(), &pairs_made, &all, nullptr,
                                       CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING, 2));
  CUdevResourceDesc last_desc{};
  CU_CHECK(cuDevResourceGenerateDesc(&last_desc, &pair_groups[pairs_made - 1], 1));
  CUgreenCtx last{};
  CU_CHECK(cuGreenCtxCreate(&last, last_desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
  CUstream last_stream{};
  CU_CHECK(cuGreenCtxStreamCreate(&last_stream, last, CU_STREAM_NON_BLOCKING, 0));
  const std::set<unsigned> last_sms = sms_seen(reinterpret_cast<cudaStream_t>(last_stream), smids);

  CU_CHECK(cuStreamDestroy(made_current));
  CU_CHECK(cuStreamDestroy(stream));
  CU_CHECK(cuStreamDestroy(last_stream));
  CU_CHECK(cuGreenCtxDestroy(green));
  CU_CHECK(cuGreenCtxDestroy(last));
  // Memory allocated while it lived stays usable.
  RT_CHECK(cudaMemset(dy, 0, sizeof(float) * n));
  RT_CHECK(cudaDeviceSynchronize());

  const bool ok = all.sm.smCount == device_sms.size() && made == 2 && own.sm.smCount == 16 &&
                  green_sms.size() == 16 && within && current_sms == green_sms &&
                  of_current == green && of_stream == green && green_id == ctx_id &&
                  pairs_made == pairs && last_sms.size() == 2 &&
                  std::memcmp(&of_ctx, &own, sizeof own) == 0;
  return RT_REPORT(ok,
                   "device_sms=%u groups_of_16=%u green_sms=%u seen=%zu within=%d "
                   "current_seen=%zu pairs=%u last_pair_seen=%zu stream_ctx_v2=%d checksum=%016llx",
                   all.sm.smCount, groups, own.sm.smCount, green_sms.size(), within ? 1 : 0,
                   current_sms.size(), pairs_made, last_sms.size(), stream_ctx_v2,
                   static_cast<unsigned long long>(checksum));
}
