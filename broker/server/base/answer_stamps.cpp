#include "broker/server/base/answer_stamps.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace mpsshim::server {
namespace {

std::atomic<int>& state() {
  static std::atomic<int> on = [] {
    const char* value = std::getenv("MPSSHIM_SERVER_STAMP_ANSWERS");
    return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0 ? 1 : 0;
  }();
  return on;
}

}  // namespace

bool answer_stamps_on() {
  return state().load(std::memory_order_relaxed) != 0;
}

void set_answer_stamps_for_testing(bool on) {
  state().store(on ? 1 : 0, std::memory_order_relaxed);
}

}  // namespace mpsshim::server
