// Green contexts a client makes itself, through the whole path: run under
// LD_PRELOAD=libmpsshim.so against mpsshimd and the test driver by tests/e2e/green_test.cpp,
// with and without an SM quota. Prints one PASS or FAIL line.
//
// The client's device is its quota: the SM resource it is handed has the SM count the device
// attribute answers; the green context made of a split of it runs kernels on that many SMs, all
// of them SMs its quota's streams run on; resources it wrote itself are refused; a split longer
// than one answer comes back whole, its pages combining in one descriptor; what was allocated
// while the green context was current outlives it, as natively; one left alive goes with the
// session.
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "client_check.hpp"

namespace {

constexpr char kModuleImage[] = "// mpsshim e2e green module\n.version 8.0\n.target sm_90\n";

CUfunction g_record = nullptr;

std::set<unsigned> sms_seen(CUstream stream, int blocks) {
  CUdeviceptr out = 0;
  CHECK(cuMemAlloc(&out, sizeof(unsigned) * static_cast<std::size_t>(blocks)));
  void* args[] = {&out};
  CHECK(cuLaunchKernel(g_record, static_cast<unsigned>(blocks), 1, 1, 32, 1, 1, 0, stream, args,
                       nullptr));
  std::vector<unsigned> ids(static_cast<std::size_t>(blocks));
  CHECK(cuStreamSynchronize(stream));
  CHECK(cuMemcpyDtoH(ids.data(), out, sizeof(unsigned) * ids.size()));
  CHECK(cuMemFree(out));
  return {ids.begin(), ids.end()};
}

bool within(const std::set<unsigned>& inner, const std::set<unsigned>& outer) {
  return std::includes(outer.begin(), outer.end(), inner.begin(), inner.end());
}

int check(bool ok, const char* what) {
  if (!ok) return fail(what);
  return 0;
}

}  // namespace

int main() {
  CUdevice device{};
  CUcontext primary{};
  CUmodule module{};
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&primary, device));
  CHECK(cuCtxSetCurrent(primary));
  CHECK(cuModuleLoadData(&module, kModuleImage));
  CHECK(cuModuleGetFunction(&g_record, module, "record_smid"));
  int sms = 0;
  CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device));
  const int blocks = 8 * sms;

  // The device's resource is the client's quota.
  CUdevResource quota{};
  CHECK(cuDeviceGetDevResource(device, &quota, CU_DEV_RESOURCE_TYPE_SM));
  if (int rc = check(quota.sm.smCount == static_cast<unsigned>(sms),
                     "the device's SM resource differs from its SM count")) {
    return rc;
  }
  CUdevResource invalid{};
  EXPECT(cuDeviceGetDevResource(device, &invalid, CU_DEV_RESOURCE_TYPE_INVALID),
         CUDA_ERROR_INVALID_RESOURCE_TYPE);
  CUdevResource of_primary{};
  CHECK(cuCtxGetDevResource(primary, &of_primary, CU_DEV_RESOURCE_TYPE_SM));
  if (int rc = check(std::memcmp(&of_primary, &quota, sizeof quota) == 0,
                     "the primary context's SM resource is not the device's")) {
    return rc;
  }
  const std::set<unsigned> quota_sms = sms_seen(nullptr, blocks);
  if (int rc = check(quota_sms.size() == static_cast<std::size_t>(sms),
                     "the quota's streams do not run on its SM count")) {
    return rc;
  }

  // Two groups of 8; a green context of the first.
  unsigned count = 0;
  CHECK(cuDevSmResourceSplitByCount(nullptr, &count, &quota, nullptr, 0, 8));
  CUdevResource groups[2]{}, rest{};
  unsigned two = 2;
  CHECK(cuDevSmResourceSplitByCount(groups, &two, &quota, &rest, 0, 8));
  if (int rc = check(count >= 2 && two == 2 && groups[0].sm.smCount == 8 &&
                         groups[1].sm.smCount == 8 && rest.sm.smCount == quota.sm.smCount - 16,
                     "the split's groups")) {
    return rc;
  }
  CUdevResourceDesc desc{};
  CHECK(cuDevResourceGenerateDesc(&desc, &groups[0], 1));
  CUgreenCtx green{};
  EXPECT(cuGreenCtxCreate(&green, desc, device, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGreenCtxCreate(&green, desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
  CUdevResource own{};
  CHECK(cuGreenCtxGetDevResource(green, &own, CU_DEV_RESOURCE_TYPE_SM));
  if (int rc = check(own.sm.smCount == 8, "the green context's SM resource")) return rc;

  CUstream green_stream{};
  EXPECT(cuGreenCtxStreamCreate(&green_stream, green, 0, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGreenCtxStreamCreate(&green_stream, green, CU_STREAM_NON_BLOCKING, 0));
  const std::set<unsigned> green_sms = sms_seen(green_stream, blocks);
  if (int rc = check(green_sms.size() == 8 && within(green_sms, quota_sms),
                     "the green context's kernels leave its 8 SMs of the quota")) {
    return rc;
  }
  CUgreenCtx of_stream{};
  CHECK(cuStreamGetGreenCtx(green_stream, &of_stream));
  CUstream plain{};
  CHECK(cuStreamCreate(&plain, CU_STREAM_NON_BLOCKING));
  CUgreenCtx of_plain = green;
  CHECK(cuStreamGetGreenCtx(plain, &of_plain));
  if (int rc = check(of_stream == green && of_plain == nullptr, "cuStreamGetGreenCtx")) return rc;
  // cuStreamGetCtx_v2: a green context's stream names it and the device's primary context.
  CUcontext ctx_of_stream{}, ctx_of_plain{};
  CUgreenCtx green_of_stream{}, green_of_plain = green;
  CHECK(cuStreamGetCtx_v2(green_stream, &ctx_of_stream, &green_of_stream));
  CHECK(cuStreamGetCtx_v2(plain, &ctx_of_plain, &green_of_plain));
  EXPECT(cuStreamGetCtx_v2(plain, &ctx_of_plain, nullptr), CUDA_ERROR_INVALID_VALUE);
  if (int rc = check(ctx_of_stream == primary && green_of_stream == green &&
                         ctx_of_plain == primary && green_of_plain == nullptr,
                     "cuStreamGetCtx_v2")) {
    return rc;
  }

  CUcontext green_ctx{};
  CHECK(cuCtxFromGreenCtx(&green_ctx, green));
  unsigned long long green_id = 0, ctx_id = 0;
  CHECK(cuGreenCtxGetId(green, &green_id));
  CHECK(cuCtxGetId(green_ctx, &ctx_id));
  if (int rc = check(green_id == ctx_id && green_id != 0, "cuGreenCtxGetId")) return rc;
  EXPECT(cuCtxDestroy(green_ctx), CUDA_ERROR_INVALID_CONTEXT);

  // Current: its streams, its NULL stream and its resource are the green context's.
  CHECK(cuCtxSetCurrent(green_ctx));
  CUstream made_current{};
  CHECK(cuStreamCreate(&made_current, CU_STREAM_NON_BLOCKING));
  CUgreenCtx of_current{};
  CHECK(cuStreamGetGreenCtx(made_current, &of_current));
  const std::set<unsigned> current_sms = sms_seen(made_current, blocks);
  const std::set<unsigned> null_sms = sms_seen(nullptr, blocks);
  CUdevResource of_green_ctx{};
  CHECK(cuCtxGetDevResource(green_ctx, &of_green_ctx, CU_DEV_RESOURCE_TYPE_SM));
  CUdeviceptr kept = 0;
  CHECK(cuMemAlloc(&kept, 4096));
  CHECK(cuCtxSetCurrent(primary));
  if (int rc = check(of_current == green && current_sms == green_sms && null_sms == green_sms &&
                         std::memcmp(&of_green_ctx, &own, sizeof own) == 0,
                     "streams made while the green context is current")) {
    return rc;
  }

  // Its activity as an event, and a wait for one.
  CUevent event{};
  CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
  CHECK(cuGreenCtxRecordEvent(green, event));
  CHECK(cuEventSynchronize(event));
  CHECK(cuGreenCtxWaitEvent(green, event));
  // Again, from the stream the server keeps for the green context's records.
  CHECK(cuGreenCtxRecordEvent(green, event));
  CHECK(cuEventSynchronize(event));

  // Bytes the client wrote itself are refused, whatever they say.
  CUdevResource forged = groups[1];
  forged._internal_padding[40] ^= 0x5a;
  CUdevResource out[2]{};
  unsigned n = 2;
  EXPECT(cuDevSmResourceSplitByCount(out, &n, &forged, nullptr, 0, 8),
         CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  CUdevResourceDesc forged_desc{};
  EXPECT(cuDevResourceGenerateDesc(&forged_desc, &forged, 1),
         CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);

  // A split into more groups than one answer holds (pairs of SMs).
  unsigned pairs = 0;
  CHECK(cuDevSmResourceSplitByCount(nullptr, &pairs, &quota, nullptr,
                                    CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING, 2));
  std::vector<CUdevResource> all(pairs);
  unsigned made = pairs;
  CHECK(cuDevSmResourceSplitByCount(all.data(), &made, &quota, nullptr,
                                    CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING, 2));
  std::set<std::vector<unsigned char>> distinct;
  for (const CUdevResource& r : all) {
    const auto* b = reinterpret_cast<const unsigned char*>(&r);
    if (r.sm.smCount == 2) distinct.emplace(b, b + sizeof r);
  }
  if (int rc = check(made == pairs && distinct.size() == pairs, "a split of many groups")) {
    return rc;
  }
  // The first and the last pair come from different answers of one split: one descriptor.
  CUdevResource ends[2] = {all[0], all[pairs - 1]};
  CUdevResourceDesc ends_desc{};
  CHECK(cuDevResourceGenerateDesc(&ends_desc, ends, 2));
  CUgreenCtx kept_alive{};  // never destroyed: the session's end destroys it
  CHECK(cuGreenCtxCreate(&kept_alive, ends_desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
  CHECK(cuGreenCtxRecordEvent(kept_alive, event));  // its record stream goes with the session
  CUstream kept_stream{};
  CHECK(cuGreenCtxStreamCreate(&kept_stream, kept_alive, CU_STREAM_NON_BLOCKING, 0));
  if (int rc = check(sms_seen(kept_stream, blocks).size() == 4, "the two pairs' green context")) {
    return rc;
  }
  CUdevResourceDesc last_pair{};
  CHECK(cuDevResourceGenerateDesc(&last_pair, &all[pairs - 1], 1));
  CUgreenCtx small{};
  CHECK(cuGreenCtxCreate(&small, last_pair, device, CU_GREEN_CTX_DEFAULT_STREAM));
  CUstream small_stream{};
  CHECK(cuGreenCtxStreamCreate(&small_stream, small, CU_STREAM_NON_BLOCKING, 0));
  const std::set<unsigned> small_sms = sms_seen(small_stream, blocks);
  if (int rc = check(small_sms.size() == 2 && within(small_sms, quota_sms),
                     "the last pair's green context")) {
    return rc;
  }

  // Destroyed: its handle is refused; memory allocated in it stays the client's.
  CHECK(cuStreamDestroy(green_stream));
  CHECK(cuGreenCtxDestroy(green));
  CUstream late{};
  EXPECT(cuGreenCtxStreamCreate(&late, green, CU_STREAM_NON_BLOCKING, 0),
         CUDA_ERROR_INVALID_CONTEXT);
  CHECK(cuMemsetD32(kept, 0x600dcafe, 1024));
  unsigned word = 0;
  CHECK(cuMemcpyDtoH(&word, kept + 4092, sizeof word));
  if (int rc = check(word == 0x600dcafe, "memory allocated in the green context")) return rc;
  CHECK(cuGreenCtxDestroy(small));
  std::printf("PASS sms=%d groups_of_8=%u pairs=%u green_sms=%zu\n", sms, count, pairs,
              green_sms.size());
  return 0;
}
