// The page-by-page advice of managed memory (libshim/managed_advice.hpp): what the range
// attributes read after advice on overlapping page ranges, and that equal neighbours merge.
#include "libshim/managed_advice.hpp"

#include <catch2/catch.hpp>

using mpsshim::shim::AdviceSpans;
using mpsshim::shim::kHostBit;
using mpsshim::shim::Location;
using mpsshim::shim::PageAdvice;

namespace {
const Location kGpu0{CU_MEM_LOCATION_TYPE_DEVICE, 0};
const Location kGpu1{CU_MEM_LOCATION_TYPE_DEVICE, 1};
const Location kHost{CU_MEM_LOCATION_TYPE_HOST, 0};
}  // namespace

TEST_CASE("advice on part of an allocation splits its run and reads back per range",
          "[entry][managed]") {
  AdviceSpans spans(8);
  CHECK(spans.runs() == 1);
  spans.update(2, 4, [](PageAdvice& a) { a.preferred = kGpu0; });
  CHECK(spans.runs() == 3);
  CHECK(spans.combined(2, 4).preferred == kGpu0);
  CHECK(spans.combined(3, 3).preferred == kGpu0);
  CHECK(spans.combined(0, 7).preferred == Location{});  // mixed: not set
  CHECK(spans.combined(0, 1).preferred == Location{});
  spans.update(4, 6, [](PageAdvice& a) { a.preferred = kHost; });
  CHECK(spans.combined(2, 3).preferred == kGpu0);
  CHECK(spans.combined(4, 6).preferred == kHost);
  CHECK(spans.combined(3, 4).preferred == Location{});
}

TEST_CASE("runs that become equal again merge", "[entry][managed]") {
  AdviceSpans spans(16);
  spans.update(3, 5, [](PageAdvice& a) { a.read_mostly = true; });
  spans.update(9, 12, [](PageAdvice& a) { a.read_mostly = true; });
  CHECK(spans.runs() == 5);
  spans.update(6, 8, [](PageAdvice& a) { a.read_mostly = true; });
  CHECK(spans.runs() == 3);  // 0-2, 3-12, 13-15
  CHECK(spans.combined(3, 12).read_mostly);
  CHECK_FALSE(spans.combined(2, 12).read_mostly);
  spans.update(0, 15, [](PageAdvice& a) { a.read_mostly = false; });
  CHECK(spans.runs() == 1);
  // The last page alone, then the first alone.
  spans.update(15, 15, [](PageAdvice& a) { a.last_prefetch = kGpu1; });
  spans.update(0, 0, [](PageAdvice& a) { a.last_prefetch = kGpu1; });
  CHECK(spans.runs() == 3);
  CHECK(spans.combined(15, 15).last_prefetch == kGpu1);
  CHECK(spans.combined(0, 0).last_prefetch == kGpu1);
  CHECK(spans.combined(0, 15).last_prefetch == Location{});
}

TEST_CASE("accessed-by is what every page of the range has", "[entry][managed]") {
  AdviceSpans spans(4);
  spans.update(0, 3, [](PageAdvice& a) { a.accessed_by |= 1; });
  spans.update(1, 2, [](PageAdvice& a) { a.accessed_by |= kHostBit | 2; });
  CHECK(spans.combined(0, 3).accessed_by == 1);
  CHECK(spans.combined(1, 2).accessed_by == (kHostBit | 3));
  CHECK(spans.combined(2, 3).accessed_by == 1);
  // Pages past the allocation change nothing.
  spans.update(2, 9, [](PageAdvice& a) { a.read_mostly = true; });
  CHECK_FALSE(spans.combined(3, 3).read_mostly);
}
