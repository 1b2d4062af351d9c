// Child graph nodes (cudaGraphAddChildGraphNode -> the driver's cuGraphAddChildGraphNode, how XLA
// nests command buffers): a kernel captured into a graph is nested after a memset node of
// another; the child is destroyed after the add (the driver cloned it); the embedded graph's node
// count is a result field; replays are checked against a CPU model; then
// cudaGraphExecChildGraphNodeSetParams points the node at a child captured on another buffer.
// Exit 77 without a GPU.
static const char* const kProgram = "rt_child_graph";
#include <vector>

#include "rt_common.cuh"

constexpr int kN = 1 << 14;
constexpr unsigned kX = 11;

__global__ void step(unsigned* x, unsigned k, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = x[i] * 1664525u + k + i;
}

cudaGraph_t captured_step(cudaStream_t s, unsigned* x, unsigned k) {
  cudaGraph_t graph;
  RT_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  step<<<64, 256, 0, s>>>(x, k, kN);
  RT_CHECK(cudaStreamEndCapture(s, &graph));
  return graph;
}

int wrong_in(const unsigned* device, unsigned k, unsigned start) {
  std::vector<unsigned> got(kN);
  RT_CHECK(cudaMemcpy(got.data(), device, sizeof(unsigned) * kN, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < kN; ++i) wrong += got[i] != start * 1664525u + k + static_cast<unsigned>(i);
  return wrong;
}

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: no GPU SKIP\n", kProgram);
    return 77;
  }
  const int replays = argc > 1 ? std::atoi(argv[1]) : 200;
  unsigned *x, *y;
  for (unsigned** p : {&x, &y}) {
    RT_CHECK(cudaMalloc(p, sizeof(unsigned) * kN));
    RT_CHECK(cudaMemset(*p, 0, sizeof(unsigned) * kN));
  }
  RT_CHECK(cudaDeviceSynchronize());
  cudaStream_t s, launch;
  RT_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  RT_CHECK(cudaStreamCreateWithFlags(&launch, cudaStreamNonBlocking));

  cudaGraph_t child = captured_step(s, x, 17);
  cudaGraph_t outer;
  RT_CHECK(cudaGraphCreate(&outer, 0));
  cudaMemsetParams p{};
  p.dst = x;
  p.value = kX;
  p.elementSize = sizeof(unsigned);
  p.width = kN;
  p.height = 1;
  cudaGraphNode_t set_x, node;
  RT_CHECK(cudaGraphAddMemsetNode(&set_x, outer, nullptr, 0, &p));
  RT_CHECK(cudaGraphAddChildGraphNode(&node, outer, &set_x, 1, child));
  RT_CHECK(cudaGraphDestroy(child));  // cloned into the node
  cudaGraph_t embedded;
  RT_CHECK(cudaGraphChildGraphNodeGetGraph(node, &embedded));
  size_t embedded_nodes = 0;
  RT_CHECK(cudaGraphGetNodes(embedded, nullptr, &embedded_nodes));

  cudaGraphExec_t exec;
  RT_CHECK(cudaGraphInstantiate(&exec, outer, 0));
  for (int r = 0; r < replays; ++r) RT_CHECK(cudaGraphLaunch(exec, launch));
  RT_CHECK(cudaStreamSynchronize(launch));
  const int wrong_x = wrong_in(x, 17, kX);  // every replay starts from the memset

  // The node replays a child captured on y from now on (y starts at 0: one replay's model).
  cudaGraph_t other = captured_step(s, y, 5);
  RT_CHECK(cudaGraphExecChildGraphNodeSetParams(exec, node, other));
  RT_CHECK(cudaGraphLaunch(exec, launch));
  RT_CHECK(cudaStreamSynchronize(launch));
  const int wrong_y = wrong_in(y, 5, 0);
  std::vector<unsigned> got(kN);
  RT_CHECK(cudaMemcpy(got.data(), y, sizeof(unsigned) * kN, cudaMemcpyDeviceToHost));
  const std::uint64_t checksum = rt_checksum(got.data(), sizeof(unsigned) * kN);

  RT_CHECK(cudaGraphExecDestroy(exec));
  RT_CHECK(cudaGraphDestroy(outer));
  RT_CHECK(cudaGraphDestroy(other));
  for (cudaStream_t st : {s, launch}) RT_CHECK(cudaStreamDestroy(st));
  for (unsigned* d : {x, y}) RT_CHECK(cudaFree(d));
  const bool ok = wrong_x == 0 && wrong_y == 0 && embedded_nodes == 1;
  return RT_REPORT(ok, "replays=%d embedded_nodes=%zu wrong_x=%d wrong_y=%d checksum=%016llx",
                   replays, embedded_nodes, wrong_x, wrong_y,
                   static_cast<unsigned long long>(checksum));
}
