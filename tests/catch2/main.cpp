// main() of the test programs that need no set-up of their own (catch2/meson.build).
#include "catch2_session.hpp"

int main(int argc, char* argv[]) {
  return mpsshim::test::run_catch2_session(argc, argv);
}
