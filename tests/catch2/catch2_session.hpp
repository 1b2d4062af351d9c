// The Catch2 session of a test program, for a program with its own main(): Catch2's single
// header declares Catch::Session only where its implementation is compiled (session.cpp).
#pragma once

namespace mpsshim::test {

// Catch::Session().run(argc, argv): runs the test cases the command line selects and returns
// the number that failed (at most 255), or an error of the command line.
int run_catch2_session(int argc, char* argv[]);

}  // namespace mpsshim::test
