// libmpsshim.so as an application sees it: dlopen()ed, never linked, so the test exercises the
// exported surface only. MPSSHIM_TEST_LIBRARY names the library.
#pragma once

#include <string>

namespace mpsshim::test {

class ShimUnderTest {
 public:
  // Loaded on first use, after pointing the shim's log at a fresh file at level warn (the log
  // sink is chosen at the first message, so this must precede any call into the shim).
  static const ShimUnderTest& get();

  const std::string& path() const { return path_; }
  const std::string& log_path() const { return log_path_; }
  // dlsym in the library's own scope; nullptr when not exported.
  void* symbol(const std::string& name) const;
  template <typename Function>
  Function function(const std::string& name) const {
    return reinterpret_cast<Function>(symbol(name));
  }
  std::string read_log() const;

 private:
  ShimUnderTest();
  ~ShimUnderTest();
  std::string path_;
  std::string log_path_;
  void* handle_ = nullptr;
};

}  // namespace mpsshim::test
