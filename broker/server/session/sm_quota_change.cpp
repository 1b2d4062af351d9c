#include "broker/server/session/sm_quota_change.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "broker/server/driver/driver.hpp"
#include "broker/server/launch/launch_batch.hpp"
#include "broker/server/scheduling/priority_reserve.hpp"
#include "broker/server/scheduling/quota.hpp"
#include "broker/server/session/busy_time.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

constexpr std::string_view kByOperator = "SM quota changed by the operator to";

// Server events of the old green context that are still in use come back to the pool later:
// they are destroyed then instead (Session::release_event, busy_time.cpp).
void mark_events_in_use_stale(Session& s) {
  for (const Completion& c : s.pending) {
    for (const Completion::Wait& w : c.waits) {
      if (w.owner == Completion::Owner::kPool) s.quota_changes.stale_events.push_back(w.event);
    }
  }
  for (const Retired& bundle : s.retiring) {
    for (std::size_t i = bundle.fences_done; i < bundle.fences.size(); ++i) {
      s.quota_changes.stale_events.push_back(bundle.fences[i]);
    }
  }
  for (const BusySpans::Span& span : s.busy.closed) {
    s.quota_changes.stale_events.push_back(span.begin);
    s.quota_changes.stale_events.push_back(span.end);
  }
  for (const PriorityState::Fence& fence : s.priority.fences) {
    if (!fence.word.armed()) s.quota_changes.stale_events.push_back(fence.event);
  }
  for (std::uint64_t id : s.objects.ids<StreamObj>()) {
    if (CUevent fence = s.objects.get<StreamObj>(id)->capture_fence)
      s.quota_changes.stale_events.push_back(fence);
  }
  const DriverTable& cu = s.cu();
  for (CUevent e : s.event_pool) cu.cuEventDestroy_v2(e);
  for (CUevent e : s.busy.timing_pool) cu.cuEventDestroy_v2(e);
  s.event_pool.clear();
  s.busy.timing_pool.clear();
}

// The green context of the shape asked: one the session had before (moving back and forth
// between the same shapes makes no more green contexts), else a new one.
tl::expected<GreenContext, std::string> green_of_shape(Session& s, int percentage,
                                                       bool outside_reserve) {
  const Gpu& gpu = s.gpu();
  // A client of a Kubernetes allocation stays in its slot of the device, one of a static
  // partition in its partition (admit.cpp).
  const PlannedQuota planned =
      plan_client_quota(gpu.snapshot, percentage, s.sm.ignore_coscheduling, s.sm.placement);
  outside_reserve =
      outside_reserve && !s.sm.placement.placed() && reaches_reserve(planned, s.sm.reserve);
  auto same = [&](const GreenContext& g) {
    return g.percentage == percentage && g.outside_reserve == outside_reserve;
  };
  if (same(s.green)) return s.green;
  if (auto it = std::find_if(s.quota_changes.earlier_greens.begin(),
                             s.quota_changes.earlier_greens.end(), same);
      it != s.quota_changes.earlier_greens.end()) {
    GreenContext again = *it;
    s.quota_changes.earlier_greens.erase(it);
    return again;
  }
  auto green = make_client_green_context(s.green_pool(), gpu, percentage, planned, s.sm.placement,
                                         s.sm.reserve, outside_reserve);
  if (!green) {
    return tl::unexpected(fmt::format("creating a green context of {} SMs failed: {}",
                                      planned.quota.target, describe(s.cu(), green.error())));
  }
  return *green;
}

// Gives a green context taken out of earlier_greens back to it (a failed move).
void keep_unused(Session& s, const GreenContext& green) {
  if (green.green != s.green.green) s.quota_changes.earlier_greens.push_back(green);
}

tl::expected<std::string, std::string> apply(Session& s, int percentage, bool outside_reserve,
                                             std::string_view cause) {
  const DriverTable& cu = s.cu();
  const proto::DeviceSnapshot& snap = s.gpu().snapshot;
  auto green = green_of_shape(s, percentage, outside_reserve);
  if (!green) return tl::unexpected(green.error());
  if (green->green == s.green.green) {
    return fmt::format("{}: {}% of the SMs, {} of {} (unchanged)", s.who(), percentage,
                       s.green.sm_count, snap.sm_count);
  }
  // Every stream of the new context first, so that a failure changes nothing. Streams of the
  // client's own green contexts stay on the SMs those were carved from (client_green.hpp).
  const std::vector<std::uint64_t> ids =
      s.objects.ids_where<StreamObj>([](const StreamObj& st) { return !st.in_client_green; });
  std::vector<CUstream> fresh;
  for (std::uint64_t id : ids) {
    CUstream stream = nullptr;
    CUresult r = cu.cuGreenCtxStreamCreate(&stream, green->green, CU_STREAM_NON_BLOCKING,
                                           s.objects.get<StreamObj>(id)->priority);
    if (r != CUDA_SUCCESS) {
      for (CUstream made : fresh) cu.cuStreamDestroy_v2(made);
      keep_unused(s, *green);
      return tl::unexpected(
          fmt::format("creating its streams in the new green context failed: {}", describe(cu, r)));
    }
    fresh.push_back(stream);
  }

  // Safe point: nothing waits in the launch batch (this runs between passes; flushed anyway),
  // and the busy spans end on the old streams.
  if (CUresult r = flush_launches(s); r != CUDA_SUCCESS) {
    log_warn("{}: launches before the SM quota change failed: {}", s.who(), describe(cu, r));
  }
  close_busy_spans(s);
  // The cached launch graphs' nodes may name the old green context.
  s.launch_batch.forget(cu);
  mark_events_in_use_stale(s);

  // Each new stream waits for its old stream's last work; the old one is destroyed, its work
  // runs on. The fences are freed once they completed (retire.hpp), as stale events.
  Retired fences;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    StreamObj* stream = s.objects.get<StreamObj>(ids[i]);
    auto fence = s.create_event(CU_EVENT_DISABLE_TIMING);  // the old context's: s.green still
    if (fence && cu.cuEventRecordWithFlags(*fence, stream->stream, 0) == CUDA_SUCCESS) {
      cu.cuStreamWaitEvent(fresh[i], *fence, 0);
      fences.fences.push_back(*fence);
      s.quota_changes.stale_events.push_back(*fence);
    } else {
      // Without a fence the order is kept the slow way: the old stream's work ends first.
      if (fence) cu.cuEventDestroy_v2(*fence);
      cu.cuStreamSynchronize(stream->stream);
    }
    if (stream->join_event != nullptr) {
      s.destroy_client_event(stream->join_event);
      stream->join_event = nullptr;  // made again, in the new context, when needed
    }
    cu.cuStreamDestroy_v2(stream->stream);
    stream->stream = fresh[i];
  }
  if (!fences.fences.empty()) s.retiring.push_back(std::move(fences));
  if (s.fence_stream != nullptr) {
    cu.cuStreamDestroy_v2(s.fence_stream);
    s.fence_stream = nullptr;
  }

  const unsigned before = s.green.sm_count;
  s.quota_changes.earlier_greens.push_back(s.green);
  s.green = *green;
  s.client_green.forget_all();  // what it was handed named the old quota's SMs
  ++s.quota_changes.generation;
  s.sm.percentage = percentage;
  const std::string held =
      s.green.outside_reserve
          ? fmt::format(", {} held back for normal-priority clients", s.green.held_back_sms)
          : std::string();
  log_info("{}: {} {}%: {} of {} SMs{} (was {}); its {} stream(s) go on in the new green context",
           s.who(), cause, percentage, s.green.sm_count, snap.sm_count, held, before, ids.size());
  return fmt::format("{}: {}% of the SMs, {} of {}{} (was {})", s.who(), percentage,
                     s.green.sm_count, snap.sm_count, held, before);
}

}  // namespace

tl::expected<std::string, std::string> change_sm_quota(Session& session, int percentage) {
  percentage = std::clamp(percentage, 1, 100);
  if (session.active_captures != 0) {
    session.quota_changes.pending_percentage = percentage;
    return fmt::format("{}: {}% of the SMs once its stream capture ends", session.who(),
                       percentage);
  }
  session.quota_changes.pending_percentage = 0;
  return apply(session, percentage, session.sm.kept_out_of_reserve, kByOperator);
}

tl::expected<std::string, std::string> move_sm_share(Session& session, int percentage,
                                                     bool outside_reserve, std::string_view why) {
  return apply(session, percentage, outside_reserve,
               fmt::format("SMs moved because {}; its share of", why));
}

void apply_pending_sm_quota(Session& session) {
  if (session.quota_changes.pending_percentage == 0 || session.active_captures != 0) return;
  const int percentage = session.quota_changes.pending_percentage;
  session.quota_changes.pending_percentage = 0;
  if (auto applied = apply(session, percentage, session.sm.kept_out_of_reserve, kByOperator);
      !applied) {
    log_warn("{}: the SM quota change to {}% could not be applied: {}", session.who(), percentage,
             applied.error());
  }
}

}  // namespace mpsshim::server
