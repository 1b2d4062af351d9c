#include "broker/server/session/host_callbacks.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/log.hpp"
#include "proto/futex.hpp"

namespace mpsshim::server {
namespace {

// A waiting host function looks at the session's state this often, whatever the client does.
constexpr std::uint64_t kWaitSliceNs = 50'000'000;
constexpr auto kSlowCallback = std::chrono::seconds(10);

}  // namespace

std::shared_ptr<HostCallbackChannel> HostCallbackChannel::open(int memfd,
                                                               const proto::SegmentHeader& geometry,
                                                               int client_socket, std::string who,
                                                               std::string* error) {
  if (geometry.callback_cell_count == 0) {
    *error = "the session segment has no host-callback cells";
    return nullptr;
  }
  proto::UniqueFd socket_copy(::fcntl(client_socket, F_DUPFD_CLOEXEC, 0));
  if (!socket_copy) {
    *error = fmt::format("duplicating its socket: {}", std::strerror(errno));
    return nullptr;
  }
  const std::size_t bytes = proto::callback_region_bytes(geometry.callback_cell_count);
  void* at = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd,
                    static_cast<off_t>(geometry.callbacks_offset));
  if (at == MAP_FAILED) {
    *error = fmt::format("mapping its host-callback cells: {}", std::strerror(errno));
    return nullptr;
  }
  std::shared_ptr<HostCallbackChannel> channel(new HostCallbackChannel());
  channel->mapping_ = at;
  channel->mapping_bytes_ = bytes;
  channel->control_ = static_cast<proto::HostCallbackControl*>(at);
  channel->cells_ = reinterpret_cast<proto::HostCallbackCell*>(static_cast<std::byte*>(at) +
                                                               sizeof(proto::HostCallbackControl));
  channel->cell_count_ = geometry.callback_cell_count;
  channel->control_->cell_count = geometry.callback_cell_count;
  channel->tickets_.assign(geometry.callback_cell_count, 0);
  channel->who_ = std::move(who);
  channel->client_socket_ = std::move(socket_copy);
  return channel;
}

HostCallbackChannel::~HostCallbackChannel() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
}

std::uint32_t HostCallbackChannel::acquire_cell() {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (ended()) return kNoCell;
    for (std::uint32_t i = 0; i < cell_count_; ++i) {
      if (tickets_[i] != 0) continue;
      if (++next_ticket_ == 0) next_ticket_ = 1;  // 0 means "free" and "never used"
      tickets_[i] = next_ticket_;
      return i;
    }
    // More host functions wait at once than there are cells: one frees within a callback.
    cell_freed_.wait_for(lock, std::chrono::nanoseconds(kWaitSliceNs));
  }
}

void HostCallbackChannel::release_cell(std::uint32_t cell) {
  {
    std::lock_guard lock(mutex_);
    tickets_[cell] = 0;
  }
  cell_freed_.notify_one();
}

void HostCallbackChannel::run(std::uint64_t callback_id, CUresult status, std::uint32_t flags) {
  const std::uint32_t cell = acquire_cell();
  if (cell == kNoCell) return;
  std::uint32_t ticket;
  {
    std::lock_guard lock(mutex_);
    ticket = tickets_[cell];
  }
  proto::HostCallbackCell& c = cells_[cell];
  c.callback_id = callback_id;
  c.status = static_cast<std::int32_t>(status);
  c.flags = flags;
  // Publish: the client reads id, status and flags after it sees the ticket (acquire).
  c.requested.store(ticket, std::memory_order_seq_cst);
  control_->posted.fetch_add(1, std::memory_order_seq_cst);
  proto::futex_wake(&control_->posted);

  const auto started = std::chrono::steady_clock::now();
  bool warned = false;
  for (;;) {
    const std::uint32_t seen = c.done.load(std::memory_order_acquire);
    if (seen == ticket || ended()) break;
    if (client_hung_up()) {
      end();  // the callback will never run: every host function of the client goes on
      break;
    }
    proto::futex_wait(&c.done, seen, kWaitSliceNs);
    if (!warned && std::chrono::steady_clock::now() - started > kSlowCallback) {
      warned = true;
      log_warn(
          "{}: one of its host functions has run for more than 10 s; the stream waits, and "
          "the driver's callback thread is held until it returns",
          who_);
    }
  }
  release_cell(cell);
}

bool HostCallbackChannel::client_hung_up() const {
  pollfd watch{client_socket_.get(), POLLRDHUP, 0};
  return ::poll(&watch, 1, 0) == 1 && (watch.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
}

void HostCallbackChannel::end() {
  std::lock_guard lock(mutex_);
  ended_.store(true, std::memory_order_seq_cst);
  for (std::uint32_t i = 0; i < cell_count_; ++i) {
    if (tickets_[i] == 0) continue;
    // Answered on the client's behalf, so a host function about to sleep does not.
    cells_[i].done.store(tickets_[i], std::memory_order_seq_cst);
    proto::futex_wake(&cells_[i].done);
  }
  cell_freed_.notify_all();
}

void HostCallbackChannel::keep(std::unique_ptr<Call> call) {
  std::lock_guard lock(mutex_);
  kept_.push_back(std::move(call));
}

void HostCallbackChannel::drop_kept() {
  std::vector<std::unique_ptr<Call>> kept;
  {
    std::lock_guard lock(mutex_);
    kept.swap(kept_);
  }
  // Each kept call holds the channel: dropping them outside the lock may free it.
}

std::size_t HostCallbackChannel::held() const {
  std::lock_guard lock(mutex_);
  return one_shot_held_.load(std::memory_order_relaxed) + kept_.size();
}

std::size_t HostCallbackChannel::waiting() const {
  std::lock_guard lock(mutex_);
  std::size_t n = 0;
  for (std::uint32_t t : tickets_) n += t != 0 ? 1 : 0;
  return n;
}

namespace {

void run_call(void* user_data, CUresult status) {
  auto* call = static_cast<HostCallbackChannel::Call*>(user_data);
  if (call == nullptr) return;
  call->channel->run(call->callback_id, status, call->one_shot ? 0 : proto::kCallbackKeep);
  if (call->one_shot) {
    call->channel->ran_one_shot();
    delete call;
  }
}

}  // namespace

void CUDA_CB run_host_function(void* user_data) {
  run_call(user_data, CUDA_SUCCESS);
}

void CUDA_CB run_stream_callback(CUstream, CUresult status, void* user_data) {
  run_call(user_data, status);
}

}  // namespace mpsshim::server
