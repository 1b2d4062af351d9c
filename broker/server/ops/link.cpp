// The driver's JIT linker for clients (proto/ops_link.hpp; docs/cuda-runtime.md, "Linking at run
// time"). A link is the client's object (session/objects.hpp, LinkObj, counted as a module): the
// driver reads its inputs, writes its logs into the link's own buffers and its outputs into the
// link's option values, and every step answers with what the logs hold so far, failed steps
// included, so the client's own buffers read as the driver would have left them.
//
// Only options that carry plain numbers cross the wire; the shim keeps the pointers (log buffers,
// the wall time) and refuses the options that name host memory of the client's.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "broker/server/ops/ops.hpp"
#include "broker/server/session/client_socket.hpp"
#include "broker/server/session/limit_check.hpp"
#include "common/log.hpp"
#include "proto/fd_io.hpp"
#include "proto/image_extent.hpp"
#include "proto/ops_graph_nodes.hpp"
#include "proto/ops_link.hpp"

namespace mpsshim::server {
namespace {

// The options a client may set: each is a number the driver reads, none an address.
bool value_option(std::uint32_t option) {
  switch (option) {
    case CU_JIT_MAX_REGISTERS:
    case CU_JIT_THREADS_PER_BLOCK:
    case CU_JIT_OPTIMIZATION_LEVEL:
    case CU_JIT_TARGET_FROM_CUCONTEXT:
    case CU_JIT_TARGET:
    case CU_JIT_FALLBACK_STRATEGY:
    case CU_JIT_GENERATE_DEBUG_INFO:
    case CU_JIT_LOG_VERBOSE:
    case CU_JIT_GENERATE_LINE_INFO:
    case CU_JIT_CACHE_MODE:
    case CU_JIT_NEW_SM3X_OPT:
    case CU_JIT_FAST_COMPILE:
    case CU_JIT_LTO:
    case CU_JIT_FTZ:
    case CU_JIT_PREC_DIV:
    case CU_JIT_PREC_SQRT:
    case CU_JIT_FMA:
    case CU_JIT_OPTIMIZE_UNUSED_DEVICE_VARIABLES:
    case CU_JIT_POSITION_INDEPENDENT_CODE:
    case CU_JIT_MIN_CTA_PER_SM:
    case CU_JIT_MAX_THREADS_PER_BLOCK:
    case CU_JIT_OVERRIDE_DIRECTIVE_VALUES:
    case CU_JIT_SPLIT_COMPILE:
      return true;
    default:
      return false;
  }
}

// Appends `count` wire options at `offset` of the record; false for one that is not a value.
bool append_options(Call& call, std::size_t offset, std::uint32_t count,
                    std::vector<CUjit_option>& options, std::vector<void*>& values) {
  for (std::uint32_t i = 0; i < count; ++i) {
    proto::WireJitOption o;
    std::memcpy(&o, call.trailing(offset + std::size_t{i} * sizeof o, sizeof o).data(), sizeof o);
    if (!value_option(o.option)) return false;
    options.push_back(static_cast<CUjit_option>(o.option));
    values.push_back(reinterpret_cast<void*>(static_cast<std::uintptr_t>(o.value)));
  }
  return true;
}

// The logs so far and the last step's wall time (the driver writes it into its option's value
// as a float).
OpResult log_answer(Call& call, const LinkState& link, CUresult status,
                    std::uint64_t image_bytes = 0) {
  proto::LinkLogRep rep{};
  rep.image_bytes = image_bytes;
  for (std::size_t i = 0; i < link.options.size(); ++i) {
    if (link.options[i] == CU_JIT_WALL_TIME) std::memcpy(&rep.wall_time_ms, &link.values[i], 4);
  }
  const std::size_t room = sizeof rep.text;
  const std::size_t error = std::min(strnlen(link.error_log.data(), link.error_log.size()), room);
  const std::size_t info =
      std::min(strnlen(link.info_log.data(), link.info_log.size()), room - error);
  std::memcpy(rep.text, link.info_log.data(), info);
  std::memcpy(rep.text + info, link.error_log.data(), error);
  rep.info_bytes = static_cast<std::uint32_t>(info);
  rep.error_bytes = static_cast<std::uint32_t>(error);
  OpResult result = call.reply(rep, offsetof(proto::LinkLogRep, text) + info + error);
  result.status = status;
  return result;
}

std::uint64_t padded(std::uint64_t n) {
  return (n + 7) / 8 * 8;
}

}  // namespace

OpResult op_link_create(Call& call) {
  auto req = call.request<proto::LinkCreateReq>();
  if (req.option_count > proto::kMaxJitOptions ||
      !call.exact(sizeof req, std::uint64_t{req.option_count} * sizeof(proto::WireJitOption))) {
    return call.malformed("sent a link whose options the record does not hold");
  }
  Session& session = call.session;
  if (session.objects.get<ContextObj>(req.ctx) == nullptr) {
    return call.done(CUDA_ERROR_INVALID_CONTEXT);
  }
  if (!within_client_limit(session, ClientLimit::kModules))
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  auto state = std::make_unique<LinkState>();
  state->ctx = req.ctx;
  // The value vector must not move once the driver holds it: room for every option up front.
  state->options.reserve(req.option_count + 5);
  state->values.reserve(req.option_count + 5);
  if (!append_options(call, sizeof req, req.option_count, state->options, state->values)) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  state->options.push_back(CU_JIT_WALL_TIME);
  state->values.push_back(nullptr);
  auto add_log = [&](std::uint32_t bytes, CUjit_option buffer, CUjit_option size,
                     std::vector<char>& log) {
    if (bytes == 0) return;
    log.assign(std::min(bytes, proto::kMaxJitLogBytes), '\0');
    state->options.push_back(buffer);
    state->values.push_back(log.data());
    state->options.push_back(size);
    state->values.push_back(reinterpret_cast<void*>(static_cast<std::uintptr_t>(log.size())));
  };
  add_log(req.info_log_bytes, CU_JIT_INFO_LOG_BUFFER, CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
          state->info_log);
  add_log(req.error_log_bytes, CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
          state->error_log);
  if (CUresult r =
          call.cu.cuLinkCreate_v2(static_cast<unsigned>(state->options.size()),
                                  state->options.data(), state->values.data(), &state->link);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  CUlinkState link = state->link;
  const std::uint64_t id = session.objects.insert(LinkObj{std::move(state)});
  if (id == 0) {
    call.cu.cuLinkDestroy(link);
    return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  }
  return call.reply(proto::GraphRep{id});
}

OpResult op_link_add(Call& call) {
  auto req = call.request<proto::LinkAddReq>();
  if (req.name_bytes > proto::kMaxNameBytes || req.option_count > proto::kMaxJitOptions ||
      !call.exact(sizeof req, padded(req.name_bytes) +
                                  std::uint64_t{req.option_count} * sizeof(proto::WireJitOption))) {
    return call.malformed("sent a link input whose name or options the record does not hold");
  }
  Session& session = call.session;
  auto stashed = take_stashed_fd(session, req.token, proto::MessageKind::kModuleImage);
  if (!stashed) return call.done(stashed.error());
  LinkObj* obj = session.objects.get<LinkObj>(req.link);
  if (obj == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  LinkState& link = *obj->state;
  const auto input = static_cast<proto::LinkInput>(req.input);
  if (input != proto::LinkInput::kData && input != proto::LinkInput::kFile) {
    return call.malformed(fmt::format("sent a link input of kind {}", req.input));
  }
  if (req.bytes == 0 || req.bytes > proto::kMaxImageBytes) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  const auto name_bytes = call.trailing(sizeof req, req.name_bytes);
  std::string name(reinterpret_cast<const char*>(name_bytes.data()), name_bytes.size());
  std::vector<CUjit_option> options;
  std::vector<void*> values;
  if (!append_options(call, sizeof req + padded(req.name_bytes), req.option_count, options,
                      values)) {
    return call.done(CUDA_ERROR_INVALID_VALUE);
  }
  const auto type = static_cast<CUjitInputType>(req.type);
  CUresult r = CUDA_SUCCESS;
  if (input == proto::LinkInput::kFile) {
    // The driver reads the file itself (an archive's members among them); the client's file is
    // this memfd, open here.
    const std::string path = fmt::format("/proc/self/fd/{}", stashed->fd.get());
    r = call.cu.cuLinkAddFile_v2(link.link, type, path.c_str(),
                                 static_cast<unsigned>(options.size()), options.data(),
                                 values.data());
  } else {
    std::vector<std::byte> data(req.bytes);
    if (!proto::pread_all(stashed->fd.get(), data.data(), data.size())) {
      return call.done(CUDA_ERROR_OUT_OF_MEMORY);
    }
    r = call.cu.cuLinkAddData_v2(link.link, type, data.data(), data.size(), name.c_str(),
                                 static_cast<unsigned>(options.size()), options.data(),
                                 values.data());
    // The driver may read it again when the link completes.
    if (r == CUDA_SUCCESS) link.inputs.push_back(std::move(data));
  }
  return log_answer(call, link, r);
}

OpResult op_link_complete(Call& call) {
  auto req = call.request<proto::HandleReq>();
  Session& session = call.session;
  LinkObj* obj = session.objects.get<LinkObj>(req.handle);
  if (obj == nullptr) return call.done(CUDA_ERROR_INVALID_HANDLE);
  LinkState& link = *obj->state;
  void* image = nullptr;
  std::size_t bytes = 0;
  if (CUresult r = call.cu.cuLinkComplete(link.link, &image, &bytes); r != CUDA_SUCCESS) {
    return log_answer(call, link, r);
  }
  proto::UniqueFd fd(::memfd_create("mpsshim-linked", MFD_CLOEXEC));
  if (!fd) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  if (!proto::write_all(fd.get(), image, bytes)) return call.done(CUDA_ERROR_OUT_OF_MEMORY);
  if (CUresult r = send_memory_fd(session, std::move(fd), bytes); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  return log_answer(call, link, CUDA_SUCCESS, bytes);
}

OpResult op_link_destroy(Call& call) {
  auto req = call.request<proto::HandleReq>();
  auto obj = call.session.objects.take<LinkObj>(req.handle);
  if (!obj) return call.done(CUDA_ERROR_INVALID_HANDLE);
  return call.done(call.cu.cuLinkDestroy(obj->state->link));
}

}  // namespace mpsshim::server
