// The driver version the shim advertises (cuDriverGetVersion, the cuGetProcAddress cap) and its
// one input. advertised_driver_version() is also part of client_view.hpp; this narrower header
// lets entry/ use it without the device snapshot and the wire headers.
#pragma once

namespace mpsshim::shim {

// The server's driver version once connected, capped at the version the cuGetProcAddress table
// was generated from (whose entry points are all the shim knows); that version until then.
// Lock-free and callable before cuInit and before any constructor of the shim has run.
int advertised_driver_version() noexcept;

// Records the real driver version of the server this process is connected to; the core calls
// it when the server's hello arrives. Values <= 0 are ignored.
void set_server_driver_version(int version) noexcept;

}  // namespace mpsshim::shim
