// The coordinator's side of the memory policies (scheduling/memory_arbiter.hpp): serving the
// allocations that did not fit, resuming the clients it suspended, and overcommit's admission
// rule. Everything about a session runs on its worker; the coordinator only decides.
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "broker/server/core/server.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/ops/ops.hpp"
#include "broker/server/session/suspension.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

using Clock = std::chrono::steady_clock;

// A suspend or resume copies the client's memory (docs/suspend.md): as long as the operator's.
constexpr auto kPolicyTaskTimeout = std::chrono::milliseconds(300'000);
// How often the coordinator looks whether a client it suspended fits on the GPU again.
constexpr auto kResumeLookInterval = std::chrono::milliseconds(50);

// The GPU's free and total memory as the driver says, from a worker (its thread has the primary
// context current).
struct DeviceRoom {
  std::size_t free = 0;
  std::size_t total = 0;
};
DeviceRoom device_room(Session& s) {
  DeviceRoom room;
  if (s.cu().cuMemGetInfo_v2(&room.free, &room.total) != CUDA_SUCCESS) room = {};
  return room;
}

// A policy's suspend waits this long at most for the client's issued work: an idle client's
// work is done or nearly; one with a long kernel still running is passed over instead of holding
// its worker and the coordinator for the operator's 30 s.
constexpr auto kPolicyWorkWait = std::chrono::milliseconds(500);

// The session's memory suspended for a policy: the bytes parked, or why not (logged).
std::optional<std::uint64_t> suspend_for_policy(Session& s, std::string_view why) {
  auto done = suspend_session(s, kPolicyWorkWait);
  if (!done) {
    log_info("memory policy: {}", done.error());
    return std::nullopt;
  }
  s.suspension.by_policy = true;
  log_info("memory policy: {} was suspended {}", s.who(), why);
  return s.suspension.parked_bytes;
}

// Whether a call of the client waits for its GPU work (a synchronize): then it is not idle.
// Completions that only hand staging chunks back do not count.
bool waits_for_gpu(const Session& s) {
  return std::any_of(s.pending.begin(), s.pending.end(),
                     [](const Completion& c) { return c.slot != proto::kNoReply; });
}

// A below-normal client that may be suspended for another's memory: idle for `idle_ns` (no
// call, none waiting for its GPU work), holding memory, not suspended or waiting itself.
bool preemptible(const Session& s, std::uint64_t now_ns, std::uint64_t idle_ns) {
  return s.life.state == SessionState::kActive && s.priority.below_normal && !s.suspension.on &&
         !s.memory_wait.on && !waits_for_gpu(s) && s.charge.used() != 0 &&
         now_ns - s.stamps.record_taken_ns >= idle_ns;
}

std::uint64_t nanoseconds(std::chrono::milliseconds ms) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(ms).count());
}

// Whether the operator holds the session suspended: its wait is left alone until the operator's
// resume posts it again (resume_session).
bool held_by_operator(const Session& s) {
  return s.suspension.on && !s.suspension.by_policy;
}

}  // namespace

// Every result a task writes is read only when on_session returned true: the task ran to its end
// before that (release/acquire on `found`). A worker that does not answer within the timeout is
// stuck in a driver call for minutes; what its late task decides is then lost to the
// coordinator's books (a wait stays owed, a client stays suspended) until the session ends.
bool Server::on_session(std::uint32_t client, std::function<void(Session&)> task,
                        std::chrono::milliseconds timeout) {
  auto found = std::make_shared<std::atomic<bool>>(false);
  on_each_worker(
      [client, task, found](Worker& worker) {
        Session* s = worker.find_session(client);
        if (s != nullptr && s->life.state == SessionState::kActive) {
          task(*s);
          found->store(true, std::memory_order_release);
        }
        return std::string();
      },
      timeout);
  return found->load(std::memory_order_acquire);
}

void Server::arbitrate_memory(Clock::time_point now) {
  if (!memory_arbiter_) return;
  for (const MemoryWant& want : memory_arbiter_->take_wants()) serve_memory_want(want);
  if (!memory_arbiter_->suspended().empty() && now >= next_resume_look_) {
    next_resume_look_ = now + kResumeLookInterval;
    resume_what_fits();
  }
}

bool Server::memory_policy_busy() const {
  return memory_arbiter_ && (memory_arbiter_->has_wants() || !memory_arbiter_->suspended().empty());
}

void Server::serve_memory_want(const MemoryWant& want) {
  const MemoryPolicySettings& policy = memory_arbiter_->settings();
  // Whether the wait is over: the allocation answered (it fit, or failed for good), its client
  // gone, or held by the operator. The first look also fails at once an allocation that could
  // never fit: the client's memory and it together more than the GPU has.
  auto try_again = [this, &want](bool last_try, bool first_look) {
    auto over = std::make_shared<bool>(true);
    const bool found = on_session(
        want.client,
        [over, last_try, first_look](Session& s) {
          if (!s.memory_wait.on || held_by_operator(s)) return;
          if (first_look) {
            const DeviceRoom room = device_room(s);
            const std::uint64_t used = std::min<std::uint64_t>(s.charge.used(), room.total);
            if (s.memory_wait.bytes > room.total - used) {
              log_info("memory policy: {}'s {} of {} could never fit beside its {}", s.who(),
                       s.memory_wait.what(), format_bytes(s.memory_wait.bytes), format_bytes(used));
              retry_waiting_allocation(s, true);
              return;
            }
          }
          *over = retry_waiting_allocation(s, last_try);
        },
        kPolicyTaskTimeout);
    return !found || *over;
  };
  if (try_again(false, true)) return;  // memory freed since it asked, or it could never fit

  if (policy.preemption && !want.below_normal) {
    const std::uint64_t idle_ns = nanoseconds(policy.idle_after);
    // The physical memory of the clients suspended for it goes to this allocation, cleared,
    // rather than back to the driver (device_heap.hpp says why), and its addresses are taken now
    // so that the suspends' copies map the clients' own allocations there (handover_range.hpp).
    // What it does not take is given back once the preemption is over, on this thread (the
    // context lease's: the primary context is current while a session is).
    DeviceHeap* heap = want.heap_allocation ? gpu_.heap.get() : nullptr;
    if (heap != nullptr) heap->start_handover(want.client, want.bytes);
    const auto end_handover = [heap] {
      if (heap != nullptr) heap->end_handover();
    };
    for (const IdleClientRef& idle : idle_below_normal_clients()) {
      struct Suspended {
        std::optional<std::uint64_t> parked;
        std::size_t free = 0;  // the GPU's free memory after it
      };
      auto done = std::make_shared<Suspended>();
      const std::string why = fmt::format("for client {}'s allocation", want.client);
      const bool found = on_session(
          idle.client,
          [done, why, idle_ns, heap](Session& s) {
            // Still idle: the earlier victims' copies took time.
            if (!preemptible(s, SessionStats::now_ns(), idle_ns)) return;
            done->parked = suspend_for_policy(s, why);
            done->free = device_room(s).free + (heap != nullptr ? heap->handover_bytes() : 0);
          },
          kPolicyTaskTimeout);
      if (!found || !done->parked) continue;
      memory_arbiter_->suspended().push_back(
          PolicySuspended{idle.client, *done->parked, 0, false, Clock::now()});
      last_preemption_ = Clock::now();
      // An allocation that cannot fit yet is not tried: a failed try of a large one takes the
      // driver tens of milliseconds.
      if (done->free >= want.bytes && try_again(false, false)) {
        end_handover();
        return;
      }
    }
    end_handover();
  }
  if (policy.overcommit_percent == 0) {
    try_again(true, false);
    return;
  }
  // Overcommit: the client waits suspended, unless it cannot be suspended.
  auto entry = std::make_shared<std::optional<PolicySuspended>>();
  const bool found = on_session(
      want.client,
      [entry](Session& s) {
        if (!s.memory_wait.on || held_by_operator(s)) return;
        if (auto parked = suspend_for_policy(s, "to wait for room for its allocation")) {
          *entry = PolicySuspended{s.client.id, *parked, s.memory_wait.bytes, true, Clock::now()};
          return;
        }
        retry_waiting_allocation(s, true);
      },
      kPolicyTaskTimeout);
  if (found && entry->has_value()) memory_arbiter_->suspended().push_back(**entry);
}

std::vector<Server::IdleClientRef> Server::idle_below_normal_clients() {
  struct Found {
    std::mutex mutex;
    std::vector<IdleClientRef> clients;
  };
  auto found = std::make_shared<Found>();
  const auto idle_after = memory_arbiter_->settings().idle_after;
  on_each_worker(
      [found, idle_ns = nanoseconds(idle_after)](Worker& worker) {
        const std::uint64_t now_ns = SessionStats::now_ns();
        for (const auto& s : worker.sessions()) {
          if (!preemptible(*s, now_ns, idle_ns)) continue;
          std::lock_guard lock(found->mutex);
          found->clients.push_back({s->client.id, s->stamps.record_taken_ns});
        }
        return std::string();
      },
      kPolicyTaskTimeout);
  std::lock_guard lock(found->mutex);
  std::vector<IdleClientRef> clients = found->clients;
  // Least recently active first.
  std::sort(clients.begin(), clients.end(), [](const IdleClientRef& a, const IdleClientRef& b) {
    return a.last_record_ns < b.last_record_ns;
  });
  return clients;
}

void Server::resume_what_fits() {
  std::vector<PolicySuspended>& suspended = memory_arbiter_->suspended();
  // Clients waiting for their own allocation first, then in the order they were suspended; the
  // first that does not fit stops the look, so a large client is not passed by small ones for
  // good.
  std::stable_sort(suspended.begin(), suspended.end(),
                   [](const PolicySuspended& a, const PolicySuspended& b) {
                     if (a.waiting != b.waiting) return a.waiting;
                     return a.since < b.since;
                   });
  // Clients preempted for another are not resumed while preemptions go on: the client that took
  // their memory is likely to want more soon, and each resume and suspend copies it all.
  const bool victims_may_resume =
      Clock::now() - last_preemption_ >= memory_arbiter_->settings().idle_after;
  while (!suspended.empty()) {
    if (!suspended.front().waiting && !victims_may_resume) return;
    enum class Outcome { kGone, kResumed, kNoRoom };
    auto outcome = std::make_shared<Outcome>(Outcome::kGone);
    const PolicySuspended entry = suspended.front();
    const bool found = on_session(
        entry.client,
        [outcome, entry](Session& s) {
          // Resumed by the operator meanwhile (or suspended again by it): no longer the policy's.
          // A wait of its own is the operator's resume's to post again (resume_session).
          if (!s.suspension.on || !s.suspension.by_policy) return;
          const DeviceRoom room = device_room(s);
          const std::uint64_t needed =
              s.suspension.parked_bytes + (s.memory_wait.on ? s.memory_wait.bytes : 0);
          if (room.free < needed) {
            *outcome = Outcome::kNoRoom;
            return;
          }
          if (auto done = resume_session(s); !done) {
            // Out of memory after all (another client took the room), or the copy stream could
            // not be made: tried again at the next look.
            log_info("memory policy: {}", done.error());
            *outcome = Outcome::kNoRoom;
            return;
          }
          log_info("memory policy: {} was resumed: the GPU has room for it again", s.who());
          *outcome = Outcome::kResumed;
          // Its allocation fits now unless another client took the room first: then it fails.
          if (s.memory_wait.on) retry_waiting_allocation(s, true);
        },
        kPolicyTaskTimeout);
    if (found && *outcome == Outcome::kNoRoom) return;
    suspended.erase(suspended.begin());
  }
}

std::string Server::overcommit_refusal(std::uint64_t limit, int changing_pid,
                                       std::chrono::milliseconds timeout) {
  const unsigned percent = memory_arbiter_ ? memory_arbiter_->settings().overcommit_percent : 0;
  if (percent == 0) return {};
  const std::uint64_t total = gpu_.snapshot.total_memory;
  auto counted = [total](std::uint64_t l) { return l == 0 || l > total ? total : l; };
  struct Sum {
    std::atomic<std::uint64_t> others{0};
    std::atomic<std::uint64_t> changing{0};  // the changing client's limit now, counted
    std::atomic<bool> changing_found{false};
  };
  auto sum = std::make_shared<Sum>();
  const std::vector<std::string> answers = on_each_worker(
      [sum, counted, changing_pid](Worker& worker) {
        for (const auto& s : worker.sessions()) {
          if (s->life.state != SessionState::kActive) continue;
          if (changing_pid != 0 && s->client.pid == changing_pid) {
            sum->changing_found.store(true);
            sum->changing.fetch_add(counted(s->charge.limit()));
            continue;
          }
          sum->others.fetch_add(counted(s->charge.limit()));
        }
        return std::string("counted");
      },
      timeout);
  const bool all_counted =
      std::all_of(answers.begin(), answers.end(), [](const std::string& a) { return !a.empty(); });
  if (changing_pid != 0) {
    // A worker that did not answer may hold the client, or others: nothing is known.
    if (!all_counted) {
      return "a worker of the server did not answer in time, so the clients' limits could not be "
             "added up (a suspend or resume may be copying); try again";
    }
    // No such client: the change itself answers that. A lower limit is always allowed.
    if (!sum->changing_found.load() || counted(limit) <= sum->changing.load()) return {};
  }
  const std::uint64_t allowed = total / 100 * percent;
  const std::uint64_t after = sum->others.load() + counted(limit);
  if (after <= allowed) return {};
  const std::string limit_text =
      limit == 0 ? std::string("none: the whole GPU") : format_bytes(limit);
  if (changing_pid != 0) {
    return fmt::format(
        "a memory limit of {} would bring the limits of this GPU's clients to {}, more than the "
        "{}% of its {} that --memory-overcommit allows",
        limit_text, format_bytes(after), percent, format_bytes(total));
  }
  return fmt::format(
      "its memory limit ({}) would bring the limits of this GPU's clients to {}, more than the "
      "{}% of its {} that --memory-overcommit allows; give it a smaller limit "
      "(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), wait for a client to leave, or raise the percentage",
      limit_text, format_bytes(after), percent, format_bytes(total));
}

}  // namespace mpsshim::server
