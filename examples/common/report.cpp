#include "examples/common/report.hpp"

#include <cstdio>
#include <cstdlib>

#include "examples/common/check.hpp"

namespace mpsshim::examples {

Report::Report(const char* program) : program_(program) {
  set_program_name(program);
}

void Report::add(std::string_view key, std::string_view value) {
  fields_ += ' ';
  fields_ += key;
  fields_ += '=';
  fields_ += value;
}

void Report::add_fixed(std::string_view key, double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  add(key, std::string_view(text));
}

void Report::add_real(std::string_view key, double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.6g", value);
  add(key, std::string_view(text));
}

void Report::expect(bool ok, std::string_view tag) {
  if (ok) return;
  std::fprintf(stderr, "%s: check failed: %.*s\n", program_.c_str(), static_cast<int>(tag.size()),
               tag.data());
  if (first_failure_.empty()) first_failure_ = tag;
}

int Report::finish() {
  const bool pass = passed();
  if (!pass) add("failed", std::string_view(first_failure_));
  std::printf("%s:%s %s\n", program_.c_str(), fields_.c_str(), pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  return pass ? EXIT_SUCCESS : EXIT_FAILURE;
}

}  // namespace mpsshim::examples
