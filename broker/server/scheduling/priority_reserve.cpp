#include "broker/server/scheduling/priority_reserve.hpp"

#include <algorithm>
#include <vector>

#include "broker/server/scheduling/priority_gate.hpp"
#include "broker/server/session/session.hpp"
#include "broker/server/session/sm_quota_change.hpp"
#include "common/log.hpp"

namespace mpsshim::server {

SmReserve plan_sm_reserve(const SmReserveSpec& spec, unsigned sm_count, unsigned granularity,
                          unsigned split_groups) {
  if (spec.amount == 0 || granularity == 0 || split_groups < 2) return {};
  const std::uint64_t wanted =
      spec.percent ? (std::uint64_t{sm_count} * spec.amount + 99) / 100 : spec.amount;
  const std::uint64_t groups = (wanted + granularity - 1) / granularity;
  SmReserve reserve;
  reserve.groups = static_cast<unsigned>(std::clamp<std::uint64_t>(groups, 1, split_groups - 1));
  reserve.granularity = granularity;
  reserve.split_groups = split_groups;
  return reserve;
}

bool reaches_reserve(const PlannedQuota& planned, const SmReserve& reserve) {
  if (!reserve.on()) return false;
  return planned.quota.whole_device ||
         planned.quota.target > (reserve.split_groups - reserve.groups) * reserve.granularity;
}

tl::expected<GreenContext, CUresult> make_green_outside_reserve(const DriverTable& cu,
                                                                CUdevice device,
                                                                const CUdevResource& device_sms,
                                                                const SmReserve& reserve) {
  auto building = hold_green_builds();
  unsigned count = reserve.split_groups;
  std::vector<CUdevResource> groups(count);
  CUdevResource remaining{};
  CUresult r = cu.cuDevSmResourceSplitByCount(groups.data(), &count, &device_sms, &remaining, 0,
                                              reserve.granularity);
  if (r != CUDA_SUCCESS) return tl::unexpected(r);
  // The server counted the groups at its start; a device that splits otherwise now cannot be
  // told which SMs are reserved.
  if (count != reserve.split_groups)
    return tl::unexpected(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  groups.resize(count - reserve.groups);
  // The SMs no group took (a GPC's beyond a multiple of the granularity) are not reserved; a
  // descriptor may join them to the groups of the same split.
  if (remaining.sm.smCount != 0) groups.push_back(remaining);
  return green_context_of(cu, device, std::move(groups));
}

tl::expected<GreenContext, CUresult> make_client_green_context(
    GreenContextPool& pool, const Gpu& gpu, int percentage, const PlannedQuota& planned,
    const SmPlacement& placement, const SmReserve& reserve, bool outside_reserve) {
  outside_reserve = outside_reserve && !placement.placed() && reaches_reserve(planned, reserve);
  tl::expected<GreenContext, CUresult> green;
  if (outside_reserve) {
    // The same SMs whatever the quota that reached the reserve: one pooled shape.
    GreenShape shape;
    shape.kind = GreenShape::Kind::kOutsideReserve;
    shape.granularity = reserve.granularity;
    shape.groups = reserve.split_groups - reserve.groups;
    green = pool.take(shape, [&] {
      return make_green_outside_reserve(*gpu.cu, gpu.device, gpu.sm_resource, reserve);
    });
  } else {
    green = pool.take(planned.quota, planned.granularity, placement);
  }
  if (!green) return green;
  // A pooled context carries its last session's labels: set them for this one.
  green->percentage = std::clamp(percentage, 1, 100);
  green->outside_reserve = outside_reserve;
  green->held_back_sms = 0;
  if (outside_reserve) {
    const unsigned share =
        planned.quota.whole_device ? gpu.snapshot.sm_count : planned.quota.target;
    green->held_back_sms = share > green->sm_count ? share - green->sm_count : 0;
  }
  return green;
}

void follow_priority_reserve(Session& session, const PriorityBoard& board,
                             std::chrono::steady_clock::time_point now) {
  if (!session.sm.reserve.on()) return;
  const bool wanted = board.normal_sessions() > 0;
  if (wanted == session.sm.kept_out_of_reserve) {
    // Where the board wants it (again): nothing owed from an earlier failure.
    session.sm.reserve_retry.failures = 0;
    session.sm.reserve_retry.given_up = false;
    return;
  }
  if (session.active_captures != 0) return;
  if (session.sm.reserve_retry.given_up) {
    if (board.normal_changes() == session.sm.reserve_retry.given_up_at) return;
    session.sm.reserve_retry.given_up = false;  // a normal client came or went since: try afresh
  }
  if (session.sm.reserve_retry.failures != 0 && now < session.sm.reserve_retry.at) return;
  const char* verb = wanted ? "leave" : "get back";
  auto moved = move_sm_share(session, session.sm.percentage, wanted,
                             wanted ? "a normal-priority client connected"
                                    : "no normal-priority client is connected any more");
  if (moved) {
    session.sm.kept_out_of_reserve = wanted;
    session.sm.reserve_retry.failures = 0;
    return;
  }
  const unsigned failures = ++session.sm.reserve_retry.failures;
  if (failures >= kReserveMoveTries) {
    session.sm.reserve_retry.failures = 0;
    session.sm.reserve_retry.given_up = true;
    session.sm.reserve_retry.given_up_at = board.normal_changes();
    log_warn(
        "{}: could not {} the SMs reserved for normal-priority clients ({} tries): {}; it "
        "stays where it is until a normal-priority client connects or leaves",
        session.who(), verb, failures, moved.error());
    return;
  }
  const auto delay = kReserveRetryFirst * (1u << (failures - 1));
  session.sm.reserve_retry.at = now + delay;
  log_warn(
      "{}: could not {} the SMs reserved for normal-priority clients: {}; trying again in "
      "{} ms",
      session.who(), verb, moved.error(), delay.count());
}

}  // namespace mpsshim::server
