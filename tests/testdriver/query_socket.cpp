// A test hook for tests that see the driver only from outside its process (the e2e crash storm,
// tests/e2e/crash_storm_test.cpp): with MPSSHIM_TESTDRIVER_QUERY_SOCKET=PATH in the environment,
// the first successful cuInit listens on a unix stream socket at PATH, and every connection gets
// one line of the driver's live objects by kind, then end of file:
//
//   objects=N streams=N events=N modules=N libraries=N allocations=N device_bytes=N
//   registrations=N green_contexts=N graphs=N graph_execs=N arrays=N pools=N vmm=N physical=N
//   injected=N
// (device_bytes counts cuMemAlloc memory and the physical VMM allocations this process made)
//
// `objects` is mpsshim_testdriver_live_objects(), what the in-process tests compare. The
// listening thread is detached and lives as long as the process; it holds the state's mutex only
// while it counts.
#include "tests/testdriver/query_socket.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "tests/testdriver/fault_injection.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

std::string live_object_line(State& s) {
  const int total = s.live_objects();
  std::lock_guard lock(s.mutex);
  std::size_t allocations = 0, device_bytes = 0, modules = 0;
  for (const auto& [base, a] : s.allocations) {
    if (!a.user) continue;
    ++allocations;
    device_bytes += a.size;
  }
  // Physical VMM allocations are device memory too: the server's cuMemAlloc memory lives in them
  // (its address arena). Imported ones are another process's.
  std::size_t physical = 0;
  for (const auto& [handle, p] : s.vmm.physical) {
    if (p.imported) continue;
    ++physical;
    device_bytes += p.size;
  }
  for (const auto& [handle, m] : s.modules) modules += m->library == nullptr ? 1 : 0;
  char line[512];
  std::snprintf(line, sizeof line,
                "objects=%d streams=%zu events=%zu modules=%zu libraries=%zu allocations=%zu "
                "device_bytes=%zu registrations=%zu green_contexts=%zu graphs=%zu "
                "graph_execs=%zu arrays=%zu pools=%d vmm=%d physical=%zu injected=%llu\n",
                total, s.streams.size(), s.events.size(), modules, s.libraries.size(), allocations,
                device_bytes, s.registrations.size(), s.green_contexts.size(), s.graphs.size(),
                s.graph_execs.size(), s.arrays.size(), live_pools(s), live_vmm_objects(s), physical,
                static_cast<unsigned long long>(injected_failures()));
  return line;
}

void serve(int listener) {
  for (;;) {
    const int peer = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (peer < 0) continue;
    const std::string line = live_object_line(state());
    [[maybe_unused]] ssize_t n = ::send(peer, line.data(), line.size(), MSG_NOSIGNAL);
    ::close(peer);
  }
}

}  // namespace

void start_query_socket() {
  const char* path = std::getenv("MPSSHIM_TESTDRIVER_QUERY_SOCKET");
  if (path == nullptr || *path == '\0') return;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (std::strlen(path) >= sizeof address.sun_path) {
    std::fprintf(stderr, "test driver: MPSSHIM_TESTDRIVER_QUERY_SOCKET %s is too long\n", path);
    return;
  }
  std::strcpy(address.sun_path, path);
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ::unlink(path);  // a restarted server's predecessor left it
  if (listener < 0 ||
      ::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener, 8) != 0) {
    std::fprintf(stderr, "test driver: cannot listen on %s: %s\n", path, std::strerror(errno));
    if (listener >= 0) ::close(listener);
    return;
  }
  std::thread(serve, listener).detach();
}

}  // namespace mpsshim::testdriver
