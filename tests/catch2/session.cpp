// Catch2's implementation (its single header's CATCH_CONFIG_RUNNER part), compiled once for
// every test program. Each program that compiled it itself paid about a minute of CPU at -O2;
// with some 25 such programs that was about a quarter of a cold build on CI's two cores.
#define CATCH_CONFIG_RUNNER
#include "catch2_session.hpp"

#include <catch2/catch.hpp>

namespace mpsshim::test {

int run_catch2_session(int argc, char* argv[]) {
  return Catch::Session().run(argc, argv);
}

}  // namespace mpsshim::test
