// The green-context pool (green_context_pool.hpp) through the server, on the fake driver: a
// finished session's green context serves the next session of its shape, the pool keeps at
// most its capacity, churn leaves no more than that alive, and nothing is kept once the primary
// context is released at rest.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <vector>

#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

proto::ClientHello hello_with_quota(int pid, int percentage) {
  proto::ClientHello hello = default_hello(pid);
  hello.active_thread_percentage = percentage;
  return hello;
}

ServerSettings pool_of(std::size_t capacity) {
  ServerSettings settings;
  settings.green_context_pool = capacity;
  return settings;
}

void end_and_wait(Harness& h, TestClient& client, std::size_t sessions_left) {
  client.hang_up();
  REQUIRE(h.pump_until([&] { return h.server->session_count() == sessions_left; }));
}

}  // namespace

TEST_CASE("a session of the same quota gets the last one's green context", "[server][green_pool]") {
  Harness h;
  auto first = std::make_unique<TestClient>(h, hello_with_quota(4123, 50));
  REQUIRE(first->connected());
  const unsigned first_sms = first->welcome().sm_count;
  REQUIRE(fake_gpu().green_created == 1);
  end_and_wait(h, *first, 0);
  first.reset();
  REQUIRE(h.server->green_context_pool().idle == 1);
  const int synchronized = fake_gpu().ctx_synchronizes;

  TestClient sut(h, hello_with_quota(4124, 50));

  REQUIRE(sut.connected());
  CHECK(fake_gpu().green_created == 1);  // no new one
  CHECK(fake_gpu().green_live == 1);
  CHECK(sut.welcome().sm_count == first_sms);
  const GreenContextPoolFigures pool = h.server->green_context_pool();
  CHECK(pool.reused == 1);
  CHECK(pool.idle == 0);
  CHECK(pool.created == 1);
  CHECK(synchronized >= 1);  // it was synchronized before it was kept
  CHECK(sut.create_context().ctx != 0);
}

TEST_CASE("a session of another quota gets a green context of its own", "[server][green_pool]") {
  Harness h;
  {
    TestClient half(h, hello_with_quota(4123, 50));
    end_and_wait(h, half, 0);
  }

  TestClient sut(h, hello_with_quota(4124, 25));

  REQUIRE(sut.connected());
  CHECK(fake_gpu().green_created == 2);
  CHECK(h.server->green_context_pool().idle == 1);  // the 50 % one waits for its shape
  CHECK(h.server->green_context_pool().reused == 0);
}

TEST_CASE("the pool keeps at most its capacity and destroys the rest", "[server][green_pool]") {
  constexpr std::size_t kCapacity = 2;
  Harness h(pool_of(kCapacity));
  std::vector<std::unique_ptr<TestClient>> clients;
  int pid = 5000;
  for (int percentage : {25, 50, 75, 100}) {  // four shapes, all alive at once
    clients.push_back(std::make_unique<TestClient>(h, hello_with_quota(pid++, percentage)));
    REQUIRE(clients.back()->connected());
  }
  REQUIRE(fake_gpu().green_live == 4);

  for (auto& client : clients) client->hang_up();
  REQUIRE(h.pump_until([&] { return h.server->session_count() == 0; }));

  const GreenContextPoolFigures pool = h.server->green_context_pool();
  CHECK(pool.idle == kCapacity);
  CHECK(pool.destroyed == 4 - kCapacity);
  CHECK(fake_gpu().green_live == static_cast<int>(kCapacity));
}

TEST_CASE("a pool of capacity 0 keeps nothing", "[server][green_pool]") {
  Harness h(pool_of(0));
  {
    TestClient client(h);
    end_and_wait(h, client, 0);
  }
  CHECK(fake_gpu().green_live == 0);
  CHECK(h.server->green_context_pool().idle == 0);
  CHECK(h.server->green_context_pool().destroyed == 1);
}

TEST_CASE("clients coming and going leave at most the pool's capacity alive",
          "[server][green_pool]") {
  constexpr std::size_t kCapacity = 3;
  constexpr int kRounds = 30;
  constexpr int kAtOnce = 2;
  const int quotas[] = {25, 50, 100};
  Harness h(pool_of(kCapacity));
  std::vector<std::unique_ptr<TestClient>> alive;
  int pid = 6000;
  for (int round = 0; round < kRounds; ++round) {
    alive.push_back(std::make_unique<TestClient>(h, hello_with_quota(pid++, quotas[round % 3])));
    REQUIRE(alive.back()->connected());
    if (alive.size() > kAtOnce) {
      end_and_wait(h, *alive.front(), kAtOnce);
      alive.erase(alive.begin());
    }
    // The sessions' own and the pool's, never more.
    CHECK(fake_gpu().green_live <=
          static_cast<int>(h.server->session_count() + h.server->green_context_pool().idle));
  }
  for (auto& client : alive) client->hang_up();
  REQUIRE(h.pump_until([&] { return h.server->session_count() == 0; }));

  const GreenContextPoolFigures pool = h.server->green_context_pool();
  CHECK(fake_gpu().green_live == static_cast<int>(pool.idle));
  CHECK(pool.idle <= kCapacity);
  // Three shapes, at most three sessions at once: a handful made, the rest reused.
  CHECK(fake_gpu().green_created <= 9);
  CHECK(pool.reused >= static_cast<std::size_t>(kRounds) - 9);
}

TEST_CASE("the pool is empty before the primary context is released at rest",
          "[server][green_pool]") {
  ServerSettings settings;
  settings.context_idle_timeout = std::chrono::milliseconds(0);
  Harness h(settings);
  {
    TestClient first(h, hello_with_quota(4123, 50));
    TestClient second(h, hello_with_quota(4124, 100));
    REQUIRE(fake_gpu().green_live == 2);
    end_and_wait(h, first, 1);
    CHECK(h.server->context_held());  // the other client still needs it
    CHECK(h.server->green_context_pool().idle == 1);
    end_and_wait(h, second, 0);
  }

  REQUIRE(h.pump_until([&] { return !h.server->context_held(); }));

  CHECK(fake_gpu().primary_refs == 0);
  CHECK(fake_gpu().green_live == 0);
  CHECK(fake_gpu().green_live_at_primary_release == 0);
  CHECK(h.server->green_context_pool().idle == 0);
  CHECK(
      h.logged("released the primary context (no client for the idle timeout) and 2 idle "
               "green context(s)"));

  // The next client starts afresh: a new context and a new green context.
  TestClient later(h, hello_with_quota(4125, 50));
  REQUIRE(later.connected());
  CHECK(fake_gpu().green_created == 3);
}

TEST_CASE("the server's end destroys what the pool keeps and logs its figures",
          "[server][green_pool]") {
  {
    Harness h;
    {
      TestClient client(h);
      end_and_wait(h, client, 0);
    }
    REQUIRE(fake_gpu().green_live == 1);
    h.server.reset();
    CHECK(fake_gpu().green_live == 0);
    CHECK(
        h.logged("green contexts: 1 created, 0 reused from the pool, 0 destroyed; 1 kept at "
                 "the end (at most 32)"));
  }
}

}  // namespace mpsshim::server::test
