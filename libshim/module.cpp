// Modules, libraries, functions and kernels. Images are shipped to the server once, through a
// memfd, before the load call returns (the caller may free its copy). Functions carry their
// parameter layout (fetched with the handle, one round trip) and a cache of their attributes:
// PyTorch asks cuKernelGetAttribute thousands of times per inference.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/client_view.hpp"
#include "libshim/darkapi/image_length.hpp"
#include "libshim/kernel_lookup.hpp"
#include "proto/fd_io.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

namespace {

using proto::write_all;

// A library's load asks for its kernels' names (`names`, kernel_lookup.hpp) unless the client
// looks its kernels up eagerly; a module's passes nullptr.
CUresult ship_image(Context* ctx, std::span<const std::span<const std::byte>> pieces,
                    proto::ImageKind kind, proto::WireHandle& out,
                    proto::LibraryLoadRep* names = nullptr) {
  proto::UniqueFd fd(::memfd_create("mpsshim-image", MFD_CLOEXEC));
  if (!fd) return CUDA_ERROR_OUT_OF_MEMORY;
  std::uint64_t total = 0;
  for (auto piece : pieces) {
    if (!write_all(fd.get(), piece.data(), piece.size())) return CUDA_ERROR_OUT_OF_MEMORY;
    total += piece.size();
  }
  std::uint32_t token = 0;
  if (CUresult rc = ctx->session->send_fd(proto::MessageKind::kModuleImage, fd.get(), total, token);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  proto::ImageLoadReq request{ctx->wire,
                              total,
                              token,
                              kind,
                              pieces.size() > 1 ? static_cast<std::uint32_t>(pieces.size()) : 0,
                              0};
  if (names != nullptr && config().lazy_kernels) {
    request.flags = proto::kImageLoadKernelNames;
    CUresult rc = ctx->session->call(proto::Op::kImageLoad, request, names);
    if (rc == CUDA_SUCCESS) out = names->handle;
    return rc;
  }
  proto::ImageLoadRep reply{};
  CUresult rc = ctx->session->call(proto::Op::kImageLoad, request, &reply);
  if (rc == CUDA_SUCCESS) out = reply.handle;
  return rc;
}

// A file's bytes plus a terminating NUL (PTX files carry none; the driver reads text images up
// to their NUL).
bool read_file(const char* path, std::vector<std::byte>& out) {
  proto::UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) return false;
  out.resize(static_cast<std::size_t>(st.st_size) + 1);
  std::size_t got = 0;
  while (got < static_cast<std::size_t>(st.st_size)) {
    ssize_t n = ::read(fd.get(), out.data() + got, out.size() - 1 - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<std::size_t>(n);
  }
  out[got] = std::byte{0};
  return true;
}

CUresult load_module(CUmodule* module, const void* image) {
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::optional<std::size_t> length = module_image_length(image);
  if (!length) return CUDA_ERROR_INVALID_IMAGE;
  std::span<const std::byte> piece(static_cast<const std::byte*>(image), *length);
  proto::WireHandle wire = 0;
  if (CUresult rc = ship_image(ctx, {&piece, 1}, proto::ImageKind::kModule, wire);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  auto* object = new Module();
  object->ctx = ctx;
  object->wire = wire;
  *module = reinterpret_cast<CUmodule>(object);
  return CUDA_SUCCESS;
}

// A library's image kept past its load: views of the caller's memory when it is `preserved`,
// else views of a copy made into `copy`. May throw std::bad_alloc.
void keep_image(std::vector<std::span<const std::byte>> pieces, bool preserved,
                std::vector<std::span<const std::byte>>& kept, std::vector<std::byte>& copy) {
  if (preserved) {
    kept = std::move(pieces);
    return;
  }
  std::size_t total = 0;
  for (auto piece : pieces) total += piece.size();
  copy.reserve(total);  // no reallocation below: the views stay valid
  for (auto piece : pieces) {
    const std::byte* at = copy.data() + copy.size();
    copy.insert(copy.end(), piece.begin(), piece.end());
    kept.emplace_back(at, piece.size());
  }
}

// `preserved`: the caller promised (CU_LIBRARY_BINARY_IS_PRESERVED) that `code` stays valid
// until cuLibraryUnload.
CUresult load_library(CUlibrary* library, const void* code, bool preserved) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  if (library == nullptr || code == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::span<const std::byte>> pieces;
  if (!library_image_pieces(code, pieces)) return CUDA_ERROR_INVALID_IMAGE;
  Context* ctx = nullptr;
  CUresult rc = current(ctx);
  if (rc == CUDA_ERROR_INVALID_CONTEXT) {
    // No current context: the real driver loads a library without one (the CUDA runtime does
    // so at its initialisation), so the image is shipped into the first context that is
    // current when the library is used. Unless preserved, it is copied now: the caller may
    // free it as soon as this returns.
    auto* object = new Library();
    try {
      keep_image(std::move(pieces), preserved, object->unbound_pieces, object->unbound_copy);
    } catch (...) {
      delete object;
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *library = reinterpret_cast<CUlibrary>(object);
    return CUDA_SUCCESS;
  }
  if (rc != CUDA_SUCCESS) return rc;
  proto::WireHandle wire = 0;
  auto names = std::make_unique<proto::LibraryLoadRep>();
  if (rc = ship_image(ctx, pieces, proto::ImageKind::kLibrary, wire, names.get());
      rc != CUDA_SUCCESS) {
    return rc;
  }
  auto* object = new Library();
  object->ctx = ctx;
  object->wire = wire;
  take_kernel_names(object, *names);
  // Kept for the other GPUs' servers (Library::image); copied unless preserved.
  if (visible_device_count() > 1) {
    try {
      keep_image(std::move(pieces), preserved, object->image, object->image_copy);
    } catch (...) {
      object->image.clear();
    }
  }
  *library = reinterpret_cast<CUlibrary>(object);
  return CUDA_SUCCESS;
}

// Ships a library loaded with no current context into the calling thread's current context (on a
// thread with none, a retained primary context: context_for_library), on the library's first
// use. The caller holds library->mutex.
CUresult bind_library(Library* library) {
  if (library->ctx != nullptr) return CUDA_SUCCESS;
  Context* ctx = nullptr;
  if (CUresult rc = context_for_library(ctx); rc != CUDA_SUCCESS) return rc;
  proto::WireHandle wire = 0;
  auto names = std::make_unique<proto::LibraryLoadRep>();
  if (CUresult rc =
          ship_image(ctx, library->unbound_pieces, proto::ImageKind::kLibrary, wire, names.get());
      rc != CUDA_SUCCESS) {
    return rc;
  }
  library->ctx = ctx;
  library->wire = wire;
  take_kernel_names(library, *names);
  if (visible_device_count() > 1) {
    library->image = std::move(library->unbound_pieces);
    library->image_copy = std::move(library->unbound_copy);
  }
  std::vector<std::span<const std::byte>>().swap(library->unbound_pieces);
  std::vector<std::byte>().swap(library->unbound_copy);
  return CUDA_SUCCESS;
}

void forget_functions(std::unordered_map<std::string, Function*>& functions) {
  for (auto& [name, f] : functions) f->magic = Magic::kDead;
  functions.clear();
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  return load_module(module, image);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* module, const void* image,
                                                   unsigned int count, CUjit_option*, void**) {
  if (count > 0) {
    log_once("cuModuleLoadDataEx.options", LogLevel::kInfo,
             "cuModuleLoadDataEx: JIT options are not forwarded; the server's driver uses its "
             "defaults");
  }
  return load_module(module, image);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuModuleLoadFatBinary(CUmodule* module, const void* image) {
  return load_module(module, image);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuModuleLoad(CUmodule* module, const char* path) {
  if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::byte> bytes;
  if (!read_file(path, bytes)) return CUDA_ERROR_FILE_NOT_FOUND;
  return load_module(module, bytes.data());
}

MPSSHIM_EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Module* module = object_of<Module>(handle);
  if (module == nullptr || module->owned_by_library) return CUDA_ERROR_INVALID_HANDLE;
  proto::HandleReq request{module->wire};
  CUresult rc =
      module->ctx->session->call(proto::Op::kModuleUnload, request, static_cast<int*>(nullptr));
  std::lock_guard lock(module->mutex);
  forget_functions(module->functions);
  module->magic = Magic::kDead;
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuModuleGetFunction(CUfunction* hfunc, CUmodule handle,
                                                    const char* name) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Module* module = object_of<Module>(handle);
  if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(module->mutex);
  if (auto it = module->functions.find(name); it != module->functions.end()) {
    *hfunc = reinterpret_cast<CUfunction>(it->second);
    return CUDA_SUCCESS;
  }
  proto::FunctionRep reply{};
  CUresult rc =
      lookup(module->ctx, proto::Op::kModuleGetFunction, module->wire, name, &reply, sizeof reply);
  if (rc != CUDA_SUCCESS) return rc;
  Function* f = make_function(module->ctx, reply, name, false);
  f->module = module;
  module->functions.emplace(name, f);
  *hfunc = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

namespace {

// Fills module->function_names from the server, a reply at a time (the caller holds
// module->mutex).
CUresult fetch_function_names(Module* module) {
  if (module->function_names_known) return CUDA_SUCCESS;
  std::vector<std::string> names;
  for (;;) {
    proto::ModuleFunctionsReq request{module->wire, static_cast<std::uint32_t>(names.size()), 0};
    proto::ModuleFunctionsRep reply{};
    if (CUresult rc = module->ctx->session->call(proto::Op::kModuleFunctionNames, request, &reply);
        rc != CUDA_SUCCESS) {
      return rc;
    }
    if (!append_names(reply.names, reply.count, reply.bytes, names)) {
      return CUDA_ERROR_UNKNOWN;  // a malformed reply
    }
    if (names.size() >= reply.total) break;
    if (reply.count == 0) return CUDA_ERROR_UNKNOWN;  // no progress: never loop forever
  }
  module->function_names = std::move(names);
  module->function_names_known = true;
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuModuleGetFunctionCount(unsigned int* count, CUmodule handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Module* module = object_of<Module>(handle);
  if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(module->mutex);
  if (CUresult rc = fetch_function_names(module); rc != CUDA_SUCCESS) return rc;
  *count = static_cast<unsigned int>(module->function_names.size());
  return CUDA_SUCCESS;
}

// The handles are cuModuleGetFunction's for each name, so that a function found either way is
// the same handle, as with the real driver.
MPSSHIM_EXPORT CUresult CUDAAPI cuModuleEnumerateFunctions(CUfunction* functions,
                                                           unsigned int count, CUmodule handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Module* module = object_of<Module>(handle);
  if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (functions == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::string> names;
  {
    std::lock_guard lock(module->mutex);
    if (CUresult rc = fetch_function_names(module); rc != CUDA_SUCCESS) return rc;
    names = module->function_names;
  }
  const std::size_t n = std::min<std::size_t>(count, names.size());
  for (std::size_t i = 0; i < n; ++i) {
    if (CUresult rc = cuModuleGetFunction(&functions[i], handle, names[i].c_str());
        rc != CUDA_SUCCESS) {
      return rc;
    }
  }
  return CUDA_SUCCESS;
}

namespace {

CUresult get_global(Context* ctx, proto::Op op, proto::WireHandle handle, CUdeviceptr* dptr,
                    size_t* bytes, const char* name) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  proto::GlobalRep reply{};
  CUresult rc = lookup(ctx, op, handle, name, &reply, sizeof reply);
  if (rc != CUDA_SUCCESS) return rc;
  if (!address_book().find_device(reply.dptr, nullptr)) {
    DeviceRange global{reply.dptr, reply.bytes, ctx};
    global.module_global = true;
    address_book().add_device(global);
  }
  if (dptr) *dptr = reply.dptr;
  if (bytes) *bytes = reply.bytes;
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuModuleGetGlobal_v2(CUdeviceptr* dptr, size_t* bytes,
                                                     CUmodule handle, const char* name) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Module* module = object_of<Module>(handle);
  if (module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  return get_global(module->ctx, proto::Op::kModuleGetGlobal, module->wire, dptr, bytes, name);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuModuleGetLoadingMode(CUmoduleLoadingMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *mode = config().lazy_loading ? CU_MODULE_LAZY_LOADING : CU_MODULE_EAGER_LOADING;
  return CUDA_SUCCESS;
}

// ---- libraries ----

MPSSHIM_EXPORT CUresult CUDAAPI cuLibraryLoadData(CUlibrary* library, const void* code,
                                                  CUjit_option*, void**, unsigned int,
                                                  CUlibraryOption* options, void** values,
                                                  unsigned int count) {
  // CU_LIBRARY_BINARY_IS_PRESERVED is only a hint: with a current context the image is shipped
  // now either way; without one it spares a copy until the first use ships it. The CUDA
  // runtime passes it with the value (void*)1.
  bool preserved = false;
  for (unsigned i = 0; options != nullptr && i < count; ++i) {
    if (options[i] == CU_LIBRARY_BINARY_IS_PRESERVED) {
      preserved = values != nullptr && values[i] != nullptr;
    }
  }
  return load_library(library, code, preserved);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLibraryLoadFromFile(CUlibrary* library, const char* path,
                                                      CUjit_option*, void**, unsigned int,
                                                      CUlibraryOption*, void**, unsigned int) {
  if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::byte> bytes;
  if (!read_file(path, bytes)) return CUDA_ERROR_FILE_NOT_FOUND;
  return load_library(library, bytes.data(), false);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLibraryUnload(CUlibrary handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Library* library = object_of<Library>(handle);
  if (library == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard lock(library->mutex);
  CUresult rc = CUDA_SUCCESS;
  // Nothing to do on the server when the library was never shipped. Once shipped it lives
  // there until now, whatever became of the context it was shipped from (the CUDA runtime
  // unloads its libraries at exit, after a cudaDeviceReset). One-way: the handle was checked
  // here, and the CUDA runtime unloads each of its libraries at exit (4,383 for PyTorch), which
  // took a minute of round trips on a crowded server (the soak's PyTorch clients). The server
  // logs a failure; it frees the library behind the work queued before.
  if (library->ctx != nullptr && library->ctx->session->fault() == CUDA_SUCCESS) {
    proto::HandleReq request{library->wire};
    rc = library->ctx->session->post(proto::Op::kLibraryUnload, request);
  }
  for (const Library::Elsewhere& copy : library->elsewhere) {
    if (copy.ctx->session->fault() != CUDA_SUCCESS) continue;
    copy.ctx->session->post(proto::Op::kLibraryUnload, proto::HandleReq{copy.wire});
  }
  forget_functions(library->kernels);
  if (library->module) {
    forget_functions(library->module->functions);
    library->module->magic = Magic::kDead;
  }
  library->magic = Magic::kDead;
  return rc;
}

Function* mpsshim::shim::kernel_on_device(Function* f, Context* ctx, CUresult& rc) {
  rc = CUDA_ERROR_INVALID_HANDLE;
  // A function cuKernelGetFunction gave for one GPU: its kernel's counterpart on this one.
  if (!f->is_kernel && f->kernel_of != nullptr) f = f->kernel_of;
  Library* library = f->library;
  if (!f->is_kernel || library == nullptr || ctx->device < 0 ||
      ctx->device >= static_cast<int>(f->on_device.size())) {
    return nullptr;
  }
  auto& slot = f->on_device[static_cast<std::size_t>(ctx->device)];
  if (Function* there = slot.load(std::memory_order_acquire)) {
    rc = CUDA_SUCCESS;
    return there;
  }
  std::lock_guard lock(library->mutex);
  if (Function* there = slot.load(std::memory_order_relaxed)) {
    rc = CUDA_SUCCESS;
    return there;
  }
  if (library->image.empty()) return nullptr;
  proto::WireHandle wire = 0;
  for (const Library::Elsewhere& copy : library->elsewhere) {
    if (copy.ctx->session == ctx->session) wire = copy.wire;
  }
  if (wire == 0) {
    auto names = std::make_unique<proto::LibraryLoadRep>();
    if (rc = ship_image(ctx, library->image, proto::ImageKind::kLibrary, wire, names.get());
        rc != CUDA_SUCCESS) {
      return nullptr;
    }
    library->elsewhere.push_back({ctx, wire});
  }
  proto::FunctionRep reply{};
  if (rc = lookup(ctx, proto::Op::kLibraryGetKernel, wire, f->name.c_str(), &reply, sizeof reply);
      rc != CUDA_SUCCESS) {
    return nullptr;
  }
  Function* there = make_function(ctx, reply, f->name, true);
  there->library = library;
  slot.store(there, std::memory_order_release);
  log_debug("kernel {} shipped to device {}'s server for its first launch there", f->name,
            ctx->device);
  return there;
}

Function* mpsshim::shim::kernel_for_device(Function* f, int device, CUresult& rc) {
  rc = CUDA_SUCCESS;
  if (device == f->ctx->device) return f;
  Context* ctx = nullptr;
  if (rc = primary_context(device, ctx); rc != CUDA_SUCCESS) return nullptr;
  Function* there = kernel_on_device(f, ctx, rc);
  if (there == nullptr && rc == CUDA_ERROR_INVALID_HANDLE) rc = CUDA_ERROR_INVALID_DEVICE;
  return there;
}

Function* mpsshim::shim::function_here(Function* f, CUresult& rc) {
  rc = CUDA_SUCCESS;
  if (!f->is_kernel) return f;
  Context* ctx = nullptr;
  if (current(ctx) != CUDA_SUCCESS || ctx->session == f->ctx->session) return f;
  return kernel_on_device(f, ctx, rc);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLibraryGetKernel(CUkernel* kernel, CUlibrary handle,
                                                   const char* name) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Library* library = object_of<Library>(handle);
  if (library == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (kernel == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(library->mutex);
  if (auto it = library->kernels.find(name); it != library->kernels.end()) {
    *kernel = reinterpret_cast<CUkernel>(it->second);
    return CUDA_SUCCESS;
  }
  if (CUresult rc = bind_library(library); rc != CUDA_SUCCESS) return rc;
  if (Function* f = listed_kernel(library, name)) {
    *kernel = reinterpret_cast<CUkernel>(f);
    return CUDA_SUCCESS;
  }
  // Not listed: the server's answer decides. cuDNN's libraries list no kernels at all and find
  // them by name (measured, driver 580), so every one of their kernels comes this way.
  log_debug("kernel {} is not among the {} kernels its library listed; looked up by name", name,
            library->kernel_names_known ? library->kernel_names.size() : 0);
  proto::FunctionRep reply{};
  CUresult rc =
      lookup(library->ctx, proto::Op::kLibraryGetKernel, library->wire, name, &reply, sizeof reply);
  if (rc != CUDA_SUCCESS) return rc;
  Function* f = make_function(library->ctx, reply, name, true);
  f->library = library;
  library->kernels.emplace(name, f);
  *kernel = reinterpret_cast<CUkernel>(f);
  return CUDA_SUCCESS;
}

namespace {

// The library's listed kernel names (kernel_lookup.hpp), shipping it first if need be; the
// caller holds library->mutex. A library whose kernels the server did not list answers
// CUDA_ERROR_NOT_SUPPORTED, and says so in the log (once).
CUresult listed_names(Library* library) {
  if (CUresult rc = bind_library(library); rc != CUDA_SUCCESS) return rc;
  if (library->kernel_names_known) return CUDA_SUCCESS;
  static constinit std::atomic<bool> logged{false};
  log_once(
      logged, LogLevel::kWarn,
      "the server did not list this library's kernels (MPSSHIM_KERNEL_LOOKUP=eager or "
      "CUDA_MODULE_LOADING=EAGER); cuLibraryGetKernelCount and cuLibraryEnumerateKernels return "
      "CUDA_ERROR_NOT_SUPPORTED");
  return CUDA_ERROR_NOT_SUPPORTED;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuLibraryGetKernelCount(unsigned int* count, CUlibrary handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Library* library = object_of<Library>(handle);
  if (library == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(library->mutex);
  if (CUresult rc = listed_names(library); rc != CUDA_SUCCESS) return rc;
  *count = static_cast<unsigned int>(library->kernel_names.size());
  return CUDA_SUCCESS;
}

// The handles are cuLibraryGetKernel's for each name, so that a kernel found either way is the
// same handle, as with the real driver.
MPSSHIM_EXPORT CUresult CUDAAPI cuLibraryEnumerateKernels(CUkernel* kernels, unsigned int count,
                                                          CUlibrary handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Library* library = object_of<Library>(handle);
  if (library == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (kernels == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(library->mutex);
  if (CUresult rc = listed_names(library); rc != CUDA_SUCCESS) return rc;
  const std::size_t n = std::min<std::size_t>(count, library->kernel_names.size());
  for (std::size_t i = 0; i < n; ++i) {
    const std::string& name = library->kernel_names[i];
    auto it = library->kernels.find(name);
    Function* f = it != library->kernels.end() ? it->second : listed_kernel(library, name);
    kernels[i] = reinterpret_cast<CUkernel>(f);
  }
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLibraryGetModule(CUmodule* module, CUlibrary handle) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Library* library = object_of<Library>(handle);
  if (library == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(library->mutex);
  if (CUresult rc = bind_library(library); rc != CUDA_SUCCESS) return rc;
  if (library->module == nullptr) {
    proto::HandleReq request{library->wire};
    proto::ImageLoadRep reply{};
    CUresult rc = library->ctx->session->call(proto::Op::kLibraryGetModule, request, &reply);
    if (rc != CUDA_SUCCESS) return rc;
    auto* m = new Module();
    m->ctx = library->ctx;
    m->wire = reply.handle;
    m->owned_by_library = true;
    library->module = m;
  }
  *module = reinterpret_cast<CUmodule>(library->module);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLibraryGetGlobal(CUdeviceptr* dptr, size_t* bytes,
                                                   CUlibrary handle, const char* name) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Library* library = object_of<Library>(handle);
  if (library == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  {
    std::lock_guard lock(library->mutex);
    if (CUresult rc = bind_library(library); rc != CUDA_SUCCESS) return rc;
  }
  return get_global(library->ctx, proto::Op::kLibraryGetGlobal, library->wire, dptr, bytes, name);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuKernelGetLibrary(CUlibrary* library, CUkernel kernel) {
  Function* f = object_of<Function>(kernel);
  if (f == nullptr || !f->is_kernel) return CUDA_ERROR_INVALID_HANDLE;
  if (library == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *library = reinterpret_cast<CUlibrary>(f->library);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuKernelGetFunction(CUfunction* pfunc, CUkernel kernel) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* k = object_of<Function>(kernel);
  if (k == nullptr || !k->is_kernel) return CUDA_ERROR_INVALID_HANDLE;
  if (pfunc == nullptr) return CUDA_ERROR_INVALID_VALUE;
  // The function is the current context's (one per GPU, each GPU another server).
  if (CUcontext current = current_context(); current != nullptr) {
    Context* ctx = object_of<Context>(current);
    if (ctx != nullptr && ctx->session != nullptr && ctx->session != k->ctx->session) {
      CUresult rc = CUDA_ERROR_INVALID_HANDLE;
      k = kernel_on_device(k, ctx, rc);
      if (k == nullptr) return rc;
    }
  }
  if (Function* f = k->function_of_kernel.load(std::memory_order_acquire)) {
    *pfunc = reinterpret_cast<CUfunction>(f);
    return CUDA_SUCCESS;
  }
  if (CUresult rc = usable(k); rc != CUDA_SUCCESS) return rc;
  proto::HandleReq request{k->wire};
  proto::FunctionRep reply{};
  CUresult rc = k->ctx->session->call(proto::Op::kKernelGetFunction, request, &reply);
  if (rc != CUDA_SUCCESS) return rc;
  Function* f = make_function(k->ctx, reply, k->name, false);
  f->kernel_of = k;
  Function* expected = nullptr;
  if (!k->function_of_kernel.compare_exchange_strong(expected, f)) {
    delete f;  // another thread won the race; same server function
    f = expected;
  }
  *pfunc = reinterpret_cast<CUfunction>(f);
  return CUDA_SUCCESS;
}

// ---- attributes and parameter layouts (cached) ----

namespace {

CUresult cached_attribute(Function* f, int attribute, int device, proto::Op op, int* value) {
  if (attribute < 0 || attribute >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  std::int64_t cached = f->attributes[attribute].load(std::memory_order_relaxed);
  if (cached != 0) {
    *value = static_cast<int>(cached - 1);
    return CUDA_SUCCESS;
  }
  if (CUresult rc = usable(f); rc != CUDA_SUCCESS) return rc;
  proto::AttributeReq request{f->wire, attribute, 0, device, 0};
  proto::AttributeRep reply{};
  CUresult rc = f->ctx->session->call(op, request, &reply);
  if (rc != CUDA_SUCCESS) return rc;
  f->attributes[attribute].store(std::int64_t{reply.value} + 1, std::memory_order_relaxed);
  *value = reply.value;
  return CUDA_SUCCESS;
}

CUresult set_attribute(Function* f, int attribute, int value, int device, proto::Op op) {
  if (attribute < 0 || attribute >= CU_FUNC_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult rc = usable(f); rc != CUDA_SUCCESS) return rc;
  proto::AttributeReq request{f->wire, attribute, value, device, 0};
  CUresult rc = f->ctx->session->call(op, request, static_cast<int*>(nullptr));
  // Setting one attribute can change others (max dynamic shared memory vs. carveout), and the
  // function's occupancy.
  for (auto& a : f->attributes) a.store(0, std::memory_order_relaxed);
  function_settings_generation.fetch_add(1, std::memory_order_acq_rel);
  return rc;
}

CUresult param_info(Function* f, size_t index, size_t* offset, size_t* size) {
  if (CUresult rc = usable(f); rc != CUDA_SUCCESS) return rc;
  if (index >= f->params.size()) return CUDA_ERROR_INVALID_VALUE;
  if (offset) *offset = f->params[index].offset;
  if (size) *size = f->params[index].size;
  return CUDA_SUCCESS;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuFuncGetAttribute(int* value, CUfunction_attribute attribute,
                                                   CUfunction hfunc) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(hfunc);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult rc = CUDA_SUCCESS;
  if (f = function_here(f, rc); f == nullptr) return rc;
  proto::Op op = f->is_kernel ? proto::Op::kKernelGetAttribute : proto::Op::kFuncGetAttribute;
  return cached_attribute(f, attribute, f->ctx->device, op, value);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attribute,
                                                   int value) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(hfunc);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult rc = CUDA_SUCCESS;
  if (f = function_here(f, rc); f == nullptr) return rc;
  proto::Op op = f->is_kernel ? proto::Op::kKernelSetAttribute : proto::Op::kFuncSetAttribute;
  return set_attribute(f, attribute, value, f->ctx->device, op);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuKernelGetAttribute(int* value, CUfunction_attribute attribute,
                                                     CUkernel kernel, CUdevice device) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(kernel);
  if (f == nullptr || !f->is_kernel) return CUDA_ERROR_INVALID_HANDLE;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult rc = CUDA_SUCCESS;
  if (f = kernel_for_device(f, device, rc); f == nullptr) return rc;
  return cached_attribute(f, attribute, device, proto::Op::kKernelGetAttribute, value);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute attribute, int value,
                                                     CUkernel kernel, CUdevice device) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(kernel);
  if (f == nullptr || !f->is_kernel) return CUDA_ERROR_INVALID_HANDLE;
  CUresult rc = CUDA_SUCCESS;
  if (f = kernel_for_device(f, device, rc); f == nullptr) return rc;
  return set_attribute(f, attribute, value, device, proto::Op::kKernelSetAttribute);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(hfunc);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  CUresult here = CUDA_SUCCESS;
  if (f = function_here(f, here); f == nullptr) return here;
  if (CUresult rc = usable(f); rc != CUDA_SUCCESS) return rc;
  proto::AttributeReq request{f->wire, static_cast<std::int32_t>(config), 0, f->ctx->device, 0};
  CUresult rc =
      f->ctx->session->call(proto::Op::kFuncSetCacheConfig, request, static_cast<int*>(nullptr));
  function_settings_generation.fetch_add(1, std::memory_order_acq_rel);  // the occupancy may move
  return rc;
}

// A library kernel's preference on one GPU: its copy there (kernel_for_device), set as for a
// function (the server's driver applies it to that GPU's function).
MPSSHIM_EXPORT CUresult CUDAAPI cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config,
                                                       CUdevice device) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Function* f = object_of<Function>(kernel);
  if (f == nullptr || !f->is_kernel) return CUDA_ERROR_INVALID_HANDLE;
  CUresult rc = CUDA_SUCCESS;
  if (f = kernel_for_device(f, device, rc); f == nullptr) return rc;
  if (rc = usable(f); rc != CUDA_SUCCESS) return rc;
  proto::AttributeReq request{f->wire, static_cast<std::int32_t>(config), 0, device, 0};
  rc = f->ctx->session->call(proto::Op::kFuncSetCacheConfig, request, static_cast<int*>(nullptr));
  function_settings_generation.fetch_add(1, std::memory_order_acq_rel);
  return rc;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuFuncGetParamInfo(CUfunction hfunc, size_t index, size_t* offset,
                                                   size_t* size) {
  Function* f = object_of<Function>(hfunc);
  // As measured on the real driver: a CUkernel passed here is an invalid handle.
  if (f == nullptr || f->is_kernel) return CUDA_ERROR_INVALID_HANDLE;
  return param_info(f, index, offset, size);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuKernelGetParamInfo(CUkernel kernel, size_t index, size_t* offset,
                                                     size_t* size) {
  Function* f = object_of<Function>(kernel);
  if (f == nullptr || !f->is_kernel) return CUDA_ERROR_INVALID_HANDLE;
  return param_info(f, index, offset, size);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction hfunc) {
  Function* f = object_of<Function>(hfunc);
  if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = f->name.c_str();
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuKernelGetName(const char** name, CUkernel kernel) {
  return cuFuncGetName(name, reinterpret_cast<CUfunction>(kernel));
}

MPSSHIM_EXPORT CUresult CUDAAPI cuFuncGetModule(CUmodule* module, CUfunction hfunc) {
  Function* f = object_of<Function>(hfunc);
  if (f == nullptr || f->module == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (module == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *module = reinterpret_cast<CUmodule>(f->module);
  return CUDA_SUCCESS;
}
