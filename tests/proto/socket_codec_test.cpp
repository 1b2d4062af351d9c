// Socket messages round-trip with their descriptors and credentials; truncated or oversized
// messages are refused rather than half-read.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "proto/control.hpp"
#include "proto/unix_socket.hpp"

using namespace mpsshim::proto;

TEST_CASE("a hello and a memfd travel together and arrive intact", "[socket]") {
  UniqueFd a, b;
  REQUIRE(seqpacket_pair(a, b));
  ClientHello hello{};
  hello.header = make_header(MessageKind::kClientAttach, sizeof hello);
  hello.pid = 1234;
  hello.active_thread_percentage = 25;
  std::strcpy(hello.visible_devices, "1,GPU-abcd");
  UniqueFd memfd(memfd_create("codec-test", MFD_CLOEXEC));
  REQUIRE(ftruncate(memfd.get(), 4096) == 0);
  REQUIRE(pwrite(memfd.get(), "mpsshim", 7, 0) == 7);
  int fds[1] = {memfd.get()};
  REQUIRE(send_struct(a.get(), hello, fds) == 0);

  Received got;
  REQUIRE(receive_message(b.get(), got) == 0);
  REQUIRE(got.bytes.size() == sizeof hello);
  ClientHello copy;
  std::memcpy(&copy, got.bytes.data(), sizeof copy);
  CHECK(std::memcmp(&copy, &hello, sizeof hello) == 0);
  REQUIRE(got.fds.size() == 1);
  char text[8] = {};
  REQUIRE(pread(got.fds[0].get(), text, 7, 0) == 7);
  CHECK(std::string(text) == "mpsshim");
  CHECK((fcntl(got.fds[0].get(), F_GETFD) & FD_CLOEXEC) != 0);
}

TEST_CASE("the peer's credentials come from the kernel", "[socket]") {
  UniqueFd a, b;
  REQUIRE(seqpacket_pair(a, b));
  auto cred = peer_credentials(b.get());
  REQUIRE(cred.has_value());
  CHECK(cred->pid == getpid());
  CHECK(cred->uid == getuid());
}

TEST_CASE("a hang-up reads as an empty message", "[socket]") {
  UniqueFd a, b;
  REQUIRE(seqpacket_pair(a, b));
  a.reset();
  Received got;
  REQUIRE(receive_message(b.get(), got) == 0);
  CHECK(got.bytes.empty());
}

TEST_CASE("more descriptors than allowed are refused by the sender", "[socket]") {
  UniqueFd a, b;
  REQUIRE(seqpacket_pair(a, b));
  int fds[kMaxFdsPerMessage + 1];
  for (int& fd : fds) fd = a.get();
  std::byte byte{};
  CHECK(send_message(a.get(), {&byte, 1}, fds) == EINVAL);
}

TEST_CASE("a message arrives with exactly its own length", "[socket]") {
  UniqueFd a, b;
  REQUIRE(seqpacket_pair(a, b));
  std::vector<std::byte> sent(100'000);
  for (std::size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<std::byte>(i * 7);
  REQUIRE(send_message(a.get(), sent) == 0);
  REQUIRE(send_message(a.get(), std::span<const std::byte>(sent.data(), 3)) == 0);
  Received got;
  REQUIRE(receive_message(b.get(), got) == 0);
  CHECK(got.bytes == sent);
  REQUIRE(receive_message(b.get(), got) == 0);
  CHECK(got.bytes.size() == 3);
}
