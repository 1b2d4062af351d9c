// Loading a library image through the server as the shim does: the bytes as a memfd, then the
// ImageLoad call naming it.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "tests/server/harness.hpp"

namespace mpsshim::server::test {

// The client's library image, sent as a memfd under `token`; its handle.
inline std::uint64_t load_library_image(TestClient& client, std::uint64_t ctx,
                                        const std::vector<std::byte>& image, std::uint32_t token) {
  client.send_memfd(proto::MessageKind::kModuleImage, token, image.size(), image);
  auto reply =
      client.call(proto::Op::kImageLoad,
                  proto::ImageLoadReq{ctx, image.size(), token, proto::ImageKind::kLibrary, 0, 0});
  REQUIRE(reply.result == CUDA_SUCCESS);
  return reply.as<proto::ImageLoadRep>().handle;
}

}  // namespace mpsshim::server::test
