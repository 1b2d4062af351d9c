// libshim/config.cpp: the sizes of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
#include <catch2/catch.hpp>

#include "libshim/client.hpp"

namespace mpsshim::shim {

TEST_CASE("parse_memory_size reads sizes with binary units", "[config]") {
  CHECK(parse_memory_size("1024") == 1024u);
  CHECK(parse_memory_size(" 4G ") == 4ull << 30);
  CHECK(parse_memory_size("512MiB") == 512ull << 20);
  CHECK(parse_memory_size("1.5k") == 1536u);
  CHECK(parse_memory_size("16777215T") == 16777215ull << 40);
  CHECK(parse_memory_size("") == 0u);
  CHECK(parse_memory_size("-1G") == 0u);
  CHECK(parse_memory_size("4X") == 0u);
}

// Found by tests/fuzz/fuzz_limits: a size past 2^64 bytes was converted to an integer, which
// is undefined (UBSan: "6.06607e+20 is outside the range of representable values").
TEST_CASE("parse_memory_size refuses sizes that do not fit in 64 bits", "[config]") {
  CHECK(parse_memory_size("606606906606969699999") == 0u);
  CHECK(parse_memory_size("16777216T") == 0u);  // 2^64
  CHECK(parse_memory_size("1e300G") == 0u);
  CHECK(parse_memory_size("inf") == 0u);
  CHECK(parse_memory_size("nan") == 0u);
}

}  // namespace mpsshim::shim
