// The dynamic symbol table of libmpsshim.so is exactly the generated entry-point list, and the
// library passes for the driver by its SONAME.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "tests/entry/elf_dynamic.hpp"
#include "tests/entry/procaddr_tsv.hpp"
#include "tests/entry/shim_under_test.hpp"

namespace {

using mpsshim::test::ShimUnderTest;

const std::set<std::string> kEntryPoints = {
#define MPSSHIM_ENTRY_POINT(name) #name,
#include "libshim/entry/entry_points.inc"
#undef MPSSHIM_ENTRY_POINT
};

}  // namespace

TEST_CASE("the SONAME is libcuda.so.1", "[exports]") {
  REQUIRE(mpsshim::test::read_elf_dynamic(ShimUnderTest::get().path()).soname == "libcuda.so.1");
}

TEST_CASE("every listed entry point is exported", "[exports]") {
  for (const std::string& name : kEntryPoints) {
    CAPTURE(name);
    REQUIRE(ShimUnderTest::get().symbol(name) != nullptr);
  }
}

TEST_CASE("nothing but the listed entry points is exported", "[exports]") {
  const auto elf = mpsshim::test::read_elf_dynamic(ShimUnderTest::get().path());

  REQUIRE(elf.defined_symbols == kEntryPoints);
  REQUIRE(elf.defined_non_functions.empty());
}

TEST_CASE("every variant cuGetProcAddress can return is listed", "[exports]") {
  for (const auto& [key, breakpoints] : mpsshim::test::procaddr_tsv().breakpoints) {
    for (const auto& breakpoint : breakpoints) {
      CAPTURE(breakpoint.symbol);
      REQUIRE(kEntryPoints.contains(breakpoint.symbol));
    }
  }
}
