// What the rest of the shim needs to know of stream capture (graph.cpp).
#pragma once

#include <cuda.h>

#include "libshim/client.hpp"

namespace mpsshim::shim {

// True while this process has a capture open (begun, not yet ended).
bool process_has_open_capture() noexcept;

// A pageable copy goes through staging chunks, whose addresses a graph must never hold: on a
// capturing stream it is refused with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the capture is
// invalidated, as the real driver does. CUDA_SUCCESS otherwise (at once while no capture is open).
CUresult refuse_staged_copy_in_capture(Context* ctx, Stream* stream) noexcept;

// A stream destroyed while it captured (the real driver invalidates such a capture): its record
// goes, so that the stream object's next owner (object_pool.hpp) is not taken for a capturer.
void forget_capture_origin(const Stream* stream) noexcept;

}  // namespace mpsshim::shim
