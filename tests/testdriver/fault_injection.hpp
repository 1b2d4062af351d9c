// Fault injection: calls that the real driver can fail for lack of memory or resources fail here
// on purpose, so that the server's and the shim's failure paths run in the CPU tests.
//
//   MPSSHIM_TESTDRIVER_INJECT="p=0.1,seed=7,calls=cuMemCreate+cuMemMap,armed_by=/path"
//
// p: the chance each injectable call fails (0..1); seed: the random sequence (per process);
// calls: which entry points may fail ('+'-separated; all of them when absent); armed_by: a
// file whose existence arms the injection (checked at each call), so that a test can set up its
// bystanders first. Without the variable nothing is injected. A failed call has no effect and
// answers what the real driver answers then: CUDA_ERROR_OUT_OF_MEMORY. The injected count
// shows on the query socket (query_socket.hpp: injected=N).
#pragma once

#include <cstdint>

namespace mpsshim::testdriver {

// Whether the call named `call` (its exported name) fails now.
bool inject_failure(const char* call) noexcept;

// How many calls failed by injection so far in this process.
std::uint64_t injected_failures() noexcept;

}  // namespace mpsshim::testdriver
