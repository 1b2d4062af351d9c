// The primary context is held only while clients need it (context_lease.hpp): memory at rest.
#include <catch2/catch.hpp>

#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

ServerSettings idle_timeout(std::chrono::milliseconds timeout) {
  ServerSettings settings;
  settings.context_idle_timeout = timeout;
  return settings;
}

}  // namespace

TEST_CASE("the context made at start is kept for the idle timeout, then released",
          "[server][context]") {
  SECTION("within the timeout a first client finds it") {
    Harness h(idle_timeout(std::chrono::hours(1)));
    REQUIRE(fake_gpu().primary_refs == 1);  // open_gpu's, for the snapshot
    h.pump();
    CHECK(h.server->context_held());
    TestClient client(h);
    REQUIRE(client.connected());
    CHECK(fake_gpu().primary_refs == 1);
    CHECK(client.create_context().ctx != 0);
    CHECK(h.count_logged("retained the primary context for a client") == 0);
  }
  SECTION("after it, with no client, the server holds none") {
    constexpr auto kTimeout = std::chrono::milliseconds(300);
    const auto started = std::chrono::steady_clock::now();
    Harness h(idle_timeout(kTimeout));
    REQUIRE(h.pump_until([&] { return !h.server->context_held(); }));
    CHECK(std::chrono::steady_clock::now() - started >= kTimeout);
    CHECK(fake_gpu().primary_refs == 0);
    CHECK(h.logged("released the primary context (no client since the server's start)"));
  }
  SECTION("a timeout of 0 releases it at once") {
    Harness h(idle_timeout(std::chrono::milliseconds(0)));
    h.pump(1);
    CHECK_FALSE(h.server->context_held());
    CHECK(fake_gpu().primary_refs == 0);
  }
}

TEST_CASE("the first client retains the context and the last one's leaving releases it",
          "[server][context]") {
  Harness h(idle_timeout(std::chrono::milliseconds(0)));
  h.pump(1);
  REQUIRE(fake_gpu().primary_refs == 0);
  {
    TestClient first(h);
    REQUIRE(first.connected());
    CHECK(fake_gpu().primary_refs == 1);
    CHECK(h.server->gpu().primary != nullptr);
    TestClient second(h, default_hello(4124));
    REQUIRE(second.connected());
    CHECK(fake_gpu().primary_refs == 1);  // one retain serves every client

    first.hang_up();
    REQUIRE(h.pump_until([&] { return h.server->session_count() == 1; }));
    h.pump();
    CHECK(fake_gpu().primary_refs == 1);  // a client is still there

    second.hang_up();
    REQUIRE(h.pump_until([&] { return h.server->session_count() == 0; }));
    REQUIRE(h.pump_until([&] { return !h.server->context_held(); }));
    CHECK(fake_gpu().primary_refs == 0);
  }
  // A later client gets a context again.
  TestClient later(h, default_hello(4125));
  REQUIRE(later.connected());
  CHECK(fake_gpu().primary_refs == 1);
  CHECK(later.create_context().ctx != 0);
  CHECK(h.count_logged("retained the primary context for a client") == 2);
}

TEST_CASE("within the idle timeout the context stays for the next client", "[server][context]") {
  Harness h(idle_timeout(std::chrono::hours(1)));
  {
    TestClient client(h);
    REQUIRE(client.connected());
    client.hang_up();
    REQUIRE(h.pump_until([&] { return h.server->session_count() == 0; }));
  }
  h.pump();
  CHECK(h.server->context_held());
  CHECK(fake_gpu().primary_refs == 1);
}

TEST_CASE("a negative idle timeout keeps the context for the server's life", "[server][context]") {
  Harness h(idle_timeout(std::chrono::milliseconds(-1)));
  h.pump();
  CHECK(h.server->context_held());
  CHECK(fake_gpu().primary_refs == 1);
}

TEST_CASE("a context that cannot be retained refuses the client and says why",
          "[server][context]") {
  Harness h(idle_timeout(std::chrono::milliseconds(0)));
  h.pump(1);
  fake_gpu().primary_retain_result = CUDA_ERROR_OUT_OF_MEMORY;

  TestClient client(h);

  CHECK_FALSE(client.connected());
  CHECK(h.server->session_count() == 0);
  CHECK(h.logged("retaining the GPU's primary context failed"));
  fake_gpu().primary_retain_result = CUDA_SUCCESS;
  TestClient next(h, default_hello(4124));
  CHECK(next.connected());
}

}  // namespace mpsshim::server::test
