// MPSSHIM_TRACE_ANSWERS=FILE: every call that waits for an answer is written to FILE ("%p": the
// pid) when the process exits, one CSV line each, with the server's stamps from the reply slot (0
// unless the server runs with MPSSHIM_SERVER_STAMP_ANSWERS=1: broker/server/base/answer_stamps.hpp)
// between the client's own times, all CLOCK_MONOTONIC ns:
//
//   op,launch_sent,launch_taken,launch_issued,sent,taken,known,answered,seen,early,slept
//
// op: the request's opcode (proto::Op's number); launch_sent: when this process last committed a
// kernel launch; sent: when the call's record was committed; seen: when the calling thread saw
// the answer; early: 1 when it returned on an early answer, its fence's landing
// (proto::ResponseSlot::watch), before the server's answer, whose stamps are then 0; slept: the
// ns the thread asked to sleep before it looked for the answer (a paced wait, wait_pacer.hpp).
// tools/probes/answer_trace.py
// splits the round trips into their hops. A diagnostic, off by default: when on, a clock read per
// committed record and a locked append per answer (at most kMaxLines kept).
#pragma once

#include <cstddef>
#include <cstdint>

#include "proto/ops.hpp"
#include "proto/segment.hpp"

namespace mpsshim::shim {

class AnswerTrace {
 public:
  static constexpr std::size_t kMaxLines = 1 << 20;

  // The trace, or nullptr when MPSSHIM_TRACE_ANSWERS is unset or empty (read once).
  static AnswerTrace* get();

  // One answered call: its opcode, the client's times and the slot's stamps (nullptr: an early
  // answer, no stamps), and the paced sleep it began with.
  void add(proto::Op op, std::uint64_t launch_sent, std::uint64_t sent,
           const proto::ResponseSlot* slot, std::uint64_t seen, std::uint64_t slept);

  static std::uint64_t now_ns();

  // Writes the lines to the file (at exit; registered by get()).
  void write();
};

}  // namespace mpsshim::shim
