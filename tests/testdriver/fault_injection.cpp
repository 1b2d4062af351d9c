#include "tests/testdriver/fault_injection.hpp"

#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>

namespace mpsshim::testdriver {
namespace {

struct Injection {
  bool enabled = false;
  double probability = 0;
  std::set<std::string> calls;  // empty: every injectable call
  std::string armed_by;
  std::mutex mutex;
  std::mt19937_64 random;
  std::atomic<std::uint64_t> injected{0};
};

Injection& injection() {
  static Injection* it = [] {
    auto* in = new Injection();  // never destroyed: stream threads may call at exit
    const char* spec = std::getenv("MPSSHIM_TESTDRIVER_INJECT");
    if (spec == nullptr || *spec == '\0') return in;
    std::uint64_t seed = 1;
    std::stringstream fields(spec);
    for (std::string field; std::getline(fields, field, ',');) {
      const auto eq = field.find('=');
      if (eq == std::string::npos) continue;
      const std::string key = field.substr(0, eq), value = field.substr(eq + 1);
      if (key == "p") in->probability = std::strtod(value.c_str(), nullptr);
      if (key == "seed") seed = std::strtoull(value.c_str(), nullptr, 0);
      if (key == "armed_by") in->armed_by = value;
      if (key == "calls") {
        std::stringstream names(value);
        for (std::string name; std::getline(names, name, '+');) in->calls.insert(name);
      }
    }
    in->random.seed(seed);
    in->enabled = in->probability > 0;
    return in;
  }();
  return *it;
}

}  // namespace

bool inject_failure(const char* call) noexcept {
  Injection& in = injection();
  if (!in.enabled) return false;
  if (!in.calls.empty() && in.calls.count(call) == 0) return false;
  struct stat st {};
  if (!in.armed_by.empty() && ::stat(in.armed_by.c_str(), &st) != 0) return false;
  std::lock_guard lock(in.mutex);
  if (std::uniform_real_distribution<double>(0.0, 1.0)(in.random) >= in.probability) return false;
  in.injected.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::uint64_t injected_failures() noexcept {
  return injection().injected.load(std::memory_order_relaxed);
}

}  // namespace mpsshim::testdriver
