// The JIT linker: cuLinkCreate, cuLinkAddData, cuLinkAddFile, cuLinkComplete and cuLinkDestroy
// (docs/cuda-runtime.md, "Linking at run time"; proto/ops_link.hpp). numba-cuda and CuPy link
// device code at run time so.
//
// The link lives in the server's driver. Each input goes there as a memfd (a file's bytes read
// here: the server cannot open the client's files). The options that carry numbers travel; the
// ones that point into this process stay here: after every step the shim copies the logs the
// server reports into the caller's buffers, writes the filled sizes and the wall time back into
// the caller's option values (which the driver documents as living as long as the link), and
// keeps the linked image until cuLinkDestroy, as the driver keeps its own.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <vector>

#include "common/log.hpp"
#include "libshim/api.hpp"
#include "libshim/client.hpp"
#include "libshim/object_pool.hpp"
#include "proto/fd_io.hpp"
#include "proto/ops_graph_nodes.hpp"
#include "proto/ops_link.hpp"

using namespace mpsshim::shim;
using namespace mpsshim;  // the log (common/log.hpp)
namespace proto = mpsshim::proto;

namespace mpsshim::shim {

inline constexpr std::uint32_t kLinkMagic = 0x4c4e4b31;  // "LNK1"

struct LinkObject {
  std::uint32_t magic = kLinkMagic;
  Context* ctx = nullptr;
  proto::WireHandle wire = 0;
  // The caller's option arrays (cuLinkCreate's): outputs are written back into `values`.
  std::vector<CUjit_option> options;
  void** values = nullptr;
  char* info_log = nullptr;
  std::size_t info_capacity = 0;
  char* error_log = nullptr;
  std::size_t error_capacity = 0;
  std::vector<std::byte> image;  // cuLinkComplete's answer, until cuLinkDestroy
};

}  // namespace mpsshim::shim

namespace {

LinkObject* link_of(CUlinkState state) {
  auto* link = reinterpret_cast<LinkObject*>(state);
  return link != nullptr && link->magic == kLinkMagic ? link : nullptr;
}

std::uintptr_t as_number(void* value) {
  return reinterpret_cast<std::uintptr_t>(value);
}

// The options that travel (numbers); the log buffers and the wall time are noted by the caller
// of this function. CUDA_ERROR_NOT_SUPPORTED, logged, for options naming this process's memory.
CUresult wire_options(unsigned count, const CUjit_option* options, void** values,
                      std::vector<proto::WireJitOption>& out) {
  if (count > 0 && (options == nullptr || values == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (count > proto::kMaxJitOptions) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < count; ++i) {
    switch (options[i]) {
      case CU_JIT_INFO_LOG_BUFFER:
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
      case CU_JIT_ERROR_LOG_BUFFER:
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
      case CU_JIT_WALL_TIME:
        break;
      case CU_JIT_GLOBAL_SYMBOL_NAMES:
      case CU_JIT_GLOBAL_SYMBOL_ADDRESSES:
      case CU_JIT_GLOBAL_SYMBOL_COUNT:
      case CU_JIT_REFERENCED_KERNEL_NAMES:
      case CU_JIT_REFERENCED_KERNEL_COUNT:
      case CU_JIT_REFERENCED_VARIABLE_NAMES:
      case CU_JIT_REFERENCED_VARIABLE_COUNT:
        log_once("cuLink.host_symbols", LogLevel::kWarn,
                 "cuLink: JIT option {} names memory of this process, which the server that "
                 "links cannot read; it is not supported by mpsshim (define those symbols in "
                 "device code, or link without the option)",
                 static_cast<int>(options[i]));
        return CUDA_ERROR_NOT_SUPPORTED;
      default:
        out.push_back(proto::WireJitOption{static_cast<std::uint32_t>(options[i]), 0,
                                           static_cast<std::uint64_t>(as_number(values[i]))});
    }
  }
  return CUDA_SUCCESS;
}

// Copies the logs into the caller's buffers (cut, NUL-terminated, as the driver caps them) and
// writes the outputs into the option values.
void deliver(LinkObject& link, const proto::LinkLogRep& rep) {
  auto copy = [](char* to, std::size_t capacity, const char* from, std::size_t bytes) {
    if (to == nullptr || capacity == 0) return std::size_t{0};
    const std::size_t n = std::min(bytes, capacity - 1);
    std::memcpy(to, from, n);
    to[n] = '\0';
    return n;
  };
  const std::size_t info_bytes = std::min<std::size_t>(rep.info_bytes, sizeof rep.text);
  const std::size_t error_bytes =
      std::min<std::size_t>(rep.error_bytes, sizeof rep.text - info_bytes);
  const std::size_t info = copy(link.info_log, link.info_capacity, rep.text, info_bytes);
  const std::size_t error =
      copy(link.error_log, link.error_capacity, rep.text + info_bytes, error_bytes);
  for (std::size_t i = 0; i < link.options.size(); ++i) {
    switch (link.options[i]) {
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
        link.values[i] = reinterpret_cast<void*>(static_cast<std::uintptr_t>(info));
        break;
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
        link.values[i] = reinterpret_cast<void*>(static_cast<std::uintptr_t>(error));
        break;
      case CU_JIT_WALL_TIME:
        link.values[i] = nullptr;
        std::memcpy(&link.values[i], &rep.wall_time_ms, sizeof rep.wall_time_ms);
        break;
      default:
        break;
    }
  }
}

using proto::pread_all;
using proto::write_all;

CUresult add_input(CUlinkState state, CUjitInputType type, std::span<const std::byte> data,
                   std::string_view name, proto::LinkInput input, unsigned count,
                   CUjit_option* options, void** values) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  LinkObject* link = link_of(state);
  if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (data.empty() || name.size() > proto::kMaxNameBytes) return CUDA_ERROR_INVALID_VALUE;
  std::vector<proto::WireJitOption> wire;
  if (CUresult rc = wire_options(count, options, values, wire); rc != CUDA_SUCCESS) return rc;
  proto::UniqueFd fd(::memfd_create("mpsshim-link-input", MFD_CLOEXEC));
  if (!fd) return CUDA_ERROR_OUT_OF_MEMORY;
  std::size_t bytes = data.size();
  if (!write_all(fd.get(), data.data(), data.size())) return CUDA_ERROR_OUT_OF_MEMORY;
  // PTX and NVVM text must end with a NUL, which a caller's size may leave out.
  const bool text = type == CU_JIT_INPUT_PTX || type == CU_JIT_INPUT_NVVM;
  if (input == proto::LinkInput::kData && text && data.back() != std::byte{0}) {
    const char nul = '\0';
    if (!write_all(fd.get(), &nul, 1)) return CUDA_ERROR_OUT_OF_MEMORY;
    ++bytes;
  }
  std::uint32_t token = 0;
  if (CUresult rc =
          link->ctx->session->send_fd(proto::MessageKind::kModuleImage, fd.get(), bytes, token);
      rc != CUDA_SUCCESS) {
    return rc;
  }
  proto::LinkAddReq request{link->wire,
                            bytes,
                            token,
                            static_cast<std::uint32_t>(type),
                            static_cast<std::uint32_t>(input),
                            static_cast<std::uint32_t>(name.size()),
                            static_cast<std::uint32_t>(wire.size()),
                            0};
  std::vector<std::byte> trailing((name.size() + 7) / 8 * 8);
  std::memcpy(trailing.data(), name.data(), name.size());
  const auto* option_bytes = reinterpret_cast<const std::byte*>(wire.data());
  trailing.insert(trailing.end(), option_bytes,
                  option_bytes + wire.size() * sizeof(proto::WireJitOption));
  proto::LinkLogRep reply{};
  const CUresult rc = link->ctx->session->call(proto::Op::kLinkAdd, &request, sizeof request,
                                               trailing, &reply, sizeof reply);
  deliver(*link, reply);
  return rc;
}

}  // namespace

MPSSHIM_EXPORT CUresult CUDAAPI cuLinkCreate_v2(unsigned int count, CUjit_option* options,
                                                void** values, CUlinkState* out) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  Context* ctx = nullptr;
  if (CUresult rc = current(ctx); rc != CUDA_SUCCESS) return rc;
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::vector<proto::WireJitOption> wire;
  if (CUresult rc = wire_options(count, options, values, wire); rc != CUDA_SUCCESS) return rc;
  LinkObject* link = ObjectPool<LinkObject>::instance().make();
  link->ctx = ctx;
  link->values = values;
  for (unsigned i = 0; i < count; ++i) {
    link->options.push_back(options[i]);
    switch (options[i]) {
      case CU_JIT_INFO_LOG_BUFFER:
        link->info_log = static_cast<char*>(values[i]);
        break;
      case CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES:
        link->info_capacity = as_number(values[i]);
        break;
      case CU_JIT_ERROR_LOG_BUFFER:
        link->error_log = static_cast<char*>(values[i]);
        break;
      case CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES:
        link->error_capacity = as_number(values[i]);
        break;
      default:
        break;
    }
  }
  if (link->info_log == nullptr) link->info_capacity = 0;
  if (link->error_log == nullptr) link->error_capacity = 0;
  proto::LinkCreateReq request{ctx->wire,
                               static_cast<std::uint32_t>(std::min<std::size_t>(
                                   link->info_capacity, proto::kMaxJitLogBytes)),
                               static_cast<std::uint32_t>(std::min<std::size_t>(
                                   link->error_capacity, proto::kMaxJitLogBytes)),
                               static_cast<std::uint32_t>(wire.size()), 0};
  const auto* bytes = reinterpret_cast<const std::byte*>(wire.data());
  proto::GraphRep reply{};
  if (CUresult rc = ctx->session->call(
          proto::Op::kLinkCreate, &request, sizeof request,
          std::span<const std::byte>(bytes, wire.size() * sizeof(proto::WireJitOption)), &reply,
          sizeof reply);
      rc != CUDA_SUCCESS) {
    ObjectPool<LinkObject>::instance().retire(link);
    return rc;
  }
  link->wire = reply.handle;
  *out = reinterpret_cast<CUlinkState>(link);
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLinkCreate(unsigned int count, CUjit_option* options,
                                             void** values, CUlinkState* out) {
  return cuLinkCreate_v2(count, options, values, out);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void* data,
                                                 size_t size, const char* name, unsigned int count,
                                                 CUjit_option* options, void** values) {
  if (data == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  return add_input(state, type, {static_cast<const std::byte*>(data), size},
                   name != nullptr ? std::string_view(name) : std::string_view(),
                   proto::LinkInput::kData, count, options, values);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLinkAddData(CUlinkState state, CUjitInputType type, void* data,
                                              size_t size, const char* name, unsigned int count,
                                              CUjit_option* options, void** values) {
  return cuLinkAddData_v2(state, type, data, size, name, count, options, values);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLinkAddFile_v2(CUlinkState state, CUjitInputType type,
                                                 const char* path, unsigned int count,
                                                 CUjit_option* options, void** values) {
  if (path == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (link_of(state) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  proto::UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return CUDA_ERROR_FILE_NOT_FOUND;
  }
  std::vector<std::byte> bytes(static_cast<std::size_t>(st.st_size));
  if (bytes.empty() || !pread_all(fd.get(), bytes.data(), bytes.size())) {
    return CUDA_ERROR_FILE_NOT_FOUND;
  }
  return add_input(state, type, bytes, path, proto::LinkInput::kFile, count, options, values);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLinkAddFile(CUlinkState state, CUjitInputType type,
                                              const char* path, unsigned int count,
                                              CUjit_option* options, void** values) {
  return cuLinkAddFile_v2(state, type, path, count, options, values);
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLinkComplete(CUlinkState state, void** image, size_t* bytes) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  LinkObject* link = link_of(state);
  if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  if (image == nullptr || bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Session* session = link->ctx->session;
  proto::LinkLogRep reply{};
  proto::UniqueFd fd;
  {
    std::lock_guard receiving(session->fd_receive_mutex());
    const CUresult rc =
        session->call(proto::Op::kLinkComplete, proto::HandleReq{link->wire}, &reply);
    deliver(*link, reply);
    if (rc != CUDA_SUCCESS) return rc;
    if (CUresult got = session->receive_fd(proto::MessageKind::kPeerMemory, fd);
        got != CUDA_SUCCESS) {
      return got;
    }
  }
  link->image.resize(reply.image_bytes);
  if (!pread_all(fd.get(), link->image.data(), link->image.size())) {
    return CUDA_ERROR_OPERATING_SYSTEM;
  }
  *image = link->image.data();
  *bytes = link->image.size();
  return CUDA_SUCCESS;
}

MPSSHIM_EXPORT CUresult CUDAAPI cuLinkDestroy(CUlinkState state) {
  if (CUresult rc = init_status(); rc != CUDA_SUCCESS) return rc;
  LinkObject* link = link_of(state);
  if (link == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  const proto::HandleReq request{link->wire};
  const CUresult rc =
      link->ctx->session->call(proto::Op::kLinkDestroy, &request, sizeof request, {}, nullptr, 0);
  link->image = {};
  link->options = {};
  ObjectPool<LinkObject>::instance().retire(link);  // a stale handle reads a dead magic
  return rc;
}
