#include "libshim/answer_trace.hpp"

#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace mpsshim::shim {
namespace {

struct Line {
  std::uint16_t op;
  bool early;
  std::uint64_t values[8];
  std::uint64_t slept;
};

struct State {
  std::string path;
  std::mutex mutex;
  std::vector<Line> lines;
  bool written = false;
};

State* state() {
  static State* s = []() -> State* {
    const char* path = std::getenv("MPSSHIM_TRACE_ANSWERS");
    if (path == nullptr || *path == '\0') return nullptr;
    auto* made = new State;  // never freed: the atexit handler writes it last
    made->path = path;
    // All of it now: a vector doubling as it fills copies everything it holds while the
    // client waits, which showed up as round trips slower by 0.1-3 ms at doubling intervals.
    made->lines.reserve(AnswerTrace::kMaxLines);
    std::atexit([] { AnswerTrace::get()->write(); });
    return made;
  }();
  return s;
}

}  // namespace

AnswerTrace* AnswerTrace::get() {
  // The class has no state of its own: the object is a handle to the process's State.
  static AnswerTrace trace;
  return state() != nullptr ? &trace : nullptr;
}

std::uint64_t AnswerTrace::now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

void AnswerTrace::add(proto::Op op, std::uint64_t launch_sent, std::uint64_t sent,
                      const proto::ResponseSlot* slot, std::uint64_t seen, std::uint64_t slept) {
  State& s = *state();
  // An early answer has no stamps yet: the server writes them with its late answer.
  const proto::ResponseSlot none{};
  const proto::ResponseSlot& stamps = slot != nullptr ? *slot : none;
  Line line{static_cast<std::uint16_t>(op),
            slot == nullptr,
            {launch_sent, stamps.stamp_launch_taken_ns, stamps.stamp_launch_issued_ns, sent,
             stamps.stamp_taken_ns, stamps.stamp_known_ns, stamps.stamp_answered_ns, seen},
            slept};
  std::lock_guard lock(s.mutex);
  if (s.lines.size() < kMaxLines) s.lines.push_back(line);
}

void AnswerTrace::write() {
  State& s = *state();
  std::lock_guard lock(s.mutex);
  if (s.written) return;
  s.written = true;
  // "%p" in the name becomes the writing process's pid: a forked child, which inherits the
  // trace, writes a file of its own instead of over its parent's.
  std::string path = s.path;
  if (auto at = path.find("%p"); at != std::string::npos) {
    path.replace(at, 2, std::to_string(::getpid()));
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return;
  std::fprintf(f,
               "op,launch_sent,launch_taken,launch_issued,sent,taken,known,answered,seen,early,"
               "slept\n");
  for (const Line& l : s.lines) {
    std::fprintf(f, "%u", static_cast<unsigned>(l.op));  // proto/ops.hpp's numbers
    for (std::uint64_t v : l.values) std::fprintf(f, ",%llu", static_cast<unsigned long long>(v));
    std::fprintf(f, ",%d,%llu\n", l.early ? 1 : 0, static_cast<unsigned long long>(l.slept));
  }
  std::fclose(f);
}

}  // namespace mpsshim::shim
