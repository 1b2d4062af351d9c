// Conditional and batch memory operation nodes, kernel node attributes, user objects, the JIT
// linker and the driver's smaller queries through the whole path: run under
// LD_PRELOAD=libmpsshim.so against mpsshimd and the test driver by tests/e2e/control_test.cpp.
// Each mode prints one PASS or FAIL line.
#include <cuda.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "client_check.hpp"

namespace {

constexpr char kModuleImage[] = "// mpsshim e2e control module\n.version 8.0\n.target sm_90\n";

struct Setup {
  CUcontext ctx{};
  CUmodule module{};
  CUstream stream{};
};

Setup setup() {
  Setup s;
  CUdevice device{};
  CHECK(cuInit(0));
  CHECK(cuDeviceGet(&device, 0));
  CHECK(cuDevicePrimaryCtxRetain(&s.ctx, device));
  CHECK(cuCtxSetCurrent(s.ctx));
  CHECK(cuModuleLoadData(&s.module, kModuleImage));
  CHECK(cuStreamCreate(&s.stream, CU_STREAM_NON_BLOCKING));
  return s;
}

int read_int(CUdeviceptr p) {
  int v = 0;
  CHECK(cuMemcpyDtoH(&v, p, sizeof v));
  return v;
}

CUgraphNode kernel_node(CUgraph g, CUfunction f, void** args, std::vector<CUgraphNode> deps = {}) {
  CUDA_KERNEL_NODE_PARAMS k{};
  k.func = f;
  k.gridDimX = k.gridDimY = k.gridDimZ = 1;
  k.blockDimX = 32;
  k.blockDimY = k.blockDimZ = 1;
  k.kernelParams = args;
  CUgraphNode node{};
  CHECK(cuGraphAddKernelNode(&node, g, deps.data(), deps.size(), &k));
  return node;
}

CUgraphNode set_int_node(CUgraph g, CUdeviceptr p, unsigned value, CUcontext ctx,
                         std::vector<CUgraphNode> deps = {}) {
  CUDA_MEMSET_NODE_PARAMS m{};
  m.dst = p;
  m.value = value;
  m.elementSize = 4;
  m.width = 1;
  m.height = 1;
  CUgraphNode node{};
  CHECK(cuGraphAddMemsetNode(&node, g, deps.data(), deps.size(), &m, ctx));
  return node;
}

// A conditional node of `type` with `size` bodies, after `deps`; the bodies come back.
CUgraphNode conditional_node(CUgraph g, CUgraphConditionalHandle h, CUgraphConditionalNodeType type,
                             unsigned size, std::vector<CUgraphNode> deps,
                             std::vector<CUgraph>& bodies) {
  CUgraphNodeParams p{};
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = type;
  p.conditional.size = size;
  CUgraphNode node{};
  CHECK(cuGraphAddNode(&node, g, deps.data(), nullptr, deps.size(), &p));
  bodies.assign(p.conditional.phGraph_out, p.conditional.phGraph_out + size);
  return node;
}

// A while loop counts down from 3, adding one to `data` each time round; an if/else takes its
// else branch; a switch takes body 2. Graphs with conditional nodes refuse what the driver
// refuses.
int conditional() {
  Setup s = setup();
  CUfunction increment{}, countdown{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  CHECK(cuModuleGetFunction(&countdown, s.module, "countdown"));
  CUdeviceptr data{}, counter{}, x{}, y{};
  for (CUdeviceptr* p : {&data, &counter, &x, &y}) {
    CHECK(cuMemAlloc(p, sizeof(int)));
    CHECK(cuMemsetD32(*p, 0, 1));
  }
  CHECK(cuCtxSynchronize());
  CUgraph g{};
  CHECK(cuGraphCreate(&g, 0));
  CUgraphConditionalHandle loop{}, choose{}, pick{};
  CHECK(cuGraphConditionalHandleCreate(&loop, g, s.ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT));
  CHECK(cuGraphConditionalHandleCreate(&choose, g, s.ctx, 0, CU_GRAPH_COND_ASSIGN_DEFAULT));
  CHECK(cuGraphConditionalHandleCreate(&pick, g, s.ctx, 2, CU_GRAPH_COND_ASSIGN_DEFAULT));
  const CUgraphNode start = set_int_node(g, counter, 3, s.ctx);
  std::vector<CUgraph> body;
  conditional_node(g, loop, CU_GRAPH_COND_TYPE_WHILE, 1, {start}, body);
  int n = 1;
  void* inc_args[] = {&data, &n};
  void* count_args[] = {&loop, &counter};
  const CUgraphNode step = kernel_node(body[0], increment, inc_args);
  kernel_node(body[0], countdown, count_args, {step});
  std::vector<CUgraph> branches;
  conditional_node(g, choose, CU_GRAPH_COND_TYPE_IF, 2, {}, branches);
  set_int_node(branches[0], x, 1, s.ctx);
  set_int_node(branches[1], x, 2, s.ctx);
  std::vector<CUgraph> cases;
  conditional_node(g, pick, CU_GRAPH_COND_TYPE_SWITCH, 3, {}, cases);
  for (unsigned i = 0; i < 3; ++i) set_int_node(cases[i], y, 10 + i, s.ctx);
  EXPECT(cuGraphDestroy(body[0]), CUDA_ERROR_INVALID_VALUE);  // the node's, not the caller's

  // Another graph's handle is not this graph's.
  CUgraph other{};
  CHECK(cuGraphCreate(&other, 0));
  CUgraphConditionalHandle foreign{};
  CHECK(cuGraphConditionalHandleCreate(&foreign, other, s.ctx, 0, 0));
  CUgraphNodeParams wrong{};
  wrong.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  wrong.conditional.handle = foreign;
  wrong.conditional.type = CU_GRAPH_COND_TYPE_IF;
  wrong.conditional.size = 1;
  CUgraphNode refused{};
  EXPECT(cuGraphAddNode(&refused, g, nullptr, nullptr, 0, &wrong), CUDA_ERROR_INVALID_VALUE);

  CUgraphExec exec{};
  CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
  for (int launch = 0; launch < 2; ++launch) CHECK(cuGraphLaunch(exec, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (read_int(data) != 6) return fail("the while loop ran 3 times per launch");
  if (read_int(counter) != 0) return fail("the countdown ended at 0");
  if (read_int(x) != 2) return fail("the if node took its else branch");
  if (read_int(y) != 12) return fail("the switch node took body 2");
  CUgraph clone{};
  EXPECT(cuGraphClone(&clone, g), CUDA_ERROR_NOT_SUPPORTED);
  CUgraphExec second{};
  EXPECT(cuGraphInstantiateWithFlags(&second, g, 0), CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuGraphExecDestroy(exec));
  CHECK(cuGraphDestroy(g));
  CHECK(cuGraphDestroy(other));
  std::printf("PASS conditional\n");
  return 0;
}

CUstreamBatchMemOpParams write_op(CUdeviceptr at, unsigned value) {
  CUstreamBatchMemOpParams op{};
  op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op.writeValue.address = at;
  op.writeValue.value = value;
  return op;
}

// A batch memory operation node writes a flag and waits on it; its operations read back as
// given; an executable graph's and the node's own take new ones; memory not the client's is
// refused. Kernel node attributes: set, read back, copied to another node.
int batch_and_attributes() {
  Setup s = setup();
  CUdeviceptr flag{};
  CHECK(cuMemAlloc(&flag, 8));
  CHECK(cuMemsetD32(flag, 0, 2));
  CHECK(cuCtxSynchronize());
  CUgraph g{};
  CHECK(cuGraphCreate(&g, 0));
  CUstreamBatchMemOpParams ops[2] = {write_op(flag, 7), {}};
  ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[1].waitValue.address = flag;
  ops[1].waitValue.value = 7;
  ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  CUDA_BATCH_MEM_OP_NODE_PARAMS p{s.ctx, 2, ops, 0};
  CUgraphNode node{};
  CHECK(cuGraphAddBatchMemOpNode(&node, g, nullptr, 0, &p));
  CUDA_BATCH_MEM_OP_NODE_PARAMS got{};
  CHECK(cuGraphBatchMemOpNodeGetParams(node, &got));
  if (got.count != 2 || got.paramArray[0].writeValue.value != 7) {
    return fail("the node's operations read back");
  }
  CUgraphExec exec{};
  CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
  CHECK(cuGraphLaunch(exec, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (read_int(flag) != 7) return fail("the batch node wrote 7");
  CUstreamBatchMemOpParams nine = write_op(flag, 9);
  CUDA_BATCH_MEM_OP_NODE_PARAMS q{s.ctx, 1, &nine, 0};
  CHECK(cuGraphExecBatchMemOpNodeSetParams(exec, node, &q));
  CHECK(cuGraphLaunch(exec, s.stream));
  CHECK(cuStreamSynchronize(s.stream));
  if (read_int(flag) != 9) return fail("the executable graph's new operation");
  CHECK(cuGraphBatchMemOpNodeGetParams(node, &got));
  if (got.count != 2) return fail("the node kept its own operations");
  int on_stack = 0;
  CUstreamBatchMemOpParams wild = write_op(reinterpret_cast<CUdeviceptr>(&on_stack), 1);
  CUDA_BATCH_MEM_OP_NODE_PARAMS bad{s.ctx, 1, &wild, 0};
  CUgraphNode refused{};
  EXPECT(cuGraphAddBatchMemOpNode(&refused, g, nullptr, 0, &bad), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuGraphExecDestroy(exec));

  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  int n = 1;
  void* args[] = {&flag, &n};
  const CUgraphNode a = kernel_node(g, increment, args);
  const CUgraphNode b = kernel_node(g, increment, args);
  CUkernelNodeAttrValue v{};
  v.priority = -1;
  CHECK(cuGraphKernelNodeSetAttribute(a, CU_LAUNCH_ATTRIBUTE_PRIORITY, &v));
  v = {};
  v.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
  CHECK(cuGraphKernelNodeSetAttribute(a, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &v));
  CUkernelNodeAttrValue read{};
  CHECK(cuGraphKernelNodeGetAttribute(a, CU_LAUNCH_ATTRIBUTE_PRIORITY, &read));
  if (read.priority != -1) return fail("the priority read back");
  CHECK(cuGraphKernelNodeCopyAttributes(b, a));
  read = {};
  CHECK(cuGraphKernelNodeGetAttribute(b, CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN, &read));
  if (read.memSyncDomain != CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE) return fail("the copied domain");
  CHECK(cuGraphKernelNodeGetAttribute(b, CU_LAUNCH_ATTRIBUTE_PRIORITY, &read));
  if (read.priority != -1) return fail("the copied priority");
  EXPECT(cuGraphKernelNodeGetAttribute(node, CU_LAUNCH_ATTRIBUTE_PRIORITY, &read),
         CUDA_ERROR_INVALID_VALUE);  // not a kernel node
  CHECK(cuGraphDestroy(g));
  std::printf("PASS batch_and_attributes\n");
  return 0;
}

// Destructors run on a thread of the shim's: the test waits for them on a condition variable.
struct Destroyed {
  std::mutex mutex;
  std::condition_variable cv;
  int count = 0;
};
Destroyed destroyed;

void CUDA_CB on_destroy(void*) {
  std::lock_guard lock(destroyed.mutex);
  ++destroyed.count;
  destroyed.cv.notify_all();
}

bool destroyed_reaches(int count) {
  std::unique_lock lock(destroyed.mutex);
  return destroyed.cv.wait_for(lock, std::chrono::seconds(10),
                               [&] { return destroyed.count >= count; });
}

int destroyed_now() {
  std::lock_guard lock(destroyed.mutex);
  return destroyed.count;
}

// A user object lives while the program, a graph or an executable graph holds it; the last to
// let go runs its destructor, after the executable graph's last launch.
int user_objects() {
  Setup s = setup();
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, s.module, "increment_i32"));
  CUdeviceptr data{};
  CHECK(cuMemAlloc(&data, sizeof(int)));
  CUuserObject object{};
  EXPECT(cuUserObjectCreate(&object, nullptr, on_destroy, 1, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuUserObjectCreate(&object, nullptr, on_destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  CUgraph g{};
  CHECK(cuGraphCreate(&g, 0));
  int n = 1;
  void* args[] = {&data, &n};
  kernel_node(g, increment, args);
  CHECK(cuGraphRetainUserObject(g, object, 1, 0));
  CHECK(cuUserObjectRelease(object, 1));  // the graph still holds it
  CUgraphExec exec{};
  CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
  CHECK(cuGraphDestroy(g));  // the executable graph still holds it
  CHECK(cuGraphLaunch(exec, s.stream));
  if (destroyed_now() != 0) return fail("destroyed while an executable graph held it");
  CHECK(cuGraphExecDestroy(exec));
  if (!destroyed_reaches(1)) return fail("destroyed after the last launch");
  CHECK(cuStreamSynchronize(s.stream));

  // References moved into a graph go with it.
  CUuserObject moved{};
  CHECK(cuUserObjectCreate(&moved, nullptr, on_destroy, 2, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  CUgraph h{};
  CHECK(cuGraphCreate(&h, 0));
  CHECK(cuGraphRetainUserObject(h, moved, 2, CU_GRAPH_USER_OBJECT_MOVE));
  CUgraph copy{};
  CHECK(cuGraphClone(&copy, h));  // the clone holds its own references
  CHECK(cuGraphReleaseUserObject(h, moved, 2));
  if (destroyed_now() != 1) return fail("destroyed while a clone held it");
  CHECK(cuGraphDestroy(copy));
  if (!destroyed_reaches(2)) return fail("destroyed with the clone");
  CHECK(cuGraphDestroy(h));
  EXPECT(cuUserObjectRetain(moved, 1), CUDA_ERROR_INVALID_VALUE);  // gone
  // Releasing more than is held succeeds and destroys, as the driver answers.
  CUuserObject over{};
  CHECK(cuUserObjectCreate(&over, nullptr, on_destroy, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  CHECK(cuUserObjectRelease(over, 5));
  if (!destroyed_reaches(3)) return fail("destroyed by a release of more than it held");
  std::printf("PASS user_objects\n");
  return 0;
}

// Links inputs (data and a file) with log buffers and the wall time; a bad input fails with its
// reason in the error log; the linked image loads and its kernel runs.
int link() {
  Setup s = setup();
  char info[1024] = {}, error[1024] = {};
  CUjit_option options[] = {CU_JIT_INFO_LOG_BUFFER,  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_WALL_TIME,        CU_JIT_OPTIMIZATION_LEVEL};
  void* values[] = {info,    reinterpret_cast<void*>(std::uintptr_t{sizeof info}),
                    error,   reinterpret_cast<void*>(std::uintptr_t{sizeof error}),
                    nullptr, reinterpret_cast<void*>(std::uintptr_t{3})};
  CUlinkState link{};
  CHECK(cuLinkCreate(6, options, values, &link));
  std::string ptx = ".version 8.0\n.target sm_90\n// caller.ptx\n";
  CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, ptx.data(), ptx.size(), "caller.ptx", 0, nullptr,
                      nullptr));
  if (std::strstr(info, "caller.ptx") == nullptr) return fail("the info log names the input");
  float wall = 0;
  std::memcpy(&wall, &values[4], sizeof wall);
  if (!(wall > 0)) return fail("the wall time arrived");
  char path[] = "/tmp/mpsshim-link-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return fail("a temporary file");
  const std::string callee = ".version 8.0\n.target sm_90\n// callee.ptx\n";
  if (::write(fd, callee.data(), callee.size()) != static_cast<ssize_t>(callee.size())) {
    return fail("writing the temporary file");
  }
  ::close(fd);
  CHECK(cuLinkAddFile(link, CU_JIT_INPUT_PTX, path, 0, nullptr, nullptr));
  ::unlink(path);
  EXPECT(cuLinkAddFile(link, CU_JIT_INPUT_PTX, "/nonexistent/x.ptx", 0, nullptr, nullptr),
         CUDA_ERROR_FILE_NOT_FOUND);
  const std::string broken = ".version 8.0\nsyntax error\n";
  EXPECT(cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(broken.data()), broken.size(),
                       "broken.ptx", 0, nullptr, nullptr),
         CUDA_ERROR_INVALID_PTX);
  if (std::strstr(error, "broken.ptx") == nullptr) return fail("the error log names the input");
  void* image = nullptr;
  size_t bytes = 0;
  CHECK(cuLinkComplete(link, &image, &bytes));
  if (image == nullptr || bytes == 0) return fail("the linked image");
  CUmodule linked{};
  CHECK(cuModuleLoadData(&linked, image));
  CUfunction increment{};
  CHECK(cuModuleGetFunction(&increment, linked, "increment_i32"));
  CUdeviceptr data{};
  CHECK(cuMemAlloc(&data, sizeof(int)));
  CHECK(cuMemsetD32(data, 41, 1));
  CHECK(cuCtxSynchronize());  // the memset is asynchronous to the host; the stream does not block
  int n = 1;
  void* args[] = {&data, &n};
  CHECK(cuLaunchKernel(increment, 1, 1, 1, 32, 1, 1, 0, s.stream, args, nullptr));
  CHECK(cuStreamSynchronize(s.stream));
  if (read_int(data) != 42) return fail("the linked module's kernel ran");
  CHECK(cuLinkDestroy(link));
  EXPECT(cuLinkDestroy(link), CUDA_ERROR_INVALID_HANDLE);
  CUjit_option host_symbols[] = {CU_JIT_GLOBAL_SYMBOL_COUNT};
  void* host_values[] = {nullptr};
  CUlinkState refused{};
  EXPECT(cuLinkCreate(1, host_symbols, host_values, &refused), CUDA_ERROR_NOT_SUPPORTED);
  CHECK(cuModuleUnload(linked));
  std::printf("PASS link\n");
  return 0;
}

// The smaller queries and settings reach the server's driver and answer what it answers.
int extras() {
  setup();
  const std::size_t bytes = 2u << 20;
  CUdeviceptr p{};
  CHECK(cuMemAlloc(&p, bytes));
  int fd = -1;
  CHECK(cuMemGetHandleForAddressRange(&fd, p, bytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || static_cast<std::size_t>(st.st_size) != bytes) {
    return fail("the dma-buf fd");
  }
  ::close(fd);
  EXPECT(cuMemGetHandleForAddressRange(&fd, p + bytes + (64u << 20), 4096,
                                       CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
         CUDA_ERROR_INVALID_VALUE);  // not the client's memory
  size_t width = 0;
  CHECK(cuDeviceGetTexture1DLinearMaxWidth(&width, CU_AD_FORMAT_FLOAT, 1, 0));
  if (width != (std::size_t{1} << 30)) return fail("the 1D texture width");
  CUatomicOperation ops[] = {CU_ATOMIC_OPERATION_INTEGER_ADD, CU_ATOMIC_OPERATION_FLOAT_ADD};
  unsigned caps[2] = {~0u, ~0u};
  CHECK(cuDeviceGetHostAtomicCapabilities(caps, ops, 2, 0));
  if (caps[0] != 0 || caps[1] != 0) return fail("the host atomic capabilities (none)");
  CHECK(cuDeviceGetP2PAtomicCapabilities(caps, ops, 2, 0, 1));
  if ((caps[0] & CU_ATOMIC_CAPABILITY_SIGNED) == 0 || caps[1] != 0) {
    return fail("the peer atomic capabilities");
  }
  CHECK(cuCtxResetPersistingL2Cache());
  CHECK(cuFlushGPUDirectRDMAWrites(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                                   CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER));
  EXPECT(cuFlushGPUDirectRDMAWrites(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                                    static_cast<CUflushGPUDirectRDMAWritesScope>(7)),
         CUDA_ERROR_INVALID_VALUE);
  // Synchronous memsets and copies into a marked allocation return once done.
  const unsigned one = 1, zero = 0;
  CHECK(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p + 4096));
  CHECK(cuMemsetD32(p, 0x5a5a5a5a, bytes / 4));
  unsigned first = 0;
  CHECK(cuMemcpyDtoH(&first, p + bytes - 4, 4));
  if (first != 0x5a5a5a5a) return fail("the marked memset");
  CHECK(cuPointerSetAttribute(&zero, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p));
  EXPECT(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_CONTEXT, p), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p + (256u << 20)),
         CUDA_ERROR_INVALID_VALUE);  // not the client's memory
  CUDA_ARRAY3D_DESCRIPTOR d{};
  d.Width = 64;
  d.Height = 64;
  d.Format = CU_AD_FORMAT_FLOAT;
  d.NumChannels = 1;
  CUarray array{};
  CHECK(cuArray3DCreate(&array, &d));
  CUDA_ARRAY_SPARSE_PROPERTIES sparse{};
  EXPECT(cuArrayGetSparseProperties(&sparse, array), CUDA_ERROR_INVALID_VALUE);  // not sparse
  CUDA_ARRAY_MEMORY_REQUIREMENTS req{};
  EXPECT(cuArrayGetMemoryRequirements(&req, array, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuArrayDestroy(array));
  CUexecAffinityParam affinity{};
  CHECK(cuCtxGetExecAffinity(&affinity, CU_EXEC_AFFINITY_TYPE_SM_COUNT));
  int sms = 0;
  CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0));
  if (affinity.param.smCount.val == 0 || static_cast<int>(affinity.param.smCount.val) != sms) {
    return fail("the execution affinity is the client's SM count");
  }
  CUasyncCallbackHandle notification{};
  CHECK(cuDeviceRegisterAsyncNotification(
      0, [](CUasyncNotificationInfo*, void*, CUasyncCallbackHandle) {}, nullptr, &notification));
  CHECK(cuDeviceUnregisterAsyncNotification(0, notification));
  EXPECT(cuDeviceUnregisterAsyncNotification(0, notification), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree(p));
  std::printf("PASS extras\n");
  return 0;
}

}  // namespace

// cuCtxRecordEvent captures the work of every stream of the context without making any stream
// wait; cuCtxWaitEvent makes every stream of it (the legacy one too) wait for an event; both are
// refused while a stream of the context captures.
int ctx_events() {
  Setup s = setup();
  CUfunction sleep_kernel{}, fill{};
  CHECK(cuModuleGetFunction(&sleep_kernel, s.module, "sleep_kernel"));
  CHECK(cuModuleGetFunction(&fill, s.module, "fill_u32"));
  CUstream other{};
  CHECK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUdeviceptr p{}, q{}, r{};
  CHECK(cuMemAlloc(&p, 4));
  CHECK(cuMemAlloc(&q, 4));
  CHECK(cuMemAlloc(&r, 4));
  CHECK(cuMemsetD32(p, 0, 1));
  CHECK(cuMemsetD32(r, 0, 1));
  CHECK(cuCtxSynchronize());
  auto launch_sleep = [&](CUstream stream, int microseconds) {
    void* args[] = {&microseconds};
    CHECK(cuLaunchKernel(sleep_kernel, 1, 1, 1, 1, 1, 1, 0, stream, args, nullptr));
  };
  auto launch_fill = [&](CUstream stream, CUdeviceptr where, unsigned value) {
    int one = 1;
    void* args[] = {&where, &value, &one};
    CHECK(cuLaunchKernel(fill, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr));
  };
  CUevent all{}, seven{};
  CHECK(cuEventCreate(&all, CU_EVENT_DISABLE_TIMING));
  CHECK(cuEventCreate(&seven, CU_EVENT_DISABLE_TIMING));

  // A slow kernel then a fill on one stream: the context's event waits for both.
  launch_sleep(s.stream, 1000000);
  launch_fill(s.stream, p, 7);
  CHECK(cuCtxRecordEvent(s.ctx, all));
  // Work on another stream after the record does not wait for the slow one.
  launch_fill(other, q, 1);
  CHECK(cuStreamSynchronize(other));
  EXPECT(cuEventQuery(all), CUDA_ERROR_NOT_READY);
  CHECK(cuEventSynchronize(all));
  if (read_int(p) != 7) return fail("cuCtxRecordEvent completed before the context's work");

  // Every stream of the context, the legacy one included, waits for an event of one stream.
  launch_sleep(s.stream, 300000);
  launch_fill(s.stream, p, 9);
  CHECK(cuEventRecord(seven, s.stream));
  CHECK(cuCtxWaitEvent(s.ctx, seven));
  CHECK(cuMemcpyDtoDAsync(r, p, 4, other));
  CHECK(cuStreamSynchronize(other));
  if (read_int(r) != 9) return fail("a stream did not wait for cuCtxWaitEvent's event");
  launch_sleep(s.stream, 300000);
  launch_fill(s.stream, p, 11);
  CHECK(cuEventRecord(seven, s.stream));
  CHECK(cuCtxWaitEvent(s.ctx, seven));
  CHECK(cuMemcpyDtoDAsync(r, p, 4, nullptr));
  CHECK(cuStreamSynchronize(nullptr));
  if (read_int(r) != 11) return fail("the legacy stream did not wait for cuCtxWaitEvent's event");

  // The driver's refusals.
  EXPECT(cuCtxRecordEvent(reinterpret_cast<CUcontext>(&r), all), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT(cuCtxWaitEvent(s.ctx, nullptr), CUDA_ERROR_INVALID_HANDLE);
  // As on an H200: refused, and the capture is invalidated.
  CHECK(cuStreamBeginCapture(other, CU_STREAM_CAPTURE_MODE_RELAXED));
  EXPECT(cuCtxRecordEvent(s.ctx, all), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CUgraph graph{};
  EXPECT(cuStreamEndCapture(other, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  if (graph != nullptr) return fail("an invalidated capture gave a graph");
  CHECK(cuCtxRecordEvent(s.ctx, all));
  CHECK(cuEventSynchronize(all));

  CHECK(cuEventDestroy(all));
  CHECK(cuEventDestroy(seven));
  CHECK(cuStreamDestroy(other));
  CHECK(cuMemFree(p));
  CHECK(cuMemFree(q));
  CHECK(cuMemFree(r));
  std::printf("PASS ctx_events\n");
  return 0;
}

// Mipmapped arrays: the driver's level count rule, levels as arrays (the same handle each time)
// that copies reach, a texture object over the whole mipmapped array sampling level 0, a level's
// handle destroyed and asked for again, the queries only sparse or deferred arrays answer, and
// the destroy.
int mipmapped() {
  Setup s = setup();
  CUDA_ARRAY3D_DESCRIPTOR desc{};
  desc.Width = 64;
  desc.Height = 64;
  desc.Format = CU_AD_FORMAT_FLOAT;
  desc.NumChannels = 1;
  CUmipmappedArray mipmap{};
  EXPECT(cuMipmappedArrayCreate(&mipmap, &desc, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuMipmappedArrayCreate(&mipmap, &desc, 8), CUDA_ERROR_INVALID_VALUE);  // 7 fit 64
  CHECK(cuMipmappedArrayCreate(&mipmap, &desc, 4));
  CUarray level2{}, again{}, level0{};
  CHECK(cuMipmappedArrayGetLevel(&level2, mipmap, 2));
  CHECK(cuMipmappedArrayGetLevel(&again, mipmap, 2));
  if (again != level2) return fail("a level's handle changed between two asks");
  EXPECT(cuMipmappedArrayGetLevel(&again, mipmap, 4), CUDA_ERROR_INVALID_VALUE);
  CUDA_ARRAY3D_DESCRIPTOR got{};
  CHECK(cuArray3DGetDescriptor(&got, level2));
  if (got.Width != 16 || got.Height != 16 || got.Format != CU_AD_FORMAT_FLOAT) {
    return fail("level 2's descriptor");
  }
  // Level 2: host -> array -> host.
  std::vector<float> in(16 * 16), out(16 * 16, -1.0f);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.5f;
  auto copy = [](CUarray array, std::vector<float>& host, bool to_array, std::size_t side) {
    CUDA_MEMCPY3D c{};
    c.WidthInBytes = side * sizeof(float);
    c.Height = side;
    c.Depth = 1;
    if (to_array) {
      c.srcMemoryType = CU_MEMORYTYPE_HOST;
      c.srcHost = host.data();
      c.srcPitch = side * sizeof(float);
      c.srcHeight = side;
      c.dstMemoryType = CU_MEMORYTYPE_ARRAY;
      c.dstArray = array;
    } else {
      c.srcMemoryType = CU_MEMORYTYPE_ARRAY;
      c.srcArray = array;
      c.dstMemoryType = CU_MEMORYTYPE_HOST;
      c.dstHost = host.data();
      c.dstPitch = side * sizeof(float);
      c.dstHeight = side;
    }
    CHECK(cuMemcpy3D(&c));
  };
  copy(level2, in, true, 16);
  copy(level2, out, false, 16);
  if (out != in) return fail("level 2 did not hold what was copied in");

  // A texture over the whole mipmapped array samples level 0.
  std::vector<float> base(64 * 64);
  for (std::size_t i = 0; i < base.size(); ++i) base[i] = static_cast<float>(i % 97) + 1.0f;
  CHECK(cuMipmappedArrayGetLevel(&level0, mipmap, 0));
  copy(level0, base, true, 64);
  CUDA_RESOURCE_DESC resource{};
  resource.resType = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
  resource.res.mipmap.hMipmappedArray = mipmap;
  CUDA_TEXTURE_DESC texture{};
  texture.filterMode = CU_TR_FILTER_MODE_POINT;
  CUtexObject tex{};
  CHECK(cuTexObjectCreate(&tex, &resource, &texture, nullptr));
  CUDA_RESOURCE_DESC back{};
  CHECK(cuTexObjectGetResourceDesc(&back, tex));
  if (back.resType != CU_RESOURCE_TYPE_MIPMAPPED_ARRAY ||
      back.res.mipmap.hMipmappedArray != mipmap) {
    return fail("the texture's resource description");
  }
  CUfunction fetch{};
  CHECK(cuModuleGetFunction(&fetch, s.module, "tex2d_fetch_f32"));
  CUdeviceptr sampled{};
  CHECK(cuMemAlloc(&sampled, base.size() * sizeof(float)));
  int side = 64;
  void* args[] = {&tex, &sampled, &side, &side};
  CHECK(cuLaunchKernel(fetch, 1, 1, 1, 1, 1, 1, 0, nullptr, args, nullptr));
  std::vector<float> seen(base.size());
  CHECK(cuMemcpyDtoH(seen.data(), sampled, seen.size() * sizeof(float)));
  if (seen != base) return fail("the texture over the mipmapped array did not sample level 0");
  CHECK(cuTexObjectDestroy(tex));

  // A level's handle destroyed: the level stays, asked for again.
  CHECK(cuArrayDestroy(level2));
  CHECK(cuMipmappedArrayGetLevel(&level2, mipmap, 2));
  std::fill(out.begin(), out.end(), -1.0f);
  copy(level2, out, false, 16);
  if (out != in) return fail("level 2 lost its data with its handle");

  CUDA_ARRAY_MEMORY_REQUIREMENTS requirements{};
  EXPECT(cuMipmappedArrayGetMemoryRequirements(&requirements, mipmap, 0), CUDA_ERROR_INVALID_VALUE);
  CUDA_ARRAY_SPARSE_PROPERTIES sparse{};
  EXPECT(cuMipmappedArrayGetSparseProperties(&sparse, mipmap), CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMipmappedArrayDestroy(mipmap));
  EXPECT(cuMipmappedArrayDestroy(mipmap), CUDA_ERROR_INVALID_HANDLE);
  EXPECT(cuArray3DGetDescriptor(&got, level2), CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuMemFree(sampled));
  std::printf("PASS mipmapped\n");
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "conditional") return conditional();
  if (mode == "batch_and_attributes") return batch_and_attributes();
  if (mode == "user_objects") return user_objects();
  if (mode == "link") return link();
  if (mode == "extras") return extras();
  if (mode == "ctx_events") return ctx_events();
  if (mode == "mipmapped") return mipmapped();
  std::printf(
      "FAIL unknown mode '%s' (conditional, batch_and_attributes, user_objects, link, extras)\n",
      mode.c_str());
  return 2;
}
