#include "broker/server/session/handle_table.hpp"

#include <catch2/catch.hpp>

namespace mpsshim::server {
namespace {

struct Stream {
  int value;
};
struct Event {
  int value;
};
using Table = HandleTable<Stream, Event>;

TEST_CASE("a handle names its object until it is taken", "[server][handles]") {
  Table sut(7);
  std::uint64_t id = sut.insert(Stream{42});

  REQUIRE(id != 0);
  REQUIRE(sut.get<Stream>(id) != nullptr);
  CHECK(sut.get<Stream>(id)->value == 42);
  CHECK(sut.size() == 1);

  auto taken = sut.take<Stream>(id);
  REQUIRE(taken);
  CHECK(taken->value == 42);
  CHECK(sut.get<Stream>(id) == nullptr);
  CHECK(sut.size() == 0);
}

TEST_CASE("a handle of one kind does not name an object of another", "[server][handles]") {
  Table sut(7);
  std::uint64_t stream = sut.insert(Stream{1});

  CHECK(sut.get<Event>(stream) == nullptr);
  CHECK_FALSE(sut.take<Event>(stream));
  CHECK(sut.get<Stream>(stream) != nullptr);  // the failed take left it alone
}

TEST_CASE("a stale handle stops working when its slot is reused", "[server][handles]") {
  Table sut(7);
  std::uint64_t first = sut.insert(Stream{1});
  sut.take<Stream>(first);

  std::uint64_t second = sut.insert(Stream{2});

  CHECK((second & 0xffffffffu) == (first & 0xffffffffu));  // same slot...
  CHECK(second != first);                                  // ...new generation
  CHECK(sut.get<Stream>(first) == nullptr);
  REQUIRE(sut.get<Stream>(second) != nullptr);
  CHECK(sut.get<Stream>(second)->value == 2);
}

TEST_CASE("another client's handles do not name this client's objects", "[server][handles]") {
  constexpr std::uint32_t kClient1Salt = 1 * 0x9E3779B1u;
  constexpr std::uint32_t kClient2Salt = 2 * 0x9E3779B1u;
  Table client1(kClient1Salt);
  Table client2(kClient2Salt);
  std::uint64_t mine = client1.insert(Stream{1});
  std::uint64_t theirs = client2.insert(Stream{2});

  CHECK(client1.get<Stream>(theirs) == nullptr);
  CHECK(client2.get<Stream>(mine) == nullptr);
}

TEST_CASE("garbage ids name nothing", "[server][handles]") {
  Table sut(7);
  sut.insert(Stream{1});

  CHECK(sut.get<Stream>(0) == nullptr);
  CHECK(sut.get<Stream>(0xffffffffffffffffull) == nullptr);
  CHECK(sut.get<Stream>(std::uint64_t{7} << 32 | 2) == nullptr);  // index past the end
}

TEST_CASE("a full table refuses new objects", "[server][handles]") {
  Table sut(7, 2);
  CHECK(sut.insert(Stream{1}) != 0);
  CHECK(sut.insert(Stream{2}) != 0);
  CHECK(sut.insert(Stream{3}) == 0);
}

TEST_CASE("ids_where finds the live objects that match", "[server][handles]") {
  Table sut(7);
  std::uint64_t a = sut.insert(Stream{1});
  sut.insert(Event{1});
  std::uint64_t c = sut.insert(Stream{3});
  std::uint64_t d = sut.insert(Stream{1});
  sut.take<Stream>(d);

  auto ids = sut.ids_where<Stream>([](const Stream& s) { return s.value == 1; });

  CHECK(ids == std::vector<std::uint64_t>{a});
  CHECK(sut.ids<Stream>() == std::vector<std::uint64_t>{a, c});
}

}  // namespace
}  // namespace mpsshim::server
