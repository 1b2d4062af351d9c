// proto/text_parts: long operator answers travel as several messages and arrive whole.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>

#include "proto/text_parts.hpp"

namespace mpsshim::proto {
namespace {

std::string lines(std::size_t count) {
  std::string text;
  for (std::size_t i = 0; i < count; ++i) {
    text += "client=" + std::to_string(i) + " pid=" + std::to_string(4000 + i) +
            " program=python3 records=123456 state=active\n";
  }
  return text;
}

std::string assemble(const std::vector<TextMessage>& parts, std::int32_t& status) {
  TextAssembly assembly;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const bool done = assembly.add(parts[i]);
    REQUIRE(done == (i + 1 == parts.size()));
  }
  status = assembly.status();
  return assembly.text();
}

}  // namespace

TEST_CASE("a short answer is one message with its status", "[text_parts]") {
  auto parts = text_messages(MessageKind::kCtlReply, 1, "no client with pid 7\n");
  REQUIRE(parts.size() == 1);
  CHECK(parts[0].status == 1);
  std::int32_t status = 0;
  CHECK(assemble(parts, status) == "no client with pid 7\n");
  CHECK(status == 1);
  CHECK(text_messages(MessageKind::kCtlReply, 0, "").size() == 1);
}

TEST_CASE("a long answer is cut at line ends and put together again", "[text_parts]") {
  const std::string text = lines(600);  // ~40 KiB
  auto parts = text_messages(MessageKind::kServerStats, 0, text);
  REQUIRE(parts.size() >= 5);
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    CHECK(parts[i].status == kTextContinues);
    CHECK(parts[i].text[parts[i].length - 1] == '\n');  // no line split
    CHECK(parts[i].header.kind == static_cast<std::uint16_t>(MessageKind::kServerStats));
  }
  std::int32_t status = -1;
  CHECK(assemble(parts, status) == text);
  CHECK(status == 0);
}

TEST_CASE("a line longer than a message is split, not lost", "[text_parts]") {
  const std::string text = std::string(20000, 'x') + "\nend\n";
  auto parts = text_messages(MessageKind::kCtlReply, 0, text);
  CHECK(parts.size() == 3);
  std::int32_t status = -1;
  CHECK(assemble(parts, status) == text);
}

TEST_CASE("an assembly stops growing at its cap and says so", "[text_parts]") {
  TextAssembly assembly;
  TextMessage part{};
  part.status = kTextContinues;
  part.length = sizeof part.text;
  std::memset(part.text, 'y', sizeof part.text);
  for (std::size_t i = 0; i < kMaxTextAnswer / sizeof part.text + 10; ++i) {
    REQUIRE_FALSE(assembly.add(part));
  }
  part.status = 0;
  part.length = 0;
  CHECK(assembly.add(part));
  CHECK(assembly.text().size() < kMaxTextAnswer + 100);
  CHECK(assembly.text().find("answer cut") != std::string::npos);
}

}  // namespace mpsshim::proto
