// Every entry point the server resolves must be defined by this library, with the signature the
// server's table expects: taking each address as that type turns a missing or mismatched one
// into a build error here instead of a dlsym failure in a test.
#include "broker/server/driver/driver_table.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

#define MPSSHIM_TESTDRIVER_ADDRESS(name, ret, params) \
  reinterpret_cast<const void*>(static_cast<ret(CUDAAPI*) params>(&::name)),
[[gnu::used]] const void* const kExports[] = {MPSSHIM_DRIVER_FUNCTIONS(MPSSHIM_TESTDRIVER_ADDRESS)};
#undef MPSSHIM_TESTDRIVER_ADDRESS

}  // namespace
}  // namespace mpsshim::testdriver
