// Error handling shared by the example and benchmark programs.
//
// Every program prints exactly one result line on stdout, "<program>: key=value ... PASS|FAIL",
// and exits 0 only on PASS. A failed CUDA call therefore still ends in a FAIL line (naming the
// call and the error) so that a harness reading stdout never sees a program end silently.
#pragma once

#include <cuda.h>

#include <string>

namespace mpsshim::examples {

// The name the FAIL line of a failed check starts with; Report sets it.
void set_program_name(const char* name);
const char* program_name();

// "CUDA_ERROR_ILLEGAL_ADDRESS(700)"; "CUresult(N)" when the driver cannot name it.
std::string error_name(CUresult result);

// Prints the failed call, its error and line (stderr), the FAIL line (stdout), and exits 1.
[[noreturn]] void fail_call(const char* call, CUresult result, const char* file, int line);

// For failures that are not a CUDA error (host allocation, bad input): same reporting.
// `reason` is one word (no spaces): it becomes the failed= field.
[[noreturn]] void fail_reason(const char* reason, const char* file, int line);

}  // namespace mpsshim::examples

#define CU_CHECK(call)                                                             \
  do {                                                                             \
    const CUresult cu_check_result_ = (call);                                      \
    if (cu_check_result_ != CUDA_SUCCESS) {                                        \
      ::mpsshim::examples::fail_call(#call, cu_check_result_, __FILE__, __LINE__); \
    }                                                                              \
  } while (0)
