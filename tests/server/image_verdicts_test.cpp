// broker/server/images/image_verdicts: the scan's verdicts survive a server's restart in a file
// only this server's user may write; anything else in its place is ignored, never trusted; and
// through the server, the first client after a restart loads images it scanned before without
// scanning them again.
#include "broker/server/images/image_verdicts.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/server/fatbin_builder.hpp"
#include "tests/server/harness.hpp"
#include "tests/server/library_load.hpp"

namespace mpsshim::server::test {
namespace {

using Catch::Matchers::Contains;

// A fresh directory, removed with everything in it at the end.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "verdicts.XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~ScratchDir() { std::filesystem::remove_all(path); }
};

ImageDigest digest_of(std::uint8_t seed) {
  ImageDigest digest{};
  for (std::size_t i = 0; i < digest.size(); ++i) digest[i] = static_cast<std::uint8_t>(seed + i);
  return digest;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  ::chmod(path.c_str(), 0644);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

const std::string kHeader = "mpsshim image verdicts rules=" + std::to_string(kScanRules) + "\n";
const std::string kLine =
    "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f shared\n";

}  // namespace

TEST_CASE("image verdicts: the scan's rules are raised with every change to the scan",
          "[image_verdicts]") {
  // A change to image_globals.cpp may refuse what it once allowed; verdicts kept under the old
  // rules would then skip the new scan. Raise kScanRules, then pin the file's new digest here.
  const char* root = std::getenv("MPSSHIM_SOURCE_ROOT");
  REQUIRE(root != nullptr);
  const std::string text = read_text(std::string(root) + "/broker/server/images/image_globals.cpp");
  REQUIRE_FALSE(text.empty());
  std::string hex;
  for (std::uint8_t b :
       digest_image({reinterpret_cast<const std::byte*>(text.data()), text.size()}, 1)) {
    hex += fmt::format("{:02x}", b);
  }
  CHECK(kScanRules == 2);
  CHECK(hex == "a16bec73f54a13dd4d313f0a48286eeaf329015bb8eca41f167cb6f8948246ef");
}

TEST_CASE("image verdicts: the file is named after the compute capability", "[image_verdicts]") {
  CHECK(verdict_file("/var/cache/mpsshim", DeviceArch{9, 0}) ==
        "/var/cache/mpsshim/image-verdicts-sm90");
  CHECK(verdict_file("/d", DeviceArch{12, 1}) == "/d/image-verdicts-sm121");
}

TEST_CASE("image verdicts: written, read back and merged with what the file held",
          "[image_verdicts]") {
  ScratchDir dir;
  const std::string path = verdict_file(dir.path, DeviceArch{9, 0});
  auto none = read_verdicts(path);
  REQUIRE(none);
  CHECK(none->empty());  // no file yet: nothing, and no complaint

  REQUIRE(write_verdicts(path, {{digest_of(1), true}, {digest_of(2), false}}) == 2u);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0600);
  auto first = read_verdicts(path);
  REQUIRE(first);
  CHECK(first->size() == 2);
  CHECK(std::find(first->begin(), first->end(), ImageVerdict{digest_of(1), true}) != first->end());
  CHECK(std::find(first->begin(), first->end(), ImageVerdict{digest_of(2), false}) != first->end());

  // Another server of the GPU adds its own and changes one: the newer verdict wins.
  REQUIRE(write_verdicts(path, {{digest_of(3), true}, {digest_of(2), true}}) == 3u);
  auto merged = read_verdicts(path);
  REQUIRE(merged);
  CHECK(merged->size() == 3);
  CHECK(std::find(merged->begin(), merged->end(), ImageVerdict{digest_of(2), true}) !=
        merged->end());
  // Nothing left behind but the file and its lock.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path),
                      std::filesystem::directory_iterator{}) == 2);
}

TEST_CASE("image verdicts: servers writing at once lose none of each other's", "[image_verdicts]") {
  ScratchDir dir;
  const std::string path = verdict_file(dir.path, DeviceArch{9, 0});
  constexpr int kRounds = 40;
  std::atomic<int> failed{0};  // Catch's assertions are not for other threads
  auto writer = [&](std::uint8_t first) {
    for (int i = 0; i < kRounds; ++i) {
      if (!write_verdicts(path, {{digest_of(static_cast<std::uint8_t>(first + i)), true}})) {
        ++failed;
      }
    }
  };
  std::thread a(writer, 0), b(writer, 100);
  a.join();
  b.join();
  CHECK(failed == 0);
  auto all = read_verdicts(path);
  REQUIRE(all);
  CHECK(all->size() == 2 * kRounds);
}

TEST_CASE("image verdicts: a file the server did not write is ignored, never half read",
          "[image_verdicts]") {
  ScratchDir dir;
  const std::string path = dir.path + "/image-verdicts-sm90";
  SECTION("other rules") {
    write_text(path, "mpsshim image verdicts rules=1\n" + kLine);
    auto read = read_verdicts(path);
    REQUIRE_FALSE(read);
    CHECK_THAT(read.error(), Contains("rules"));
  }
  SECTION("a malformed line") {
    for (std::string bad : {std::string("0001 shared\n"), kLine.substr(0, 65) + "maybe\n",
                            "G" + kLine.substr(1), kLine.substr(0, 64) + "\tshared\n"}) {
      write_text(path, kHeader + kLine + bad);
      auto read = read_verdicts(path);
      REQUIRE_FALSE(read);
      CHECK(read.error() == "line 3 is malformed");
    }
  }
  SECTION("a last line cut short") {
    write_text(path, kHeader + kLine.substr(0, 40));
    REQUIRE_FALSE(read_verdicts(path));
  }
  SECTION("an empty file") {
    write_text(path, "");
    REQUIRE_FALSE(read_verdicts(path));
  }
  SECTION("writable by others") {
    write_text(path, kHeader + kLine);
    REQUIRE(read_verdicts(path));
    ::chmod(path.c_str(), 0664);
    auto read = read_verdicts(path);
    REQUIRE_FALSE(read);
    CHECK_THAT(read.error(), Contains("others may write it"));
  }
  SECTION("a symbolic link") {
    const std::string target = dir.path + "/elsewhere";
    write_text(target, kHeader + kLine);
    REQUIRE(::symlink(target.c_str(), path.c_str()) == 0);
    REQUIRE_FALSE(read_verdicts(path));
  }
  SECTION("a directory") {
    std::filesystem::create_directory(path);
    REQUIRE_FALSE(read_verdicts(path));
  }
}

TEST_CASE("image verdicts: the first client after a restart waits for no scan",
          "[server][image_verdicts]") {
  ScratchDir dir;
  ServerSettings settings;
  settings.image_verdict_dir = dir.path;
  const auto clean = make_container({{kElf, clean_elf()}});
  const auto with_globals = make_container({{kElf, elf_with(".nv.global", SHT_NOBITS)}});
  {
    Harness h(settings);
    TestClient a(h);
    auto ctx = a.create_context();
    load_library_image(a, ctx.ctx, clean, 1);
    load_library_image(a, ctx.ctx, with_globals, 2);
    CHECK(h.server->image_cache().stats().scans == 2);
    CHECK(h.server->image_cache().stats().adopted == 0);
  }  // the server's end keeps its verdicts
  const std::string file = read_text(verdict_file(dir.path, DeviceArch{9, 0}));
  CHECK(file.starts_with(kHeader));
  CHECK(std::count(file.begin(), file.end(), '\n') == 3);

  Harness h(settings);
  CHECK(h.server->image_cache().stats().adopted == 2);
  CHECK(h.logged("image verdicts: 2 read from"));
  TestClient a(h), b(h);
  auto ctx_a = a.create_context();
  auto ctx_b = b.create_context();
  load_library_image(a, ctx_a.ctx, clean, 1);
  load_library_image(a, ctx_a.ctx, with_globals, 2);
  load_library_image(b, ctx_b.ctx, clean, 3);
  const ImageCacheStats stats = h.server->image_cache().stats();
  CHECK(stats.scans == 0);
  CHECK(stats.loads == 1);  // the clean image: shared, as the verdict says
  CHECK(stats.hits == 1);
  CHECK(stats.private_loads == 1);  // the one with a variable: still its client's alone
}

TEST_CASE("image verdicts: a verdict file another user could have written is not trusted",
          "[server][image_verdicts]") {
  ScratchDir dir;
  ServerSettings settings;
  settings.image_verdict_dir = dir.path;
  const auto with_globals = make_container({{kElf, elf_with(".nv.global", SHT_NOBITS)}});
  // Claims the image with a variable may be shared.
  std::string line;
  for (std::uint8_t b : digest_image(with_globals, 1)) line += fmt::format("{:02x}", b);
  const std::string path = verdict_file(dir.path, DeviceArch{9, 0});
  write_text(path, kHeader + line + " shared\n");
  ::chmod(path.c_str(), 0666);
  Harness h(settings);
  CHECK(h.logged("others may write it"));
  TestClient a(h);
  auto ctx = a.create_context();
  load_library_image(a, ctx.ctx, with_globals, 1);
  CHECK(h.server->image_cache().stats().scans == 1);
  CHECK(h.server->image_cache().stats().private_loads == 1);
}

}  // namespace mpsshim::server::test
