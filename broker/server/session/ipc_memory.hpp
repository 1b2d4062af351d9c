// Interprocess memory as its exporter and its importers let go of it (docs/ipc.md, *Lifetime*):
// an allocation another client has open is not freed when its exporter frees it or ends, but
// by the last client that closes it. Called by the worker of the session named.
#pragma once

#include <cstdint>

#include "broker/server/session/session.hpp"

namespace mpsshim::server {

// The exporter lets go of its allocation at `base` (cuMemFree, cuCtxDestroy): if it exported
// it, no later open finds it. True if another client still has it open: the caller must not
// free it (the last closer will) and keeps it charged to the exporter until then.
bool ipc_hand_over(Session& session, std::uint64_t base);

// The session drops one open of the import at `base` (all of them: `all`); memory it was the
// last holder of goes into `into` to be freed. False if `base` is no import of the session.
bool ipc_close(Session& session, std::uint64_t base, Retired& into, bool all = false);

// A refused open or import: logs why, the first refusal of each kind in a session at warn
// level and later ones at debug (a client that loops on a bad handle is no flood); returns the
// driver's answer for it.
CUresult log_ipc_refusal(Session& session, const IpcRefusal& refusal, const char* tried);

// Session end: every export handed over (those still opened elsewhere leave the session's
// memory map, so they are not freed with its allocations) and every import closed, into `into`.
void ipc_end_session(Session& session, Retired& into);

}  // namespace mpsshim::server
