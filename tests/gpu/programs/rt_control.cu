// Graph control flow and the driver's JIT linker, natively and under the shim: conditional nodes
// (a while loop counting down, an if/else, a switch) with the handle set from a kernel, a batch
// memory operation node (driver API) whose operations an executable graph replaces, kernel node
// attributes set, read and copied, user objects whose destructor runs once nothing holds them,
// and cuLink* linking two relocatable PTX inputs (one calls a function the other defines) into a
// module whose kernel runs. Every result and every driver answer is a field, so the GPU suite
// compares the shim's run with the driver's. Exit 77 without a GPU.
static const char* const kProgram = "rt_control";
#include <cuda.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <vector>

#include "rt_driver.cuh"

constexpr int kN = 4096;

__global__ void bump(int* data, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    data[i] += i % 7 + 1;
}
__global__ void countdown(cudaGraphConditionalHandle handle, int* counter) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *counter -= 1;
    cudaGraphSetConditional(handle, *counter > 0 ? 1u : 0u);
  }
}

// nvcc -arch=sm_90 -rdc=true -ptx of:
//   extern "C" __device__ int add_seven(int x) { return x + 7; }
const char kCallee[] = R"PTX(.version 9.0
.target sm_90
.address_size 64
	// .globl	add_seven
.visible .func  (.param .b32 func_retval0) add_seven(
	.param .b32 add_seven_param_0
)
{
	.reg .b32 	%r<3>;
	ld.param.u32 	%r1, [add_seven_param_0];
	add.s32 	%r2, %r1, 7;
	st.param.b32 	[func_retval0+0], %r2;
	ret;
}
)PTX";
// nvcc -arch=sm_90 -rdc=true -ptx of:
//   extern "C" __device__ int add_seven(int x);
//   extern "C" __global__ void apply(int* p, int n) { ...p[i] = add_seven(p[i]); } (grid-stride)
const char kCaller[] = R"PTX(.version 9.0
.target sm_90
.address_size 64
	// .globl	apply
.extern .func  (.param .b32 func_retval0) add_seven
(
	.param .b32 add_seven_param_0
)
;
.visible .entry apply(
	.param .u64 apply_param_0,
	.param .u32 apply_param_1
)
{
	.reg .pred 	%p<3>;
	.reg .b32 	%r<13>;
	.reg .b64 	%rd<5>;
	ld.param.u64 	%rd2, [apply_param_0];
	ld.param.u32 	%r6, [apply_param_1];
	mov.u32 	%r1, %ntid.x;
	mov.u32 	%r7, %ctaid.x;
	mov.u32 	%r8, %tid.x;
	mad.lo.s32 	%r12, %r7, %r1, %r8;
	setp.ge.s32 	%p1, %r12, %r6;
	@%p1 bra 	$L__BB0_3;
	mov.u32 	%r9, %nctaid.x;
	mul.lo.s32 	%r3, %r9, %r1;
	cvta.to.global.u64 	%rd1, %rd2;
$L__BB0_2:
	mul.wide.s32 	%rd3, %r12, 4;
	add.s64 	%rd4, %rd1, %rd3;
	ld.global.u32 	%r10, [%rd4];
	{ // callseq 0, 0
	.reg .b32 temp_param_reg;
	.param .b32 param0;
	st.param.b32 	[param0+0], %r10;
	.param .b32 retval0;
	call.uni (retval0), 
	add_seven, 
	(
	param0
	);
	ld.param.b32 	%r11, [retval0+0];
	} // callseq 0
	st.global.u32 	[%rd4], %r11;
	add.s32 	%r12, %r12, %r3;
	setp.lt.s32 	%p2, %r12, %r6;
	@%p2 bra 	$L__BB0_2;
$L__BB0_3:
	ret;
}
)PTX";

std::mutex g_mutex;
std::condition_variable g_cv;
int g_destroyed = 0;
void CUDART_CB on_destroy(void*) {
  std::lock_guard lock(g_mutex);
  ++g_destroyed;
  g_cv.notify_all();
}

cudaGraphNode_t conditional(cudaGraph_t g, cudaGraphConditionalHandle h,
                            cudaGraphConditionalNodeType type, unsigned size,
                            const cudaGraphNode_t* deps, size_t ndeps, cudaGraph_t* bodies) {
  cudaGraphNodeParams p{};
  p.type = cudaGraphNodeTypeConditional;
  p.conditional.handle = h;
  p.conditional.type = type;
  p.conditional.size = size;
  cudaGraphNode_t node{};
  RT_CHECK(cudaGraphAddNode(&node, g, deps, nullptr, ndeps, &p));
  for (unsigned i = 0; i < size; ++i) bodies[i] = p.conditional.phGraph_out[i];
  return node;
}

cudaGraphNode_t set_int(cudaGraph_t g, int* at, int value, const cudaGraphNode_t* deps,
                        size_t ndeps) {
  cudaMemsetParams m{};
  m.dst = at;
  m.value = static_cast<unsigned>(value);
  m.elementSize = 4;
  m.width = 1;
  m.height = 1;
  cudaGraphNode_t node{};
  RT_CHECK(cudaGraphAddMemsetNode(&node, g, deps, ndeps, &m));
  return node;
}

cudaGraphNode_t kernel(cudaGraph_t g, void* fn, void** args, const cudaGraphNode_t* deps,
                       size_t ndeps, unsigned grid) {
  cudaKernelNodeParams k{};
  k.func = fn;
  k.gridDim = dim3(grid);
  k.blockDim = dim3(256);
  k.kernelParams = args;
  cudaGraphNode_t node{};
  RT_CHECK(cudaGraphAddKernelNode(&node, g, deps, ndeps, &k));
  return node;
}

int expected_sum(int launches, int loops) {
  long long s = 0;
  for (int i = 0; i < kN; ++i) s += static_cast<long long>(launches) * loops * (i % 7 + 1);
  return static_cast<int>(s % 1000003);
}

int checksum(const int* device) {
  std::vector<int> host(kN);
  RT_CHECK(cudaMemcpy(host.data(), device, sizeof(int) * kN, cudaMemcpyDeviceToHost));
  long long s = 0;
  for (int v : host) s += v;
  return static_cast<int>(s % 1000003);
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return 77;
  RT_CHECK(cudaSetDevice(0));
  cudaStream_t stream{};
  RT_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int *data{}, *counter{}, *x{}, *y{};
  RT_CHECK(cudaMalloc(&data, sizeof(int) * kN));
  RT_CHECK(cudaMemset(data, 0, sizeof(int) * kN));
  for (int** p : {&counter, &x, &y}) {
    RT_CHECK(cudaMalloc(p, sizeof(int)));
    RT_CHECK(cudaMemset(*p, 0, sizeof(int)));
  }
  RT_CHECK(cudaDeviceSynchronize());

  // ---- conditional nodes ----
  cudaGraph_t g{};
  RT_CHECK(cudaGraphCreate(&g, 0));
  cudaGraphConditionalHandle loop{}, choose{}, pick{};
  RT_CHECK(cudaGraphConditionalHandleCreate(&loop, g, 1, cudaGraphCondAssignDefault));
  RT_CHECK(cudaGraphConditionalHandleCreate(&choose, g, 0, cudaGraphCondAssignDefault));
  RT_CHECK(cudaGraphConditionalHandleCreate(&pick, g, 2, cudaGraphCondAssignDefault));
  const int loops = 5;
  cudaGraphNode_t start = set_int(g, counter, loops, nullptr, 0);
  cudaGraph_t body{};
  conditional(g, loop, cudaGraphCondTypeWhile, 1, &start, 1, &body);
  int n = kN;
  void* bump_args[] = {&data, &n};
  void* count_args[] = {&loop, &counter};
  cudaGraphNode_t step = kernel(body, reinterpret_cast<void*>(bump), bump_args, nullptr, 0, 16);
  kernel(body, reinterpret_cast<void*>(countdown), count_args, &step, 1, 1);
  cudaGraph_t branches[2]{};
  conditional(g, choose, cudaGraphCondTypeIf, 2, nullptr, 0, branches);
  set_int(branches[0], x, 1, nullptr, 0);
  set_int(branches[1], x, 2, nullptr, 0);
  cudaGraph_t cases[3]{};
  conditional(g, pick, cudaGraphCondTypeSwitch, 3, nullptr, 0, cases);
  for (int i = 0; i < 3; ++i) set_int(cases[i], y, 10 + i, nullptr, 0);
  cudaGraphExec_t exec{};
  RT_CHECK(cudaGraphInstantiate(&exec, g, 0));
  const int launches = 3;
  for (int i = 0; i < launches; ++i) RT_CHECK(cudaGraphLaunch(exec, stream));
  RT_CHECK(cudaStreamSynchronize(stream));
  const int sum_ok = checksum(data) == expected_sum(launches, loops);
  int host_x = 0, host_y = 0, host_counter = -1;
  RT_CHECK(cudaMemcpy(&host_x, x, sizeof(int), cudaMemcpyDeviceToHost));
  RT_CHECK(cudaMemcpy(&host_y, y, sizeof(int), cudaMemcpyDeviceToHost));
  RT_CHECK(cudaMemcpy(&host_counter, counter, sizeof(int), cudaMemcpyDeviceToHost));
  cudaGraph_t clone{};
  const int clone_cond = static_cast<int>(cudaGraphClone(&clone, g));
  cudaGraphExec_t second{};
  const int second_cond = static_cast<int>(cudaGraphInstantiate(&second, g, 0));
  cudaGetLastError();
  cudaGraph_t parent{};
  RT_CHECK(cudaGraphCreate(&parent, 0));
  cudaGraphNode_t child{};
  const int child_cond =
      static_cast<int>(cudaGraphAddChildGraphNode(&child, parent, nullptr, 0, g));
  cudaGetLastError();
  RT_CHECK(cudaGraphExecDestroy(exec));
  RT_CHECK(cudaGraphDestroy(parent));
  RT_CHECK(cudaGraphDestroy(g));

  // ---- a batch memory operation node (driver API) ----
  CUcontext ctx{};
  CU_CHECK(cuCtxGetCurrent(&ctx));
  CUstreamBatchMemOpParams ops[2]{};
  ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  ops[0].writeValue.address = reinterpret_cast<CUdeviceptr>(counter);
  ops[0].writeValue.value = 7;
  ops[1].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
  ops[1].waitValue.address = reinterpret_cast<CUdeviceptr>(counter);
  ops[1].waitValue.value = 7;
  ops[1].waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  CUDA_BATCH_MEM_OP_NODE_PARAMS bp{ctx, 2, ops, 0};
  CUgraph mg{};
  CU_CHECK(cuGraphCreate(&mg, 0));
  CUgraphNode mem_node{};
  CU_CHECK(cuGraphAddBatchMemOpNode(&mem_node, mg, nullptr, 0, &bp));
  CUDA_BATCH_MEM_OP_NODE_PARAMS got{};
  CU_CHECK(cuGraphBatchMemOpNodeGetParams(mem_node, &got));
  const int ops_read = got.count == 2 && got.paramArray[0].writeValue.value == 7;
  CUgraphExec mx{};
  CU_CHECK(cuGraphInstantiate(&mx, mg, 0));
  CU_CHECK(cuGraphLaunch(mx, stream));
  CU_CHECK(cuStreamSynchronize(stream));
  int flag_first = 0, flag_second = 0;
  RT_CHECK(cudaMemcpy(&flag_first, counter, sizeof(int), cudaMemcpyDeviceToHost));
  ops[0].writeValue.value = 9;
  ops[1].waitValue.value = 9;
  CU_CHECK(cuGraphExecBatchMemOpNodeSetParams(mx, mem_node, &bp));
  CU_CHECK(cuGraphLaunch(mx, stream));
  CU_CHECK(cuStreamSynchronize(stream));
  RT_CHECK(cudaMemcpy(&flag_second, counter, sizeof(int), cudaMemcpyDeviceToHost));

  // ---- kernel node attributes ----
  cudaGraph_t kg{};
  RT_CHECK(cudaGraphCreate(&kg, 0));
  cudaGraphNode_t ka = kernel(kg, reinterpret_cast<void*>(bump), bump_args, nullptr, 0, 16);
  cudaGraphNode_t kb = kernel(kg, reinterpret_cast<void*>(bump), bump_args, nullptr, 0, 16);
  cudaKernelNodeAttrValue v{};
  v.priority = -1;
  RT_CHECK(cudaGraphKernelNodeSetAttribute(ka, cudaLaunchAttributePriority, &v));
  v = {};
  v.memSyncDomain = cudaLaunchMemSyncDomainRemote;
  RT_CHECK(cudaGraphKernelNodeSetAttribute(ka, cudaLaunchAttributeMemSyncDomain, &v));
  RT_CHECK(cudaGraphKernelNodeCopyAttributes(kb, ka));
  cudaKernelNodeAttrValue read_priority{}, read_domain{};
  RT_CHECK(cudaGraphKernelNodeGetAttribute(kb, cudaLaunchAttributePriority, &read_priority));
  RT_CHECK(cudaGraphKernelNodeGetAttribute(kb, cudaLaunchAttributeMemSyncDomain, &read_domain));

  // ---- user objects ----
  cudaUserObject_t object{};
  RT_CHECK(cudaUserObjectCreate(&object, nullptr, on_destroy, 1, cudaUserObjectNoDestructorSync));
  RT_CHECK(cudaGraphRetainUserObject(kg, object, 1, cudaGraphUserObjectMove));
  cudaGraphExec_t kx{};
  RT_CHECK(cudaGraphInstantiate(&kx, kg, 0));
  RT_CHECK(cudaGraphDestroy(kg));
  RT_CHECK(cudaGraphLaunch(kx, stream));
  int destroyed_while_held = 0;
  {
    std::lock_guard lock(g_mutex);
    destroyed_while_held = g_destroyed;
  }
  RT_CHECK(cudaGraphExecDestroy(kx));
  RT_CHECK(cudaStreamSynchronize(stream));
  int destroyed_after = 0;
  {
    std::unique_lock lock(g_mutex);
    g_cv.wait_for(lock, std::chrono::seconds(10), [] { return g_destroyed >= 1; });
    destroyed_after = g_destroyed;
  }

  // ---- the JIT linker ----
  char info[4096] = {}, error[4096] = {};
  CUjit_option options[] = {CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_WALL_TIME};
  void* values[] = {info, reinterpret_cast<void*>(sizeof info), error,
                    reinterpret_cast<void*>(sizeof error), nullptr};
  CUlinkState link{};
  CU_CHECK(cuLinkCreate(5, options, values, &link));
  CU_CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(kCaller), sizeof kCaller,
                         "caller.ptx", 0, nullptr, nullptr));
  CU_CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(kCallee), sizeof kCallee,
                         "callee.ptx", 0, nullptr, nullptr));
  const char broken[] = ".version 9.0\n.target sm_90\nthis is not ptx;\n";
  const int broken_ptx =
      static_cast<int>(cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(broken),
                                     sizeof broken, "broken.ptx", 0, nullptr, nullptr));
  const int error_logged = std::strlen(error) > 0;
  void* image = nullptr;
  size_t image_bytes = 0;
  const int completed = static_cast<int>(cuLinkComplete(link, &image, &image_bytes));
  int linked_ok = 0;
  if (completed == CUDA_SUCCESS) {
    CUmodule module{};
    CU_CHECK(cuModuleLoadData(&module, image));
    CUfunction apply{};
    CU_CHECK(cuModuleGetFunction(&apply, module, "apply"));
    std::vector<int> before(kN);
    RT_CHECK(cudaMemcpy(before.data(), data, sizeof(int) * kN, cudaMemcpyDeviceToHost));
    CUdeviceptr p = reinterpret_cast<CUdeviceptr>(data);
    void* args[] = {&p, &n};
    CU_CHECK(cuLaunchKernel(apply, 16, 1, 1, 256, 1, 1, 0, stream, args, nullptr));
    CU_CHECK(cuStreamSynchronize(stream));
    std::vector<int> after(kN);
    RT_CHECK(cudaMemcpy(after.data(), data, sizeof(int) * kN, cudaMemcpyDeviceToHost));
    linked_ok = 1;
    for (int i = 0; i < kN; ++i) linked_ok &= after[i] == before[i] + 7;
    CU_CHECK(cuModuleUnload(module));
  }
  float wall = 0;
  std::memcpy(&wall, &values[4], sizeof wall);
  const int wall_time = wall > 0;
  CU_CHECK(cuLinkDestroy(link));

  const bool ok = sum_ok && host_x == 2 && host_y == 12 && host_counter == 0 && ops_read &&
                  flag_first == 7 && flag_second == 9 && read_priority.priority == -1 &&
                  read_domain.memSyncDomain == cudaLaunchMemSyncDomainRemote &&
                  destroyed_while_held == 0 && destroyed_after == 1 && completed == 0 &&
                  linked_ok && wall_time && error_logged;
  return RT_REPORT(ok,
                   "while_sum=%d if=%d switch=%d counter=%d clone=%d second_instantiation=%d "
                   "as_child=%d batch_read=%d batch_flags=%d/%d priority=%d domain=%d "
                   "destroyed=%d/%d link=%d linked=%d broken_ptx=%d error_logged=%d wall_time=%d",
                   sum_ok, host_x, host_y, host_counter, clone_cond, second_cond, child_cond,
                   ops_read, flag_first, flag_second, read_priority.priority,
                   static_cast<int>(read_domain.memSyncDomain), destroyed_while_held,
                   destroyed_after, completed, linked_ok, broken_ptx, error_logged, wall_time);
}
