// The server's hint to its clients' waiting threads (proto::SessionControl::crowded): with more
// clients than ServerSettings::spin_clients they sleep after a short spin instead of yielding
// the CPUs the workers need (libshim/wait_policy.hpp).
#include <catch2/catch.hpp>
#include <optional>
#include <string>

#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

bool told_crowded(const TestClient& client) {
  return client.control()->crowded.load(std::memory_order_relaxed) != 0;
}

TEST_CASE("clients are told the server is crowded while they outnumber spin_clients",
          "[server][wait_hint]") {
  ServerSettings settings;
  settings.spin_clients = 2;
  Harness h(settings);
  TestClient a(h, default_hello(101));
  TestClient b(h, default_hello(102));
  h.pump();
  CHECK_FALSE(told_crowded(a));
  CHECK_FALSE(told_crowded(b));

  {
    TestClient c(h, default_hello(103));
    REQUIRE(h.pump_until([&] { return told_crowded(a) && told_crowded(b) && told_crowded(c); }));
    // Freed, the third client's session no longer counts.
    c.hang_up();
    REQUIRE(h.pump_until([&] { return !told_crowded(a) && !told_crowded(b); }));
  }
  // A client that comes to a crowded server learns it too.
  TestClient d(h, default_hello(104));
  TestClient e(h, default_hello(105));
  REQUIRE(h.pump_until([&] { return told_crowded(d) && told_crowded(e) && told_crowded(a); }));
}

TEST_CASE("with spin_clients 0 every client is told to sleep; by default a lone one is not",
          "[server][wait_hint]") {
  // The default, half the CPUs, is at least one.
  for (std::optional<std::size_t> spin_clients :
       {std::optional<std::size_t>{0}, ServerSettings{}.spin_clients}) {
    INFO("spin_clients " << (spin_clients ? std::to_string(*spin_clients) : "unset"));
    ServerSettings settings;
    settings.spin_clients = spin_clients;
    Harness h(settings);
    TestClient a(h);
    h.pump();
    CHECK(told_crowded(a) == (spin_clients == 0u));
  }
}

}  // namespace
}  // namespace mpsshim::server::test
