// Loading the driver the server runs on, and what its error codes mean to the server.
#pragma once

#include <cuda.h>

#include <string>
#include <tl/expected.hpp>

#include "broker/server/driver/driver_table.hpp"

namespace mpsshim::server {

// Why the server could not start: the CUresult the daemon is told, and a sentence for the log.
struct StartError {
  CUresult status;
  std::string message;
};

// dlopen(path, RTLD_NOW | RTLD_LOCAL) and resolve every function of MPSSHIM_DRIVER_FUNCTIONS.
// The library stays loaded for the life of the process.
tl::expected<DriverTable, StartError> load_driver(const std::string& path);

// "CUDA_ERROR_OUT_OF_MEMORY (2)", from the driver's own names where it knows them.
std::string describe(const DriverTable& cu, CUresult result);

// Errors after which the driver is unusable in this process (measured: a fault in one green
// context fails later work in every other one). CONTEXT_IS_DESTROYED counts only when it comes
// back from completed work: as the answer to a call it can mean the caller's own mistake.
bool is_sticky(CUresult result, bool from_completion);

}  // namespace mpsshim::server
