// Diagnostic time stamps in each answer: with MPSSHIM_SERVER_STAMP_ANSWERS=1 in the server's
// environment (mpsshimd passes its own on), the worker writes into every reply slot it answers
// (proto::ResponseSlot's stamp_* fields, CLOCK_MONOTONIC ns) when it took the request from the
// ring, when it knew the answer (for a synchronize: when it saw the fence word or event
// complete), when it wrote the slot, and when it took and issued the session's last kernel
// launch before it. A client with MPSSHIM_TRACE_ANSWERS=FILE (libshim/answer_trace.hpp) writes
// them beside its own send and receive times, so a round trip splits into its hops:
// tools/probes/answer_trace.py.
//
// Why: the round trip stays ~1 µs over native, and a latency client beside batch clients loses
// ~1.2 µs between its kernel's end and its answer (docs/benchmarks.md, "Priorities"); the GPU's
// stamps and the client's alone cannot say which hop grows. Off by default: one or two clock reads
// per answer and one per launch when on, one branch when off.
#pragma once

#include <cstdint>

namespace mpsshim::server {

// Whether MPSSHIM_SERVER_STAMP_ANSWERS is set to a value other than 0 (read once).
bool answer_stamps_on();

// Tests: stamps on or off from now on, whatever the environment said.
void set_answer_stamps_for_testing(bool on);

}  // namespace mpsshim::server
