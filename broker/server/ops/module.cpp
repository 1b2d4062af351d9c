#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "broker/server/driver/driver.hpp"
#include "broker/server/images/image.hpp"
#include "broker/server/images/image_cache.hpp"
#include "broker/server/images/image_globals.hpp"
#include "broker/server/images/image_verdicts.hpp"
#include "broker/server/images/name_pages.hpp"
#include "broker/server/ops/ops.hpp"
#include "broker/server/session/client_socket.hpp"
#include "broker/server/session/limit_check.hpp"
#include "broker/server/session/retire.hpp"
#include "common/log.hpp"
#include "proto/fd_io.hpp"

namespace mpsshim::server {
namespace {

// The server copies every image before the driver sees it; this bounds what one load costs.
// Real containers are far smaller (cuBLASLt's largest is tens of MiB).
constexpr std::uint64_t kMaxImageBytes = std::uint64_t{4} << 30;

// The library's kernels in the driver's order (cuLibraryEnumerateKernels).
CUresult library_kernels(const DriverTable& cu, CUlibrary library, std::vector<CUkernel>& out) {
  unsigned int count = 0;
  if (CUresult r = cu.cuLibraryGetKernelCount(&count, library); r != CUDA_SUCCESS) return r;
  out.resize(count);
  return count == 0 ? CUDA_SUCCESS : cu.cuLibraryEnumerateKernels(out.data(), count, library);
}

auto kernel_name_of(const DriverTable& cu, const std::vector<CUkernel>& kernels) {
  return [&cu, &kernels](std::uint32_t i, const char*& name) {
    return cu.cuKernelGetName(&name, kernels[i]);
  };
}

void name_too_long(Call& call, std::string_view what, std::size_t length) {
  log_warn(
      "{}: a name of {} bytes does not fit in one reply; the {} cannot be listed "
      "(CUDA_ERROR_NOT_SUPPORTED)",
      call.session.who(), length, what);
}

// A page of names from `first` on (ModuleFunctionsRep), as many as fit in one reply.
template <typename NameOf>
OpResult reply_name_page(Call& call, std::uint32_t first, std::uint32_t total, NameOf&& name_of,
                         std::string_view what) {
  proto::ModuleFunctionsRep rep{};
  rep.total = total;
  NamePage page;
  std::size_t too_long = 0;
  if (CUresult r = fill_name_page(first, total, rep.names, name_of, page, too_long);
      r != CUDA_SUCCESS) {
    if (too_long != 0) name_too_long(call, what, too_long);
    return call.done(r);
  }
  rep.count = page.count;
  rep.bytes = page.bytes;
  return call.reply(rep, offsetof(proto::ModuleFunctionsRep, names) + rep.bytes);
}

// A library's load answers with its kernels' names, as many as fit (the shim hands out CUkernels
// from them and looks each up at its first use). A library whose names the driver cannot list
// still loads: names_known 0, and the shim looks each kernel up by name as before.
OpResult reply_library_loaded(Call& call, std::uint64_t id, CUlibrary library) {
  proto::LibraryLoadRep rep{};
  rep.handle = id;
  std::vector<CUkernel> kernels;
  NamePage page;
  std::size_t too_long = 0;
  CUresult r = library_kernels(call.cu, library, kernels);
  if (r == CUDA_SUCCESS) {
    r = fill_name_page(0, static_cast<std::uint32_t>(kernels.size()), rep.names,
                       kernel_name_of(call.cu, kernels), page, too_long);
  }
  if (r == CUDA_SUCCESS) {
    rep.names_known = 1;
    rep.total = static_cast<std::uint32_t>(kernels.size());
    rep.count = page.count;
    rep.bytes = page.bytes;
  } else {
    log_debug(
        "{}: a library's kernel names could not be listed ({}); its kernels are looked up "
        "by name",
        call.session.who(), describe(call.cu, r));
  }
  return call.reply(rep, offsetof(proto::LibraryLoadRep, names) + rep.bytes);
}

// A private copy of the client's image: the client can rewrite its memfd at any time, and the
// driver's parser must not see bytes change under it or run off the end. One zeroed page
// follows the copy.
class PrivateImage {
 public:
  bool read(int fd, std::uint64_t bytes) {
    const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
    size_ = (bytes / page + 2) * page;
    void* at = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (at == MAP_FAILED) {
      size_ = 0;
      return false;
    }
    data_ = static_cast<std::byte*>(at);
    if (!proto::pread_all(fd, data_, bytes)) return false;
    bytes_ = bytes;
    return true;
  }
  ~PrivateImage() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  std::span<const std::byte> bytes() const { return {data_, bytes_}; }
  const void* data() const { return data_; }

 private:
  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t bytes_ = 0;
};

// A function's parameter layout, or the error its lookup answers: the driver's, or
// NOT_SUPPORTED for more parameters than a FunctionRep carries.
CUresult layout_of(Call& call, CUfunction function, bool kernel, ParamLayout& layout) {
  if (CUresult r = read_param_layout(call.cu, function, kernel, layout); r != CUDA_SUCCESS) {
    return r;
  }
  constexpr std::size_t kMaxParams = std::size(proto::FunctionRep{}.params);
  return layout.params.size() > kMaxParams ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS;
}

// The parameter layout, as the launch path of the shim needs it.
OpResult reply_function(Call& call, std::uint64_t id, const ParamLayout& layout) {
  proto::FunctionRep rep{};
  rep.function = id;
  for (std::size_t i = 0; i < layout.params.size(); ++i) {
    rep.params[i] = proto::ParamSlot{layout.params[i].offset, layout.params[i].size};
  }
  rep.param_count = static_cast<std::uint32_t>(layout.params.size());
  rep.args_bytes = layout.bytes;
  return call.reply(rep, offsetof(proto::FunctionRep, params) +
                             std::size_t{rep.param_count} * sizeof(proto::ParamSlot));
}

// The name that follows a NamedLookupReq, or nullopt when its stated length is not exact.
std::optional<std::string> lookup_name(Call& call, const proto::NamedLookupReq& req) {
  if (req.name_bytes > proto::kMaxNameBytes || !call.exact(sizeof req, req.name_bytes)) {
    return std::nullopt;
  }
  auto bytes = call.trailing(sizeof req, req.name_bytes);
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

OpResult bad_name(Call& call, const proto::NamedLookupReq& req) {
  return call.malformed(
      fmt::format("a lookup names {} bytes of name that the record does not hold", req.name_bytes));
}

// A library image: the library another session loaded from the same bytes, or a new load,
// shared with later sessions when nothing in it could carry one session's state to another
// (image_cache.hpp, image_globals.hpp). `code` is what the driver is given (`bytes`, or the
// wrapper of a device-linked program over them).
CUresult load_library(Call& call, std::span<const std::byte> bytes, std::uint32_t containers,
                      const void* code, LibraryObj& out) {
  ImageCache* cache = call.session.image_cache();
  const bool sharing = cache != nullptr && cache->enabled();
  ImageDigest digest{};
  if (sharing) {
    digest = digest_image(bytes, containers);
    if (std::shared_ptr<SharedLibrary> live = cache->find(digest)) {
      out.library = live->library();
      out.shared = std::move(live);
      return CUDA_SUCCESS;
    }
  }
  CUlibrary library = nullptr;
  if (CUresult r =
          call.cu.cuLibraryLoadData(&library, code, nullptr, nullptr, 0, nullptr, nullptr, 0);
      r != CUDA_SUCCESS) {
    return r;
  }
  out.library = library;
  if (!sharing) return CUDA_SUCCESS;
  if (cache->known_private(digest)) {
    cache->count_private_load();
    return CUDA_SUCCESS;
  }
  if (!cache->known_shareable(digest)) {
    // 0 and 1 both mean one image (a container, a cubin or PTX); more, a device-linked program.
    cache->count_scan();
    if (GlobalsScan scan = scan_image_globals(bytes, std::max<std::uint32_t>(containers, 1),
                                              device_arch(call.session.gpu()));
        !scan.shareable) {
      log_debug("{}: a library image of {} is loaded for this client alone: {}", call.session.who(),
                format_bytes(bytes.size()), scan.reason);
      cache->remember_private(digest);
      cache->count_private_load();
      return CUDA_SUCCESS;
    }
    cache->remember_shareable(digest);
  }
  // If another session published the same bytes meanwhile, its library is used and this load,
  // dropped with `fresh`, is unloaded.
  auto fresh = std::make_shared<SharedLibrary>(call.cu, library, digest, *cache, bytes.size());
  out.shared = cache->publish(digest, std::move(fresh));
  out.library = out.shared->library();
  return CUDA_SUCCESS;
}

// A compiler string literal of a library other sessions share: its address is not handed out,
// so no session can rewrite another's assert or printf text (image_globals.hpp).
bool shared_string_literal(Session& session, std::uint64_t library_id, const std::string& name) {
  const LibraryObj* library =
      library_id != 0 ? session.objects.get<LibraryObj>(library_id) : nullptr;
  return library != nullptr && library->shared != nullptr && is_string_literal_name(name);
}

const char* kind_name(proto::ImageKind kind) {
  return kind == proto::ImageKind::kLibrary ? "library" : "module";
}

}  // namespace

OpResult op_image_load(Call& call) {
  auto req = call.request<proto::ImageLoadReq>();
  Session& session = call.session;
  auto stashed = take_stashed_fd(session, req.token, proto::MessageKind::kModuleImage);
  if (!stashed) return call.done(stashed.error());
  if (session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  if (req.kind != proto::ImageKind::kModule && req.kind != proto::ImageKind::kLibrary) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  if ((req.flags & ~proto::kImageLoadKernelNames) != 0) {
    return call.malformed(fmt::format("an image load with unknown flags {:#x}", req.flags));
  }
  if (!within_client_limit(session, ClientLimit::kModules))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  if (req.containers > 1 && req.kind != proto::ImageKind::kLibrary) {
    // Only cuLibraryLoadData takes a device-linked wrapper; the shim never sends one otherwise.
    return call.malformed(fmt::format("a module image of {} linked containers", req.containers));
  }
  if (req.bytes > kMaxImageBytes) {
    log_warn("{} sent a {} image of {}; the server takes images up to {}", session.who(),
             kind_name(req.kind), format_bytes(req.bytes), format_bytes(kMaxImageBytes));
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  struct stat st {};
  if (req.bytes == 0 || ::fstat(stashed->fd.get(), &st) != 0 ||
      static_cast<std::uint64_t>(st.st_size) < req.bytes) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  PrivateImage image;
  if (!image.read(stashed->fd.get(), req.bytes)) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  // A device-linked program: rebuild its v2 wrapper over the private copy, so the driver picks
  // the device-linked container or links the prelinked ones exactly as it would natively.
  std::vector<const void*> prelinked;
  LinkedWrapper wrapper{};
  const void* code = image.data();
  if (req.containers > 1) {
    auto containers = split_containers(image.bytes(), req.containers);
    if (!containers) {
      log_warn(
          "{} sent a device-linked library of {} bytes that is not {} whole fat-binary "
          "containers; refused",
          session.who(), req.bytes, req.containers);
      return call.done(CUDA_ERROR_INVALID_IMAGE);
    }
    for (std::size_t i = 1; i < containers->size(); ++i) {
      prelinked.push_back((*containers)[i].data());
    }
    prelinked.push_back(nullptr);
    wrapper = LinkedWrapper{kWrapperMagic, kWrapperVersionLinked, (*containers)[0].data(),
                            prelinked.data()};
    code = &wrapper;
  } else {
    auto extent = image_extent(image.bytes());
    if (!extent || extent->bytes > req.bytes) {
      log_warn("{} sent a {} image of {} bytes whose own headers {}; refused", session.who(),
               kind_name(req.kind), req.bytes,
               extent ? fmt::format("say it is {} bytes long", extent->bytes)
                      : std::string("do not describe a fat binary, cubin or PTX text"));
      return call.done(CUDA_ERROR_INVALID_IMAGE);
    }
  }
  const DriverTable& cu = call.cu;
  std::uint64_t id = 0;
  if (req.kind == proto::ImageKind::kModule) {
    CUmodule module = nullptr;
    if (CUresult r = cu.cuModuleLoadData(&module, code); r != CUDA_SUCCESS) {
      return call.done(r);
    }
    id = session.objects.insert(ModuleObj{module, req.ctx, 0});
    if (id == 0) cu.cuModuleUnload(module);
  } else {
    LibraryObj library{nullptr, req.ctx, nullptr};
    if (CUresult r = load_library(call, image.bytes(), req.containers, code, library);
        r != CUDA_SUCCESS) {
      return call.done(r);
    }
    const CUlibrary loaded = library.library;
    const bool shared = library.shared != nullptr;
    id = session.objects.insert(std::move(library));
    if (id == 0 && !shared) cu.cuLibraryUnload(loaded);
  }
  if (id == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  const LibraryObj* library =
      req.kind == proto::ImageKind::kLibrary ? session.objects.get<LibraryObj>(id) : nullptr;
  if (library != nullptr && library->shared != nullptr) {
    ++session.stats.images_shared;
    session.stats.images_shared_bytes += req.bytes;
  } else {
    ++session.stats.images_private;
    session.stats.images_private_bytes += req.bytes;
  }
  if (library != nullptr && (req.flags & proto::kImageLoadKernelNames) != 0) {
    return reply_library_loaded(call, id, library->library);
  }
  return call.reply(proto::ImageLoadRep{id});
}

OpResult op_module_unload(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  const ModuleObj* module = session.objects.get<ModuleObj>(req.handle);
  if (module == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  // A library's module goes with its library.
  if (module->library != 0) return call.done(CUDA_ERROR_NOT_PERMITTED);
  Retired bundle;
  forget_module(session, req.handle, bundle);
  return call.done(retire(session, std::move(bundle)));
}

OpResult op_module_get_function(Call& call) {
  auto req = call.request<proto::NamedLookupReq>();
  auto name = lookup_name(call, req);
  if (!name) return bad_name(call, req);
  Session& session = call.session;
  const ModuleObj* module = session.objects.get<ModuleObj>(req.handle);
  if (module == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  CUfunction function = nullptr;
  if (CUresult r = call.cu.cuModuleGetFunction(&function, module->module, name->c_str());
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  ParamLayout layout;
  if (CUresult r = layout_of(call, function, false, layout); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  std::uint64_t id = remember(session, function, FunctionObj{function, req.handle, layout});
  if (id == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  return reply_function(call, id, layout);
}

// The names of a module's functions, in the driver's order, from req.first on: as many as fit
// in one reply (the client asks again from where a reply stopped). The shim builds
// cuModuleEnumerateFunctions and the ToolsModule table cuFFT walks modules with on it.
OpResult op_module_function_names(Call& call) {
  auto req = call.request<proto::ModuleFunctionsReq>();
  const ModuleObj* module = call.session.objects.get<ModuleObj>(req.module);
  if (module == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  unsigned int total = 0;
  if (CUresult r = call.cu.cuModuleGetFunctionCount(&total, module->module); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  if (req.first > total) return call.done(CUDA_ERROR_INVALID_VALUE);
  std::vector<CUfunction> functions(total);
  if (total > 0) {
    if (CUresult r = call.cu.cuModuleEnumerateFunctions(functions.data(), total, module->module);
        r != CUDA_SUCCESS) {
      return call.done(r);
    }
  }
  auto name_of = [&](std::uint32_t i, const char*& name) {
    return call.cu.cuFuncGetName(&name, functions[i]);
  };
  return reply_name_page(call, req.first, total, name_of, "module's functions");
}

// The names of a library's kernels from req.first on, where its load's reply (LibraryLoadRep)
// could not hold them all.
OpResult op_library_kernel_names(Call& call) {
  auto req = call.request<proto::ModuleFunctionsReq>();
  const LibraryObj* library = call.session.objects.get<LibraryObj>(req.module);
  if (library == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  std::vector<CUkernel> kernels;
  if (CUresult r = library_kernels(call.cu, library->library, kernels); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  const auto total = static_cast<std::uint32_t>(kernels.size());
  if (req.first > total) return call.done(CUDA_ERROR_INVALID_VALUE);
  return reply_name_page(call, req.first, total, kernel_name_of(call.cu, kernels),
                         "library's kernels");
}

OpResult op_module_get_global(Call& call) {
  auto req = call.request<proto::NamedLookupReq>();
  auto name = lookup_name(call, req);
  if (!name) return bad_name(call, req);
  Session& session = call.session;
  const ModuleObj* module = session.objects.get<ModuleObj>(req.handle);
  if (module == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  if (shared_string_literal(session, module->library, *name)) {
    return call.done(CUDA_ERROR_NOT_FOUND);
  }
  CUdeviceptr dptr = 0;
  std::size_t bytes = 0;
  if (CUresult r = call.cu.cuModuleGetGlobal_v2(&dptr, &bytes, module->module, name->c_str());
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  // A global is the client's memory from now on (it may copy to and from it).
  session.memory.add(DeviceRange{dptr, bytes, RangeKind::kGlobal, req.handle});
  return call.reply(proto::GlobalRep{dptr, bytes});
}

// The shim posts it one-way (libshim/module.cpp: the CUDA runtime unloads thousands of libraries
// at a PyTorch client's exit), having checked the handle itself. A failure then is only logged: it
// belongs to no later call of the client.
OpResult op_library_unload(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  CUresult status = CUDA_ERROR_INVALID_HANDLE;
  if (session.objects.get<LibraryObj>(req.handle) != nullptr) {
    Retired bundle;
    forget_library(session, req.handle, bundle);
    status = retire(session, std::move(bundle));
  }
  OpResult result = call.done(status);
  if (status != CUDA_SUCCESS && !call.has_reply_slot()) {
    log_warn("{}: unloading library {} failed ({}); the client was not waiting for it",
             session.who(), req.handle, describe(call.cu, status));
    result.post_async_error = false;
  }
  return result;
}

OpResult op_library_get_kernel(Call& call) {
  auto req = call.request<proto::NamedLookupReq>();
  auto name = lookup_name(call, req);
  if (!name) return bad_name(call, req);
  Session& session = call.session;
  const LibraryObj* library = session.objects.get<LibraryObj>(req.handle);
  if (library == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  CUkernel kernel = nullptr;
  if (CUresult r = call.cu.cuLibraryGetKernel(&kernel, library->library, name->c_str());
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  ParamLayout layout;
  if (CUresult r = layout_of(call, reinterpret_cast<CUfunction>(kernel), true, layout);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  std::uint64_t id = remember(session, kernel, KernelObj{kernel, req.handle, nullptr, layout});
  if (id == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  return reply_function(call, id, layout);
}

OpResult op_library_get_module(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  const LibraryObj* library = session.objects.get<LibraryObj>(req.handle);
  if (library == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  CUmodule module = nullptr;
  if (CUresult r = call.cu.cuLibraryGetModule(&module, library->library); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  std::uint64_t id = remember(session, module, ModuleObj{module, library->ctx, req.handle});
  if (id == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  return call.reply(proto::ImageLoadRep{id});
}

OpResult op_library_get_global(Call& call) {
  auto req = call.request<proto::NamedLookupReq>();
  auto name = lookup_name(call, req);
  if (!name) return bad_name(call, req);
  Session& session = call.session;
  const LibraryObj* library = session.objects.get<LibraryObj>(req.handle);
  if (library == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  if (shared_string_literal(session, req.handle, *name)) return call.done(CUDA_ERROR_NOT_FOUND);
  CUdeviceptr dptr = 0;
  std::size_t bytes = 0;
  if (CUresult r = call.cu.cuLibraryGetGlobal(&dptr, &bytes, library->library, name->c_str());
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  session.memory.add(DeviceRange{dptr, bytes, RangeKind::kGlobal, req.handle});
  return call.reply(proto::GlobalRep{dptr, bytes});
}

OpResult op_kernel_get_function(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  KernelObj* kernel = session.objects.get<KernelObj>(req.handle);
  if (kernel == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  CUfunction function = nullptr;
  if (CUresult r = call.cu.cuKernelGetFunction(&function, kernel->kernel); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  kernel->function = function;
  ParamLayout layout;
  if (CUresult r = layout_of(call, function, false, layout); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  std::uint64_t id = remember(session, function, FunctionObj{function, req.handle, layout});
  if (id == 0) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  return reply_function(call, id, layout);
}

}  // namespace mpsshim::server
