// The coordinator's loop: the control socket, placing sessions on workers, asking workers,
// and the end of the process after a fault. The workers' loop is worker.cpp.
#include <fcntl.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string>
#include <string_view>

#include "broker/server/core/server.hpp"
#include "broker/server/core/timer_slack.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/images/image_verdicts.hpp"
#include "broker/server/scheduling/quota.hpp"
#include "common/log.hpp"

namespace mpsshim::server {
namespace {

// While inline passes run, the control socket is looked at this often.
constexpr auto kIoPollInterval = std::chrono::microseconds(100);
// After a fault, how long the coordinator waits for every worker to fail its sessions.
constexpr auto kFaultSpreadTimeout = std::chrono::seconds(5);
// The coordinator parks at most this long: a signal that lands just before epoll_wait is seen
// by the next look at most this late.
constexpr int kCoordinatorParkMs = 1000;
// How long the coordinator parks while a memory policy has clients suspended.
constexpr auto kPolicyLook = std::chrono::milliseconds(50);
// A heap trim that gave back at least this much is logged.
constexpr std::uint64_t kTrimLogBytes = 16u << 20;

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

enum Source : std::uint64_t { kControl = 0, kWake = 1 };

}  // namespace

std::size_t default_worker_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<std::size_t>(n);
  }
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<std::size_t>(n) : 1;
}

ServerSettings with_machine_defaults(ServerSettings settings) {
  const std::size_t cpus = default_worker_count();
  if (settings.workers == 0) settings.workers = cpus;
  if (!settings.spin_clients) settings.spin_clients = std::max<std::size_t>(cpus / 2, 1);
  return settings;
}

Server::Server(Gpu gpu, ServerSettings settings, proto::UniqueFd control)
    : gpu_(gpu),
      settings_(with_machine_defaults(settings)),
      control_(std::move(control)),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      fatal_([](int code) {
        std::fflush(nullptr);
        // No destructors or atexit handlers: they would call into a poisoned driver.
        std::_Exit(code);
      }) {
  auto watch = [this](int fd, std::uint64_t tag) {
    epoll_event event{};
    event.events = EPOLLIN | EPOLLRDHUP;
    event.data.u64 = tag;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
      log_error("cannot watch fd {} ({})", fd, std::strerror(errno));
    }
  };
  if (control_) {
    set_nonblocking(control_.get());
    watch(control_.get(), kControl);
  }
  if (wake_) watch(wake_.get(), kWake);
  for (std::size_t i = 0; i < settings_.workers; ++i)
    workers_.push_back(std::make_unique<Worker>(*this, i));
  plan_priority_reserve();
  if (gpu_.heap && settings_.park_pool != 0) gpu_.heap->set_park_pool(&park_pool_);
  adopt_kept_verdicts(images_, settings_.image_verdict_dir, device_arch(gpu_));
  if (settings_.memory_policy.on()) {
    memory_arbiter_ = std::make_unique<MemoryArbiter>(settings_.memory_policy, [this] { wake(); });
    const MemoryPolicySettings& policy = settings_.memory_policy;
    log_info(
        "memory policies: preemption of idle below-normal clients {} (idle after {} ms), "
        "overcommit {}",
        policy.preemption ? "on" : "off", policy.idle_after.count(),
        policy.overcommit_percent == 0 ? std::string("off")
                                       : fmt::format("{}%", policy.overcommit_percent));
  }
}

void Server::plan_priority_reserve() {
  const PrioritySettings& priority = settings_.priority;
  if (!priority.enabled || priority.reserve.amount == 0) return;
  // The split static partitions are cut from: the reserve is its last groups.
  const proto::DeviceSnapshot& snap = gpu_.snapshot;
  const unsigned granularity =
      sm_granularity(snap.sm_min_partition, snap.sm_coscheduled_alignment, false);
  auto groups = count_sm_groups(*gpu_.cu, gpu_.sm_resource, granularity);
  if (!groups) {
    log_warn(
        "no SMs reserved for normal-priority clients: splitting the device's SMs in groups "
        "of {} failed: {}",
        granularity, describe(*gpu_.cu, groups.error()));
    return;
  }
  sm_reserve_ = plan_sm_reserve(priority.reserve, snap.sm_count, granularity, *groups);
  if (!sm_reserve_.on()) {
    log_warn(
        "no SMs reserved for normal-priority clients: the device's SMs split into {} "
        "group(s) of {}, too few to set any apart",
        *groups, granularity);
    return;
  }
  log_info(
      "{} of {} SMs ({} of {} groups of {}; --priority-reserve-sms {}) are reserved for "
      "normal-priority clients: below-normal clients leave them while one is connected",
      sm_reserve_.sms(), snap.sm_count, sm_reserve_.groups, *groups, granularity,
      format_sm_reserve(priority.reserve));
}

void Server::nudge_workers() {
  for (auto& worker : workers_) worker->nudge();
}

Server::~Server() {
  for (auto& worker : workers_) worker->stop();
  // The sessions go first (a parked block of one gives its memory back to the pool), then the
  // pool, before the heap that outlives it.
  workers_.clear();
  if (gpu_.heap) gpu_.heap->set_park_pool(nullptr);
  // The operator's figure for the pool (docs/architecture.md); what is still kept is destroyed
  // with it.
  const GreenContextPoolFigures pool = green_pool_.figures();
  log_info(
      "green contexts: {} created, {} reused from the pool, {} destroyed; {} kept at the end "
      "(at most {})",
      pool.created, pool.reused, pool.destroyed, pool.idle, pool.capacity);
  const ImageCacheStats images = images_.stats();
  log_info(
      "library images: {} loaded to share, {} loads answered by a shared one ({} not loaded "
      "again), {} loaded for one client alone, {} unloaded after no client held them; {} "
      "scanned, {} verdicts of earlier servers adopted",
      images.loads, images.hits, format_bytes(images.hit_bytes), images.private_loads,
      images.expired, images.scans, images.adopted);
  keep_verdicts(images_, settings_.image_verdict_dir, device_arch(gpu_));
}

void Server::wake() {
  std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

std::size_t Server::session_count() const {
  std::size_t n = 0;
  for (const auto& worker : workers_) n += worker->load();
  return n;
}

bool Server::finished() const {
  return stopping_ && session_count() == 0;
}

Session* Server::find_session(std::uint32_t client_id) const {
  for (const auto& worker : workers_) {
    if (Session* s = worker->find_session(client_id)) return s;
  }
  return nullptr;
}

Worker& Server::least_loaded() {
  Worker* best = workers_.front().get();
  for (auto& worker : workers_) {
    if (worker->load() < best->load()) best = worker.get();
  }
  return *best;
}

std::vector<std::string> Server::on_each_worker(const std::function<std::string(Worker&)>& task,
                                                std::chrono::milliseconds timeout) {
  std::vector<std::string> answers(workers_.size());
  if (workers_.empty() || !workers_.front()->threaded()) {
    for (std::size_t i = 0; i < workers_.size(); ++i) answers[i] = task(*workers_[i]);
    return answers;
  }
  // Shared with the posted tasks: a worker that answers after the timeout writes into this,
  // not into the coordinator's stack.
  struct Gather {
    std::mutex mutex;
    std::condition_variable done;
    std::vector<std::string> answers;
    std::vector<bool> answered;
    std::size_t count = 0;
  };
  auto gather = std::make_shared<Gather>();
  gather->answers.resize(workers_.size());
  gather->answered.assign(workers_.size(), false);
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    workers_[i]->post([gather, task, i](Worker& w) {
      std::string answer = task(w);
      std::lock_guard lock(gather->mutex);
      gather->answers[i] = std::move(answer);
      gather->answered[i] = true;
      ++gather->count;
      gather->done.notify_all();
    });
  }
  std::unique_lock lock(gather->mutex);
  gather->done.wait_for(lock, timeout, [&] { return gather->count == workers_.size(); });
  for (std::size_t i = 0; i < workers_.size(); ++i) {
    if (gather->answered[i]) {
      answers[i] = std::move(gather->answers[i]);
    } else {
      // A worker is never parked with mail waiting; one that does not answer is inside a
      // driver call that takes long. Its task still runs when the call returns.
      log_warn(
          "worker {} did not answer an operator request within {} ms; its clients are "
          "left out of this answer",
          i, timeout.count());
    }
  }
  return answers;
}

std::size_t Server::poll_control(std::chrono::nanoseconds timeout) {
  constexpr int kMaxEvents = 8;
  epoll_event events[kMaxEvents];
  int ms = timeout.count() < 0
               ? kCoordinatorParkMs
               : static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(timeout).count());
  int n = ::epoll_wait(epoll_.get(), events, kMaxEvents, ms);
  std::size_t work = 0;
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u64 == kWake) {
      std::uint64_t count = 0;
      [[maybe_unused]] ssize_t r = ::read(wake_.get(), &count, sizeof count);
    } else {
      work += read_control();
    }
  }
  return work;
}

void Server::finish_fault() {
  // Inline workers fail their sessions here; threaded ones were nudged by raise_fault.
  for (auto& worker : workers_) {
    if (!worker->threaded()) worker->fail_sessions(fault());
  }
  auto deadline = std::chrono::steady_clock::now() + kFaultSpreadTimeout;
  while (workers_failed_.load(std::memory_order_acquire) < workers_.size()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      log_error("{} of {} workers did not pass the fault on within {} s; exiting anyway",
                workers_.size() - workers_failed_.load(), workers_.size(),
                std::chrono::duration_cast<std::chrono::seconds>(kFaultSpreadTimeout).count());
      break;
    }
    poll_control(std::chrono::milliseconds(10));
  }
  report_fault_to_daemon();
  fatal_(kExitGpuFault);
}

void Server::report_fault_to_daemon() {
  const FaultCulprit& culprit = fault_culprit();
  const std::string error = describe(*gpu_.cu, fault());
  // key=value fields; the program name (the client's, any text) takes the rest of the line.
  reply_text(
      proto::MessageKind::kServerFault, static_cast<int>(fault()),
      fmt::format("client={} pid={} uid={} clients={} op={} error={} program={}", culprit.client,
                  culprit.pid, culprit.uid, culprit.clients, culprit.op.empty() ? "-" : culprit.op,
                  error.substr(0, error.find(' ')), culprit.program));
}

std::size_t Server::do_work() {
  if (faulted()) return 0;
  std::size_t work = 0;
  auto now = std::chrono::steady_clock::now();
  if (now >= next_io_poll_) {
    next_io_poll_ = now + kIoPollInterval;
    work += poll_control(std::chrono::nanoseconds(0));
  }
  for (auto& worker : workers_) {
    work += worker->do_work();
    if (faulted()) break;
  }
  if (faulted()) {
    finish_fault();
    return work;
  }
  look_after_memory(std::chrono::steady_clock::now());
  arbitrate_memory(std::chrono::steady_clock::now());
  return work;
}

void Server::look_after_memory(std::chrono::steady_clock::time_point now) {
  lease_.check(session_count(), now);
  // Kept libraries go after their idle timeout, and all of them once the primary context is
  // released (no client for --context-idle-timeout): at rest nothing is kept.
  const UnloadedImages unloaded =
      lease_.held() ? images_.unload_unused(now) : images_.unload_all_unused();
  if (unloaded.libraries != 0) {
    log_info("unloaded {} shared library image(s) ({}) that no client held {}", unloaded.libraries,
             format_bytes(unloaded.bytes),
             lease_.held() ? fmt::format("for {} s", settings_.image_idle_timeout.count())
                           : std::string("since the primary context's release"));
    heap_trimmer_.memory_freed();
  }
  if (std::uint64_t released = heap_trimmer_.maybe_trim(now); released >= kTrimLogBytes) {
    log_info("gave {} of heap that finished sessions left back to the system",
             format_bytes(released));
  }
}

namespace {

// MPSSHIM_SERVER_IDLE=
//   "SPIN,YIELD,PENDING_YIELD,PENDING_NAP[,PARK_AT_ONCE_AFTER[,CROWDED_PENDING_WAIT]]"
// (microseconds, a count of spells, microseconds): the workers' idle strategy, for measuring
// what it costs (docs/environment.md); unset or malformed: the defaults.
BackoffIdleStrategy::Config idle_config() {
  BackoffIdleStrategy::Config config;
  const char* text = std::getenv("MPSSHIM_SERVER_IDLE");
  if (text == nullptr || *text == '\0') return config;
  long us[4];
  long after = config.park_at_once_after;
  long crowded_wait =
      std::chrono::duration_cast<std::chrono::microseconds>(config.crowded_pending_wait).count();
  int fields = std::sscanf(text, "%ld,%ld,%ld,%ld,%ld,%ld", &us[0], &us[1], &us[2], &us[3], &after,
                           &crowded_wait);
  if (fields < 4 || us[0] < 0 || us[1] < 0 || us[2] < 0 || us[3] <= 0 || after < 0 ||
      after > 1000 || crowded_wait < 0) {
    log_warn(
        "MPSSHIM_SERVER_IDLE=\"{}\" is not SPIN,YIELD,PENDING_YIELD,PENDING_NAP in "
        "microseconds[,PARK_AT_ONCE_AFTER spells (0 to 1000)[,CROWDED_PENDING_WAIT in "
        "microseconds]]; the defaults apply",
        text);
    return config;
  }
  config.spin = std::chrono::microseconds(us[0]);
  config.yield = std::chrono::microseconds(us[1]);
  config.pending_yield = std::chrono::microseconds(us[2]);
  config.pending_nap = std::chrono::microseconds(us[3]);
  config.park_at_once_after = static_cast<unsigned>(after);
  config.crowded_pending_wait = std::chrono::microseconds(crowded_wait);
  log_info(
      "worker idle strategy: spin {} us, yield {} us, with GPU work owed yield {} us then "
      "naps of {} us (on a crowded server naps after {} us); {} (MPSSHIM_SERVER_IDLE)",
      us[0], us[1], us[2], us[3], crowded_wait,
      after == 0
          ? std::string("never parks at once")
          : "parks at once after " + std::to_string(after) + " long watched spells in a row");
  return config;
}

// MPSSHIM_SERVER_DOZE="DOZE_AFTER,DOZE,SPELLS" (microseconds, microseconds, a count) or "off":
// when a worker whose clients trickle records dozes (idle_strategy.hpp), for measuring it
// (docs/environment.md); unset or malformed: the defaults.
void read_doze_config(BackoffIdleStrategy::Config& config) {
  const char* text = std::getenv("MPSSHIM_SERVER_DOZE");
  if (text == nullptr || *text == '\0') return;
  if (std::string_view(text) == "off") {
    config.doze_after_spells = 0;
    log_info("workers never doze (MPSSHIM_SERVER_DOZE=off)");
    return;
  }
  long after = -1, nap = -1, spells = -1;
  char tail = 0;
  if (std::sscanf(text, "%ld,%ld,%ld%c", &after, &nap, &spells, &tail) != 3 || after < 0 ||
      nap <= 0 || nap > 1'000'000'000 || spells < 0 || spells > 1000) {
    log_warn(
        "MPSSHIM_SERVER_DOZE=\"{}\" is not DOZE_AFTER,DOZE in microseconds (DOZE 1 to "
        "1000000000),SPELLS (0 to 1000) or off; the defaults apply",
        text);
    return;
  }
  config.doze_after = std::chrono::microseconds(after);
  config.doze = std::chrono::microseconds(nap);
  config.doze_after_spells = static_cast<unsigned>(spells);
  log_info(
      "workers doze after {} us of a spell owing nothing, for at most {} us, once {} such spells "
      "in a row lasted that long (MPSSHIM_SERVER_DOZE)",
      after, nap, spells);
}

}  // namespace

int Server::run(const std::atomic<bool>& stop) {
  BackoffIdleStrategy::Config idle = idle_config();
  read_doze_config(idle);
  const std::optional<std::chrono::nanoseconds> slack =
      worker_timer_slack(std::getenv("MPSSHIM_SERVER_TIMER_SLACK"));
  for (auto& worker : workers_) {
    worker->start(std::make_unique<BackoffIdleStrategy>(idle), slack);
  }
  log_info("{} worker thread(s) serve the clients", workers_.size());
  int code = 0;
  while (!finished()) {
    if (stop.load(std::memory_order_relaxed) && !stopping_) shutdown("asked to stop");
    if (faulted()) {
      finish_fault();  // returns only when a test replaced the fatal handler
      code = kExitGpuFault;
      break;
    }
    look_after_memory(std::chrono::steady_clock::now());
    arbitrate_memory(std::chrono::steady_clock::now());
    // A want is posted with a wake; clients the policies suspended are looked at often.
    poll_control(memory_policy_busy() ? std::chrono::nanoseconds(kPolicyLook)
                                      : std::chrono::nanoseconds(-1));
  }
  for (auto& worker : workers_) worker->stop();
  if (code == 0) lease_.release("the server stops");
  return code;
}

}  // namespace mpsshim::server
