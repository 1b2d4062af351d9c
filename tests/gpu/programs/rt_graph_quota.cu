// Graph kernels must stay inside the client's SM quota: a kernel captured from a stream and one
// added to a graph by hand (cudaGraphAddKernelNode) each record which SMs ran their blocks. The
// grid is many blocks per reported SM and every block lingers, so an unrestricted kernel spreads
// over the whole GPU. PASS when each graph used no more SMs than the device reports (under the
// shim: the granted quota); the suite runs it with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25.
constexpr const char* kProgram = "rt_graph_quota";
#include "rt_common.cuh"

#include <vector>

constexpr int kMaxSms = 1024;

__global__ void record_smid(unsigned* seen) {
  unsigned smid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  if (threadIdx.x == 0 && smid < kMaxSms) atomicAdd(&seen[smid], 1u);
  rt_spin_ns(20000);
}

namespace {

// Distinct SMs with a mark, and the highest SM id seen.
int distinct(const std::vector<unsigned>& seen, int* max_smid) {
  int count = 0;
  for (int i = 0; i < kMaxSms; ++i) {
    if (seen[i] != 0) {
      ++count;
      *max_smid = i > *max_smid ? i : *max_smid;
    }
  }
  return count;
}

}  // namespace

int main() {
  int sms = 0;
  RT_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const unsigned grid = static_cast<unsigned>(sms) * 8;
  const size_t bytes = kMaxSms * sizeof(unsigned);
  unsigned *captured_seen = nullptr, *node_seen = nullptr;
  RT_CHECK(cudaMalloc(&captured_seen, bytes));
  RT_CHECK(cudaMalloc(&node_seen, bytes));
  RT_CHECK(cudaMemset(captured_seen, 0, bytes));
  RT_CHECK(cudaMemset(node_seen, 0, bytes));
  RT_CHECK(cudaDeviceSynchronize());  // the graphs run on a non-blocking stream
  cudaStream_t stream;
  RT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // A kernel captured from a stream.
  cudaGraph_t captured = nullptr;
  RT_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  record_smid<<<grid, 128, 0, stream>>>(captured_seen);
  RT_CHECK_LAUNCH();
  RT_CHECK(cudaStreamEndCapture(stream, &captured));

  // The same kernel as a node added by hand.
  cudaGraph_t built = nullptr;
  RT_CHECK(cudaGraphCreate(&built, 0));
  void* args[] = {&node_seen};
  cudaKernelNodeParams params{};
  params.func = reinterpret_cast<void*>(record_smid);
  params.gridDim = dim3(grid);
  params.blockDim = dim3(128);
  params.kernelParams = args;
  cudaGraphNode_t node = nullptr;
  RT_CHECK(cudaGraphAddKernelNode(&node, built, nullptr, 0, &params));

  cudaGraphExec_t captured_exec = nullptr, built_exec = nullptr;
  RT_CHECK(cudaGraphInstantiate(&captured_exec, captured, 0));
  RT_CHECK(cudaGraphInstantiate(&built_exec, built, 0));
  for (int replay = 0; replay < 3; ++replay) {
    RT_CHECK(cudaGraphLaunch(captured_exec, stream));
    RT_CHECK(cudaGraphLaunch(built_exec, stream));
  }
  RT_CHECK(cudaStreamSynchronize(stream));

  std::vector<unsigned> a(kMaxSms), b(kMaxSms);
  RT_CHECK(cudaMemcpy(a.data(), captured_seen, bytes, cudaMemcpyDeviceToHost));
  RT_CHECK(cudaMemcpy(b.data(), node_seen, bytes, cudaMemcpyDeviceToHost));
  unsigned long long blocks_a = 0, blocks_b = 0;
  for (int i = 0; i < kMaxSms; ++i) {
    blocks_a += a[i];
    blocks_b += b[i];
  }
  int max_smid = -1;
  const int distinct_captured = distinct(a, &max_smid);
  const int distinct_node = distinct(b, &max_smid);
  RT_CHECK(cudaGraphExecDestroy(captured_exec));
  RT_CHECK(cudaGraphExecDestroy(built_exec));
  RT_CHECK(cudaGraphDestroy(captured));
  RT_CHECK(cudaGraphDestroy(built));
  RT_CHECK(cudaStreamDestroy(stream));
  RT_CHECK(cudaFree(captured_seen));
  RT_CHECK(cudaFree(node_seen));

  const unsigned long long expected_blocks = 3ull * grid;
  const bool ok = blocks_a == expected_blocks && blocks_b == expected_blocks &&
                  distinct_captured <= sms && distinct_node <= sms;
  return RT_REPORT(ok,
                   "reported_sms=%d distinct_captured=%d distinct_node=%d max_smid=%d blocks=%llu",
                   sms, distinct_captured, distinct_node, max_smid, blocks_a + blocks_b);
}
