// The test driver exports what the server resolves, under the server's (versioned) names.
#include <dlfcn.h>

#include <catch2/catch.hpp>

#include "tests/testdriver/test_support.hpp"

namespace mpsshim::testdriver::test {
namespace {

#define MPSSHIM_TEST_NAME(name, ret, params) #name,
constexpr const char* kServerNames[] = {MPSSHIM_DRIVER_FUNCTIONS(MPSSHIM_TEST_NAME)};
#undef MPSSHIM_TEST_NAME

TEST_CASE("every entry point of the server's driver table resolves", "[exports]") {
  void* sut = driver().handle;
  for (const char* name : kServerNames) {
    INFO(name);
    CHECK(dlsym(sut, name) != nullptr);
  }
}

TEST_CASE("the live-object count is exported", "[exports]") {
  CHECK(dlsym(driver().handle, "mpsshim_testdriver_live_objects") != nullptr);
}

TEST_CASE("internals stay hidden", "[exports]") {
  CHECK(dlsym(driver().handle, "_ZN7mpsshim10testdriver5stateEv") == nullptr);
}

}  // namespace
}  // namespace mpsshim::testdriver::test
