// Kernel arguments as the driver API takes them (kernelParams: one pointer per parameter, or
// extra: a CU_LAUNCH_PARAM_BUFFER_POINTER block), packed into the parameter block the server
// hands the driver: each parameter at its offset in the function's cached layout. Launches and
// kernel graph nodes share this.
#pragma once

#include <cstddef>

#include "libshim/api.hpp"
#include "libshim/client.hpp"

namespace mpsshim::shim {

// Where the arguments are: `buffer` (extra's block, `bytes` long) or, with buffer == nullptr,
// `params` to be packed into f->args_bytes. INVALID_VALUE for a malformed extra list, both forms
// at once, or missing kernelParams; the caller checks `bytes` against proto::kMaxArgsBytes.
CUresult argument_bytes(const Function* f, void** params, void** extra, const void*& buffer,
                        std::size_t& bytes);

// Writes the `bytes` of the parameter block to `out`: the extra block verbatim, or every
// parameter at its offset with the padding between them zeroed (the block is copied verbatim
// to the GPU).
void pack_arguments(const Function* f, void** params, const void* buffer, std::size_t bytes,
                    std::byte* out);

}  // namespace mpsshim::shim
