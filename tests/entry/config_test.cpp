// libshim/config.cpp: the sizes of CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, the kernel lookup switches.
#include <cstdlib>
#include <optional>
#include <string>

#include <catch2/catch.hpp>

#include "libshim/client.hpp"

namespace mpsshim::shim {

TEST_CASE("parse_memory_size reads sizes with binary units", "[config]") {
  CHECK(parse_memory_size("1024") == 1024u);
  CHECK(parse_memory_size(" 4G ") == 4ull << 30);
  CHECK(parse_memory_size("512MiB") == 512ull << 20);
  CHECK(parse_memory_size("1.5k") == 1536u);
  CHECK(parse_memory_size("16777215T") == 16777215ull << 40);
  CHECK(parse_memory_size("") == 0u);
  CHECK(parse_memory_size("-1G") == 0u);
  CHECK(parse_memory_size("4X") == 0u);
}

// Found by tests/fuzz/fuzz_limits: a size past 2^64 bytes was converted to an integer, which
// is undefined (UBSan: "6.06607e+20 is outside the range of representable values").
TEST_CASE("parse_memory_size refuses sizes that do not fit in 64 bits", "[config]") {
  CHECK(parse_memory_size("606606906606969699999") == 0u);
  CHECK(parse_memory_size("16777216T") == 0u);  // 2^64
  CHECK(parse_memory_size("1e300G") == 0u);
  CHECK(parse_memory_size("inf") == 0u);
  CHECK(parse_memory_size("nan") == 0u);
}

}  // namespace mpsshim::shim

namespace {

// Sets (or with nullptr unsets) one variable for the scope.
class ScopedVariable {
 public:
  ScopedVariable(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedVariable() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

bool lazy_kernels(const char* lookup, const char* module_loading) {
  ScopedVariable a("MPSSHIM_KERNEL_LOOKUP", lookup);
  ScopedVariable b("CUDA_MODULE_LOADING", module_loading);
  return mpsshim::shim::read_client_config().lazy_kernels;
}

bool lazy_loading(const char* lookup, const char* module_loading) {
  ScopedVariable a("MPSSHIM_KERNEL_LOOKUP", lookup);
  ScopedVariable b("CUDA_MODULE_LOADING", module_loading);
  return mpsshim::shim::read_client_config().lazy_loading;
}

}  // namespace

TEST_CASE("modules load lazily, as the real driver's, unless CUDA_MODULE_LOADING=EAGER",
          "[config]") {
  CHECK(lazy_loading(nullptr, nullptr));
  CHECK(lazy_loading(nullptr, "LAZY"));
  CHECK_FALSE(lazy_loading(nullptr, "EAGER"));
  CHECK(lazy_loading("eager", nullptr));       // the shim's lookups alone
  CHECK_FALSE(lazy_loading("lazy", "EAGER"));  // the runtime is still told eager
}

TEST_CASE("kernel lookups are lazy unless MPSSHIM_KERNEL_LOOKUP or CUDA_MODULE_LOADING says eager",
          "[config]") {
  CHECK(lazy_kernels(nullptr, nullptr));
  CHECK(lazy_kernels(nullptr, "LAZY"));
  CHECK_FALSE(lazy_kernels("eager", nullptr));
  CHECK_FALSE(lazy_kernels(nullptr, "EAGER"));
  CHECK(lazy_kernels("lazy", "EAGER"));       // the shim's own switch wins
  CHECK(lazy_kernels("sometimes", nullptr));  // ignored, with a warning
}
