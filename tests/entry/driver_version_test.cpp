// The advertised driver version: the table's until a server is known, then never newer than
// either.
#include <catch2/catch.hpp>

#include "libshim/driver_version.hpp"
#include "libshim/entry/proc_address_version.hpp"

namespace {

using mpsshim::shim::advertised_driver_version;
using mpsshim::shim::set_server_driver_version;

constexpr int kTableVersion = mpsshim::shim::entry::kProcAddressTableDriverVersion;

}  // namespace

// One test case: the server version is process state, and the order of these steps matters.
TEST_CASE("the advertised version is the table's, capped by the server's", "[driver_version]") {
  REQUIRE(kTableVersion == 13000);
  REQUIRE(advertised_driver_version() == kTableVersion);

  set_server_driver_version(0);
  set_server_driver_version(-1);
  REQUIRE(advertised_driver_version() == kTableVersion);

  set_server_driver_version(12080);
  REQUIRE(advertised_driver_version() == 12080);

  set_server_driver_version(kTableVersion + 10);
  REQUIRE(advertised_driver_version() == kTableVersion);
}
