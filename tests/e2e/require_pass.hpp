// For the e2e tests: a client run under the shim passed (exit 0 and its PASS line), with what it
// printed and the daemon's log shown when it did not.
#pragma once

#include <catch2/catch.hpp>

#include "harness.hpp"

namespace mpsshim::e2e {

inline void require_pass(const Outcome& o, const Daemon& d) {
  INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon log:\n" << d.log());
  REQUIRE(o.exit_code == 0);
  REQUIRE(o.out.find("PASS") != std::string::npos);
}

}  // namespace mpsshim::e2e
