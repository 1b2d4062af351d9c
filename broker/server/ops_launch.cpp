#include <cstring>

#include "broker/server/launch_attributes.hpp"
#include "broker/server/ops.hpp"

namespace mpsshim::server {

OpResult op_launch_kernel(Call& call) {
  auto req = call.request<proto::LaunchReq>();
  const std::uint64_t attribute_bytes =
      std::uint64_t{req.attribute_count} * sizeof(proto::WireLaunchAttribute);
  if (req.attribute_count > proto::kMaxLaunchAttributes || req.args_bytes > proto::kMaxArgsBytes ||
      !call.exact(sizeof req, attribute_bytes + req.args_bytes)) {
    return call.malformed(
        fmt::format("a launch states {} attributes and {} argument bytes that the "
                    "record does not hold",
                    req.attribute_count, req.args_bytes));
  }
  Session& session = call.session;
  CUfunction function = nullptr;
  if (CUresult r = resolve_function(call, req.function, false, &function); r != CUDA_SUCCESS) {
    return call.done(r);
  }
  CUlaunchAttribute attributes[proto::kMaxLaunchAttributes];
  if (CUresult r = convert_launch_attributes(session, call.trailing(sizeof req, attribute_bytes),
                                             req.attribute_count, attributes);
      r != CUDA_SUCCESS) {
    return call.done(r);
  }
  CUresult error = CUDA_SUCCESS;
  StreamObj* stream = use_stream(call, req.stream, true, &error);
  if (stream == nullptr) return call.done(error);

  // The arguments sit after the attributes at an 8-byte boundary; the driver reads them as
  // the kernel's parameter block, whose members may need 16-byte alignment.
  alignas(16) std::byte args[proto::kMaxArgsBytes];
  std::size_t args_size = req.args_bytes;
  if (args_size != 0) {
    std::memcpy(args, call.trailing(sizeof req + attribute_bytes, args_size).data(), args_size);
  }
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args, CU_LAUNCH_PARAM_BUFFER_SIZE, &args_size,
                   CU_LAUNCH_PARAM_END};

  CUlaunchConfig config{};
  config.gridDimX = req.grid[0];
  config.gridDimY = req.grid[1];
  config.gridDimZ = req.grid[2];
  config.blockDimX = req.block[0];
  config.blockDimY = req.block[1];
  config.blockDimZ = req.block[2];
  config.sharedMemBytes = req.shared_bytes;
  config.hStream = stream->stream;
  config.attrs = attributes;
  config.numAttrs = req.attribute_count;
  CUresult r =
      call.cu.cuLaunchKernelEx(&config, function, nullptr, args_size != 0 ? extra : nullptr);
  if (r == CUDA_SUCCESS) ++session.launches;
  return finish_on_stream(call, *stream, r);
}

}  // namespace mpsshim::server
