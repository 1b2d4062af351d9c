// Graph nodes beyond kernels, memsets and copies through the whole path: run under
// LD_PRELOAD=libmpsshim.so against mpsshimd and the test driver by tests/e2e/capture_test.cpp.
// Each mode prints one PASS or FAIL line.
#include <cuda.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "client_check.hpp"

namespace {

constexpr char kModuleImage[] = "// mpsshim e2e graph nodes module\n.version 8.0\n.target sm_90\n";
constexpr int kElements = 4096;
constexpr std::size_t kBytes = kElements * sizeof(unsigned);
constexpr unsigned kSetA = 77;

struct Setup {
  CUcontext ctx{};
  CUmodule module{};
  CUstream s1{}, s2{};
};

Setup setup() {
  Setup s;
  CUdevice device{};
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&s.ctx, device));
  CHECK(cuCtxSetCurrent(s.ctx));
  CHECK(cuModuleLoadData(&s.module, kModuleImage));
  CHECK(cuStreamCreate(&s.s1, CU_STREAM_NON_BLOCKING));
  CHECK(cuStreamCreate(&s.s2, CU_STREAM_NON_BLOCKING));
  return s;
}

bool all_equal(CUdeviceptr p, unsigned expected, const char* what) {
  std::vector<unsigned> host(kElements);
  CHECK(cuMemcpyDtoH(host.data(), p, kBytes));
  for (unsigned v : host) {
    if (v != expected) {
      std::printf("FAIL %s: found %u where %u was expected\n", what, v, expected);
      return false;
    }
  }
  return true;
}

CUgraphNode memset_node(CUgraph graph, CUdeviceptr dst, unsigned value, CUcontext ctx,
                        const std::vector<CUgraphNode>& deps) {
  CUDA_MEMSET_NODE_PARAMS p{};
  p.dst = dst;
  p.value = value;
  p.elementSize = sizeof(unsigned);
  p.width = kElements;
  p.height = 1;
  CUgraphNode node = nullptr;
  CHECK(cuGraphAddMemsetNode(&node, graph, deps.data(), deps.size(), &p, ctx));
  return node;
}

CUgraphNode copy_node(CUgraph graph, CUdeviceptr dst, CUdeviceptr src, CUcontext ctx,
                      const std::vector<CUgraphNode>& deps) {
  CUDA_MEMCPY3D p{};
  p.srcMemoryType = CU_MEMORYTYPE_DEVICE;
  p.srcDevice = src;
  p.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  p.dstDevice = dst;
  p.WidthInBytes = kBytes;
  p.Height = 1;
  p.Depth = 1;
  CUgraphNode node = nullptr;
  CHECK(cuGraphAddMemcpyNode(&node, graph, deps.data(), deps.size(), &p, ctx));
  return node;
}

CUgraphNode increment_node(CUgraph graph, CUfunction increment, CUdeviceptr* p,
                           const std::vector<CUgraphNode>& deps) {
  static int n = kElements;
  void* args[] = {p, &n};
  CUDA_KERNEL_NODE_PARAMS k{};
  k.func = increment;
  k.gridDimX = (kElements + 255) / 256;
  k.gridDimY = k.gridDimZ = 1;
  k.blockDimX = 256;
  k.blockDimY = k.blockDimZ = 1;
  k.kernelParams = args;
  CUgraphNode node = nullptr;
  CHECK(cuGraphAddKernelNode(&node, graph, deps.data(), deps.size(), &k));
  return node;
}

std::atomic<int> g_calls[3];
std::atomic<bool> g_open{false};
void CUDA_CB count0(void*) {
  g_calls[0]++;
}
void CUDA_CB count1(void*) {
  g_calls[1]++;
}
void CUDA_CB count2(void*) {
  g_calls[2]++;
}
// Holds its stream until the main thread opens the gate (no timing: the test asserts what is
// pending while it is shut).
void CUDA_CB gate(void*) {
  while (!g_open.load()) {
  }
}

// A producer graph (memset a, increment a, host node, record ev) and a consumer graph (wait ev,
// copy a to b), launched on two streams while the producer's stream is held: the record is
// pending from the launch on, the consumer waits for it, both run once the stream goes on.
// Then the executable graphs' host node and events are changed, a kernel node disabled, and the
// nodes' parameters queried.
int events_hosts() {
  Setup s = setup();
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  CUdeviceptr a{}, b{};
  CHECK(cuMemAlloc(&a, kBytes));
  CHECK(cuMemAlloc(&b, kBytes));
  CHECK(cuMemsetD32(b, 0, kElements));
  // The memset runs on the NULL stream, which the non-blocking streams below do not wait for:
  // without this the consumer's copy into `b` could run before it.
  CHECK(cuCtxSynchronize());
  CUevent ev{}, ev2{};
  CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&ev2, CU_EVENT_DISABLE_TIMING));

  CUgraph producer{}, consumer{};
  CHECK(cuGraphCreate(&producer, 0));
  CHECK(cuGraphCreate(&consumer, 0));
  const CUgraphNode set_a = memset_node(producer, a, kSetA, s.ctx, {});
  const CUgraphNode inc = increment_node(producer, increment, &a, {set_a});
  CUDA_HOST_NODE_PARAMS host{count0, nullptr};
  CUgraphNode host_node{}, record{}, wait{};
  CHECK(cuGraphAddHostNode(&host_node, producer, &inc, 1, &host));
  CHECK(cuGraphAddEventRecordNode(&record, producer, &host_node, 1, ev));
  CHECK(cuGraphAddEventWaitNode(&wait, consumer, nullptr, 0, ev));
  copy_node(consumer, b, a, s.ctx, {wait});
  EXPECT(cuGraphAddEventRecordNode(&record, producer, nullptr, 0, nullptr),
         CUDA_ERROR_INVALID_VALUE);
  CUDA_HOST_NODE_PARAMS no_fn{nullptr, nullptr};
  EXPECT(cuGraphAddHostNode(&host_node, producer, nullptr, 0, &no_fn), CUDA_ERROR_INVALID_VALUE);

  CUevent got{};
  CHECK(cuGraphEventRecordNodeGetEvent(record, &got));
  if (got != ev) return fail("the record node's event is not the one it was given");
  CHECK(cuGraphEventWaitNodeGetEvent(wait, &got));
  if (got != ev) return fail("the wait node's event is not the one it was given");
  EXPECT(cuGraphEventRecordNodeGetEvent(wait, &got), CUDA_ERROR_INVALID_VALUE);
  CUDA_HOST_NODE_PARAMS got_host{};
  CHECK(cuGraphHostNodeGetParams(host_node, &got_host));
  if (got_host.fn != count0) return fail("the host node's function is not the one it was given");
  EXPECT(cuGraphHostNodeGetParams(record, &got_host), CUDA_ERROR_INVALID_VALUE);
  CUgraphNodeType type{};
  CHECK(cuGraphNodeGetType(record, &type));
  if (type != CU_GRAPH_NODE_TYPE_EVENT_RECORD) return fail("the record node's type");

  CUgraphExec px{}, cx{};
  CHECK(cuGraphInstantiateWithFlags(&px, producer, 0));
  CHECK(cuGraphInstantiateWithFlags(&cx, consumer, 0));
  // The producer's stream is held: its record is pending from the launch on.
  CHECK(cuLaunchHostFunc(s.s1, gate, nullptr));
  CHECK(cuGraphLaunch(px, s.s1));
  EXPECT(cuEventQuery(ev), CUDA_ERROR_NOT_READY);
  CHECK(cuGraphLaunch(cx, s.s2));
  EXPECT(cuStreamQuery(s.s2), CUDA_ERROR_NOT_READY);
  g_open = true;
  CHECK(cuStreamSynchronize(s.s2));
  CHECK(cuStreamSynchronize(s.s1));
  if (!all_equal(b, kSetA + 1, "the consumer's copy")) return 1;
  if (g_calls[0] != 1) return fail("the host node did not run once");
  for (int i = 0; i < 3; ++i) {
    CHECK(cuGraphLaunch(px, s.s1));
    CHECK(cuGraphLaunch(cx, s.s2));
    // The next producer sets `a` again: nothing else keeps it from overwriting what this
    // consumer still copies.
    CHECK(cuStreamSynchronize(s.s2));
  }
  CHECK(cuCtxSynchronize());
  if (g_calls[0] != 4) return fail("the host node did not run at every replay");

  // The node's own parameters change only graphs instantiated later; the executable graph's
  // change its launches.
  CUDA_HOST_NODE_PARAMS one{count1, nullptr}, two{count2, nullptr};
  CHECK(cuGraphHostNodeSetParams(host_node, &two));
  CHECK(cuGraphHostNodeGetParams(host_node, &got_host));
  if (got_host.fn != count2) return fail("the host node kept its old function");
  CHECK(cuGraphExecHostNodeSetParams(px, host_node, &one));
  CHECK(cuGraphExecEventRecordNodeSetEvent(px, record, ev2));
  CHECK(cuGraphExecEventWaitNodeSetEvent(cx, wait, ev2));
  EXPECT(cuGraphExecEventRecordNodeSetEvent(px, host_node, ev2), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGraphNodeSetEnabled(px, inc, 0));
  unsigned enabled = 1;
  CHECK(cuGraphNodeGetEnabled(px, inc, &enabled));
  if (enabled != 0) return fail("the kernel node is not disabled");
  EXPECT(cuGraphNodeSetEnabled(px, host_node, 0), CUDA_ERROR_INVALID_VALUE);
  g_open = false;
  CHECK(cuLaunchHostFunc(s.s1, gate, nullptr));
  CHECK(cuGraphLaunch(px, s.s1));
  EXPECT(cuEventQuery(ev2), CUDA_ERROR_NOT_READY);
  CHECK(cuGraphLaunch(cx, s.s2));
  g_open = true;
  CHECK(cuCtxSynchronize());
  if (!all_equal(b, kSetA, "the copy after the kernel node was disabled")) return 1;
  if (g_calls[0] != 4 || g_calls[1] != 1 || g_calls[2] != 0) {
    return fail("the executable graph's host node did not take the new function");
  }
  CUgraphExec later{};
  CHECK(cuGraphInstantiateWithFlags(&later, producer, 0));
  CHECK(cuGraphLaunch(later, s.s1));
  CHECK(cuStreamSynchronize(s.s1));
  if (g_calls[2] != 1) return fail("a graph instantiated later did not take the node's function");

  for (CUgraphExec e : {px, cx, later}) CHECK(cuGraphExecDestroy(e));
  for (CUgraph g : {producer, consumer}) CHECK(cuGraphDestroy(g));
  std::printf("PASS events_hosts\n");
  return 0;
}

// Graph memory: an allocation node, a memset into it, a copy out, a free node; the address is
// the same at every launch. A graph that does not free its memory can be launched again once the
// memory was freed. What a graph with memory nodes may not do is refused as the driver refuses.
int memory() {
  Setup s = setup();
  CUdeviceptr out{};
  CHECK(cuMemAlloc(&out, kBytes));
  CUgraph g{};
  CHECK(cuGraphCreate(&g, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS alloc{};
  alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  alloc.poolProps.location.id = 0;
  alloc.bytesize = kBytes;
  CUgraphNode alloc_node{}, free_node{};
  CHECK(cuGraphAddMemAllocNode(&alloc_node, g, nullptr, 0, &alloc));
  if (alloc.dptr == 0) return fail("the allocation node gave no address");
  const CUgraphNode set = memset_node(g, alloc.dptr, kSetA, s.ctx, {alloc_node});
  const CUgraphNode copy = copy_node(g, out, alloc.dptr, s.ctx, {set});
  CHECK(cuGraphAddMemFreeNode(&free_node, g, &copy, 1, alloc.dptr));
  CUDA_MEM_ALLOC_NODE_PARAMS got{};
  CHECK(cuGraphMemAllocNodeGetParams(alloc_node, &got));
  if (got.dptr != alloc.dptr || got.bytesize != kBytes) return fail("the allocation's parameters");
  CUdeviceptr freed{};
  CHECK(cuGraphMemFreeNodeGetParams(free_node, &freed));
  if (freed != alloc.dptr) return fail("the free node's address");
  EXPECT(cuGraphAddMemFreeNode(&free_node, g, nullptr, 0, out), CUDA_ERROR_INVALID_VALUE);
  CUgraph clone{};
  EXPECT(cuGraphClone(&clone, g), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT(cuGraphDestroyNode(copy), CUDA_ERROR_NOT_SUPPORTED);
  EXPECT(cuGraphRemoveDependencies(g, &set, &copy, nullptr, 1), CUDA_ERROR_NOT_SUPPORTED);
  CUgraphExec exec{}, second{};
  CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
  EXPECT(cuGraphInstantiateWithFlags(&second, g, 0), CUDA_ERROR_NOT_SUPPORTED);
  for (int i = 0; i < 3; ++i) {
    CHECK(cuMemsetD32Async(out, 0, kElements, s.s1));
    CHECK(cuGraphLaunch(exec, s.s1));
    CHECK(cuStreamSynchronize(s.s1));
    if (!all_equal(out, kSetA, "the copy out of graph memory")) return 1;
  }
  cuuint64_t used = 0;
  CHECK(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &used));
  if (used < kBytes) return fail("the GPU's graph memory does not count the allocation");
  cuuint64_t five = 5, zero = 0;
  EXPECT(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &five),
         CUDA_ERROR_INVALID_VALUE);
  CHECK(cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero));

  // Allocated by the graph, freed outside it, allocated again by its next launch.
  CUgraph keeps{};
  CHECK(cuGraphCreate(&keeps, 0));
  CUDA_MEM_ALLOC_NODE_PARAMS kept = alloc;
  kept.dptr = 0;
  CUgraphNode kept_node{};
  CHECK(cuGraphAddMemAllocNode(&kept_node, keeps, nullptr, 0, &kept));
  memset_node(keeps, kept.dptr, kSetA + 1, s.ctx, {kept_node});
  CUgraphExec kx{};
  CHECK(cuGraphInstantiateWithFlags(&kx, keeps, 0));
  for (int i = 0; i < 2; ++i) {
    CHECK(cuGraphLaunch(kx, s.s1));
    CHECK(cuStreamSynchronize(s.s1));
    if (!all_equal(kept.dptr, kSetA + 1, "graph memory after the graph ran")) return 1;
    CHECK(cuMemFreeAsync(kept.dptr, s.s1));
    CHECK(cuStreamSynchronize(s.s1));
  }
  // More than any GPU holds: the driver's answer.
  CUDA_MEM_ALLOC_NODE_PARAMS huge = alloc;
  huge.bytesize = std::size_t{1} << 50;
  EXPECT(cuGraphAddMemAllocNode(&kept_node, keeps, nullptr, 0, &huge), CUDA_ERROR_OUT_OF_MEMORY);
  CUDA_MEM_ALLOC_NODE_PARAMS none = alloc;
  none.bytesize = 0;
  EXPECT(cuGraphAddMemAllocNode(&kept_node, keeps, nullptr, 0, &none), CUDA_ERROR_INVALID_VALUE);

  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphExecDestroy(kx));
  CHECK(cuGraphDestroy(g));
  CHECK(cuGraphDestroy(keeps));
  CHECK(cuDeviceGraphMemTrim(0));
  std::printf("PASS memory\n");
  return 0;
}

// A graph changed by hand: a node destroyed, an edge removed and put back, a clone whose host
// node is changed alone, nodes added in the generic form.
int shape() {
  Setup s = setup();
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  CUdeviceptr a{};
  CHECK(cuMemAlloc(&a, kBytes));
  CUgraph g{};
  CHECK(cuGraphCreate(&g, 0));
  const CUgraphNode set = memset_node(g, a, kSetA, s.ctx, {});
  const CUgraphNode inc = increment_node(g, increment, &a, {set});
  CUDA_HOST_NODE_PARAMS host{count0, nullptr};
  CUgraphNode h1{}, h2{};
  CHECK(cuGraphAddHostNode(&h1, g, &inc, 1, &host));
  CHECK(cuGraphAddHostNode(&h2, g, &inc, 1, &host));
  CHECK(cuGraphDestroyNode(h2));
  EXPECT(cuGraphHostNodeGetParams(h2, &host), CUDA_ERROR_INVALID_HANDLE);
  EXPECT(cuGraphRemoveDependencies(g, &inc, &set, nullptr, 1),
         CUDA_ERROR_INVALID_VALUE);  // no such edge
  CHECK(cuGraphRemoveDependencies(g, &set, &inc, nullptr, 1));
  std::size_t edges = 0;
  CHECK(cuGraphGetEdges(g, nullptr, nullptr, nullptr, &edges));
  if (edges != 1) return fail("the edge was not removed");
  CHECK(cuGraphAddDependencies(g, &set, &inc, nullptr, 1));
  std::size_t nodes = 0;
  CHECK(cuGraphGetNodes(g, nullptr, &nodes));
  if (nodes != 3) return fail("the destroyed node is still in the graph");

  CUgraph clone{};
  CHECK(cuGraphClone(&clone, g));
  CUgraphNode h1_clone{};
  CHECK(cuGraphNodeFindInClone(&h1_clone, h1, clone));
  CUDA_HOST_NODE_PARAMS got{};
  CHECK(cuGraphHostNodeGetParams(h1_clone, &got));
  if (got.fn != count0) return fail("the clone's host node does not have the original's function");
  CUDA_HOST_NODE_PARAMS one{count1, nullptr};
  CHECK(cuGraphHostNodeSetParams(h1_clone, &one));
  CUgraphNode other{};
  EXPECT(cuGraphNodeFindInClone(&other, h1_clone, g), CUDA_ERROR_INVALID_VALUE);

  // The generic form: a host node and an event record node after it.
  CUevent ev{};
  CHECK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CUgraphNodeParams hp{};
  hp.type = CU_GRAPH_NODE_TYPE_HOST;
  hp.host.fn = count2;
  CUgraphNode gh{}, ge{};
  CHECK(cuGraphAddNode(&gh, clone, &h1_clone, nullptr, 1, &hp));
  CUgraphNodeParams rp{};
  rp.type = CU_GRAPH_NODE_TYPE_EVENT_RECORD;
  rp.eventRecord.event = ev;
  CHECK(cuGraphAddNode(&ge, clone, &gh, nullptr, 1, &rp));

  // The kernel, memset and memcpy nodes' own parameters.
  CUDA_KERNEL_NODE_PARAMS kq{};
  CHECK(cuGraphKernelNodeGetParams(inc, &kq));
  if (kq.func != increment || kq.gridDimX != (kElements + 255) / 256 || kq.blockDimX != 256 ||
      kq.kernelParams == nullptr || *static_cast<CUdeviceptr*>(kq.kernelParams[0]) != a ||
      *static_cast<int*>(kq.kernelParams[1]) != kElements) {
    return fail("the kernel node's parameters");
  }
  CUDA_MEMSET_NODE_PARAMS mq{};
  CHECK(cuGraphMemsetNodeGetParams(set, &mq));
  if (mq.dst != a || mq.value != kSetA || mq.width != kElements) return fail("the memset node's");
  EXPECT(cuGraphKernelNodeGetParams(set, &kq), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuGraphMemcpyNodeGetParams(set, nullptr), CUDA_ERROR_INVALID_VALUE);

  CUgraphExec gx{}, cx{};
  CHECK(cuGraphInstantiateWithFlags(&gx, g, 0));
  CHECK(cuGraphInstantiateWithFlags(&cx, clone, 0));
  CHECK(cuGraphLaunch(gx, s.s1));
  CHECK(cuGraphLaunch(cx, s.s1));
  CHECK(cuStreamSynchronize(s.s1));
  CHECK(cuEventSynchronize(ev));
  if (!all_equal(a, kSetA + 1, "the clone's result")) return 1;
  if (g_calls[0] != 1 || g_calls[1] != 1 || g_calls[2] != 1) {
    return fail("each host node should have run once (original, clone, generic)");
  }
  for (CUgraphExec e : {gx, cx}) CHECK(cuGraphExecDestroy(e));
  for (CUgraph graph : {g, clone}) CHECK(cuGraphDestroy(graph));
  std::printf("PASS shape\n");
  return 0;
}

// A kernel node's own parameters changed (later instantiations run them, earlier ones keep theirs)
// and an executable graph's changed through the generic form; then memset and memcpy nodes'; the
// largest cluster the kernel may use.
int kernel_params() {
  Setup s = setup();
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  CUdeviceptr a{}, b{};
  CHECK(cuMemAlloc(&a, kBytes));
  CHECK(cuMemAlloc(&b, kBytes));
  CHECK(cuMemsetD32(a, 10, kElements));
  CHECK(cuMemsetD32(b, 20, kElements));
  CHECK(cuCtxSynchronize());  // a memset of device memory may still run; the streams do not wait
  CUgraph g{};
  CHECK(cuGraphCreate(&g, 0));
  const CUgraphNode inc = increment_node(g, increment, &a, {});
  CUgraphExec before{};
  CHECK(cuGraphInstantiateWithFlags(&before, g, 0));
  static int n = kElements;
  void* on_b[] = {&b, &n};
  CUDA_KERNEL_NODE_PARAMS k{};
  k.func = increment;
  k.gridDimX = (kElements + 255) / 256;
  k.gridDimY = k.gridDimZ = 1;
  k.blockDimX = 256;
  k.blockDimY = k.blockDimZ = 1;
  k.kernelParams = on_b;
  CHECK(cuGraphKernelNodeSetParams(inc, &k));
  CUDA_KERNEL_NODE_PARAMS kq{};
  CHECK(cuGraphKernelNodeGetParams(inc, &kq));
  if (*static_cast<CUdeviceptr*>(kq.kernelParams[0]) != b) return fail("the node kept a");
  CUgraphExec after{};
  CHECK(cuGraphInstantiateWithFlags(&after, g, 0));
  CHECK(cuGraphLaunch(before, s.s1));  // a + 1
  CHECK(cuStreamSynchronize(s.s1));
  if (!all_equal(a, 11, "the graph instantiated before") || !all_equal(b, 20, "b before")) return 1;
  CHECK(cuGraphLaunch(after, s.s1));  // b + 1
  CHECK(cuStreamSynchronize(s.s1));
  if (!all_equal(a, 11, "a after") || !all_equal(b, 21, "the graph instantiated after")) return 1;
  // The generic form on the executable graph made before: back to a.
  void* on_a[] = {&a, &n};
  CUgraphNodeParams gp{};
  gp.type = CU_GRAPH_NODE_TYPE_KERNEL;
  gp.kernel.func = increment;
  gp.kernel.gridDimX = k.gridDimX;
  gp.kernel.gridDimY = gp.kernel.gridDimZ = 1;
  gp.kernel.blockDimX = 256;
  gp.kernel.blockDimY = gp.kernel.blockDimZ = 1;
  gp.kernel.kernelParams = on_a;
  CHECK(cuGraphExecNodeSetParams(after, inc, &gp));
  CHECK(cuGraphLaunch(after, s.s1));
  CHECK(cuStreamSynchronize(s.s1));
  if (!all_equal(a, 12, "the generic setter's kernel")) return 1;
  CUgraphNodeParams unsupported{};
  unsupported.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  EXPECT(cuGraphNodeSetParams(inc, &unsupported), CUDA_ERROR_NOT_SUPPORTED);

  // Memset and memcpy nodes: the graph's own (later instantiations) and an executable graph's.
  CUgraph m{};
  CHECK(cuGraphCreate(&m, 0));
  const CUgraphNode fill = memset_node(m, a, 1, s.ctx, {});
  const CUgraphNode copy = copy_node(m, b, a, s.ctx, {fill});
  CUgraphExec mx{};
  CHECK(cuGraphInstantiateWithFlags(&mx, m, 0));
  CUDA_MEMSET_NODE_PARAMS two{};
  two.dst = a;
  two.value = 2;
  two.elementSize = sizeof(unsigned);
  two.width = kElements;
  two.height = 1;
  CHECK(cuGraphMemsetNodeSetParams(fill, &two));
  CUDA_MEMSET_NODE_PARAMS got{};
  CHECK(cuGraphMemsetNodeGetParams(fill, &got));
  if (got.value != 2) return fail("the memset node kept its value");
  CHECK(cuGraphLaunch(mx, s.s1));  // made before: a = 1, b = a
  CHECK(cuStreamSynchronize(s.s1));
  if (!all_equal(b, 1, "the memset graph instantiated before")) return 1;
  CUgraphExec my{};
  CHECK(cuGraphInstantiateWithFlags(&my, m, 0));
  CHECK(cuGraphLaunch(my, s.s1));  // made after: a = 2, b = a
  CHECK(cuStreamSynchronize(s.s1));
  if (!all_equal(b, 2, "the memset graph instantiated after")) return 1;
  CUDA_MEMSET_NODE_PARAMS three = two;
  three.value = 3;
  CHECK(cuGraphExecMemsetNodeSetParams(mx, fill, &three, s.ctx));
  CUDA_MEMCPY3D back{};
  back.srcMemoryType = back.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  back.srcDevice = a;
  back.dstDevice = a;  // a copy onto itself: b keeps what it had
  back.WidthInBytes = kBytes;
  back.Height = back.Depth = 1;
  CHECK(cuGraphExecMemcpyNodeSetParams(mx, copy, &back, s.ctx));
  CHECK(cuGraphLaunch(mx, s.s1));
  CHECK(cuStreamSynchronize(s.s1));
  if (!all_equal(a, 3, "the executable graph's new memset") ||
      !all_equal(b, 2, "the executable graph's new copy")) {
    return 1;
  }
  EXPECT(cuGraphExecMemsetNodeSetParams(mx, copy, &three, s.ctx), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGraphExecDestroy(mx));
  CHECK(cuGraphExecDestroy(my));
  CHECK(cuGraphDestroy(m));

  // The largest cluster: the server driver's answer (8 portable; 16 once allowed on the test
  // driver, as on an H100 or H200).
  CUlaunchConfig config{};
  config.gridDimX = 16;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 256;
  config.blockDimY = config.blockDimZ = 1;
  int cluster = 0;
  CHECK(cuOccupancyMaxPotentialClusterSize(&cluster, increment, &config));
  if (cluster != 8) return fail("the portable cluster size");
  CHECK(cuFuncSetAttribute(increment, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1));
  CHECK(cuOccupancyMaxPotentialClusterSize(&cluster, increment, &config));
  if (cluster != 16) return fail("the non-portable cluster size");
  CHECK(cuGraphExecDestroy(before));
  CHECK(cuGraphExecDestroy(after));
  CHECK(cuGraphDestroy(g));
  std::printf("PASS kernel_params\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "events_hosts") return events_hosts();
  if (mode == "memory") return memory();
  if (mode == "shape") return shape();
  if (mode == "kernel_params") return kernel_params();
  std::printf("FAIL unknown mode '%s' (events_hosts, memory, shape, kernel_params)\n",
              mode.c_str());
  return 2;
}
