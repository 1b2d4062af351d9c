// Modules and libraries. Any image loads; its kernels are the host kernel table's, by name. Each
// module (a library has one per device context) owns a 256-byte `test_global`.
#include <cstring>
#include <string_view>

#include "tests/testdriver/fault_injection.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

constexpr std::string_view kGlobalName = "test_global";
constexpr std::size_t kGlobalSize = 256;

// Locked.
CUresult load_module(State& s, Device& dev, Library* library, CUmodule* out) {
  CUdeviceptr global = 0;
  if (CUresult r = allocate(s, dev, kGlobalSize, false, &global); r != CUDA_SUCCESS) return r;
  std::memset(dev.memory.host_view(global), 0, kGlobalSize);
  *out = s.modules.add(std::make_shared<Module>(Module{dev.ordinal, library, global, {}}));
  return CUDA_SUCCESS;
}

// The library's module in `device`'s context, loaded on first use (locked).
CUresult library_module(State& s, Library& lib, int device, CUmodule* out) {
  CUmodule& m = lib.modules[static_cast<std::size_t>(device)];
  if (m == nullptr) {
    if (CUresult r = load_module(s, *s.devices[static_cast<std::size_t>(device)], &lib, &m);
        r != CUDA_SUCCESS)
      return r;
  }
  *out = m;
  return CUDA_SUCCESS;
}

// The library's CUkernel for `def`, made once (locked).
CUkernel library_kernel(State& s, Library& lib, const KernelDef* def) {
  auto it = lib.kernels.find(def);
  if (it == lib.kernels.end())
    it = lib.kernels.emplace(def, s.kernels.add(std::make_shared<Kernel>(Kernel{&lib, def, {}})))
             .first;
  return it->second;
}

// The module's function for `def`, made once (locked). In a library's module it shares the
// CUkernel's attributes for that device.
Function* module_function(State& s, Module& m, const KernelDef* def) {
  auto it = m.functions.find(def);
  if (it != m.functions.end()) return s.functions.get(it->second);
  auto fn = std::make_shared<Function>(Function{&m, def, nullptr, {}});
  fn->attributes = &fn->own;
  if (m.library != nullptr) {
    Kernel* k = s.kernels.get(library_kernel(s, *m.library, def));
    fn->attributes = &k->attributes[static_cast<std::size_t>(m.device)];
  }
  Function* raw = fn.get();
  m.functions.emplace(def, s.functions.add(std::move(fn)));
  return raw;
}

CUresult global_of(Module& m, const char* name, CUdeviceptr* dptr, size_t* bytes) {
  if (name == nullptr || (dptr == nullptr && bytes == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (name != kGlobalName) return CUDA_ERROR_NOT_FOUND;
  if (dptr != nullptr) *dptr = m.global;
  if (bytes != nullptr) *bytes = kGlobalSize;
  return CUDA_SUCCESS;
}

// Whether `code` is a text image (PTX-like: it starts with a printable character and ends with a
// NUL within 64 KiB) that contains `marker`. A binary image is never read past its first byte.
bool text_image_holds(const void* code, std::string_view marker) {
  const char* text = static_cast<const char*>(code);
  if (text[0] < 0x20 || text[0] > 0x7e) return false;
  const std::size_t length = strnlen(text, 64 * 1024);
  return std::string_view(text, length).find(marker) != std::string_view::npos;
}

CUresult param_info(const KernelDef& def, size_t index, size_t* offset, size_t* size) {
  if (offset == nullptr || index >= def.params.size()) return CUDA_ERROR_INVALID_VALUE;
  *offset = def.params[index].offset;
  if (size != nullptr) *size = def.params[index].size;
  return CUDA_SUCCESS;
}

CUresult get_attribute(const FuncAttributes& a, CUfunction_attribute attrib, int* out) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
      *out = kMaxThreadsPerBlock;
      break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
      *out = 0;
      break;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES:
      *out = 0;
      break;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES:
      *out = 0;
      break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS:
      *out = 32;
      break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION:
      *out = 90;
      break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
      *out = 90;
      break;
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA:
      *out = 0;
      break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      *out = a.max_dynamic_shared;
      break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      *out = a.carveout;
      break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET:
      *out = 0;
      break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
      *out = a.required_cluster[0];
      break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
      *out = a.required_cluster[1];
      break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
      *out = a.required_cluster[2];
      break;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
      *out = a.non_portable_cluster;
      break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      *out = a.cluster_scheduling;
      break;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult set_attribute(FuncAttributes& a, CUfunction_attribute attrib, int value) {
  auto in = [value](int lo, int hi) { return value >= lo && value <= hi; };
  switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
      if (!in(0, kSharedPerBlockOptin)) return CUDA_ERROR_INVALID_VALUE;
      a.max_dynamic_shared = value;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
      if (!in(-1, 100)) return CUDA_ERROR_INVALID_VALUE;
      a.carveout = value;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT:
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH:
      if (!in(0, 16)) return CUDA_ERROR_INVALID_VALUE;
      a.required_cluster[static_cast<std::size_t>(
          attrib - CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH)] = value;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
      if (!in(0, 1)) return CUDA_ERROR_INVALID_VALUE;
      a.non_portable_cluster = value;
      return CUDA_SUCCESS;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      if (!in(0, 2)) return CUDA_ERROR_INVALID_VALUE;
      a.cluster_scheduling = value;
      return CUDA_SUCCESS;
    default:  // read-only, or unknown
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// Unloading waits for all queued work (a kernel may be using the module's global), then unmaps
// with nothing running. Returns with `lock` held.
void quiesce(State& s, std::unique_lock<std::mutex>& lock,
             std::unique_lock<std::shared_mutex>& use) {
  lock.unlock();
  drain(s, -1);
  use.lock();
  lock.lock();
}

}  // namespace

CUresult resolve_function(State& s, CUfunction handle, int device, Function*& out) {
  if (Function* fn = s.functions.get(handle)) {
    out = fn;
    return CUDA_SUCCESS;
  }
  // A CUkernel cast to CUfunction names the kernel's function in the given context.
  Kernel* k = s.kernels.get(reinterpret_cast<CUkernel>(handle));
  if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
  CUmodule m = nullptr;
  if (CUresult r = library_module(s, *k->library, device, &m); r != CUDA_SUCCESS) return r;
  out = module_function(s, *s.modules.get(m), k->def);
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  return entry([&](State& s) {
    if (inject_failure("cuModuleLoadData")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    if (dev == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return load_module(s, *dev, nullptr, module);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  return entry([&](State& s) {
    std::unique_lock lock(s.mutex);
    std::unique_lock use(s.memory_use, std::defer_lock);
    auto known = [&] {
      const Module* m = s.modules.get(hmod);
      // A library's module belongs to the library: cuLibraryUnload frees it.
      return m != nullptr && m->library == nullptr;
    };
    if (!known()) return CUDA_ERROR_INVALID_HANDLE;
    quiesce(s, lock, use);
    if (!known()) return CUDA_ERROR_INVALID_HANDLE;
    destroy_module(s, hmod);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod,
                                                               const char* name) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Module* m = s.modules.get(hmod);
    if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    const KernelDef* def = find_kernel(name);
    if (def == nullptr) return CUDA_ERROR_NOT_FOUND;
    *hfunc = reinterpret_cast<CUfunction>(module_function(s, *m, def));
    return CUDA_SUCCESS;
  });
}

// A module holds every kernel of the host kernel table, in the table's order.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuModuleGetFunctionCount(unsigned int* count,
                                                                    CUmodule hmod) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (s.modules.get(hmod) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *count = static_cast<unsigned int>(kernel_table().size());
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuModuleEnumerateFunctions(CUfunction* functions,
                                                                      unsigned int count,
                                                                      CUmodule hmod) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (functions == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Module* m = s.modules.get(hmod);
    if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    auto table = kernel_table();
    if (count < table.size()) return CUDA_ERROR_INVALID_VALUE;
    for (std::size_t i = 0; i < table.size(); ++i) {
      functions[i] = reinterpret_cast<CUfunction>(module_function(s, *m, &table[i]));
    }
    return CUDA_SUCCESS;
  });
}

// The table's names are string literals, so data() ends with a NUL.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction hfunc) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Function* fn = s.functions.get(hfunc);
    if (fn == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *name = fn->def->name.data();
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes,
                                                                CUmodule hmod, const char* name) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Module* m = s.modules.get(hmod);
    if (m == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    return global_of(*m, name, dptr, bytes);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLibraryLoadData(
    CUlibrary* library, const void* code, CUjit_option* jitOptions, void** jitOptionsValues,
    unsigned int numJitOptions, CUlibraryOption* libraryOptions, void** libraryOptionValues,
    unsigned int numLibraryOptions) {
  return entry([&](State& s) {
    if (inject_failure("cuLibraryLoadData")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    if (library == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (numJitOptions > 0 && (jitOptions == nullptr || jitOptionsValues == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    if (numLibraryOptions > 0 && (libraryOptions == nullptr || libraryOptionValues == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    auto lib = std::make_shared<Library>();
    lib->lists_no_kernels = text_image_holds(code, kListsNoKernels);
    *library = s.libraries.add(std::move(lib));  // context-independent, as in CUDA 12+
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLibraryUnload(CUlibrary hlib) {
  return entry([&](State& s) {
    std::unique_lock lock(s.mutex);
    std::unique_lock use(s.memory_use, std::defer_lock);
    if (s.libraries.get(hlib) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    quiesce(s, lock, use);
    Library* lib = s.libraries.get(hlib);
    if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    for (CUmodule m : lib->modules)
      if (m != nullptr) destroy_module(s, m);
    for (const auto& [def, k] : lib->kernels) s.kernels.erase(k);
    s.libraries.erase(hlib);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLibraryGetKernel(CUkernel* pKernel, CUlibrary hlib,
                                                              const char* name) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (pKernel == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Library* lib = s.libraries.get(hlib);
    if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    const KernelDef* def = find_kernel(name);
    if (def == nullptr) return CUDA_ERROR_NOT_FOUND;
    *pKernel = library_kernel(s, *lib, def);
    return CUDA_SUCCESS;
  });
}

// A library holds every kernel of the host kernel table, in the table's order.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLibraryGetKernelCount(unsigned int* count,
                                                                   CUlibrary hlib) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Library* lib = s.libraries.get(hlib);
    if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *count = lib->lists_no_kernels ? 0 : static_cast<unsigned int>(kernel_table().size());
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLibraryEnumerateKernels(CUkernel* kernels,
                                                                     unsigned int count,
                                                                     CUlibrary hlib) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (kernels == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Library* lib = s.libraries.get(hlib);
    if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    auto table = lib->lists_no_kernels ? std::span<const KernelDef>{} : kernel_table();
    if (count < table.size()) return CUDA_ERROR_INVALID_VALUE;
    for (std::size_t i = 0; i < table.size(); ++i) kernels[i] = library_kernel(s, *lib, &table[i]);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuKernelGetName(const char** name, CUkernel kernel) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Kernel* k = s.kernels.get(kernel);
    if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    *name = k->def->name.data();
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLibraryGetModule(CUmodule* pMod, CUlibrary hlib) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    if (dev == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (pMod == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Library* lib = s.libraries.get(hlib);
    if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    return library_module(s, *lib, dev->ordinal, pMod);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes,
                                                              CUlibrary hlib, const char* name) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    if (dev == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    Library* lib = s.libraries.get(hlib);
    if (lib == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    CUmodule m = nullptr;
    if (CUresult r = library_module(s, *lib, dev->ordinal, &m); r != CUDA_SUCCESS) return r;
    return global_of(*s.modules.get(m), name, dptr, bytes);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuKernelGetFunction(CUfunction* pFunc, CUkernel kernel) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    if (dev == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (pFunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (s.kernels.get(kernel) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    Function* fn = nullptr;
    if (CUresult r = resolve_function(s, reinterpret_cast<CUfunction>(kernel), dev->ordinal, fn);
        r != CUDA_SUCCESS)
      return r;
    *pFunc = reinterpret_cast<CUfunction>(fn);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuKernelGetAttribute(int* pi,
                                                                CUfunction_attribute attrib,
                                                                CUkernel kernel, CUdevice dev) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Kernel* k = s.kernels.get(kernel);
    if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    return get_attribute(k->attributes[static_cast<std::size_t>(dev)], attrib, pi);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute attrib,
                                                                int val, CUkernel kernel,
                                                                CUdevice dev) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Kernel* k = s.kernels.get(kernel);
    if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    return set_attribute(k->attributes[static_cast<std::size_t>(dev)], attrib, val);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex,
                                                                size_t* paramOffset,
                                                                size_t* paramSize) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Kernel* k = s.kernels.get(kernel);
    if (k == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    return param_info(*k->def, paramIndex, paramOffset, paramSize);
  });
}

// Only a true CUfunction: given a CUkernel the real driver answers CUDA_ERROR_INVALID_HANDLE
// (measured), so this does not go through resolve_function.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuFuncGetParamInfo(CUfunction func, size_t paramIndex,
                                                              size_t* paramOffset,
                                                              size_t* paramSize) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Function* fn = s.functions.get(func);
    if (fn == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    return param_info(*fn->def, paramIndex, paramOffset, paramSize);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuFuncGetAttribute(int* pi, CUfunction_attribute attrib,
                                                              CUfunction hfunc) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    Function* fn = nullptr;
    if (CUresult r = resolve_function(s, hfunc, dev ? dev->ordinal : -1, fn); r != CUDA_SUCCESS)
      return r;
    return get_attribute(*fn->attributes, attrib, pi);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc,
                                                              CUfunction_attribute attrib,
                                                              int value) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    Function* fn = nullptr;
    if (CUresult r = resolve_function(s, hfunc, dev ? dev->ordinal : -1, fn); r != CUDA_SUCCESS)
      return r;
    return set_attribute(*fn->attributes, attrib, value);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc,
                                                                CUfunc_cache config) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    Device* dev = current_device(s);
    Function* fn = nullptr;
    if (CUresult r = resolve_function(s, hfunc, dev ? dev->ordinal : -1, fn); r != CUDA_SUCCESS)
      return r;
    if (static_cast<unsigned>(config) > CU_FUNC_CACHE_PREFER_EQUAL) return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;  // a preference; nothing here depends on it
  });
}
