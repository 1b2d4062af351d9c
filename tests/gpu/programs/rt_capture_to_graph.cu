// Stream capture into an existing graph (cudaStreamBeginCaptureToGraph -> the driver's
// cuStreamBeginCaptureToGraph, what XLA's command buffers use): a graph built by hand with three
// memset nodes; a capture after two of them adds a kernel, a fork onto a second stream and a join
// back, and a device-to-device copy. cudaStreamEndCapture must hand back the same graph; its node
// and edge counts are result fields (compared natively and under the shim); replays are checked
// against a CPU model. Exit 77 without a GPU.
static const char* const kProgram = "rt_capture_to_graph";
#include <vector>

#include "rt_common.cuh"

constexpr int kN = 1 << 14;
constexpr unsigned kX = 3, kY = 7, kW = 9;

__global__ void step_x(unsigned* x, unsigned k, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = x[i] * 1664525u + k + i;
}

__global__ void accumulate(unsigned* y, const unsigned* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] += x[i] ^ 0x5bd1e995u;
}

__global__ void combine(unsigned* z, const unsigned* y, const unsigned* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    z[i] = (y[i] >> 3) + x[i];
}

cudaGraphNode_t memset_node(cudaGraph_t graph, unsigned* dst, unsigned value) {
  cudaMemsetParams p{};
  p.dst = dst;
  p.value = value;
  p.elementSize = sizeof(unsigned);
  p.width = kN;
  p.height = 1;
  cudaGraphNode_t node;
  RT_CHECK(cudaGraphAddMemsetNode(&node, graph, nullptr, 0, &p));
  return node;
}

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: no GPU SKIP\n", kProgram);
    return 77;
  }
  const int replays = argc > 1 ? std::atoi(argv[1]) : 200;
  unsigned *x, *y, *z, *out, *w;
  for (unsigned** p : {&x, &y, &z, &out, &w}) {
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
  RT_CHECK(cudaGraphCreate(&graph, 0));
  const cudaGraphNode_t set_x = memset_node(graph, x, kX);
  const cudaGraphNode_t set_y = memset_node(graph, y, kY);
  memset_node(graph, w, kW);  // no dependency of the capture: stands alone
  const cudaGraphNode_t after[] = {set_x, set_y};
  RT_CHECK(cudaStreamBeginCaptureToGraph(s1, graph, after, nullptr, 2,
                                         cudaStreamCaptureModeThreadLocal));
  step_x<<<64, 256, 0, s1>>>(x, 17, kN);
  RT_CHECK(cudaEventRecord(fork, s1));
  RT_CHECK(cudaStreamWaitEvent(s2, fork, 0));
  accumulate<<<64, 256, 0, s2>>>(y, x, kN);
  RT_CHECK(cudaEventRecord(join, s2));
  RT_CHECK(cudaStreamWaitEvent(s1, join, 0));
  combine<<<64, 256, 0, s1>>>(z, y, x, kN);
  RT_CHECK(cudaMemcpyAsync(out, z, sizeof(unsigned) * kN, cudaMemcpyDeviceToDevice, s1));
  cudaGraph_t ended = nullptr;
  RT_CHECK(cudaStreamEndCapture(s1, &ended));
  const int same_graph = ended == graph;

  size_t nodes = 0, edges = 0;
  RT_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  RT_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  cudaGraphExec_t exec;
  RT_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < replays; ++r) RT_CHECK(cudaGraphLaunch(exec, launch));
  RT_CHECK(cudaStreamSynchronize(launch));

  // Every replay starts from the memsets, so the model is one replay's.
  std::vector<unsigned> model(kN);
  for (int i = 0; i < kN; ++i) {
    const unsigned xi = kX * 1664525u + 17u + static_cast<unsigned>(i);
    const unsigned yi = kY + (xi ^ 0x5bd1e995u);
    model[i] = (yi >> 3) + xi;
  }
  std::vector<unsigned> got(kN), got_w(kN);
  RT_CHECK(cudaMemcpy(got.data(), out, sizeof(unsigned) * kN, cudaMemcpyDeviceToHost));
  RT_CHECK(cudaMemcpy(got_w.data(), w, sizeof(unsigned) * kN, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < kN; ++i) wrong += (got[i] != model[i]) + (got_w[i] != kW);
  const std::uint64_t checksum = rt_checksum(got.data(), sizeof(unsigned) * kN);

  RT_CHECK(cudaGraphExecDestroy(exec));
  RT_CHECK(cudaGraphDestroy(graph));
  RT_CHECK(cudaEventDestroy(fork));
  RT_CHECK(cudaEventDestroy(join));
  for (cudaStream_t s : {s1, s2, launch}) RT_CHECK(cudaStreamDestroy(s));
  for (unsigned* p : {x, y, z, out, w}) RT_CHECK(cudaFree(p));
  // 3 memsets + step, accumulate, combine, copy.
  const bool ok = same_graph && wrong == 0 && nodes == 7;
  return RT_REPORT(ok, "replays=%d same_graph=%d nodes=%zu edges=%zu wrong=%d checksum=%016llx",
                   replays, same_graph, nodes, edges, wrong,
                   static_cast<unsigned long long>(checksum));
}
