// Stream capture into a graph: kernels on a stream, a fork onto a second stream and a join back
// through events, and a device-to-device memcpy; instantiate, replay 1,000 times, check against
// a CPU model of the same steps. Then re-capture with other kernel arguments, update the
// executable graph in place with cudaGraphExecUpdate, replay again and check again.
static const char* const kProgram = "rt_graph";
#include <vector>

#include "rt_common.cuh"

constexpr int kN = 1 << 14;

__global__ void step_x(unsigned* x, unsigned k, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = x[i] * 1664525u + k + i;
}

__global__ void accumulate(unsigned* y, const unsigned* x, unsigned k, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] += x[i] ^ k;
}

__global__ void combine(unsigned* z, const unsigned* y, const unsigned* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    z[i] = z[i] + (y[i] >> 3) + x[i];
}

struct Buffers {
  unsigned *x, *y, *z, *out;
};

// One replay: x steps on s1; fork: y accumulates x on s2 while x steps again on s1; join;
// z combines; out = copy of z.
void capture(cudaStream_t s1, cudaStream_t s2, cudaEvent_t fork, cudaEvent_t join, const Buffers& b,
             unsigned k, cudaGraph_t* graph) {
  RT_CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeGlobal));
  step_x<<<64, 256, 0, s1>>>(b.x, k, kN);
  RT_CHECK(cudaEventRecord(fork, s1));
  RT_CHECK(cudaStreamWaitEvent(s2, fork, 0));
  accumulate<<<64, 256, 0, s2>>>(b.y, b.x, k, kN);
  RT_CHECK(cudaEventRecord(join, s2));
  RT_CHECK(cudaStreamWaitEvent(s1, join, 0));
  step_x<<<64, 256, 0, s1>>>(b.x, k + 1, kN);
  combine<<<64, 256, 0, s1>>>(b.z, b.y, b.x, kN);
  RT_CHECK(cudaMemcpyAsync(b.out, b.z, sizeof(unsigned) * kN, cudaMemcpyDeviceToDevice, s1));
  RT_CHECK(cudaStreamEndCapture(s1, graph));
}

struct Model {
  std::vector<unsigned> x = std::vector<unsigned>(kN, 0), y = x, z = x;
  void replay(unsigned k) {
    for (int i = 0; i < kN; ++i) {
      x[i] = x[i] * 1664525u + k + i;
      y[i] += x[i] ^ k;
      x[i] = x[i] * 1664525u + (k + 1) + i;
      z[i] = z[i] + (y[i] >> 3) + x[i];
    }
  }
};

int count_wrong(const unsigned* out, const Model& m) {
  int wrong = 0;
  for (int i = 0; i < kN; ++i) wrong += out[i] != m.z[i];
  return wrong;
}

int main(int argc, char** argv) {
  const int replays = argc > 1 ? std::atoi(argv[1]) : 1000;
  Buffers b{};
  for (unsigned** p : {&b.x, &b.y, &b.z, &b.out}) {
    RT_CHECK(cudaMalloc(p, sizeof(unsigned) * kN));
    RT_CHECK(cudaMemset(*p, 0, sizeof(unsigned) * kN));
  }
  RT_CHECK(cudaDeviceSynchronize());
  cudaStream_t s1, s2, launch;
  RT_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  RT_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  RT_CHECK(cudaStreamCreateWithFlags(&launch, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  RT_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  RT_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  cudaGraph_t graph;
  capture(s1, s2, fork, join, b, 17, &graph);
  size_t nodes = 0;
  RT_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  cudaGraphExec_t exec;
  RT_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < replays; ++r) RT_CHECK(cudaGraphLaunch(exec, launch));
  RT_CHECK(cudaStreamSynchronize(launch));
  Model model;
  for (int r = 0; r < replays; ++r) model.replay(17);
  std::vector<unsigned> out(kN);
  RT_CHECK(cudaMemcpy(out.data(), b.out, sizeof(unsigned) * kN, cudaMemcpyDeviceToHost));
  const int wrong_first = count_wrong(out.data(), model);
  const std::uint64_t checksum_first = rt_checksum(out.data(), sizeof(unsigned) * kN);

  // Same topology, other arguments: the executable graph is updated in place.
  cudaGraph_t recaptured;
  capture(s1, s2, fork, join, b, 4242, &recaptured);
  cudaGraphExecUpdateResultInfo info{};
  RT_CHECK(cudaGraphExecUpdate(exec, recaptured, &info));
  const int update_ok = info.result == cudaGraphExecUpdateSuccess;
  const int second = replays / 10 + 1;
  for (int r = 0; r < second; ++r) RT_CHECK(cudaGraphLaunch(exec, launch));
  RT_CHECK(cudaStreamSynchronize(launch));
  for (int r = 0; r < second; ++r) model.replay(4242);
  RT_CHECK(cudaMemcpy(out.data(), b.out, sizeof(unsigned) * kN, cudaMemcpyDeviceToHost));
  const int wrong_updated = count_wrong(out.data(), model);
  const std::uint64_t checksum_updated = rt_checksum(out.data(), sizeof(unsigned) * kN);

  RT_CHECK(cudaGraphExecDestroy(exec));
  RT_CHECK(cudaGraphDestroy(graph));
  RT_CHECK(cudaGraphDestroy(recaptured));
  RT_CHECK(cudaEventDestroy(fork));
  RT_CHECK(cudaEventDestroy(join));
  for (cudaStream_t s : {s1, s2, launch}) RT_CHECK(cudaStreamDestroy(s));
  for (unsigned* p : {b.x, b.y, b.z, b.out}) RT_CHECK(cudaFree(p));
  const bool ok = wrong_first == 0 && wrong_updated == 0 && update_ok && nodes == 5;
  return RT_REPORT(ok,
                   "replays=%d nodes=%zu wrong=%d update_ok=%d wrong_updated=%d "
                   "checksum=%016llx checksum_updated=%016llx",
                   replays, nodes, wrong_first, update_ok, wrong_updated,
                   static_cast<unsigned long long>(checksum_first),
                   static_cast<unsigned long long>(checksum_updated));
}
