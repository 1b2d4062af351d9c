#include "examples/common/check.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace mpsshim::examples {
namespace {
const char* g_program_name = "program";

// "cuMemAlloc(&ptr, bytes)" -> "cuMemAlloc": the stdout field must hold no spaces.
std::string callee(std::string_view call) {
  const auto end = call.find_first_of("( ");
  return std::string(call.substr(0, end));
}

// "../examples/common/device.cpp" -> "device.cpp"
const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash != nullptr ? slash + 1 : path;
}
}  // namespace

void set_program_name(const char* name) {
  g_program_name = name;
}
const char* program_name() {
  return g_program_name;
}

std::string error_name(CUresult result) {
  const char* name = nullptr;
  if (cuGetErrorName(result, &name) != CUDA_SUCCESS || name == nullptr) name = "CUresult";
  return std::string(name) + "(" + std::to_string(static_cast<int>(result)) + ")";
}

void fail_call(const char* call, CUresult result, const char* file, int line) {
  const char* description = nullptr;
  if (cuGetErrorString(result, &description) != CUDA_SUCCESS || description == nullptr) {
    description = "no description";
  }
  const std::string name = error_name(result);
  std::fprintf(stderr, "%s: %s failed: %s \"%s\" at %s:%d\n", g_program_name, call, name.c_str(),
               description, file, line);
  std::printf("%s: failed_call=%s error=%s at=%s:%d FAIL\n", g_program_name, callee(call).c_str(),
              name.c_str(), base_name(file), line);
  std::fflush(stderr);
  std::fflush(stdout);
  std::exit(EXIT_FAILURE);
}

void fail_reason(const char* reason, const char* file, int line) {
  std::fprintf(stderr, "%s: %s at %s:%d\n", g_program_name, reason, file, line);
  std::printf("%s: failed=%s at=%s:%d FAIL\n", g_program_name, reason, base_name(file), line);
  std::fflush(stderr);
  std::fflush(stdout);
  std::exit(EXIT_FAILURE);
}

}  // namespace mpsshim::examples
