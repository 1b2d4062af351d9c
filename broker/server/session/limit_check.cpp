#include "broker/server/session/limit_check.hpp"

#include "broker/server/session/host_callbacks.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

std::string amount(ClientLimit limit, std::uint64_t n) {
  const ClientLimitSpec& spec = spec_of(limit);
  return spec.bytes ? format_bytes(n) : fmt::format("{} {}", n, spec.counted);
}

// The first refusal of each kind is worth a warning; a flood of them is not worth a flood of
// lines.
bool first_time(Session& session, ClientLimit limit) {
  const std::uint32_t bit = 1u << static_cast<unsigned>(limit);
  const bool first = (session.refusals_logged.limits & bit) == 0;
  session.refusals_logged.limits |= bit;
  return first;
}

}  // namespace

std::uint64_t held_of(const Session& session, ClientLimit limit) {
  const ObjectTable& objects = session.objects;
  switch (limit) {
    case ClientLimit::kStreams:
      return objects.count<StreamObj>();
    case ClientLimit::kEvents:
      return objects.count<EventObj>();
    case ClientLimit::kModules:
      return objects.count<ModuleObj>() + objects.count<LibraryObj>() + objects.count<LinkObj>();
    case ClientLimit::kGraphs:
      return objects.count<GraphObj>() + objects.count<GraphExecObj>();
    case ClientLimit::kMemoryPools:
      return objects.count<PoolObj>();
    case ClientLimit::kAllocations:  // graph memory too: each node's block is a table entry
      return session.memory.count(RangeKind::kAllocation) + session.memory.count(RangeKind::kGraph);
    case ClientLimit::kPinnedBytes:
      return session.usage.pinned_bytes;
    case ClientLimit::kHostFunctions:
      return session.callbacks ? session.callbacks->held() : 0;
    case ClientLimit::kInFlight:
      return session.pending.size() + session.retiring.size();
    case ClientLimit::kIpcOpens:  // cuIpc opens and shared VMM opens alike
      return session.ipc_memory.imports.size() + session.vmm.shared_opens.size();
    case ClientLimit::kCount:
      break;
  }
  return 0;
}

bool within_client_limit(Session& session, ClientLimit limit, std::uint64_t held,
                         std::uint64_t more) {
  const std::uint64_t cap = session.limits[limit];
  if (cap == 0 || (more <= cap && held <= cap - more)) return true;
  const ClientLimitSpec& spec = spec_of(limit);
  const LogLevel level = first_time(session, limit) ? LogLevel::kWarn : LogLevel::kDebug;
  log_at(level,
         "{} was refused {} more: it holds {}, and a client may hold at most {} (per-client limit "
         "`{}`; raise it with mpsshimd --client-limit {}=N){}",
         session.who(), amount(limit, more), amount(limit, held), amount(limit, cap), spec.name,
         spec.name,
         level == LogLevel::kWarn ? "; later refusals of this kind are logged at debug level" : "");
  return false;
}

bool in_flight_at_cap(const Session& session) {
  const std::uint64_t cap = session.limits[ClientLimit::kInFlight];
  return cap != 0 && held_of(session, ClientLimit::kInFlight) >= cap;
}

bool in_flight_full(Session& session) {
  if (!in_flight_at_cap(session)) return false;
  const std::uint64_t held = held_of(session, ClientLimit::kInFlight);
  if (first_time(session, ClientLimit::kInFlight)) {
    log_warn(
        "{} has {} (replies, staging copies and frees waiting for the GPU), the most a client "
        "may have (per-client limit `in-flight`; raise it with mpsshimd --client-limit "
        "in-flight=N); its requests are read again as they complete",
        session.who(), amount(ClientLimit::kInFlight, held));
  }
  return true;
}

}  // namespace mpsshim::server
