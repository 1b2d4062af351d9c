// libFuzzer target: the server's reading of module images a client sent
// (broker/server/images/image.hpp): image_extent on the bytes, and split_containers into a count
// the first 4 bytes choose. Found containers must tile the bytes exactly. Then whether the image
// may be shared between sessions (image_globals.hpp: containers, entries, LZ4/Zstandard payloads,
// ELF sections and symbols, PTX text): a shareable verdict never comes with a reason, a refusal
// always does (docs/testing.md, "Fuzzing").
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

#include "broker/server/images/image.hpp"
#include "broker/server/images/image_globals.hpp"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_image: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace mpsshim::server;
  // The count is the client's (ImageLoadReq::containers): any 32-bit value.
  if (size < 4) return 0;
  std::uint32_t count = 0;
  std::memcpy(&count, data, sizeof count);
  auto image = std::as_bytes(std::span(data + 4, size - 4));

  // An extent may say more than the bytes hold (the caller refuses such an image); text ends
  // at its terminator, which is there.
  if (auto extent = image_extent(image); extent && extent->format == ImageFormat::kText) {
    check(extent->bytes > 0 && extent->bytes <= image.size(), "text past its terminator");
  }
  if (auto parts = split_containers(image, count)) {
    check(parts->size() == count, "split_containers found another count");
    const std::byte* at = image.data();
    for (auto part : *parts) {
      check(part.data() == at, "the containers are not back to back");
      at += part.size();
    }
    check(at == image.data() + image.size(), "the containers do not cover the image");
  }
  const GlobalsScan scan = scan_image_globals(image, count);
  check(scan.shareable == scan.reason.empty(), "a verdict and its reason disagree");
  return 0;
}
