#include "tests/entry/shim_under_test.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace mpsshim::test {

const ShimUnderTest& ShimUnderTest::get() {
  static const ShimUnderTest shim;
  return shim;
}

ShimUnderTest::ShimUnderTest() {
  const char* path = std::getenv("MPSSHIM_TEST_LIBRARY");
  if (path == nullptr) throw std::runtime_error("MPSSHIM_TEST_LIBRARY is not set");
  path_ = path;

  std::string log_template = "/tmp/mpsshim-entry-test-XXXXXX";
  const int fd = ::mkstemp(log_template.data());
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  ::close(fd);
  log_path_ = log_template;
  ::setenv("MPSSHIM_LOG_FILE", log_path_.c_str(), 1);
  ::setenv("MPSSHIM_LOG_LEVEL", "warn", 1);

  handle_ = ::dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr) throw std::runtime_error(std::string("dlopen: ") + ::dlerror());
}

// The library stays loaded (its code may still run in exit handlers); only the log goes.
ShimUnderTest::~ShimUnderTest() {
  ::unlink(log_path_.c_str());
}

void* ShimUnderTest::symbol(const std::string& name) const {
  return ::dlsym(handle_, name.c_str());
}

std::string ShimUnderTest::read_log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace mpsshim::test
