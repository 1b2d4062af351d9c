// Black-box probe of the real driver: may a process carve green contexts out of a green
// context's own SMs, as a client of mpsshim does inside its quota (its green context is itself
// a split of the device)? And what the server may rely on when it checks what a client hands back:
//
// 1. A green context P of 64 SMs (a split of the device). Its SM resource, asked twice
//    (cuGreenCtxGetDevResource), and the split output it was made from: are the 144 bytes equal?
// 2. P's resource split again (cuDevSmResourceSplitByCount, 2 groups of 16): the groups' sizes,
//    what is left, a green context C of the first group. Kernels of many blocks record %smid:
//    the SMs seen from P's stream, from C's, and whether C's are a subset of P's.
// 3. Events: one made in the primary context, one in P's context (cuCtxFromGreenCtx), one in C's,
//    each recorded on C's stream; and cuGreenCtxRecordEvent(C) with each.
// 4. A forged resource: P's resource with smCount raised to the device's; split and desc.
//
// Build and run on the GPU machine (one line):
//   nvcc -O2 -arch=sm_90 -I/usr/local/cuda/include tools/probes/green_nested.cu -lcuda
//     -o /tmp/green_nested && /tmp/green_nested
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "must.hpp"

__global__ void record_smid(unsigned* out) {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  // Long enough that blocks spread over every SM the context may use.
  long long until = clock64() + 200000;
  while (clock64() < until) {
  }
  if (threadIdx.x == 0) out[blockIdx.x] = smid;
}

namespace {

constexpr int kBlocks = 2048;

std::set<unsigned> sms_seen(CUstream stream) {
  unsigned* buffer = nullptr;
  cudaMalloc(&buffer, kBlocks * sizeof(unsigned));
  record_smid<<<kBlocks, 32, 0, reinterpret_cast<cudaStream_t>(stream)>>>(buffer);
  std::printf("  launch: %s\n", cudaGetErrorName(cudaGetLastError()));
  MUST(cuStreamSynchronize(stream));
  std::vector<unsigned> host(kBlocks);
  cudaMemcpy(host.data(), buffer, kBlocks * sizeof(unsigned), cudaMemcpyDeviceToHost);
  cudaFree(buffer);
  return {host.begin(), host.end()};
}

void show(const char* what, const CUdevResource& r) {
  std::printf("%s: type %d smCount %u minSmPartitionSize %u smCoscheduledAlignment %u\n", what,
              r.type, r.sm.smCount, r.sm.minSmPartitionSize, r.sm.smCoscheduledAlignment);
}

}  // namespace

int main() {
  CUcontext primary;
  const CUdevice dev = start_on_gpu0(&primary);
  cudaFree(nullptr);

  CUdevResource device_sms{};
  MUST(cuDeviceGetDevResource(dev, &device_sms, CU_DEV_RESOURCE_TYPE_SM));
  show("device", device_sms);
  std::printf("sizeof(CUdevResource) %zu\n", sizeof(CUdevResource));

  // 1. P: 64 SMs of the device.
  CUdevResource p_split{}, rest{};
  unsigned groups = 1;
  MUST(cuDevSmResourceSplitByCount(&p_split, &groups, &device_sms, &rest, 0, 64));
  show("P split", p_split);
  CUdevResourceDesc p_desc;
  MUST(cuDevResourceGenerateDesc(&p_desc, &p_split, 1));
  CUgreenCtx p;
  MUST(cuGreenCtxCreate(&p, p_desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUdevResource p_res1{}, p_res2{};
  MUST(cuGreenCtxGetDevResource(p, &p_res1, CU_DEV_RESOURCE_TYPE_SM));
  MUST(cuGreenCtxGetDevResource(p, &p_res2, CU_DEV_RESOURCE_TYPE_SM));
  show("P resource", p_res1);
  std::printf("P resource asked twice equal: %d; equal to its split output: %d\n",
              std::memcmp(&p_res1, &p_res2, sizeof p_res1) == 0,
              std::memcmp(&p_res1, &p_split, sizeof p_res1) == 0);
  CUcontext p_ctx;
  MUST(cuCtxFromGreenCtx(&p_ctx, p));
  CUdevResource p_ctx_res{};
  CUresult r = cuCtxGetDevResource(p_ctx, &p_ctx_res, CU_DEV_RESOURCE_TYPE_SM);
  std::printf("cuCtxGetDevResource(P's context): %s, equal to P's: %d\n", name(r),
              std::memcmp(&p_ctx_res, &p_res1, sizeof p_res1) == 0);
  CUdevResource primary_res{};
  r = cuCtxGetDevResource(primary, &primary_res, CU_DEV_RESOURCE_TYPE_SM);
  std::printf("cuCtxGetDevResource(primary): %s, equal to the device's: %d\n", name(r),
              std::memcmp(&primary_res, &device_sms, sizeof primary_res) == 0);

  // 2. C: the first of two groups of 16 out of P's resource.
  unsigned count = 0;
  r = cuDevSmResourceSplitByCount(nullptr, &count, &p_res1, nullptr, 0, 16);
  std::printf("split of P's resource, groups of 16, counted: %s, %u groups\n", name(r), count);
  CUdevResource c_groups[2]{}, c_rest{};
  unsigned two = 2;
  r = cuDevSmResourceSplitByCount(c_groups, &two, &p_res1, &c_rest, 0, 16);
  std::printf("split of P's resource into 2 of 16: %s, %u groups\n", name(r), two);
  if (r != CUDA_SUCCESS) return 1;
  show("C group 0", c_groups[0]);
  show("C group 1", c_groups[1]);
  show("C rest", c_rest);
  CUdevResource again[2]{}, again_rest{};
  unsigned two_again = 2;
  MUST(cuDevSmResourceSplitByCount(again, &two_again, &p_res1, &again_rest, 0, 16));
  std::printf("the same split twice gives equal bytes: %d\n",
              std::memcmp(again, c_groups, sizeof again) == 0);
  CUdevResourceDesc c_desc;
  MUST(cuDevResourceGenerateDesc(&c_desc, &c_groups[0], 1));
  CUgreenCtx c;
  MUST(cuGreenCtxCreate(&c, c_desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUdevResource c_res{};
  MUST(cuGreenCtxGetDevResource(c, &c_res, CU_DEV_RESOURCE_TYPE_SM));
  show("C resource", c_res);
  CUstream p_stream, c_stream;
  MUST(cuGreenCtxStreamCreate(&p_stream, p, CU_STREAM_NON_BLOCKING, 0));
  MUST(cuGreenCtxStreamCreate(&c_stream, c, CU_STREAM_NON_BLOCKING, 0));
  std::set<unsigned> on_p = sms_seen(p_stream), on_c = sms_seen(c_stream),
                     on_primary = sms_seen(nullptr);
  bool subset = true;
  for (unsigned sm : on_c) subset = subset && on_p.count(sm) != 0;
  std::printf("SMs seen: primary %zu, P %zu, C %zu; C within P: %d\n", on_primary.size(),
              on_p.size(), on_c.size(), subset);

  // 3. Events recorded on C's stream.
  CUcontext c_ctx;
  MUST(cuCtxFromGreenCtx(&c_ctx, c));
  CUcontext makers[3] = {primary, p_ctx, c_ctx};
  const char* maker_names[3] = {"primary", "P", "C"};
  for (int i = 0; i < 3; ++i) {
    MUST(cuCtxSetCurrent(makers[i]));
    CUevent e;
    MUST(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    MUST(cuCtxSetCurrent(primary));
    CUresult on_stream = cuEventRecord(e, c_stream);
    CUresult on_green = cuGreenCtxRecordEvent(c, e);
    CUresult wait = cuStreamWaitEvent(p_stream, e, 0);
    std::printf(
        "event of %s: cuEventRecord on C's stream %s, cuGreenCtxRecordEvent(C) %s, "
        "P's stream waits %s\n",
        maker_names[i], name(on_stream), name(on_green), name(wait));
    MUST(cuStreamSynchronize(p_stream));
    MUST(cuEventDestroy(e));
  }
  unsigned long long c_id = 0, p_id = 0;
  MUST(cuGreenCtxGetId(c, &c_id));
  MUST(cuGreenCtxGetId(p, &p_id));
  unsigned long long c_ctx_id = 0;
  MUST(cuCtxGetId(c_ctx, &c_ctx_id));
  std::printf("ids: P %llu C %llu, C's context %llu\n", p_id, c_id, c_ctx_id);
  CUgreenCtx back = nullptr;
  r = cuStreamGetGreenCtx(c_stream, &back);
  std::printf("cuStreamGetGreenCtx(C's stream): %s, is C: %d\n", name(r), back == c);

  // 4. A forged resource: P's with smCount raised.
  CUdevResource forged = p_res1;
  forged.sm.smCount = device_sms.sm.smCount;
  CUdevResource forged_groups[1]{};
  unsigned one = 1;
  r = cuDevSmResourceSplitByCount(forged_groups, &one, &forged, nullptr, 0, 96);
  std::printf("forged smCount %u, split 1 of 96: %s (%u groups, %u SMs)\n", forged.sm.smCount,
              name(r), one, forged_groups[0].sm.smCount);
  CUdevResourceDesc forged_desc;
  r = cuDevResourceGenerateDesc(&forged_desc, &forged, 1);
  std::printf("forged desc: %s\n", name(r));
  if (r == CUDA_SUCCESS) {
    CUgreenCtx f;
    r = cuGreenCtxCreate(&f, forged_desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
    std::printf("forged green context: %s\n", name(r));
    if (r == CUDA_SUCCESS) {
      CUdevResource f_res{};
      MUST(cuGreenCtxGetDevResource(f, &f_res, CU_DEV_RESOURCE_TYPE_SM));
      show("forged context's resource", f_res);
      CUstream f_stream;
      MUST(cuGreenCtxStreamCreate(&f_stream, f, CU_STREAM_NON_BLOCKING, 0));
      std::printf("SMs seen on the forged context: %zu\n", sms_seen(f_stream).size());
    }
  }
  // Padding differs between two different groups? (Where the SM set lives.)
  int differing = 0;
  const auto* a = reinterpret_cast<const unsigned char*>(&c_groups[0]);
  const auto* b = reinterpret_cast<const unsigned char*>(&c_groups[1]);
  for (size_t i = 0; i < sizeof(CUdevResource); ++i) differing += a[i] != b[i];
  std::printf("bytes differing between C's two groups: %d\n", differing);
  MUST(cuGreenCtxDestroy(c));
  MUST(cuGreenCtxDestroy(p));
  std::printf("done\n");
  return 0;
}
