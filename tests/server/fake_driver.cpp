#include "tests/server/fake_driver.hpp"

#include "tests/server/fake_async.hpp"

#include <cstring>
#include <new>
#include <optional>

namespace mpsshim::server::test {
namespace {

std::uintptr_t g_next_handle = 0x1000;

template <typename T>
T new_handle() {
  g_next_handle += 0x10;
  return reinterpret_cast<T>(g_next_handle);
}

CUresult work_state() {
  FakeGpu& gpu = fake_gpu();
  CUresult state = gpu.busy ? CUDA_ERROR_NOT_READY : gpu.work_result;
  // Work that is done lands its value writes (host pointers are device pointers here).
  if (state == CUDA_SUCCESS) {
    for (const FakeGpu::ValueWrite& w : gpu.writes_in_flight) {
      *reinterpret_cast<std::uint32_t*>(w.address) = w.value;
    }
    gpu.writes_in_flight.clear();
  }
  return state;
}

}  // namespace

void finish_fake_work() {
  fake_gpu().busy = false;
  work_state();
}

namespace {

void* named(const std::string& name) {
  auto [it, inserted] = fake_gpu().named.try_emplace(name, nullptr);
  if (inserted) it->second = new_handle<void*>();
  return it->second;
}

// Device memory: host memory that the fake's copies and memsets write through.
std::byte* device_bytes(CUdeviceptr p) {
  return reinterpret_cast<std::byte*>(p);
}

CUresult alloc(CUdeviceptr* out, std::size_t bytes) {
  try {
    DeviceBlock block(bytes);
    *out = block.address();
    fake_gpu().allocations.emplace(block.address(), std::move(block));
    return CUDA_SUCCESS;
  } catch (const std::bad_alloc&) {
    return CUDA_ERROR_OUT_OF_MEMORY;  // as the driver answers; never an exception through C
  }
}

template <typename T>
void fill(CUdeviceptr dst, T value, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i)
    std::memcpy(device_bytes(dst) + i * sizeof(T), &value, sizeof(T));
}

template <typename T>
void fill_2d(CUdeviceptr dst, std::size_t pitch, T value, std::size_t width, std::size_t height) {
  for (std::size_t row = 0; row < height; ++row) fill(dst + row * pitch, value, width);
}

// The attributes a launch's shape is checked against read as a real GPU's; others as `other`.
int launch_limit(CUfunction_attribute attribute, int other) {
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      return 1024;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      return 48 * 1024;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET:
      return 0;
    default:
      return other;
  }
}

// The fakes' parameter layouts (cuKernelGetParamInfo, cuFuncGetParamInfo below): a CUkernel
// takes a pointer at 0 and an int at 8, a CUfunction three 8-byte values at 0, 8 and 16.
constexpr std::size_t kKernelParams = 2, kFunctionParams = 3;
std::size_t param_offset(std::size_t i) {
  return i * 8;
}
std::size_t param_size(bool kernel, std::size_t i) {
  return kernel && i == 1 ? 4 : 8;
}

// The packed arguments of a kernel node, gathered from its kernelParams by the layout. As on
// the real driver (tools/probes/graph_node_args.cpp), a node whose arguments come as `extra` is
// refused: nullopt.
std::optional<std::vector<std::byte>> node_args(const CUDA_KERNEL_NODE_PARAMS* p) {
  if (p->extra != nullptr) return std::nullopt;
  if (p->kernelParams == nullptr) return std::vector<std::byte>{};
  const bool kernel = p->kern != nullptr;
  const std::size_t count = kernel ? kKernelParams : kFunctionParams;
  std::vector<std::byte> block(param_offset(count - 1) + param_size(kernel, count - 1));
  for (std::size_t i = 0; i < count; ++i) {
    std::memcpy(block.data() + param_offset(i), p->kernelParams[i], param_size(kernel, i));
  }
  return block;
}

// Graphs as launch batching uses them: kernel nodes only, launched as one launch per node.
void add_graph_fakes(DriverTable& t) {
  t.cuGraphCreate = [](CUgraph* g, unsigned) {
    *g = new_handle<CUgraph>();
    fake_gpu().graphs[*g] = FakeGpu::Graph{};
    ++fake_gpu().graphs_live;
    return CUDA_SUCCESS;
  };
  t.cuGraphDestroy = [](CUgraph g) {
    FakeGpu& gpu = fake_gpu();
    if (gpu.graphs.erase(g) == 0) return CUDA_ERROR_INVALID_HANDLE;
    std::erase_if(gpu.graph_nodes, [&](const auto& kv) { return kv.second.first == g; });
    --gpu.graphs_live;
    return CUDA_SUCCESS;
  };
  t.cuGraphAddKernelNode_v2 = [](CUgraphNode* node, CUgraph g, const CUgraphNode*, std::size_t,
                                 const CUDA_KERNEL_NODE_PARAMS* p) {
    FakeGpu& gpu = fake_gpu();
    auto it = gpu.graphs.find(g);
    if (it == gpu.graphs.end() || it->second.executable) return CUDA_ERROR_INVALID_HANDLE;
    auto args = node_args(p);
    if (!args) return CUDA_ERROR_INVALID_VALUE;
    *node = new_handle<CUgraphNode>();
    gpu.graph_nodes[*node] = {g, it->second.node_args.size()};
    it->second.node_args.push_back(std::move(*args));
    return CUDA_SUCCESS;
  };
  t.cuGraphInstantiateWithFlags = [](CUgraphExec* exec, CUgraph g, unsigned long long) {
    FakeGpu& gpu = fake_gpu();
    auto it = gpu.graphs.find(g);
    if (it == gpu.graphs.end() || it->second.executable) return CUDA_ERROR_INVALID_HANDLE;
    if (gpu.graph_instantiate_result != CUDA_SUCCESS) return gpu.graph_instantiate_result;
    FakeGpu::Graph copy = it->second;
    copy.executable = true;
    copy.disabled.assign(copy.node_args.size(), false);
    *exec = new_handle<CUgraphExec>();
    gpu.graphs[*exec] = std::move(copy);
    ++gpu.graph_execs_live;
    ++gpu.graph_instantiations;
    return CUDA_SUCCESS;
  };
  t.cuGraphExecDestroy = [](CUgraphExec exec) {
    FakeGpu& gpu = fake_gpu();
    if (gpu.graphs.erase(exec) == 0) return CUDA_ERROR_INVALID_HANDLE;
    --gpu.graph_execs_live;
    return CUDA_SUCCESS;
  };
  t.cuGraphExecKernelNodeSetParams_v2 = [](CUgraphExec exec, CUgraphNode node,
                                           const CUDA_KERNEL_NODE_PARAMS* p) {
    FakeGpu& gpu = fake_gpu();
    auto e = gpu.graphs.find(exec);
    auto n = gpu.graph_nodes.find(node);
    if (e == gpu.graphs.end() || !e->second.executable || n == gpu.graph_nodes.end()) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (gpu.graph_node_update_result != CUDA_SUCCESS) return gpu.graph_node_update_result;
    auto args = node_args(p);
    if (!args) return CUDA_ERROR_INVALID_VALUE;
    e->second.node_args.at(n->second.second) = std::move(*args);
    ++gpu.graph_node_updates;
    return CUDA_SUCCESS;
  };
  t.cuGraphLaunch = [](CUgraphExec exec, CUstream) {
    FakeGpu& gpu = fake_gpu();
    auto e = gpu.graphs.find(exec);
    if (e == gpu.graphs.end() || !e->second.executable) return CUDA_ERROR_INVALID_HANDLE;
    if (gpu.graph_launch_result != CUDA_SUCCESS) return gpu.graph_launch_result;
    ++gpu.graph_launches;
    // A disabled node runs nothing.
    for (std::size_t i = 0; i < e->second.node_args.size(); ++i) {
      if (e->second.disabled[i]) continue;
      ++gpu.launches;
      gpu.last_launch_args = e->second.node_args[i];
    }
    gpu.last_launch_attribute_count = 0;
    return CUDA_SUCCESS;
  };
  t.cuGraphNodeSetEnabled = [](CUgraphExec exec, CUgraphNode node, unsigned int enabled) {
    FakeGpu& gpu = fake_gpu();
    auto e = gpu.graphs.find(exec);
    auto n = gpu.graph_nodes.find(node);
    if (e == gpu.graphs.end() || !e->second.executable || n == gpu.graph_nodes.end()) {
      return CUDA_ERROR_INVALID_HANDLE;
    }
    if (gpu.graph_enable_result != CUDA_SUCCESS) return gpu.graph_enable_result;
    e->second.disabled.at(n->second.second) = enabled == 0;
    ++gpu.graph_node_toggles;
    return CUDA_SUCCESS;
  };
}

}  // namespace

FakeGpu& fake_gpu() {
  static FakeGpu gpu;
  return gpu;
}

DriverTable fake_driver_table() {
  DriverTable t;
  t.cuInit = [](unsigned) { return CUDA_SUCCESS; };
  t.cuDriverGetVersion = [](int* v) {
    *v = 13000;
    return CUDA_SUCCESS;
  };
  t.cuGetErrorName = [](CUresult, const char** name) {
    *name = "CUDA_ERROR_FAKE";
    return CUDA_SUCCESS;
  };
  t.cuGetErrorString = [](CUresult, const char** text) {
    *text = "fake";
    return CUDA_SUCCESS;
  };
  t.cuDeviceGet = [](CUdevice* d, int ordinal) {
    *d = ordinal;
    return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
  };
  t.cuDeviceGetCount = [](int* n) {
    *n = 1;
    return CUDA_SUCCESS;
  };
  t.cuDeviceGetName = [](char* name, int length, CUdevice) {
    std::strncpy(name, "Fake H100", static_cast<std::size_t>(length));
    return CUDA_SUCCESS;
  };
  t.cuDeviceGetUuid_v2 = [](CUuuid* uuid, CUdevice) {
    for (int i = 0; i < 16; ++i) uuid->bytes[i] = static_cast<char>(i);
    return CUDA_SUCCESS;
  };
  t.cuDeviceTotalMem_v2 = [](std::size_t* bytes, CUdevice) {
    *bytes = fake_gpu().total_memory;
    return CUDA_SUCCESS;
  };
  t.cuDeviceGetAttribute = [](int* value, CUdevice_attribute a, CUdevice) {
    if (a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) {
      *value = static_cast<int>(fake_gpu().sm_count);
      return CUDA_SUCCESS;
    }
    // An H200's compute capability: which entries of an image the server scans follow it.
    if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) {
      *value = 9;
      return CUDA_SUCCESS;
    }
    if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) {
      *value = 0;
      return CUDA_SUCCESS;
    }
    if (a % 7 == 0) return CUDA_ERROR_INVALID_VALUE;  // some the driver does not know
    *value = static_cast<int>(a) * 10;
    return CUDA_SUCCESS;
  };
  t.cuDeviceGetDevResource = [](CUdevice, CUdevResource* r, CUdevResourceType type) {
    std::memset(r, 0, sizeof *r);
    r->type = type;
    r->sm.smCount = fake_gpu().sm_count;
    r->sm.minSmPartitionSize = fake_gpu().min_partition;
    r->sm.smCoscheduledAlignment = fake_gpu().coscheduled_alignment;
    return CUDA_SUCCESS;
  };
  t.cuDevSmResourceSplitByCount = [](CUdevResource* result, unsigned* groups,
                                     const CUdevResource* in, CUdevResource* remaining,
                                     unsigned flags, unsigned min_count) {
    FakeGpu& gpu = fake_gpu();
    // A count only (the server's priority reserve asks at start): the fake has one group, so
    // no SMs are reserved on it (the test driver models the split: priority_reserve_test.cpp).
    if (result == nullptr) {
      *groups = 1;
      return CUDA_SUCCESS;
    }
    gpu.last_split_min_count = min_count;
    gpu.last_split_flags = flags;
    if (min_count > in->sm.smCount) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    *result = *in;
    result->sm.smCount = min_count;
    *groups = 1;
    if (remaining != nullptr) {
      *remaining = *in;
      remaining->sm.smCount = in->sm.smCount - min_count;
    }
    return CUDA_SUCCESS;
  };
  t.cuDevResourceGenerateDesc = [](CUdevResourceDesc* desc, CUdevResource*, unsigned) {
    *desc = new_handle<CUdevResourceDesc>();
    return CUDA_SUCCESS;
  };
  t.cuGreenCtxCreate = [](CUgreenCtx* g, CUdevResourceDesc, CUdevice, unsigned) {
    *g = new_handle<CUgreenCtx>();
    ++fake_gpu().green_live;
    ++fake_gpu().green_created;
    return CUDA_SUCCESS;
  };
  t.cuGreenCtxDestroy = [](CUgreenCtx) {
    --fake_gpu().green_live;
    return CUDA_SUCCESS;
  };
  t.cuGreenCtxStreamCreate = [](CUstream* s, CUgreenCtx, unsigned flags, int priority) {
    if (flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;
    *s = new_handle<CUstream>();
    ++fake_gpu().streams_live;
    fake_gpu().last_stream_priority = priority;
    return CUDA_SUCCESS;
  };
  t.cuCtxFromGreenCtx = [](CUcontext* c, CUgreenCtx) {
    *c = new_handle<CUcontext>();
    return CUDA_SUCCESS;
  };
  t.cuDevicePrimaryCtxRetain = [](CUcontext* c, CUdevice) {
    if (fake_gpu().primary_retain_result != CUDA_SUCCESS) return fake_gpu().primary_retain_result;
    *c = new_handle<CUcontext>();
    ++fake_gpu().primary_refs;
    return CUDA_SUCCESS;
  };
  t.cuDevicePrimaryCtxRelease_v2 = [](CUdevice) {
    if (fake_gpu().primary_refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (--fake_gpu().primary_refs == 0) {
      fake_gpu().green_live_at_primary_release = fake_gpu().green_live;
    }
    return CUDA_SUCCESS;
  };
  t.cuCtxSetCurrent = [](CUcontext) { return CUDA_SUCCESS; };
  t.cuCtxSynchronize = [] {
    ++fake_gpu().ctx_synchronizes;
    return CUDA_SUCCESS;
  };
  t.cuCtxSetLimit = [](CUlimit limit, std::size_t value) {
    fake_gpu().limits[limit] = value;
    return CUDA_SUCCESS;
  };
  t.cuCtxGetLimit = [](std::size_t* value, CUlimit limit) {
    *value = fake_gpu().limits[limit];
    return CUDA_SUCCESS;
  };
  t.cuCtxGetStreamPriorityRange = [](int* least, int* greatest) {
    *least = 0;
    *greatest = -5;
    return CUDA_SUCCESS;
  };
  t.cuMemAlloc_v2 = [](CUdeviceptr* p, std::size_t bytes) { return alloc(p, bytes); };
  t.cuMemAllocPitch_v2 = [](CUdeviceptr* p, std::size_t* pitch, std::size_t width,
                            std::size_t height, unsigned) {
    *pitch = (width + 511) / 512 * 512;
    return alloc(p, *pitch * height);
  };
  t.cuMemFree_v2 = [](CUdeviceptr p) {
    return fake_gpu().allocations.erase(p) == 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  };
  t.cuMemGetInfo_v2 = [](std::size_t* free_bytes, std::size_t* total) {
    *free_bytes = fake_gpu().free_memory;
    *total = fake_gpu().total_memory;
    return CUDA_SUCCESS;
  };
  t.cuMemHostRegister_v2 = [](void* p, std::size_t bytes, unsigned) {
    if (fake_gpu().host_register_failures > 0) {
      --fake_gpu().host_register_failures;
      return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    fake_gpu().host_registrations[p] = bytes;
    return CUDA_SUCCESS;
  };
  t.cuMemHostUnregister = [](void* p) {
    return fake_gpu().host_registrations.erase(p) == 1 ? CUDA_SUCCESS
                                                       : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  };
  t.cuMemHostGetDevicePointer_v2 = [](CUdeviceptr* d, void* p, unsigned) {
    *d = reinterpret_cast<CUdeviceptr>(p);
    return CUDA_SUCCESS;
  };
  // A copy of 0 bytes is a no-op for the real driver whatever its addresses (the server lets
  // them through: AllocationMap::contains), and memcpy/memmove may not be given a null pointer
  // even then (fuzz_ring_records found a 0-byte cuMemcpyDtoDAsync from address 0).
  t.cuMemcpyHtoDAsync_v2 = [](CUdeviceptr d, const void* h, std::size_t n, CUstream) {
    if (n != 0) std::memcpy(device_bytes(d), h, n);
    return CUDA_SUCCESS;
  };
  t.cuMemcpyDtoHAsync_v2 = [](void* h, CUdeviceptr d, std::size_t n, CUstream) {
    if (n != 0) std::memcpy(h, device_bytes(d), n);
    return CUDA_SUCCESS;
  };
  t.cuMemcpyDtoDAsync_v2 = [](CUdeviceptr d, CUdeviceptr s, std::size_t n, CUstream) {
    if (n != 0) std::memmove(device_bytes(d), device_bytes(s), n);
    return CUDA_SUCCESS;
  };
  t.cuMemsetD8Async = [](CUdeviceptr d, unsigned char v, std::size_t n, CUstream) {
    fill(d, v, n);
    return CUDA_SUCCESS;
  };
  t.cuMemsetD16Async = [](CUdeviceptr d, unsigned short v, std::size_t n, CUstream) {
    fill(d, v, n);
    return CUDA_SUCCESS;
  };
  t.cuMemsetD32Async = [](CUdeviceptr d, unsigned v, std::size_t n, CUstream) {
    fill(d, v, n);
    return CUDA_SUCCESS;
  };
  t.cuMemsetD2D8Async = [](CUdeviceptr d, std::size_t pitch, unsigned char v, std::size_t w,
                           std::size_t h, CUstream) {
    fill_2d(d, pitch, v, w, h);
    return CUDA_SUCCESS;
  };
  t.cuMemsetD2D16Async = [](CUdeviceptr d, std::size_t pitch, unsigned short v, std::size_t w,
                            std::size_t h, CUstream) {
    fill_2d(d, pitch, v, w, h);
    return CUDA_SUCCESS;
  };
  t.cuMemsetD2D32Async = [](CUdeviceptr d, std::size_t pitch, unsigned v, std::size_t w,
                            std::size_t h, CUstream) {
    fill_2d(d, pitch, v, w, h);
    return CUDA_SUCCESS;
  };
  t.cuModuleLoadData = [](CUmodule* m, const void*) {
    *m = new_handle<CUmodule>();
    ++fake_gpu().modules_live;
    return CUDA_SUCCESS;
  };
  t.cuModuleUnload = [](CUmodule) {
    --fake_gpu().modules_live;
    return CUDA_SUCCESS;
  };
  t.cuModuleGetFunction = [](CUfunction* f, CUmodule, const char* name) {
    if (std::strcmp(name, "missing") == 0) return CUDA_ERROR_NOT_FOUND;
    *f = static_cast<CUfunction>(named(std::string("function:") + name));
    return CUDA_SUCCESS;
  };
  t.cuModuleGetGlobal_v2 = [](CUdeviceptr* p, std::size_t* bytes, CUmodule, const char*) {
    *bytes = 64;
    return alloc(p, 64);
  };
  t.cuLibraryLoadData = [](CUlibrary* l, const void* code, CUjit_option*, void**, unsigned,
                           CUlibraryOption*, void**, unsigned) {
    std::uint32_t magic = 0;
    std::memcpy(&magic, code, sizeof magic);
    if (magic == 0x466243B1u) {  // a __fatBinC_Wrapper_t
      struct {
        std::uint32_t magic, version;
        const void* data;
        const void* const* list;
      } w;
      std::memcpy(&w, code, sizeof w);
      auto fat_size = [](const void* container) {  // the header's u64 at offset 8
        std::uint64_t size = 0;
        std::memcpy(&size, static_cast<const std::byte*>(container) + 8, sizeof size);
        return size;
      };
      fake_gpu().last_wrapper_version = w.version;
      fake_gpu().last_wrapper_containers = {fat_size(w.data)};
      for (std::size_t i = 0; w.list != nullptr && w.list[i] != nullptr; ++i) {
        fake_gpu().last_wrapper_containers.push_back(fat_size(w.list[i]));
      }
    }
    *l = new_handle<CUlibrary>();
    ++fake_gpu().libraries_live;
    return CUDA_SUCCESS;
  };
  t.cuLibraryUnload = [](CUlibrary) {
    --fake_gpu().libraries_live;
    return CUDA_SUCCESS;
  };
  t.cuLibraryGetKernel = [](CUkernel* k, CUlibrary, const char* name) {
    *k = static_cast<CUkernel>(named(std::string("kernel:") + name));
    return CUDA_SUCCESS;
  };
  t.cuLibraryGetKernelCount = [](unsigned* count, CUlibrary) {
    *count = static_cast<unsigned>(fake_gpu().library_kernel_names.size());
    return fake_gpu().library_kernel_count_result;
  };
  t.cuLibraryEnumerateKernels = [](CUkernel* kernels, unsigned count, CUlibrary) {
    const auto& names = fake_gpu().library_kernel_names;
    if (count < names.size()) return CUDA_ERROR_INVALID_VALUE;
    for (std::size_t i = 0; i < names.size(); ++i) {
      kernels[i] = static_cast<CUkernel>(named("kernel:" + names[i]));
    }
    return CUDA_SUCCESS;
  };
  // The name `named` gave the handle, without its "kernel:".
  t.cuKernelGetName = [](const char** name, CUkernel kernel) {
    for (const auto& [key, handle] : fake_gpu().named) {
      if (handle == kernel && key.starts_with("kernel:")) {
        *name = key.c_str() + 7;
        return CUDA_SUCCESS;
      }
    }
    return CUDA_ERROR_INVALID_HANDLE;
  };
  t.cuLibraryGetModule = [](CUmodule* m, CUlibrary) {
    *m = new_handle<CUmodule>();
    return CUDA_SUCCESS;
  };
  t.cuLibraryGetGlobal = [](CUdeviceptr* p, std::size_t* bytes, CUlibrary, const char*) {
    *bytes = 32;
    return alloc(p, 32);
  };
  t.cuKernelGetFunction = [](CUfunction* f, CUkernel) {
    *f = new_handle<CUfunction>();
    return CUDA_SUCCESS;
  };
  t.cuKernelGetAttribute = [](int* v, CUfunction_attribute attribute, CUkernel, CUdevice) {
    *v = attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
             ? fake_gpu().kernel_dynamic_smem
             : launch_limit(attribute, 7);
    return CUDA_SUCCESS;
  };
  t.cuKernelSetAttribute = [](CUfunction_attribute attribute, int value, CUkernel, CUdevice) {
    if (attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
      fake_gpu().kernel_dynamic_smem = value;
    }
    return CUDA_SUCCESS;
  };
  // Two parameters: a pointer at 0 and an int at 8.
  t.cuKernelGetParamInfo = [](CUkernel, std::size_t i, std::size_t* offset, std::size_t* size) {
    if (i >= kKernelParams) return CUDA_ERROR_INVALID_VALUE;
    *offset = param_offset(i);
    *size = param_size(true, i);
    return CUDA_SUCCESS;
  };
  t.cuFuncGetParamInfo = [](CUfunction, std::size_t i, std::size_t* offset, std::size_t* size) {
    if (i >= kFunctionParams) return CUDA_ERROR_INVALID_VALUE;
    *offset = param_offset(i);
    *size = param_size(false, i);
    return CUDA_SUCCESS;
  };
  t.cuFuncGetAttribute = [](int* v, CUfunction_attribute attribute, CUfunction) {
    *v = launch_limit(attribute, 3);
    return CUDA_SUCCESS;
  };
  t.cuFuncSetAttribute = [](CUfunction, CUfunction_attribute, int) { return CUDA_SUCCESS; };
  t.cuFuncSetCacheConfig = [](CUfunction, CUfunc_cache) { return CUDA_SUCCESS; };
  t.cuLaunchKernel = [](CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void**, void**) { return CUDA_ERROR_NOT_SUPPORTED; };
  t.cuLaunchKernelEx = [](const CUlaunchConfig* config, CUfunction, void**, void** extra) {
    FakeGpu& gpu = fake_gpu();
    ++gpu.launches;
    if (gpu.on_launch) gpu.on_launch();
    gpu.last_launch_attribute_count = config->numAttrs;
    gpu.last_launch_args.clear();
    if (extra != nullptr) {
      auto* buffer = static_cast<const std::byte*>(extra[1]);
      std::size_t size = *static_cast<std::size_t*>(extra[3]);
      gpu.last_launch_args.assign(buffer, buffer + size);
    }
    return gpu.launch_result;
  };
  t.cuStreamDestroy_v2 = [](CUstream) {
    --fake_gpu().streams_live;
    return CUDA_SUCCESS;
  };
  t.cuStreamQuery = [](CUstream) {
    ++fake_gpu().stream_queries;
    return work_state();
  };
  t.cuStreamSynchronize = [](CUstream) {
    return CUDA_ERROR_NOT_SUPPORTED;
  };  // the server must not block
  t.cuStreamWaitEvent = [](CUstream, CUevent, unsigned) {
    ++fake_gpu().stream_waits;
    return CUDA_SUCCESS;
  };
  t.cuEventCreate = [](CUevent* e, unsigned) {
    *e = new_handle<CUevent>();
    ++fake_gpu().events_live;
    return CUDA_SUCCESS;
  };
  t.cuEventDestroy_v2 = [](CUevent) {
    --fake_gpu().events_live;
    return CUDA_SUCCESS;
  };
  t.cuEventRecordWithFlags = [](CUevent, CUstream, unsigned) { return CUDA_SUCCESS; };
  t.cuStreamWriteValue32_v2 = [](CUstream, CUdeviceptr address, cuuint32_t value, unsigned) {
    FakeGpu& gpu = fake_gpu();
    ++gpu.value_writes;
    gpu.writes_in_flight.push_back({address, value});
    work_state();  // lands now if nothing is running
    return CUDA_SUCCESS;
  };
  t.cuEventQuery = [](CUevent) {
    ++fake_gpu().event_queries;
    return work_state();
  };
  t.cuEventElapsedTime_v2 = [](float* ms, CUevent, CUevent) {
    *ms = 1.5f;
    return CUDA_SUCCESS;
  };
  t.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags = [](int* n, CUfunction, int, std::size_t,
                                                              unsigned) {
    *n = 4;
    return CUDA_SUCCESS;
  };
  t.cuOccupancyMaxActiveClusters = [](int* n, CUfunction, const CUlaunchConfig*) {
    *n = 2;
    return CUDA_SUCCESS;
  };
  t.cuOccupancyAvailableDynamicSMemPerBlock = [](std::size_t* n, CUfunction, int, int) {
    *n = 1024;
    return CUDA_SUCCESS;
  };
  add_copy_fakes(t);
  add_async_fakes(t);
  add_vmm_fakes(t);
  add_graph_fakes(t);
  return t;
}

}  // namespace mpsshim::server::test
