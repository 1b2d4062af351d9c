// An entry point nobody implements answers CUDA_ERROR_NOT_SUPPORTED and says so once; one refused
// on purpose (libshim/entry/refused.tsv) says why.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <string>

#include "tests/entry/shim_under_test.hpp"

namespace {

using mpsshim::test::ShimUnderTest;

// Not served: the CUDA 2.0 variant of cuArray3DCreate (32-bit sizes), which cuGetProcAddress
// hands out for versions before 3.2.
constexpr const char* kUnimplemented = "cuArray3DCreate";
// A graphics-interop call, refused on purpose.
constexpr const char* kRefused = "cuGraphicsUnregisterResource";
constexpr int kNotSupported = 801;  // CUDA_ERROR_NOT_SUPPORTED

std::size_t count(const std::string& text, const std::string& word) {
  std::size_t found = 0;
  for (auto at = text.find(word); at != std::string::npos; at = text.find(word, at + word.size())) {
    ++found;
  }
  return found;
}

}  // namespace

TEST_CASE("an unimplemented entry point returns NOT_SUPPORTED and logs its name once", "[stubs]") {
  const auto& shim = ShimUnderTest::get();
  // The real signature takes three arguments; the stub ignores them.
  const auto sut = shim.function<int (*)(void*)>(kUnimplemented);
  REQUIRE(sut != nullptr);

  REQUIRE(sut(nullptr) == kNotSupported);
  REQUIRE(sut(nullptr) == kNotSupported);

  const std::string log = shim.read_log();
  CAPTURE(log);
  REQUIRE(count(log, kUnimplemented) == 1);
  const std::string expected_line = "mpsshim[" + std::to_string(::getpid()) +
                                    "] warn: " + kUnimplemented +
                                    " is not implemented by mpsshim; returning "
                                    "CUDA_ERROR_NOT_SUPPORTED\n";
  REQUIRE(log.find(expected_line) != std::string::npos);
}

TEST_CASE("an entry point refused on purpose returns NOT_SUPPORTED and logs why once", "[stubs]") {
  const auto& shim = ShimUnderTest::get();
  const auto sut = shim.function<int (*)(void*)>(kRefused);
  REQUIRE(sut != nullptr);

  REQUIRE(sut(nullptr) == kNotSupported);
  REQUIRE(sut(nullptr) == kNotSupported);

  const std::string log = shim.read_log();
  CAPTURE(log);
  REQUIRE(count(log, kRefused) == 1);
  const std::string expected_line =
      "mpsshim[" + std::to_string(::getpid()) + "] warn: " + kRefused +
      " is refused by mpsshim: graphics interop resources come only from the GL, EGL and VDPAU "
      "registrations, which are refused; returning CUDA_ERROR_NOT_SUPPORTED\n";
  REQUIRE(log.find(expected_line) != std::string::npos);
}
