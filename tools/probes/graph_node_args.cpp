// Black-box probe of the real driver: which ways of passing a kernel's arguments does a graph
// kernel node accept? Launch batching (broker/server/launch/launch_batch.cpp) builds chains of
// kernel nodes and updates them with cuGraphExecKernelNodeSetParams before each cuGraphLaunch; on
// an H100 with driver 580 every update failed with CUDA_ERROR_INVALID_VALUE while the arguments
// travelled as `extra` (CU_LAUNCH_PARAM_BUFFER_POINTER). This prints, for each way (extra or
// kernelParams), each handle kind (CUkernel, CUfunction) and each context (primary, green), what
// cuGraphAddKernelNode, cuGraphInstantiate, cuGraphExecKernelNodeSetParams and cuGraphLaunch
// answer, and whether the kernel wrote what it was told.
//
// Build and run on the GPU machine:
//   nvcc -cubin -arch=sm_90 -o /tmp/probe_kernel.cubin tools/probes/probe_kernel.cu
//   g++ -std=c++20 -I/usr/local/cuda/include tools/probes/graph_node_args.cpp -lcuda -o /tmp/probe
//   /tmp/probe /tmp/probe_kernel.cubin
#include <cuda.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "must.hpp"

namespace {

struct Args {  // store_value(int* out, int value): 8 + 4 bytes, padded to 16
  CUdeviceptr out;
  int value;
  int pad;
};

// One try: a graph of one node (the first values), updated to the second values, launched.
// `ctx`: the node's context (a CUkernel's); `build`, `update`: current while the graph is made
// and while it is updated and launched (the server makes a batch's graph with the client's green
// context current and updates it from a worker whose current context is the primary one).
void probe(const char* label, CUfunction f, bool kernel, CUcontext ctx, CUcontext build,
           CUcontext update, CUstream stream, CUdeviceptr out, bool use_extra) {
  Args first{out, 11, 0}, second{out, 22, 0};
  std::size_t size = sizeof(Args);
  void* extra1[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &first, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                    CU_LAUNCH_PARAM_END};
  void* extra2[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &second, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                    CU_LAUNCH_PARAM_END};
  void* params1[] = {&first.out, &first.value};
  void* params2[] = {&second.out, &second.value};
  auto fill = [&](CUDA_KERNEL_NODE_PARAMS& p, bool one) {
    p = {};
    if (kernel) {
      p.kern = reinterpret_cast<CUkernel>(f);
      p.ctx = ctx;
    } else {
      p.func = f;
    }
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = p.blockDimY = p.blockDimZ = 1;
    if (use_extra) {
      p.extra = one ? extra1 : extra2;
    } else {
      p.kernelParams = one ? params1 : params2;
    }
  };
  cuCtxSetCurrent(build);
  cuMemsetD32(out, 0, 1);
  cuCtxSynchronize();
  CUgraph g = nullptr;
  CUgraphExec e = nullptr;
  CUgraphNode node = nullptr;
  CUDA_KERNEL_NODE_PARAMS p;
  fill(p, true);
  CUresult add = cuGraphCreate(&g, 0);
  if (add == CUDA_SUCCESS) add = cuGraphAddKernelNode(&node, g, nullptr, 0, &p);
  CUresult inst = add == CUDA_SUCCESS ? cuGraphInstantiate(&e, g, 0) : CUDA_ERROR_NOT_READY;
  fill(p, false);
  cuCtxSetCurrent(update);
  CUresult set =
      inst == CUDA_SUCCESS ? cuGraphExecKernelNodeSetParams(e, node, &p) : CUDA_ERROR_NOT_READY;
  CUresult launch = inst == CUDA_SUCCESS ? cuGraphLaunch(e, stream) : CUDA_ERROR_NOT_READY;
  CUresult sync = cuStreamSynchronize(stream);
  int value = -1;
  cuMemcpyDtoH(&value, out, sizeof value);
  std::printf("%-44s %-12s add=%s instantiate=%s set_params=%s launch=%s sync=%s wrote=%d\n", label,
              use_extra ? "extra" : "kernelParams", name(add), name(inst), name(set), name(launch),
              name(sync), value);
  if (e != nullptr) cuGraphExecDestroy(e);
  if (g != nullptr) cuGraphDestroy(g);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::printf("usage: %s probe_kernel.cubin\n", argv[0]);
    return 2;
  }
  MUST(cuInit(0));
  CUdevice dev;
  MUST(cuDeviceGet(&dev, 0));
  CUcontext primary;
  MUST(cuDevicePrimaryCtxRetain(&primary, dev));
  MUST(cuCtxSetCurrent(primary));
  CUlibrary library;
  MUST(cuLibraryLoadFromFile(&library, argv[1], nullptr, nullptr, 0, nullptr, nullptr, 0));
  CUkernel kernel;
  MUST(cuLibraryGetKernel(&kernel, library, "store_value"));
  CUmodule module;
  MUST(cuModuleLoad(&module, argv[1]));
  CUfunction function;
  MUST(cuModuleGetFunction(&function, module, "store_value"));
  CUdeviceptr out;
  MUST(cuMemAlloc(&out, 4));
  CUstream stream;
  MUST(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));

  // A green context of 16 SMs with its own stream, as the server makes for an SM quota.
  CUdevResource all;
  MUST(cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  CUdevResource part, rest;
  unsigned groups = 1;
  MUST(cuDevSmResourceSplitByCount(&part, &groups, &all, &rest, 0, 16));
  CUdevResourceDesc desc;
  MUST(cuDevResourceGenerateDesc(&desc, &part, 1));
  CUgreenCtx green;
  MUST(cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  CUcontext green_ctx;
  MUST(cuCtxFromGreenCtx(&green_ctx, green));
  CUstream green_stream;
  MUST(cuGreenCtxStreamCreate(&green_stream, green, CU_STREAM_NON_BLOCKING, 0));

  const auto k = reinterpret_cast<CUfunction>(kernel);
  for (bool use_extra : {true, false}) {
    probe("CUkernel ctx=primary, primary", k, true, primary, primary, primary, stream, out,
          use_extra);
    probe("CUkernel ctx=NULL, primary", k, true, nullptr, primary, primary, stream, out, use_extra);
    probe("CUfunction, primary", function, false, nullptr, primary, primary, stream, out,
          use_extra);
    probe("CUkernel ctx=green, green", k, true, green_ctx, green_ctx, green_ctx, green_stream, out,
          use_extra);
    probe("CUfunction, green", function, false, nullptr, green_ctx, green_ctx, green_stream, out,
          use_extra);
    probe("CUkernel ctx=green, built green, upd primary", k, true, green_ctx, green_ctx, primary,
          green_stream, out, use_extra);
    probe("CUkernel ctx=green, built/upd primary", k, true, green_ctx, primary, primary,
          green_stream, out, use_extra);
    probe("CUfunction, built green, upd primary", function, false, nullptr, green_ctx, primary,
          green_stream, out, use_extra);
    probe("CUfunction, built primary, green stream", function, false, nullptr, primary, primary,
          green_stream, out, use_extra);
  }
  return 0;
}
