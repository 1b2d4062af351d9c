// A library's kernels handed out from the names its load listed, and looked up on the server at
// their first use (kernel_lookup.hpp says why).
#include "libshim/kernel_lookup.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/log.hpp"

namespace mpsshim::shim {

namespace {

// The server's handle and the parameter layout a lookup answered.
void take_lookup(Function* f, const proto::FunctionRep& reply) {
  f->wire = reply.function;
  std::uint32_t count = std::min<std::uint32_t>(reply.param_count, std::size(reply.params));
  f->params.assign(reply.params, reply.params + count);
  f->args_bytes = reply.args_bytes;
}

}  // namespace

Function* make_function(Context* ctx, const proto::FunctionRep& reply, std::string_view name,
                        bool is_kernel) {
  auto* f = new Function();
  f->ctx = ctx;
  f->is_kernel = is_kernel;
  f->name = std::string(name);
  take_lookup(f, reply);
  return f;
}

CUresult lookup(Context* ctx, proto::Op op, proto::WireHandle handle, const char* name, void* reply,
                std::size_t reply_bytes) {
  std::size_t length = strnlen(name, proto::kMaxNameBytes + 1);
  if (length == 0 || length > proto::kMaxNameBytes) return CUDA_ERROR_INVALID_VALUE;
  proto::NamedLookupReq request{handle, static_cast<std::uint32_t>(length), 0};
  return ctx->session->call(op, &request, sizeof request,
                            std::as_bytes(std::span<const char>(name, length)), reply, reply_bytes);
}

bool append_names(std::span<const char> page, std::uint32_t count, std::uint32_t bytes,
                  std::vector<std::string>& out) {
  std::string_view text(page.data(), std::min<std::size_t>(bytes, page.size()));
  for (std::uint32_t i = 0; i < count; ++i) {
    std::size_t end = text.find('\0');
    if (end == std::string_view::npos) return false;
    out.emplace_back(text.substr(0, end));
    text.remove_prefix(end + 1);
  }
  return true;
}

void take_kernel_names(Library* library, const proto::LibraryLoadRep& reply) {
  if (reply.names_known == 0) return;
  std::vector<std::string> names;
  names.reserve(reply.total);
  if (!append_names(reply.names, reply.count, reply.bytes, names)) {
    log_warn(
        "a library's load listed malformed kernel names; its kernels are looked up "
        "by name");
    return;
  }
  while (names.size() < reply.total) {
    proto::ModuleFunctionsReq request{library->wire, static_cast<std::uint32_t>(names.size()), 0};
    proto::ModuleFunctionsRep page{};
    if (library->ctx->session->call(proto::Op::kLibraryKernelNames, request, &page) !=
            CUDA_SUCCESS ||
        page.count == 0 || !append_names(page.names, page.count, page.bytes, names)) {
      return;  // unknown names: each kernel is looked up when asked for, as before
    }
  }
  names.resize(reply.total);
  library->kernel_names = std::move(names);
  library->listed.clear();
  library->listed.reserve(library->kernel_names.size());
  for (const std::string& name : library->kernel_names) library->listed.insert(name);
  library->kernel_names_known = true;
}

Function* listed_kernel(Library* library, std::string_view name) {
  if (!library->kernel_names_known || !library->listed.contains(name)) return nullptr;
  auto* f = new Function();
  f->ctx = library->ctx;
  f->is_kernel = true;
  f->name = std::string(name);
  f->library = library;
  f->looked_up.store(false, std::memory_order_relaxed);
  library->kernels.emplace(f->name, f);
  return f;
}

CUresult look_up_kernel(Function* f, const char* use) {
  Library* library = f->library;
  std::lock_guard lock(library->mutex);
  if (f->looked_up.load(std::memory_order_relaxed)) return CUDA_SUCCESS;  // another thread did
  if (library->magic != Magic::kLibrary) return CUDA_ERROR_INVALID_HANDLE;
  proto::FunctionRep reply{};
  CUresult rc = lookup(library->ctx, proto::Op::kLibraryGetKernel, library->wire, f->name.c_str(),
                       &reply, sizeof reply);
  if (rc != CUDA_SUCCESS) return rc;
  take_lookup(f, reply);
  f->looked_up.store(true, std::memory_order_release);
  log_debug("kernel {} looked up at its first use, in {}", f->name, use);
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::shim
