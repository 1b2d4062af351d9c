// An entry point nobody implements answers CUDA_ERROR_NOT_SUPPORTED and says so once; one refused
// on purpose (libshim/entry/refused.tsv) says why. libmpsshim has no entry point that is neither
// served nor refused, so the first is seen in the same stubs built from lists of the test's own
// (tests/entry/stub_lists, MPSSHIM_TEST_STUBS_LIBRARY), which log to the same file.
#include <dlfcn.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "tests/entry/shim_under_test.hpp"

namespace {

using mpsshim::test::ShimUnderTest;

// A graphics-interop call, refused on purpose.
constexpr const char* kRefused = "cuGraphicsUnregisterResource";
// The CUDA 2.0 variant of cuArray3DCreate (32-bit sizes), which cuGetProcAddress hands out only
// for versions before 3.2: a variant refused on purpose (refused.tsv's `version<3020`).
constexpr const char* kRefusedVariant = "cuArray3DCreate";
constexpr int kNotSupported = 801;  // CUDA_ERROR_NOT_SUPPORTED

std::size_t count(const std::string& text, const std::string& word) {
  std::size_t found = 0;
  for (auto at = text.find(word); at != std::string::npos; at = text.find(word, at + word.size())) {
    ++found;
  }
  return found;
}

std::string line_prefix() {
  return "mpsshim[" + std::to_string(::getpid()) + "] warn: ";
}

}  // namespace

TEST_CASE("an unimplemented entry point returns NOT_SUPPORTED and logs its name once", "[stubs]") {
  const auto& shim = ShimUnderTest::get();  // points the log at its file first
  const char* path = std::getenv("MPSSHIM_TEST_STUBS_LIBRARY");
  REQUIRE(path != nullptr);
  void* stubs = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  INFO(::dlerror());
  REQUIRE(stubs != nullptr);
  const auto sut = reinterpret_cast<int (*)(void*)>(::dlsym(stubs, "cuMpsshimTestUnserved"));
  REQUIRE(sut != nullptr);

  REQUIRE(sut(nullptr) == kNotSupported);
  REQUIRE(sut(nullptr) == kNotSupported);

  const std::string log = shim.read_log();
  CAPTURE(log);
  REQUIRE(count(log, "cuMpsshimTestUnserved") == 1);
  REQUIRE(log.find(line_prefix() + "cuMpsshimTestUnserved is not implemented by mpsshim; returning "
                                   "CUDA_ERROR_NOT_SUPPORTED\n") != std::string::npos);
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
  REQUIRE(log.find(line_prefix() + kRefused +
                   " is refused by mpsshim: graphics interop resources come only from the GL, "
                   "EGL and VDPAU registrations, which are refused; returning "
                   "CUDA_ERROR_NOT_SUPPORTED\n") != std::string::npos);
}

TEST_CASE("a CUDA 2.x variant with 32-bit device pointers is refused and says why once",
          "[stubs]") {
  const auto& shim = ShimUnderTest::get();
  const auto sut = shim.function<int (*)(void*)>(kRefusedVariant);
  REQUIRE(sut != nullptr);

  REQUIRE(sut(nullptr) == kNotSupported);
  REQUIRE(sut(nullptr) == kNotSupported);

  const std::string log = shim.read_log();
  CAPTURE(log);
  const std::string line = line_prefix() + kRefusedVariant + " is refused by mpsshim: the CUDA 2.x";
  REQUIRE(count(log, line) == 1);
}
