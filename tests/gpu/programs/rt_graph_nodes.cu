// Explicit graph nodes beyond kernels, memsets and copies: event record and wait nodes, host
// nodes, memory allocation and free nodes, and the calls that change a graph or an executable
// graph afterwards (node queries and setters, enable/disable, destroy a node, remove an edge,
// clone and find a node in the clone, a kernel node's parameters queried and changed). Every
// result is a field, so the GPU suite compares the shim's run with the driver's: the checks
// against a CPU model, how many times each host function ran, and the driver's answers to what
// graphs with memory nodes may not do (clone, a second instantiation, deleting a node). Exit 77
// without a GPU.
static const char* const kProgram = "rt_graph_nodes";
#include <atomic>
#include <vector>

#include "rt_common.cuh"

constexpr int kN = 1 << 14;
constexpr unsigned kX = 11;

__global__ void step(unsigned* x, unsigned k, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] = x[i] * 1664525u + k + i;
}
__global__ void fill(unsigned* t, unsigned k, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    t[i] = k ^ static_cast<unsigned>(i);
}
__global__ void add(unsigned* x, const unsigned* t, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    x[i] += t[i];
}
// y = 3x: without the wait node's ordering it would read x while the producer rewrites it.
__global__ void triple(unsigned* y, const unsigned* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    y[i] = 3u * x[i];
}

std::atomic<int> g_calls[3];
void CUDART_CB count0(void*) {
  g_calls[0]++;
}
void CUDART_CB count1(void*) {
  g_calls[1]++;
}
void CUDART_CB count2(void*) {
  g_calls[2]++;
}

unsigned model(int i, bool stepped, unsigned k_fill) {
  unsigned v = kX;
  if (stepped) v = v * 1664525u + 17u + static_cast<unsigned>(i);
  return v + (k_fill ^ static_cast<unsigned>(i));
}

int wrong_in(const unsigned* device, bool stepped, unsigned k_fill, unsigned factor) {
  std::vector<unsigned> got(kN);
  RT_CHECK(cudaMemcpy(got.data(), device, sizeof(unsigned) * kN, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < kN; ++i) wrong += got[i] != factor * model(i, stepped, k_fill);
  return wrong;
}

cudaGraphNode_t kernel_node(cudaGraph_t g, std::vector<cudaGraphNode_t> deps, void* fn,
                            void** args) {
  cudaKernelNodeParams p{};
  p.func = fn;
  p.gridDim = dim3(64);
  p.blockDim = dim3(256);
  p.kernelParams = args;
  cudaGraphNode_t node;
  RT_CHECK(cudaGraphAddKernelNode(&node, g, deps.data(), deps.size(), &p));
  return node;
}

cudaGraphNode_t host_node(cudaGraph_t g, std::vector<cudaGraphNode_t> deps, cudaHostFn_t fn) {
  cudaHostNodeParams p{fn, nullptr};
  cudaGraphNode_t node;
  RT_CHECK(cudaGraphAddHostNode(&node, g, deps.data(), deps.size(), &p));
  return node;
}

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: no GPU SKIP\n", kProgram);
    return 77;
  }
  const int replays = argc > 1 ? std::atoi(argv[1]) : 50;
  unsigned *x, *y;
  for (unsigned** p : {&x, &y}) RT_CHECK(cudaMalloc(p, sizeof(unsigned) * kN));
  RT_CHECK(cudaMemset(y, 0, sizeof(unsigned) * kN));
  cudaStream_t s1, s2;
  RT_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  RT_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t ev, ev2;
  RT_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  RT_CHECK(cudaEventCreateWithFlags(&ev2, cudaEventDisableTiming));

  // The producer: memset x -> step x -> (+ fill of a graph allocation) -> record ev -> host.
  //   A(memset) -> B(step) ----------------> G(add) -> H(free) ; G -> C(record) -> D(host)
  //   A -> E(alloc) -> F(fill) ------------/
  cudaGraph_t g;
  RT_CHECK(cudaGraphCreate(&g, 0));
  cudaMemsetParams ms{};
  ms.dst = x;
  ms.value = kX;
  ms.elementSize = sizeof(unsigned);
  ms.width = kN;
  ms.height = 1;
  cudaGraphNode_t a, c, d, e, h;
  RT_CHECK(cudaGraphAddMemsetNode(&a, g, nullptr, 0, &ms));
  int n = kN;
  unsigned k17 = 17, k_fill = 0x5a5a;
  void* step_args[] = {&x, &k17, &n};
  cudaGraphNode_t b = kernel_node(g, {a}, reinterpret_cast<void*>(step), step_args);
  cudaMemAllocNodeParams alloc{};
  alloc.poolProps.allocType = cudaMemAllocationTypePinned;
  alloc.poolProps.location.type = cudaMemLocationTypeDevice;
  alloc.poolProps.location.id = 0;
  alloc.bytesize = sizeof(unsigned) * kN;
  RT_CHECK(cudaGraphAddMemAllocNode(&e, g, &a, 1, &alloc));
  unsigned* tmp = static_cast<unsigned*>(alloc.dptr);
  void* fill_args[] = {&tmp, &k_fill, &n};
  cudaGraphNode_t f = kernel_node(g, {e}, reinterpret_cast<void*>(fill), fill_args);
  void* add_args[] = {&x, &tmp, &n};
  cudaGraphNode_t gn = kernel_node(g, {b, f}, reinterpret_cast<void*>(add), add_args);
  RT_CHECK(cudaGraphAddMemFreeNode(&h, g, &gn, 1, alloc.dptr));
  RT_CHECK(cudaGraphAddEventRecordNode(&c, g, &gn, 1, ev));
  d = host_node(g, {c}, count0);

  // The consumer: wait for ev, then y = 3x.
  cudaGraph_t w;
  RT_CHECK(cudaGraphCreate(&w, 0));
  cudaGraphNode_t wait;
  RT_CHECK(cudaGraphAddEventWaitNode(&wait, w, nullptr, 0, ev));
  void* triple_args[] = {&y, &x, &n};
  kernel_node(w, {wait}, reinterpret_cast<void*>(triple), triple_args);

  // Queries of what was built.
  cudaMemAllocNodeParams got_alloc{};
  RT_CHECK(cudaGraphMemAllocNodeGetParams(e, &got_alloc));
  void* freed = nullptr;
  RT_CHECK(cudaGraphMemFreeNodeGetParams(h, &freed));
  cudaEvent_t got_ev = nullptr, got_wait = nullptr;
  RT_CHECK(cudaGraphEventRecordNodeGetEvent(c, &got_ev));
  RT_CHECK(cudaGraphEventWaitNodeGetEvent(wait, &got_wait));
  cudaHostNodeParams got_host{};
  RT_CHECK(cudaGraphHostNodeGetParams(d, &got_host));
  cudaGraphNodeType types[4];
  cudaGraphNode_t typed[4] = {c, d, e, h};
  for (int i = 0; i < 4; ++i) RT_CHECK(cudaGraphNodeGetType(typed[i], &types[i]));
  const bool queries_ok =
      got_alloc.dptr == alloc.dptr && got_alloc.bytesize == alloc.bytesize && freed == alloc.dptr &&
      got_ev == ev && got_wait == ev && got_host.fn == count0 &&
      types[0] == cudaGraphNodeTypeEventRecord && types[1] == cudaGraphNodeTypeHost &&
      types[2] == cudaGraphNodeTypeMemAlloc && types[3] == cudaGraphNodeTypeMemFree;

  // What a graph with memory nodes may not do: the driver's answers are result fields.
  cudaGraph_t clone_mem = nullptr;
  const int clone_memnodes = static_cast<int>(cudaGraphClone(&clone_mem, g));
  (void)cudaGetLastError();

  cudaGraphExec_t gx, wx;
  RT_CHECK(cudaGraphInstantiate(&gx, g, 0));
  RT_CHECK(cudaGraphInstantiate(&wx, w, 0));
  cudaGraphExec_t second = nullptr;
  const int second_instantiation = static_cast<int>(cudaGraphInstantiate(&second, g, 0));
  (void)cudaGetLastError();
  if (second_instantiation == 0) RT_CHECK(cudaGraphExecDestroy(second));
  const int destroy_in_memgraph = static_cast<int>(cudaGraphDestroyNode(d));
  (void)cudaGetLastError();

  int wrong_x = 0, wrong_y = 0;
  for (int r = 0; r < replays; ++r) {
    RT_CHECK(cudaGraphLaunch(gx, s1));
    RT_CHECK(cudaGraphLaunch(wx, s2));
    RT_CHECK(cudaStreamSynchronize(s2));
    RT_CHECK(cudaStreamSynchronize(s1));
    if (r == 0 || r == replays - 1) {
      wrong_x += wrong_in(x, true, k_fill, 1);
      wrong_y += wrong_in(y, true, k_fill, 3);
    }
  }
  size_t graph_mem = 0;
  RT_CHECK(cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrReservedMemCurrent, &graph_mem));
  const bool graph_mem_reserved = graph_mem >= alloc.bytesize;

  // The executable graph changed: the step disabled, the host node and the events swapped.
  RT_CHECK(cudaGraphNodeSetEnabled(gx, b, 0));
  unsigned enabled = 1;
  RT_CHECK(cudaGraphNodeGetEnabled(gx, b, &enabled));
  cudaHostNodeParams other{count1, nullptr};
  RT_CHECK(cudaGraphExecHostNodeSetParams(gx, d, &other));
  RT_CHECK(cudaGraphExecEventRecordNodeSetEvent(gx, c, ev2));
  RT_CHECK(cudaGraphExecEventWaitNodeSetEvent(wx, wait, ev2));
  RT_CHECK(cudaGraphLaunch(gx, s1));
  RT_CHECK(cudaGraphLaunch(wx, s2));
  RT_CHECK(cudaStreamSynchronize(s2));
  RT_CHECK(cudaStreamSynchronize(s1));
  const int wrong_disabled = wrong_in(x, false, k_fill, 1) + wrong_in(y, false, k_fill, 3);
  RT_CHECK(cudaGraphNodeSetEnabled(gx, b, 1));
  RT_CHECK(cudaGraphLaunch(gx, s1));
  RT_CHECK(cudaStreamSynchronize(s1));
  const int wrong_enabled = wrong_in(x, true, k_fill, 1);

  // A graph without memory nodes: its nodes changed, one destroyed, an edge removed, cloned.
  cudaGraph_t p;
  RT_CHECK(cudaGraphCreate(&p, 0));
  cudaGraphNode_t pa, pb, pc, pd;
  RT_CHECK(cudaGraphAddMemsetNode(&pa, p, nullptr, 0, &ms));
  pb = kernel_node(p, {pa}, reinterpret_cast<void*>(step), step_args);
  pc = host_node(p, {pb}, count0);
  pd = host_node(p, {pb}, count0);
  RT_CHECK(cudaGraphEventRecordNodeSetEvent(c, ev2));  // a node of g, after its instantiation
  cudaEvent_t swapped = nullptr;
  RT_CHECK(cudaGraphEventRecordNodeGetEvent(c, &swapped));
  cudaHostNodeParams two{count2, nullptr};
  RT_CHECK(cudaGraphHostNodeSetParams(pc, &two));
  RT_CHECK(cudaGraphDestroyNode(pd));
  cudaGraphNode_t from[] = {pa}, to[] = {pb};
  RT_CHECK(cudaGraphRemoveDependencies(p, from, to, nullptr, 1));
  RT_CHECK(cudaGraphAddDependencies(p, from, to, nullptr, 1));  // back, to keep the result
  size_t p_nodes = 0;
  RT_CHECK(cudaGraphGetNodes(p, nullptr, &p_nodes));
  cudaGraph_t pclone;
  RT_CHECK(cudaGraphClone(&pclone, p));
  cudaGraphNode_t pc_in_clone;
  RT_CHECK(cudaGraphNodeFindInClone(&pc_in_clone, pc, pclone));
  cudaHostNodeParams one{count1, nullptr};
  RT_CHECK(cudaGraphHostNodeSetParams(pc_in_clone, &one));  // the clone's only
  cudaGraphNode_t foreign = nullptr;
  const int find_foreign = static_cast<int>(cudaGraphNodeFindInClone(&foreign, c, pclone));
  (void)cudaGetLastError();
  cudaGraphExec_t px, pcx;
  RT_CHECK(cudaGraphInstantiate(&px, p, 0));
  RT_CHECK(cudaGraphInstantiate(&pcx, pclone, 0));
  RT_CHECK(cudaGraphLaunch(px, s1));
  RT_CHECK(cudaGraphLaunch(pcx, s1));
  RT_CHECK(cudaStreamSynchronize(s1));
  std::vector<unsigned> got(kN);
  RT_CHECK(cudaMemcpy(got.data(), x, sizeof(unsigned) * kN, cudaMemcpyDeviceToHost));
  int wrong_p = 0;
  for (int i = 0; i < kN; ++i) wrong_p += got[i] != kX * 1664525u + 17u + static_cast<unsigned>(i);

  // The generic form: a host node and an event record node through cudaGraphAddNode.
  cudaGraph_t q;
  RT_CHECK(cudaGraphCreate(&q, 0));
  cudaGraphNodeParams qp{};
  qp.type = cudaGraphNodeTypeHost;
  qp.host.fn = count2;
  cudaGraphNode_t qh, qe;
  RT_CHECK(cudaGraphAddNode(&qh, q, nullptr, nullptr, 0, &qp));
  cudaGraphNodeParams qr{};
  qr.type = cudaGraphNodeTypeEventRecord;
  qr.eventRecord.event = ev;
  RT_CHECK(cudaGraphAddNode(&qe, q, &qh, nullptr, 1, &qr));
  cudaGraphExec_t qx;
  RT_CHECK(cudaGraphInstantiate(&qx, q, 0));
  RT_CHECK(cudaGraphLaunch(qx, s2));
  RT_CHECK(cudaEventSynchronize(ev));
  RT_CHECK(cudaStreamSynchronize(s2));

  // A kernel node's own parameters: queried, changed before instantiation, then changed in the
  // executable graph through the generic form.
  cudaGraph_t r;
  RT_CHECK(cudaGraphCreate(&r, 0));
  cudaGraphNode_t ra, rb;
  RT_CHECK(cudaGraphAddMemsetNode(&ra, r, nullptr, 0, &ms));
  rb = kernel_node(r, {ra}, reinterpret_cast<void*>(step), step_args);
  cudaKernelNodeParams kq{};
  RT_CHECK(cudaGraphKernelNodeGetParams(rb, &kq));
  cudaMemsetParams mq{};
  RT_CHECK(cudaGraphMemsetNodeGetParams(ra, &mq));
  const bool kernel_query = kq.func == reinterpret_cast<void*>(step) && kq.gridDim.x == 64 &&
                            kq.blockDim.x == 256 && kq.kernelParams != nullptr &&
                            *static_cast<unsigned*>(kq.kernelParams[1]) == 17u && mq.dst == x &&
                            mq.value == kX && mq.width == kN;
  unsigned k29 = 29, k31 = 31;
  void* args29[] = {&x, &k29, &n};
  cudaKernelNodeParams kp{};
  kp.func = reinterpret_cast<void*>(step);
  kp.gridDim = dim3(64);
  kp.blockDim = dim3(256);
  kp.kernelParams = args29;
  RT_CHECK(cudaGraphKernelNodeSetParams(rb, &kp));
  cudaGraphExec_t rx;
  RT_CHECK(cudaGraphInstantiate(&rx, r, 0));
  RT_CHECK(cudaGraphLaunch(rx, s1));
  RT_CHECK(cudaStreamSynchronize(s1));
  RT_CHECK(cudaMemcpy(got.data(), x, sizeof(unsigned) * kN, cudaMemcpyDeviceToHost));
  int wrong_set = 0;
  for (int i = 0; i < kN; ++i)
    wrong_set += got[i] != kX * 1664525u + 29u + static_cast<unsigned>(i);
  void* args31[] = {&x, &k31, &n};
  cudaGraphNodeParams gp{};
  gp.type = cudaGraphNodeTypeKernel;
  gp.kernel.func = reinterpret_cast<void*>(step);
  gp.kernel.gridDim = dim3(64);
  gp.kernel.blockDim = dim3(256);
  gp.kernel.kernelParams = args31;
  RT_CHECK(cudaGraphExecNodeSetParams(rx, rb, &gp));
  RT_CHECK(cudaGraphLaunch(rx, s1));
  RT_CHECK(cudaStreamSynchronize(s1));
  RT_CHECK(cudaMemcpy(got.data(), x, sizeof(unsigned) * kN, cudaMemcpyDeviceToHost));
  int wrong_exec_set = 0;
  for (int i = 0; i < kN; ++i)
    wrong_exec_set += got[i] != kX * 1664525u + 31u + static_cast<unsigned>(i);
  // The executable graph's memset node: x = 0 before the step.
  cudaMemsetParams zero_ms = ms;
  zero_ms.value = 0;
  RT_CHECK(cudaGraphExecMemsetNodeSetParams(rx, ra, &zero_ms));
  RT_CHECK(cudaGraphLaunch(rx, s1));
  RT_CHECK(cudaStreamSynchronize(s1));
  RT_CHECK(cudaMemcpy(got.data(), x, sizeof(unsigned) * kN, cudaMemcpyDeviceToHost));
  int wrong_memset_set = 0;
  for (int i = 0; i < kN; ++i) wrong_memset_set += got[i] != 31u + static_cast<unsigned>(i);
  RT_CHECK(cudaGraphExecDestroy(rx));
  RT_CHECK(cudaGraphDestroy(r));
  // The largest cluster the step kernel may be launched with (the driver's answer).
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(64);
  cfg.blockDim = dim3(256);
  int cluster_size = 0;
  RT_CHECK(cudaOccupancyMaxPotentialClusterSize(&cluster_size, step, &cfg));

  RT_CHECK(cudaGraphExecDestroy(qx));
  RT_CHECK(cudaGraphExecDestroy(px));
  RT_CHECK(cudaGraphExecDestroy(pcx));
  RT_CHECK(cudaGraphExecDestroy(gx));
  RT_CHECK(cudaGraphExecDestroy(wx));
  for (cudaGraph_t graph : {g, w, p, pclone, q}) RT_CHECK(cudaGraphDestroy(graph));
  RT_CHECK(cudaDeviceGraphMemTrim(0));

  // count0: every replay of g, and p's remaining original host node (pc was set to count2).
  const int calls0 = g_calls[0], calls1 = g_calls[1], calls2 = g_calls[2];
  const bool ok = queries_ok && wrong_x == 0 && wrong_y == 0 && wrong_disabled == 0 &&
                  wrong_enabled == 0 && wrong_p == 0 && enabled == 0 && swapped == ev2 &&
                  p_nodes == 3 && graph_mem_reserved && calls0 == replays && kernel_query &&
                  wrong_set == 0 && wrong_exec_set == 0 && wrong_memset_set == 0 &&
                  cluster_size > 0 && calls1 == 2 + 1 && calls2 == 1 + 1;
  return RT_REPORT(ok,
                   "replays=%d queries=%d wrong_x=%d wrong_y=%d wrong_disabled=%d "
                   "wrong_enabled=%d wrong_p=%d enabled_after_disable=%u p_nodes=%zu "
                   "graph_mem_reserved=%d calls=%d/%d/%d clone_memnodes=%d "
                   "second_instantiation=%d destroy_in_memgraph=%d find_foreign=%d "
                   "kernel_query=%d wrong_set=%d wrong_exec_set=%d wrong_memset_set=%d "
                   "cluster_size=%d",
                   replays, queries_ok ? 1 : 0, wrong_x, wrong_y, wrong_disabled, wrong_enabled,
                   wrong_p, enabled, p_nodes, graph_mem_reserved ? 1 : 0, calls0, calls1, calls2,
                   clone_memnodes, second_instantiation, destroy_in_memgraph, find_foreign,
                   kernel_query ? 1 : 0, wrong_set, wrong_exec_set, wrong_memset_set, cluster_size);
}
