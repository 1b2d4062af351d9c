// module_image_length / library_image_pieces on synthetic images: the corners real nvcc
// output does not reach (ELF32, extended numbering, program headers last, sanity limits).
#include <sys/mman.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "libshim/darkapi/fatbin_format.hpp"
#include "libshim/darkapi/image_length.hpp"

using mpsshim::shim::elf_image_length;
using mpsshim::shim::fatbin_container_length;
using mpsshim::shim::library_image_pieces;
using mpsshim::shim::module_image_length;
namespace fatbin = mpsshim::shim::fatbin;

namespace {

template <class T>
void put(std::vector<std::byte>& buf, std::size_t at, T value) {
  if (buf.size() < at + sizeof value) buf.resize(at + sizeof value);
  std::memcpy(buf.data() + at, &value, sizeof value);
}

std::vector<std::byte> container(std::uint64_t fat_size, std::uint16_t version = 1,
                                 std::uint16_t header_size = 16) {
  std::vector<std::byte> buf(16 + 64);
  put<std::uint32_t>(buf, 0, fatbin::kContainerMagic);
  put<std::uint16_t>(buf, 4, version);
  put<std::uint16_t>(buf, 6, header_size);
  put<std::uint64_t>(buf, 8, fat_size);
  return buf;
}

struct Section {
  std::uint32_t type;
  std::uint64_t offset;
  std::uint64_t size;
};
struct Segment {
  std::uint64_t offset;
  std::uint64_t filesz;
};

// An ELF header plus section and program header tables; section contents are never read.
struct ElfSpec {
  bool wide = true;
  std::uint64_t shoff = 0;
  std::vector<Section> sections;
  bool extended_numbering = false;  // e_shnum = 0, count in section 0's sh_size
  std::uint64_t phoff = 0;
  std::vector<Segment> segments;
};

std::vector<std::byte> elf(const ElfSpec& s) {
  const std::size_t shent = s.wide ? 64 : 40, phent = s.wide ? 56 : 32;
  std::vector<std::byte> buf(s.wide ? 64 : 52);
  put<std::uint32_t>(buf, 0, fatbin::kElfMagic);
  put<std::uint8_t>(buf, 4, s.wide ? 2 : 1);
  put<std::uint8_t>(buf, 5, 1);  // little-endian
  put<std::uint8_t>(buf, 6, 1);
  const auto word = [&](std::size_t at, std::uint64_t v) {
    if (s.wide) {
      put<std::uint64_t>(buf, at, v);
    } else {
      put<std::uint32_t>(buf, at, static_cast<std::uint32_t>(v));
    }
  };
  word(s.wide ? 0x20 : 0x1C, s.phoff);
  word(s.wide ? 0x28 : 0x20, s.shoff);
  const std::size_t e = s.wide ? 0x36 : 0x2A;
  put<std::uint16_t>(buf, e, static_cast<std::uint16_t>(phent));
  put<std::uint16_t>(buf, e + 2, static_cast<std::uint16_t>(s.segments.size()));
  put<std::uint16_t>(buf, e + 4, static_cast<std::uint16_t>(shent));
  put<std::uint16_t>(buf, e + 6,
                     s.extended_numbering ? 0 : static_cast<std::uint16_t>(s.sections.size()));
  for (std::size_t i = 0; i < s.sections.size(); ++i) {
    const std::size_t sh = s.shoff + i * shent;
    put<std::uint32_t>(buf, sh + 4, s.sections[i].type);
    word(sh + (s.wide ? 24 : 16), s.sections[i].offset);
    word(sh + (s.wide ? 32 : 20), s.sections[i].size);
    if (buf.size() < sh + shent) buf.resize(sh + shent);
  }
  for (std::size_t i = 0; i < s.segments.size(); ++i) {
    const std::size_t ph = s.phoff + i * phent;
    word(ph + (s.wide ? 8 : 4), s.segments[i].offset);
    word(ph + 32 - (s.wide ? 0 : 16), s.segments[i].filesz);
    if (buf.size() < ph + phent) buf.resize(ph + phent);
  }
  return buf;
}

constexpr std::uint32_t kProgbits = 1, kNobits = 8;

}  // namespace

TEST_CASE("image length: one fatbin container, never the next", "[image]") {
  auto c = container(64);
  CHECK(module_image_length(c.data()) == 80u);
  CHECK(fatbin_container_length(c.data()) == 80u);
  // A second container right behind the first is another translation unit's.
  auto two = container(64);
  const auto second = container(32);
  two.insert(two.end(), second.begin(), second.end());
  CHECK(module_image_length(two.data()) == 80u);
  CHECK(module_image_length(two.data() + 80) == 48u);
  // Larger header sizes are honoured.
  CHECK(module_image_length(container(64, 1, 32).data()) == 96u);
}

TEST_CASE("image length: implausible containers are refused", "[image]") {
  CHECK_FALSE(module_image_length(container(std::uint64_t{4} << 30).data()));  // > 4 GiB
  CHECK(module_image_length(container((std::uint64_t{4} << 30) - 16).data()) == std::size_t{4}
                                                                                    << 30);
  CHECK_FALSE(module_image_length(container(~std::uint64_t{0}).data()));  // overflow
  CHECK_FALSE(module_image_length(container(64, 2).data()));              // unknown version
  CHECK_FALSE(module_image_length(container(64, 1, 8).data()));           // header too small
}

TEST_CASE("image length: ELF64 extent is the furthest table or section", "[image]") {
  ElfSpec s;
  s.shoff = 0x400;
  s.sections = {{0, 0, 0}, {kProgbits, 0x40, 0x100}, {kProgbits, 0x140, 0x200}};
  CHECK(module_image_length(elf(s).data()) == 0x400u + 3 * 64);

  // A section after the section table.
  s.sections.push_back({kProgbits, 0x800, 0x10});
  CHECK(module_image_length(elf(s).data()) == 0x810u);

  // NOBITS occupies no file bytes, however large.
  s.sections.push_back({kNobits, 0x900, 0x100000});
  CHECK(module_image_length(elf(s).data()) == 0x810u);

  // Program headers after the section headers (Triton cubins).
  s.phoff = 0x1000;
  s.segments = {{0x40, 0x300}, {0x140, 0x200}};
  CHECK(module_image_length(elf(s).data()) == 0x1000u + 2 * 56);

  // A segment past everything else still belongs to the file.
  s.segments.push_back({0x2000, 0x80});
  CHECK(module_image_length(elf(s).data()) == 0x2080u);
}

TEST_CASE("image length: ELF extended section numbering", "[image]") {
  ElfSpec s;
  s.shoff = 0x200;
  s.extended_numbering = true;
  s.sections = {
      {0, 0, 4}, {kProgbits, 0x40, 0x10}, {kProgbits, 0x50, 0x10}, {kProgbits, 0x60, 0x10}};
  // sections[0].size (4) is the count: the table ends at 0x200 + 4 * 64.
  CHECK(module_image_length(elf(s).data()) == 0x200u + 4 * 64);
}

TEST_CASE("image length: ELFCLASS32", "[image]") {
  ElfSpec s;
  s.wide = false;
  s.shoff = 0x100;
  s.sections = {{0, 0, 0}, {kProgbits, 0x34, 0x20}, {kProgbits, 0x300, 0x44}};
  CHECK(module_image_length(elf(s).data()) == 0x344u);
  s.phoff = 0x400;
  s.segments = {{0x34, 0x20}};
  CHECK(elf_image_length(elf(s).data()) == 0x400u + 32);
}

TEST_CASE("image length: implausible ELF headers are refused", "[image]") {
  ElfSpec s;
  s.shoff = 0x100;
  s.sections = {{0, 0, 0}, {kProgbits, 0x40, std::uint64_t{5} << 30}};
  CHECK_FALSE(module_image_length(elf(s).data()));
  s.sections[1] = {kProgbits, ~std::uint64_t{0} - 4, 0x10};
  CHECK_FALSE(module_image_length(elf(s).data()));

  auto big_endian = elf(ElfSpec{});
  big_endian[5] = std::byte{2};
  CHECK_FALSE(module_image_length(big_endian.data()));
  auto bad_class = elf(ElfSpec{});
  bad_class[4] = std::byte{3};
  CHECK_FALSE(module_image_length(bad_class.data()));

  // Section header entries too small to hold their fields.
  ElfSpec small;
  small.shoff = 0x40;
  small.sections = {{0, 0, 0}};
  auto small_entries = elf(small);
  put<std::uint16_t>(small_entries, 0x3A, 16);
  CHECK_FALSE(module_image_length(small_entries.data()));

  // A bare ELF header is its own extent.
  CHECK(module_image_length(elf(ElfSpec{}).data()) == 64u);
}

TEST_CASE("image length: PTX is strlen + 1", "[image]") {
  const char ptx[] = ".version 9.0\n.target sm_90\n.address_size 64\n";
  CHECK(module_image_length(ptx) == sizeof ptx);
  CHECK(module_image_length("") == 1u);
  CHECK(module_image_length("abc") == 4u);
}

TEST_CASE("image length: a short text at the end of mapped memory", "[image]") {
  // Reading a 4-byte magic from "ab\0" placed before an unmapped page would fault.
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  void* map = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(map != MAP_FAILED);
  auto* base = static_cast<char*>(map);
  REQUIRE(mprotect(base + page, page, PROT_NONE) == 0);
  std::memcpy(base + page - 3, "ab", 3);
  CHECK(module_image_length(base + page - 3) == 3u);
  CHECK(module_image_length(base + page - 1) == 1u);
  munmap(map, 2 * page);
}

TEST_CASE("image length: wrappers and NULL are not module images", "[image]") {
  const auto c = container(64);
  const fatbin::Wrapper w{fatbin::kWrapperMagic, 1, c.data(), nullptr};
  CHECK_FALSE(module_image_length(&w));
  CHECK_FALSE(module_image_length(nullptr));
  CHECK_FALSE(fatbin_container_length(nullptr));
  CHECK_FALSE(elf_image_length(nullptr));
  CHECK_FALSE(elf_image_length(c.data()));
  CHECK_FALSE(fatbin_container_length("not a container"));
}

TEST_CASE("library pieces: plain images and wrappers", "[image]") {
  const auto a = container(64);
  const auto b = container(32);
  const auto d = container(128);
  std::vector<std::span<const std::byte>> pieces;

  SECTION("plain image: one piece") {
    REQUIRE(library_image_pieces(a.data(), pieces));
    REQUIRE(pieces.size() == 1);
    CHECK(pieces[0].data() == a.data());
    CHECK(pieces[0].size() == 80);
    const char ptx[] = ".version 9.0\n";
    REQUIRE(library_image_pieces(ptx, pieces));
    REQUIRE(pieces.size() == 1);
    CHECK(pieces[0].size() == sizeof ptx);
  }
  SECTION("v1: the container at data") {
    const fatbin::Wrapper w{fatbin::kWrapperMagic, 1, a.data(), nullptr};
    REQUIRE(library_image_pieces(&w, pieces));
    REQUIRE(pieces.size() == 1);
    CHECK(pieces[0].data() == a.data());
    CHECK(pieces[0].size() == 80);
  }
  SECTION("v2: data, then each prelinked container") {
    const void* list[] = {b.data(), d.data(), nullptr};
    const fatbin::Wrapper w{fatbin::kWrapperMagic, 2, a.data(), list};
    REQUIRE(library_image_pieces(&w, pieces));
    REQUIRE(pieces.size() == 3);
    CHECK(pieces[0].data() == a.data());
    CHECK(pieces[0].size() == 80);
    CHECK(pieces[1].data() == b.data());
    CHECK(pieces[1].size() == 48);
    CHECK(pieces[2].data() == d.data());
    CHECK(pieces[2].size() == 144);
  }
  SECTION("v2 list capped at 4096 entries") {
    std::vector<const void*> list(mpsshim::shim::kMaxPrelinkedFatbins, b.data());
    list.push_back(nullptr);
    const fatbin::Wrapper w{fatbin::kWrapperMagic, 2, a.data(), list.data()};
    REQUIRE(library_image_pieces(&w, pieces));
    CHECK(pieces.size() == 1 + mpsshim::shim::kMaxPrelinkedFatbins);
    list.back() = b.data();
    list.push_back(nullptr);
    const fatbin::Wrapper too_long{fatbin::kWrapperMagic, 2, a.data(), list.data()};
    CHECK_FALSE(library_image_pieces(&too_long, pieces));
    CHECK(pieces.empty());
  }
  SECTION("refused forms leave no pieces") {
    const void* empty[] = {nullptr};
    const void* bad_entry[] = {"text", nullptr};
    const fatbin::Wrapper refused[] = {
        {fatbin::kWrapperMagic, 2, a.data(), nullptr},    // NULL list
        {fatbin::kWrapperMagic, 2, a.data(), empty},      // empty list
        {fatbin::kWrapperMagic, 2, a.data(), bad_entry},  // not a container
        {fatbin::kWrapperMagic, 1, nullptr, nullptr},     // no data
        {fatbin::kWrapperMagic, 1, "text", nullptr},      // data not a container
        {fatbin::kWrapperMagic, 3, a.data(), nullptr},    // unknown version
    };
    for (const auto& w : refused) {
      pieces.assign(2, {});
      CHECK_FALSE(library_image_pieces(&w, pieces));
      CHECK(pieces.empty());
    }
    CHECK_FALSE(library_image_pieces(nullptr, pieces));
    CHECK_FALSE(library_image_pieces(container(64, 2).data(), pieces));
  }
}
