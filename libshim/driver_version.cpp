#include "libshim/driver_version.hpp"

#include <algorithm>
#include <atomic>

#include "libshim/entry/proc_address_version.hpp"

namespace mpsshim::shim {
namespace {

// 0 until connected. Constant-initialised, so cuGetProcAddress may read it before any
// constructor of the shim has run.
constinit std::atomic<int> server_driver_version{0};

}  // namespace

void set_server_driver_version(int version) noexcept {
  if (version <= 0) return;
  server_driver_version.store(version, std::memory_order_relaxed);
}

int advertised_driver_version() noexcept {
  const int server = server_driver_version.load(std::memory_order_relaxed);
  constexpr int kTable = entry::kProcAddressTableDriverVersion;
  return server > 0 ? std::min(server, kTable) : kTable;
}

}  // namespace mpsshim::shim
