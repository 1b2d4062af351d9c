#include "broker/server/session/ipc_memory.hpp"

#include "common/log.hpp"

namespace mpsshim::server {

CUresult log_ipc_refusal(Session& session, const IpcRefusal& refusal, const char* tried) {
  const auto bit = static_cast<std::uint8_t>(1u << static_cast<unsigned>(refusal.kind));
  const bool first = (session.ipc_memory.refusals_logged & bit) == 0;
  session.ipc_memory.refusals_logged |= bit;
  log_at(first ? LogLevel::kWarn : LogLevel::kDebug, "{} (uid {}) tried to {} {}; refused{}",
         session.who(), session.client.uid, tried, refusal.why,
         first ? " (later refusals of this kind are logged at debug level)" : "");
  return refusal.result;
}

bool ipc_hand_over(Session& session, std::uint64_t base) {
  auto it = session.ipc_memory.exports.find(base);
  if (it == session.ipc_memory.exports.end()) return false;
  std::shared_ptr<IpcMemory> memory = std::move(it->second.memory);
  session.ipc_memory.exports.erase(it);
  if (session.ipc().unexport_memory(*memory)) return false;
  log_info(
      "{} let go of its allocation {:#x} ({}) while other clients have it open: it stays for "
      "them until the last one closes it",
      session.who(), base, format_bytes(memory->bytes));
  return true;
}

bool ipc_close(Session& session, std::uint64_t base, Retired& into, bool all) {
  auto it = session.ipc_memory.imports.find(base);
  if (it == session.ipc_memory.imports.end()) return false;
  if (!all && --it->second.opens != 0) return true;
  std::shared_ptr<IpcMemory> memory = std::move(it->second.memory);
  session.ipc_memory.imports.erase(it);
  session.memory.remove(base);
  if (session.ipc().drop_opener(*memory)) {
    // The exporter let go of it before: freed behind this client's work, charged to no one
    // any more (the exporter's worker takes the bytes back at its next charge).
    into.allocations.push_back(DeviceRange{memory->base, memory->bytes, RangeKind::kAllocation, 0});
    memory->charge->bytes.fetch_add(memory->bytes, std::memory_order_acq_rel);
    log_info(
        "{} closed the last open of allocation {:#x} ({}), which its exporter had let go of; "
        "freed",
        session.who(), base, format_bytes(memory->bytes));
  }
  return true;
}

void ipc_end_session(Session& session, Retired& into) {
  while (!session.ipc_memory.exports.empty()) {
    const std::uint64_t base = session.ipc_memory.exports.begin()->first;
    if (ipc_hand_over(session, base)) session.memory.remove(base);
  }
  while (!session.ipc_memory.imports.empty()) {
    ipc_close(session, session.ipc_memory.imports.begin()->first, into, true);
  }
}

}  // namespace mpsshim::server
