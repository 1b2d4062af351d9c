// Stream attributes through the runtime: an access policy window over the program's memory and
// the memory synchronization domain set, read back, copied to another stream; the priority a
// stream was created with read back; a kernel runs on the stream with the window set.
constexpr const char* kProgram = "rt_stream_attributes";
#include "rt_common.cuh"

__global__ void touch(float* p, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    p[i] = p[i] * 2.0f + 1.0f;
  }
}

int main() {
  int least = 0, greatest = 0;
  RT_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream{}, other{};
  RT_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  RT_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  constexpr int kCount = 1 << 18;
  float* data = nullptr;
  RT_CHECK(cudaMalloc(&data, kCount * sizeof(float)));
  RT_CHECK(cudaMemset(data, 0, kCount * sizeof(float)));
  cudaStreamAttrValue window{};
  window.accessPolicyWindow.base_ptr = data;
  window.accessPolicyWindow.num_bytes = kCount * sizeof(float);
  window.accessPolicyWindow.hitRatio = 0.5f;
  window.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  window.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  RT_CHECK(cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &window));
  cudaStreamAttrValue domain{};
  domain.memSyncDomain = cudaLaunchMemSyncDomainRemote;
  RT_CHECK(cudaStreamSetAttribute(stream, cudaStreamAttributeMemSyncDomain, &domain));
  cudaStreamAttrValue got{}, got_domain{}, copied{}, priority{};
  RT_CHECK(cudaStreamGetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &got));
  RT_CHECK(cudaStreamGetAttribute(stream, cudaStreamAttributeMemSyncDomain, &got_domain));
  RT_CHECK(cudaStreamGetAttribute(stream, cudaStreamAttributePriority, &priority));
  RT_CHECK(cudaStreamCopyAttributes(other, stream));
  RT_CHECK(cudaStreamGetAttribute(other, cudaStreamAttributeMemSyncDomain, &copied));
  touch<<<64, 256, 0, stream>>>(data, kCount);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaStreamSynchronize(stream));
  float first = 0;
  RT_CHECK(cudaMemcpy(&first, data, sizeof first, cudaMemcpyDeviceToHost));
  const bool window_ok = got.accessPolicyWindow.base_ptr == data &&
                         got.accessPolicyWindow.num_bytes == kCount * sizeof(float) &&
                         got.accessPolicyWindow.hitRatio == 0.5f;
  const bool ok = window_ok && got_domain.memSyncDomain == cudaLaunchMemSyncDomainRemote &&
                  copied.memSyncDomain == cudaLaunchMemSyncDomainRemote &&
                  priority.priority == greatest && first == 1.0f;
  std::printf("%s: window=%d domain=%d copied_domain=%d priority_is_greatest=%d first=%.1f %s\n",
              kProgram, window_ok, static_cast<int>(got_domain.memSyncDomain),
              static_cast<int>(copied.memSyncDomain), priority.priority == greatest, first,
              ok ? "PASS" : "FAIL");
  RT_CHECK(cudaFree(data));
  return ok ? 0 : 1;
}
