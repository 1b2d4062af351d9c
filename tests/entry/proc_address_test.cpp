// cuGetProcAddress(_v2) of libmpsshim.so against the table probed on the real driver and the
// semantics in docs/private-tables.md, "What the real driver answers". No cuInit is called:
// lookups must work before it.
#include <cuda.h>

#include <catch2/catch.hpp>

#include "tests/entry/procaddr_tsv.hpp"
#include "tests/entry/shim_under_test.hpp"

namespace {

using mpsshim::test::procaddr_tsv;
using mpsshim::test::ShimUnderTest;

using GetProcAddressV2 = CUresult (*)(const char*, void**, int, cuuint64_t,
                                      CUdriverProcAddressQueryResult*);
using GetProcAddressV1 = CUresult (*)(const char*, void**, int, cuuint64_t);

// With no server, the shim advertises the driver the table was probed on (580.159.04).
constexpr int kAdvertisedVersion = 13000;
constexpr cuuint64_t kPerThreadFlags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
constexpr cuuint64_t kBothStreamFlags =
    CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
constexpr cuuint64_t kFirstInvalidFlags = 4;
// Written into outputs before a call, to see whether the call touched them.
void* const kUntouchedPointer = reinterpret_cast<void*>(0x5);
constexpr auto kUntouchedStatus = static_cast<CUdriverProcAddressQueryResult>(77);

struct Answer {
  CUresult result;
  void* function;
  CUdriverProcAddressQueryResult status;
};

Answer ask_v2(const char* name, int version, cuuint64_t flags) {
  const auto sut = ShimUnderTest::get().function<GetProcAddressV2>("cuGetProcAddress_v2");
  Answer answer{CUDA_ERROR_UNKNOWN, kUntouchedPointer, kUntouchedStatus};
  answer.result = sut(name, &answer.function, version, flags, &answer.status);
  return answer;
}

Answer ask_v1(const char* name, int version, cuuint64_t flags) {
  const auto sut = ShimUnderTest::get().function<GetProcAddressV1>("cuGetProcAddress");
  Answer answer{CUDA_ERROR_UNKNOWN, kUntouchedPointer, kUntouchedStatus};
  answer.result = sut(name, &answer.function, version, flags);
  return answer;
}

void require_found(const Answer& answer, const std::string& symbol) {
  REQUIRE(answer.result == CUDA_SUCCESS);
  REQUIRE(answer.status == CU_GET_PROC_ADDRESS_SUCCESS);
  REQUIRE(answer.function != nullptr);
  REQUIRE(answer.function == ShimUnderTest::get().symbol(symbol));
}

}  // namespace

TEST_CASE("every breakpoint of the probed table gives its exported variant", "[proc_address]") {
  for (const auto& [key, breakpoints] : procaddr_tsv().breakpoints) {
    const auto& [name, flags] = key;
    for (std::size_t i = 0; i < breakpoints.size(); ++i) {
      const auto& breakpoint = breakpoints[i];
      const int last_version =
          i + 1 < breakpoints.size() ? breakpoints[i + 1].min_version - 1 : kAdvertisedVersion;
      CAPTURE(name, flags, breakpoint.min_version, last_version, breakpoint.symbol);

      require_found(ask_v2(name.c_str(), breakpoint.min_version, flags), breakpoint.symbol);
      require_found(ask_v2(name.c_str(), last_version, flags), breakpoint.symbol);

      const Answer v1 = ask_v1(name.c_str(), breakpoint.min_version, flags);
      REQUIRE(v1.result == CUDA_SUCCESS);
      REQUIRE(v1.function == ShimUnderTest::get().symbol(breakpoint.symbol));
    }
  }
}

TEST_CASE("a version below a name's first breakpoint is not sufficient", "[proc_address]") {
  for (const auto& [key, breakpoints] : procaddr_tsv().breakpoints) {
    const auto& [name, flags] = key;
    const int too_old = breakpoints.front().min_version - 1;
    CAPTURE(name, flags, too_old);

    const Answer v2 = ask_v2(name.c_str(), too_old, flags);
    REQUIRE(v2.result == CUDA_SUCCESS);
    REQUIRE(v2.function == nullptr);
    REQUIRE(v2.status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);

    // The v1 entry has no status: a miss is NOT_FOUND and *pfn stays as it was.
    const Answer v1 = ask_v1(name.c_str(), too_old, flags);
    REQUIRE(v1.result == CUDA_ERROR_NOT_FOUND);
    REQUIRE(v1.function == kUntouchedPointer);
  }
}

TEST_CASE("flags 3 answers as the per-thread flag does", "[proc_address]") {
  for (const auto& [key, breakpoints] : procaddr_tsv().breakpoints) {
    const auto& [name, flags] = key;
    if (flags != static_cast<int>(kPerThreadFlags)) continue;
    for (const auto& breakpoint : breakpoints) {
      CAPTURE(name, breakpoint.min_version);
      require_found(ask_v2(name.c_str(), breakpoint.min_version, kBothStreamFlags),
                    breakpoint.symbol);
    }
  }
}

TEST_CASE("names the driver does not resolve are not found", "[proc_address]") {
  // Exported variants are not base names; internal exports are not looked up either.
  for (const char* unknown : {"cuNoSuchFunction", "cuMemAlloc_v2", "cuMemcpyAsync_ptsz",
                              "cuMemcpyHtoD_v2_ptds", "cudbgApiInit", ""}) {
    CAPTURE(unknown);

    const Answer v2 = ask_v2(unknown, kAdvertisedVersion, CU_GET_PROC_ADDRESS_DEFAULT);
    REQUIRE(v2.result == CUDA_SUCCESS);
    REQUIRE(v2.function == nullptr);
    REQUIRE(v2.status == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);

    const Answer v1 = ask_v1(unknown, kAdvertisedVersion, CU_GET_PROC_ADDRESS_DEFAULT);
    REQUIRE(v1.result == CUDA_ERROR_NOT_FOUND);
    REQUIRE(v1.function == kUntouchedPointer);
  }
}

TEST_CASE("a NULL symbolStatus is allowed", "[proc_address]") {
  const auto sut = ShimUnderTest::get().function<GetProcAddressV2>("cuGetProcAddress_v2");
  constexpr int kTooOld = 1000;
  struct Case {
    const char* name;
    int version;
    void* expected;
  };
  for (const Case& c :
       {Case{"cuInit", kAdvertisedVersion, ShimUnderTest::get().symbol("cuInit")},
        Case{"cuInit", kTooOld, nullptr}, Case{"cuNoSuchFunction", kAdvertisedVersion, nullptr}}) {
    CAPTURE(c.name, c.version);
    void* function = kUntouchedPointer;

    REQUIRE(sut(c.name, &function, c.version, CU_GET_PROC_ADDRESS_DEFAULT, nullptr) ==
            CUDA_SUCCESS);
    REQUIRE(function == c.expected);
  }
}

TEST_CASE("invalid requests are refused and leave the outputs alone", "[proc_address]") {
  struct Invalid {
    const char* what;
    const char* name;
    int version;
    cuuint64_t flags;
  };
  for (const Invalid& invalid :
       {Invalid{"version newer than advertised", "cuInit", kAdvertisedVersion + 10, 0},
        Invalid{"version far newer", "cuInit", 99999, 0},
        Invalid{"unknown name, newer version", "cuNoSuchFunction", kAdvertisedVersion + 10, 0},
        Invalid{"flags 4", "cuInit", kAdvertisedVersion, kFirstInvalidFlags},
        Invalid{"flags with a high bit", "cuInit", kAdvertisedVersion, cuuint64_t{1} << 63},
        Invalid{"NULL symbol", nullptr, kAdvertisedVersion, 0}}) {
    CAPTURE(invalid.what);

    const Answer v2 = ask_v2(invalid.name, invalid.version, invalid.flags);
    REQUIRE(v2.result == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(v2.function == kUntouchedPointer);
    REQUIRE(v2.status == kUntouchedStatus);

    const Answer v1 = ask_v1(invalid.name, invalid.version, invalid.flags);
    REQUIRE(v1.result == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(v1.function == kUntouchedPointer);
  }
}

TEST_CASE("a NULL pfn is refused", "[proc_address]") {
  const auto& shim = ShimUnderTest::get();
  auto status = kUntouchedStatus;

  REQUIRE(shim.function<GetProcAddressV2>("cuGetProcAddress_v2")(
              "cuInit", nullptr, kAdvertisedVersion, 0, &status) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(status == kUntouchedStatus);
  REQUIRE(shim.function<GetProcAddressV1>("cuGetProcAddress")("cuInit", nullptr, kAdvertisedVersion,
                                                              0) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("cuGetProcAddress resolves to the entry of the caller's version", "[proc_address]") {
  constexpr int kV1Introduced = 11030;
  constexpr int kV2Introduced = 12000;

  require_found(ask_v2("cuGetProcAddress", kV1Introduced, 0), "cuGetProcAddress");
  require_found(ask_v2("cuGetProcAddress", kV2Introduced - 10, 0), "cuGetProcAddress");
  require_found(ask_v2("cuGetProcAddress", kV2Introduced, 0), "cuGetProcAddress_v2");
}
