// module_image_length / library_image_pieces on real images that nvcc built for this test
// (tests/darkapi/meson.build), checked against ground truth taken independently: file sizes,
// and the section contents objcopy extracted from each object on its own.
//
// Without nvcc the images do not exist: the program then exits 77, which meson reports as a
// skip.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "catch2_session.hpp"
#include "libshim/darkapi/fatbin_format.hpp"
#include "libshim/darkapi/image_length.hpp"

using mpsshim::shim::elf_image_length;
using mpsshim::shim::library_image_pieces;
using mpsshim::shim::module_image_length;
namespace fatbin = mpsshim::shim::fatbin;

namespace {

std::string image_dir;

// The whole file, in storage aligned like the sections nvcc emits (new[] gives 16 bytes).
std::vector<std::byte> read_image(const std::string& name) {
  std::ifstream in(image_dir + "/" + name, std::ios::binary);
  INFO(name);
  REQUIRE(in.good());
  std::vector<char> chars{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  REQUIRE(!bytes.empty());
  return bytes;
}

std::uint32_t magic(const std::byte* p) {
  return fatbin::load<std::uint32_t>(p, 0);
}

}  // namespace

TEST_CASE("real cubin: ELF extent is the file size", "[images]") {
  const auto cubin = read_image("saxpy.cubin");
  CHECK(magic(cubin.data()) == fatbin::kElfMagic);
  CHECK(module_image_length(cubin.data()) == cubin.size());
  CHECK(elf_image_length(cubin.data()) == cubin.size());
}

TEST_CASE("real fatbins: container length is the file size", "[images]") {
  for (const char* name : {"saxpy.fatbin", "saxpy_compressed.fatbin"}) {
    INFO(name);
    const auto image = read_image(name);
    CHECK(magic(image.data()) == fatbin::kContainerMagic);
    CHECK(module_image_length(image.data()) == image.size());
  }
  // The compressed one really is: its first entry carries the LZ4 or ZSTD flag (§5.3) and is
  // smaller than the uncompressed one.
  const auto plain = read_image("saxpy.fatbin");
  const auto compressed = read_image("saxpy_compressed.fatbin");
  const auto flags = fatbin::load<std::uint64_t>(compressed.data(), 16 + 40);
  CHECK((flags & (0x1000 | 0x2000 | 0x8000)) != 0);
  CHECK(compressed.size() < plain.size());
}

TEST_CASE("real PTX: strlen + 1", "[images]") {
  auto ptx = read_image("saxpy.ptx");
  const std::size_t file_size = ptx.size();
  ptx.push_back(std::byte{0});  // as a program holds it: a C string
  CHECK(module_image_length(ptx.data()) == file_size + 1);
}

TEST_CASE("real back-to-back containers: the first ends where the second starts", "[images]") {
  // .nv_fatbin of one relocatable object linked from both translation units, and the same
  // section of each unit's own object as ground truth.
  const auto linked = read_image("two_units.nv_fatbin");
  const auto first = read_image("saxpy.nv_fatbin");
  const auto second = read_image("scale.nv_fatbin");
  REQUIRE(linked.size() == first.size() + second.size());
  REQUIRE(std::memcmp(linked.data(), first.data(), first.size()) == 0);

  const auto first_length = module_image_length(linked.data());
  REQUIRE(first_length == first.size());
  const std::byte* next = linked.data() + *first_length;
  CHECK(magic(next) == fatbin::kContainerMagic);
  CHECK(module_image_length(next) == second.size());

  // cuLibraryLoadData with the bare container ships just that one.
  std::vector<std::span<const std::byte>> pieces;
  REQUIRE(library_image_pieces(linked.data(), pieces));
  REQUIRE(pieces.size() == 1);
  CHECK(pieces[0].size() == first.size());
}

TEST_CASE("real containers behind __fatBinC_Wrapper_t", "[images]") {
  const auto container = read_image("saxpy.fatbin");
  const fatbin::Wrapper v1{fatbin::kWrapperMagic, fatbin::kWrapperVersionPlain, container.data(),
                           nullptr};
  CHECK_FALSE(module_image_length(&v1));  // the real cuModuleLoadData says INVALID_IMAGE
  std::vector<std::span<const std::byte>> pieces;
  REQUIRE(library_image_pieces(&v1, pieces));
  REQUIRE(pieces.size() == 1);
  CHECK(pieces[0].data() == container.data());
  CHECK(pieces[0].size() == container.size());
}

TEST_CASE("real -rdc build: a v2 wrapper ships the linked and prelinked containers", "[images]") {
  // nvcc -dlink's container, and each unit's relocatable one (its __nv_relfatbin section),
  // arranged as the wrapper nvcc generates for the linked program points at them.
  const auto linked = read_image("rdc_dlink.nv_fatbin");
  const auto saxpy = read_image("saxpy_rdc.nv_relfatbin");
  const auto scale = read_image("scale_rdc.nv_relfatbin");
  for (const auto* image : {&linked, &saxpy, &scale}) {
    CHECK(module_image_length(image->data()) == image->size());
  }
  const void* prelinked[] = {saxpy.data(), scale.data(), nullptr};
  const fatbin::Wrapper v2{fatbin::kWrapperMagic, fatbin::kWrapperVersionLinked, linked.data(),
                           prelinked};
  CHECK_FALSE(module_image_length(&v2));
  std::vector<std::span<const std::byte>> pieces;
  REQUIRE(library_image_pieces(&v2, pieces));
  REQUIRE(pieces.size() == 3);
  CHECK(pieces[0].data() == linked.data());
  CHECK(pieces[0].size() == linked.size());
  CHECK(pieces[1].data() == saxpy.data());
  CHECK(pieces[1].size() == saxpy.size());
  CHECK(pieces[2].data() == scale.data());
  CHECK(pieces[2].size() == scale.size());
}

int main(int argc, char* argv[]) {
  const char* dir = std::getenv("DARKAPI_IMAGE_DIR");
  if (dir == nullptr || *dir == '\0') {
    std::fputs(
        "darkapi images: nvcc was not found at configure time (-Dnvcc=...); "
        "no real images to test, skipping\n",
        stderr);
    return 77;  // meson: skipped
  }
  image_dir = dir;
  return mpsshim::test::run_catch2_session(argc, argv);
}
