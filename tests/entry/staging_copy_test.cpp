// libshim/staging_copy: the bytes arrive whatever the alignment, the size and the stores used.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "libshim/staging_copy.hpp"

namespace mpsshim::shim {

TEST_CASE("staging_copy copies every byte at every alignment and size", "[staging_copy]") {
  const std::size_t big = kStreamingMinBytes * 2 + 77;
  std::vector<unsigned char> src(big + 64), dst(big + 64);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 31 + 7);
  for (std::size_t bytes :
       {std::size_t{0}, std::size_t{1}, std::size_t{15}, std::size_t{64}, std::size_t{1000},
        kStreamingMinBytes - 1, kStreamingMinBytes, kStreamingMinBytes + 63, big}) {
    for (std::size_t dst_offset : {0, 1, 8, 15}) {
      for (std::size_t src_offset : {0, 3}) {
        std::memset(dst.data(), 0xee, dst.size());
        staging_copy(dst.data() + dst_offset, src.data() + src_offset, bytes);
        INFO("bytes " << bytes << " dst+" << dst_offset << " src+" << src_offset);
        CHECK(std::memcmp(dst.data() + dst_offset, src.data() + src_offset, bytes) == 0);
        // Nothing written around the destination.
        for (std::size_t i = 0; i < dst_offset; ++i) REQUIRE(dst[i] == 0xee);
        for (std::size_t i = dst_offset + bytes; i < dst.size(); ++i) REQUIRE(dst[i] == 0xee);
      }
    }
  }
}

}  // namespace mpsshim::shim
