#include "libshim/session.hpp"

#include <poll.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "common/log.hpp"
#include "libshim/answer_trace.hpp"
#include "libshim/client.hpp"
#include "libshim/wait_pacer.hpp"
#include "libshim/wait_policy.hpp"
#include "proto/futex.hpp"
#include "proto/memfd_mapping.hpp"

namespace mpsshim::shim {

namespace {

// Sleeps are bounded so a server that died without a word is noticed.
constexpr std::uint64_t kSleepSliceNs = 20'000'000;

enum class SpinEnd { kReady, kSleep, kGone };

// Waits by spinning as `plan` says (wait_policy.hpp): first with a pause instruction, then
// yielding the CPU between looks. kSleep once the plan's spin is used up; kGone if the server
// went away meanwhile (looked at every kPeerCheck, a poll of the socket).
template <typename Ready, typename Gone>
SpinEnd spin_until(const WaitPlan& plan, Ready&& ready, Gone&& gone) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto since_check = std::chrono::nanoseconds(0);
  // Whether the wait may go on at `now`, looking at the server once per kPeerCheck.
  auto server_there = [&](Clock::time_point now) {
    if (now - start - since_check < kPeerCheck) return true;
    since_check = now - start;
    return !gone();
  };
  for (int i = 0;; ++i) {
    if (ready()) return SpinEnd::kReady;
    proto::cpu_relax();
    if ((i & 63) != 63) continue;
    const auto now = Clock::now();
    if (now - start >= plan.busy) break;
    if (!server_there(now)) return SpinEnd::kGone;
  }
  for (;;) {
    if (ready()) return SpinEnd::kReady;
    const auto now = Clock::now();
    if (now - start >= plan.spin_total) return SpinEnd::kSleep;
    if (!server_there(now)) return SpinEnd::kGone;
    sched_yield();
  }
}

}  // namespace

CUresult Session::attach(const std::string& socket_path, const proto::ClientHello& hello,
                         std::unique_ptr<Session>& out) {
  int fd = proto::connect_seqpacket(socket_path);
  if (fd < 0) {
    log_error("cannot reach the mpsshim daemon at {}: {}", socket_path, strerror(-fd));
    return CUDA_ERROR_MPS_CONNECTION_FAILED;
  }
  std::unique_ptr<Session> session(new Session());
  session->socket_.reset(fd);
  if (int err = proto::send_struct(fd, hello); err != 0) {
    log_error("sending the hello to {} failed: {}", socket_path, strerror(err));
    return CUDA_ERROR_MPS_CONNECTION_FAILED;
  }
  proto::Received reply;
  if (int err = proto::receive_message(fd, reply); err != 0 || reply.bytes.empty()) {
    log_error("the mpsshim daemon at {} closed the connection without an answer ({})", socket_path,
              err ? strerror(err) : "hang-up");
    return CUDA_ERROR_MPS_CONNECTION_FAILED;
  }
  proto::HelloHeader header;
  if (reply.bytes.size() < sizeof header) return CUDA_ERROR_MPS_CONNECTION_FAILED;
  std::memcpy(&header, reply.bytes.data(), sizeof header);
  if (header.kind == static_cast<std::uint32_t>(proto::MessageKind::kRefused) &&
      reply.bytes.size() >= sizeof(proto::Refused)) {
    proto::Refused refused;
    std::memcpy(&refused, reply.bytes.data(), sizeof refused);
    refused.message[sizeof refused.message - 1] = '\0';
    log_error("the mpsshim server refused this client: {}", refused.message);
    return refused.cuda_error != 0 ? static_cast<CUresult>(refused.cuda_error)
                                   : CUDA_ERROR_MPS_CONNECTION_FAILED;
  }
  if (header.magic != proto::kHelloMagic || header.abi_major != proto::kAbiMajor ||
      header.kind != static_cast<std::uint32_t>(proto::MessageKind::kSessionWelcome) ||
      reply.bytes.size() < sizeof(proto::SessionWelcome) || reply.fds.size() < 2) {
    log_error(
        "unexpected answer from the mpsshim server (ABI {}.{}, kind {}); this "
        "library speaks ABI {}.{}",
        header.abi_major, header.abi_minor, header.kind, proto::kAbiMajor, proto::kAbiMinor);
    return CUDA_ERROR_MPS_CONNECTION_FAILED;
  }
  std::memcpy(&session->welcome_, reply.bytes.data(), sizeof session->welcome_);
  session->doorbell_ = std::move(reply.fds[1]);

  struct stat st {};
  int memfd = reply.fds[0].get();
  if (fstat(memfd, &st) != 0 ||
      static_cast<std::uint64_t>(st.st_size) != session->welcome_.segment_bytes) {
    log_error("the session segment has the wrong size");
    return CUDA_ERROR_MPS_CONNECTION_FAILED;
  }
  auto mapping = proto::map_fd(memfd, session->welcome_.segment_bytes, true);
  if (!mapping) {
    log_error("mapping the session segment ({} bytes) failed: {}", session->welcome_.segment_bytes,
              strerror(errno));
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  session->mapping_ = std::move(*mapping);
  session->view_.base = static_cast<std::byte*>(session->mapping_.get_address());
  std::memcpy(&session->view_.geometry, session->view_.base, sizeof(proto::SegmentHeader));
  const proto::SegmentHeader& g = session->view_.geometry;
  if (!proto::segment_header_valid(g, session->welcome_.segment_bytes) || g.slot_count > 64) {
    log_error("the server sent a session segment this library cannot use");
    return CUDA_ERROR_MPS_CONNECTION_FAILED;
  }
  if (reply.fds.size() >= 3) {
    // The server leaves synchronizes to this client's watch of their fences: a page it cannot
    // read would leave them unanswered for milliseconds, so the session does not start.
    constexpr std::size_t kWatchPageBytes = proto::kWatchPageWords * sizeof(std::uint32_t);
    struct stat page {};
    if (fstat(reply.fds[2].get(), &page) != 0 ||
        static_cast<std::size_t>(page.st_size) != kWatchPageBytes) {
      log_error("the session's watch page is not one page ({} bytes)",
                static_cast<long long>(page.st_size));
      return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    auto watch = proto::map_fd(reply.fds[2].get(), kWatchPageBytes, false);
    if (!watch) {
      log_error("mapping the session's watch page read-only failed");
      return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    session->watch_mapping_ = std::move(*watch);
    session->watch_words_ =
        static_cast<const std::uint32_t*>(session->watch_mapping_.get_address());
    session->early_answers_ = config().early_answers &&
                              session->welcome_.header.abi_minor >= proto::kAbiMinorEarlyAnswers;
  }
  session->producer_ = proto::RingProducer(session->view_.ring(), g.ring_capacity);
  session->free_slots_ =
      g.slot_count == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << g.slot_count) - 1;
  session->chunk_generation_.assign(g.chunk_count, 0);
  session->chunk_held_.assign(g.chunk_count, false);
  out = std::move(session);
  return CUDA_SUCCESS;
}

Session::~Session() = default;

bool Session::ring_full_gone() {
  // The ring is full: a dozing worker takes nothing from it until it is woken.
  wake_dozing_worker();
  return peer_gone();
}

bool Session::peer_gone() {
  if (dead_.load(std::memory_order_relaxed)) return true;
  if (view_.control()->fault.load(std::memory_order_acquire) != 0) return true;
  pollfd p{socket_.get(), POLLRDHUP, 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0) {
    if (!dead_.exchange(true)) {
      log_error("the mpsshim server for this GPU went away; CUDA calls now fail");
    }
    return true;
  }
  return false;
}

CUresult Session::dead_result() const {
  if (std::uint32_t f = view_.control()->fault.load(std::memory_order_acquire); f != 0) {
    note_fault(f);
    return static_cast<CUresult>(f);
  }
  return CUDA_ERROR_MPS_CONNECTION_FAILED;
}

CUresult Session::fault() const {
  if (dead_.load(std::memory_order_relaxed)) return dead_result();
  std::uint32_t f = view_.control()->fault.load(std::memory_order_relaxed);
  if (f != 0) note_fault(f);
  return static_cast<CUresult>(f);
}

void Session::note_fault(std::uint32_t fault) const {
  if (fault_noted_.exchange(true, std::memory_order_relaxed)) return;
  // The server wrote the culprit before it stored the fault word we loaded.
  std::atomic_thread_fence(std::memory_order_acquire);
  const proto::SessionControl* control = view_.control();
  const auto pid = static_cast<pid_t>(control->fault_pid);
  char program[sizeof control->fault_program + 1] = {};
  std::memcpy(program, control->fault_program, sizeof control->fault_program);
  const char* name = nullptr;
  if (cuGetErrorName(static_cast<CUresult>(fault), &name) != CUDA_SUCCESS) name = nullptr;
  std::string cause;
  if (pid == ::getpid()) {
    cause =
        fmt::format("; this process's own work ({}) returned it first: its likely cause", program);
  } else if (pid != 0) {
    cause = fmt::format(
        "; the work of another client, pid {} ({}), returned it first: its likely cause", pid,
        program);
  }
  log_error(
      "the mpsshim server of this GPU had a GPU fault ({}){}. A fault ends every client of "
      "that server: this process's CUDA calls on the GPU now fail with it",
      name != nullptr ? name : std::to_string(fault), cause);
}

CUresult Session::take_async_error() {
  if (CUresult f = fault(); f != CUDA_SUCCESS) return f;
  auto* control = view_.control();
  if (control->async_error.load(std::memory_order_relaxed) == 0) return CUDA_SUCCESS;
  return static_cast<CUresult>(control->async_error.exchange(0, std::memory_order_acq_rel));
}

void Session::ring_doorbell() {
  std::uint64_t one = 1;
  // A full eventfd counter (never in practice) still wakes the server: ignore EAGAIN.
  [[maybe_unused]] ssize_t n = ::write(doorbell_.get(), &one, sizeof one);
}

void Session::wake_sleeping_worker() {
  // Taken back before the ring, so that every announcement cleared here is followed by a ring:
  // the worker wakes, and reads the whole ring, however many records came meanwhile.
  if (view_.ring()->consumer_waiting.exchange(0, std::memory_order_seq_cst) != 0) ring_doorbell();
}

void Session::wake_dozing_worker() {
  // The caller's record was committed behind a seq_cst fence: the worker's re-check after it
  // announced the doze sees the record, or this sees the announcement.
  if (view_.ring()->consumer_waiting.load(std::memory_order_seq_cst) == proto::kConsumerDozing) {
    wake_sleeping_worker();
  }
}

std::byte* Session::begin_record(proto::Op op, std::uint32_t payload, std::uint16_t flags) {
  std::uint32_t bytes = proto::record_bytes(payload);
  producer_mutex_.lock();
  if (bytes > producer_.max_record()) {
    producer_mutex_.unlock();
    return nullptr;
  }
  std::byte* at = producer_.reserve(bytes, [this] { return ring_full_gone(); });
  if (at == nullptr) {
    producer_mutex_.unlock();
    return nullptr;
  }
  proto::RecordHeader header{bytes, static_cast<std::uint16_t>(op), flags, proto::kNoReply, 0};
  std::memcpy(at, &header, sizeof header);
  open_record_ = at;
  return at + sizeof header;
}

std::uint64_t Session::commit_record(bool awaited) {
  proto::stamp_record(open_record_);
  std::uint64_t committed_ns = 0;
  if (trace_ != nullptr) {
    committed_ns = AnswerTrace::now_ns();
    proto::RecordHeader header;
    std::memcpy(&header, open_record_, sizeof header);
    if (header.opcode == static_cast<std::uint16_t>(proto::Op::kLaunchKernel)) {
      last_launch_commit_ns_.store(committed_ns, std::memory_order_relaxed);
    }
  }
  bool wake = producer_.commit(awaited);
  records_committed_.store(records_committed_.load(std::memory_order_relaxed) + 1,
                           std::memory_order_release);
  producer_mutex_.unlock();
  if (wake) wake_sleeping_worker();
  return committed_ns;
}

CUresult Session::post(proto::Op op, const void* request, std::size_t request_bytes,
                       std::span<const std::byte> trailing, std::uint16_t flags) {
  if (dead_.load(std::memory_order_relaxed)) return dead_result();
  std::byte* at =
      begin_record(op, static_cast<std::uint32_t>(request_bytes + trailing.size()), flags);
  if (at == nullptr) return dead_.load() ? dead_result() : CUDA_ERROR_INVALID_VALUE;
  std::memcpy(at, request, request_bytes);
  if (!trailing.empty()) std::memcpy(at + request_bytes, trailing.data(), trailing.size());
  commit_record();
  return CUDA_SUCCESS;
}

std::uint32_t Session::acquire_slot() {
  // An owed slot comes back by itself when the server's late answer lands, with no one to
  // notify: while every slot is taken and some are owed, the wait looks again every 20 us.
  constexpr auto kOwedLook = std::chrono::microseconds(20);
  std::unique_lock lock(slot_mutex_);
  for (;;) {
    if (owed_slots_ != 0) reclaim_owed_locked();
    if (free_slots_ != 0) break;
    if (owed_slots_ != 0) {
      slot_freed_.wait_for(lock, kOwedLook);
    } else {
      slot_freed_.wait(lock);
    }
  }
  std::uint32_t index = static_cast<std::uint32_t>(__builtin_ctzll(free_slots_));
  free_slots_ &= ~(std::uint64_t{1} << index);
  return index;
}

void Session::owe_slot(std::uint32_t index) {
  std::lock_guard lock(slot_mutex_);
  owed_slots_ |= std::uint64_t{1} << index;
}

void Session::reclaim_owed_locked() {
  for (std::uint64_t owed = owed_slots_; owed != 0; owed &= owed - 1) {
    const auto index = static_cast<std::uint32_t>(__builtin_ctzll(owed));
    proto::ResponseSlot* slot = view_.slot(index);
    if (slot->state.load(std::memory_order_acquire) != proto::kSlotReady) continue;
    slot->state.store(proto::kSlotIdle, std::memory_order_relaxed);
    owed_slots_ &= ~(std::uint64_t{1} << index);
    free_slots_ |= std::uint64_t{1} << index;
  }
}

void Session::release_slot(std::uint32_t index) {
  {
    std::lock_guard lock(slot_mutex_);
    free_slots_ |= std::uint64_t{1} << index;
  }
  slot_freed_.notify_one();
}

bool Session::look_at_watch(const proto::ResponseSlot& slot, std::uint64_t& rung) {
  const std::uint64_t watch = slot.watch.load(std::memory_order_relaxed);
  if (!proto::watch_set(watch) || watch_words_ == nullptr) return false;
  // Rung already, and the landing ends nothing without early answers: no more loads.
  if (watch == rung && !early_answers_) return false;
  const std::uint32_t word = proto::watch_word(watch);
  if (word >= proto::kWatchPageWords) return false;
  // The GPU's write, then the worker's announced sleep: the worker announces, fences, then
  // looks at the word, so when it missed the write this sees the announcement.
  if (__atomic_load_n(&watch_words_[word], __ATOMIC_SEQ_CST) != proto::watch_value(watch)) {
    return false;
  }
  if (watch != rung && view_.ring()->consumer_waiting.load(std::memory_order_seq_cst) != 0) {
    rung = watch;
    wake_sleeping_worker();
  }
  return true;
}

CUresult Session::wait_slot(proto::ResponseSlot* slot, std::uint16_t op, SlotEnd& end,
                            std::chrono::nanoseconds& slept) {
  // Each thread paces its own waits: its calls' history is its own.
  thread_local WaitPacer pacer;
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t rung = 0;
  end = SlotEnd::kAnswered;
  slept = std::chrono::nanoseconds(0);
  auto ready = [&] {
    if (slot->state.load(std::memory_order_acquire) == proto::kSlotReady) return true;
    if (!look_at_watch(*slot, rung) || !early_answers_) return false;
    // The call's GPU work is done, so its answer will be CUDA_SUCCESS: it returns now, unless
    // the session faulted meanwhile (the server then answers everything with the fault).
    if (view_.control()->fault.load(std::memory_order_acquire) != 0) return false;
    end = SlotEnd::kLanded;
    return true;
  };
  auto answered = [&] {
    pacer.record(op, std::chrono::steady_clock::now() - start);
    return CUDA_SUCCESS;
  };
  WaitPlan plan = current_wait_plan(crowded());
  if (plan.paced && config().wait_pacing) {
    // Slept in slices, so a server that died is noticed as while spinning.
    for (auto left = pacer.sleep_before(op); left > std::chrono::nanoseconds(0);
         left -= kPeerCheck) {
      const auto slice = std::min(left, std::chrono::nanoseconds(kPeerCheck));
      sleep_precisely(slice);
      slept += slice;
      if (ready()) return answered();
      if (peer_gone()) return dead_result();
    }
    plan = after_paced_sleep(plan, slept);
  }
  const SpinEnd spun = spin_until(plan, ready, [this] { return peer_gone(); });
  if (spun == SpinEnd::kReady) return answered();
  if (spun == SpinEnd::kGone) return dead_result();
  for (bool first = true;; first = false) {
    slot->waiter.store(1, std::memory_order_seq_cst);
    if (ready()) break;
    // A sleeping thread watches nothing: a worker that left this answer to the watch and
    // sleeps is woken to poll instead. It stores the watch, announces its sleep, fences, then
    // looks at `waiter`: it sees this thread's sleep, or this sees its announcement.
    if (first && proto::watch_set(slot->watch.load(std::memory_order_seq_cst)) &&
        view_.ring()->consumer_waiting.load(std::memory_order_seq_cst) != 0) {
      wake_sleeping_worker();
    }
    proto::futex_wait(&slot->state, proto::kSlotPending, kSleepSliceNs);
    if (ready()) break;
    if (peer_gone()) return dead_result();
  }
  slot->waiter.store(0, std::memory_order_relaxed);
  return answered();
}

CUresult Session::call(proto::Op op, const void* request, std::size_t request_bytes,
                       std::span<const std::byte> trailing, void* reply, std::size_t reply_bytes,
                       std::uint16_t flags) {
  if (dead_.load(std::memory_order_relaxed)) return dead_result();
  std::uint32_t index = acquire_slot();
  proto::ResponseSlot* slot = view_.slot(index);
  slot->waiter.store(0, std::memory_order_relaxed);
  slot->watch.store(0, std::memory_order_relaxed);
  slot->state.store(proto::kSlotPending, std::memory_order_relaxed);

  std::uint32_t bytes = proto::record_bytes(request_bytes + trailing.size());
  CUresult rc = CUDA_SUCCESS;
  producer_mutex_.lock();
  std::byte* at = bytes <= producer_.max_record()
                      ? producer_.reserve(bytes, [this] { return ring_full_gone(); })
                      : nullptr;
  if (at == nullptr) {
    producer_mutex_.unlock();
    rc = dead_.load() ? dead_result() : CUDA_ERROR_INVALID_VALUE;
  } else {
    proto::RecordHeader header{bytes, static_cast<std::uint16_t>(op), flags, index, 0};
    std::memcpy(at, &header, sizeof header);
    std::memcpy(at + sizeof header, request, request_bytes);
    if (!trailing.empty()) {
      std::memcpy(at + sizeof header + request_bytes, trailing.data(), trailing.size());
    }
    open_record_ = at;
    const std::uint64_t sent = commit_record(/*awaited=*/true);
    SlotEnd end = SlotEnd::kAnswered;
    std::chrono::nanoseconds slept{};
    rc = wait_slot(slot, static_cast<std::uint16_t>(op), end, slept);
    if (trace_ != nullptr && rc == CUDA_SUCCESS) {
      trace_->add(op, last_launch_commit_ns_.load(std::memory_order_relaxed), sent,
                  end == SlotEnd::kLanded ? nullptr : slot, AnswerTrace::now_ns(),
                  static_cast<std::uint64_t>(slept.count()));
    }
    if (rc == CUDA_SUCCESS && end == SlotEnd::kLanded) {
      // An early answer: CUDA_SUCCESS, no payload (proto::ResponseSlot::watch). The slot stays
      // out of circulation until the server's answer comes.
      owe_slot(index);
      return CUDA_SUCCESS;
    }
    if (rc == CUDA_SUCCESS) {
      rc = static_cast<CUresult>(slot->result);
      if (reply != nullptr) {
        std::size_t n = std::min<std::size_t>(
            {reply_bytes, std::size_t{slot->payload_bytes}, std::size_t{proto::kSlotPayloadBytes}});
        std::memcpy(reply, slot->payload, n);
      }
    }
  }
  if (rc == dead_result() && dead_.load()) {
    // The server never answers this slot now: leave it out of circulation.
    return rc;
  }
  slot->state.store(proto::kSlotIdle, std::memory_order_relaxed);
  release_slot(index);
  return rc;
}

CUresult Session::send_fd(proto::MessageKind kind, int fd, std::uint64_t bytes,
                          std::uint32_t& token) {
  token = next_token_.fetch_add(1, std::memory_order_relaxed);
  proto::FdTransfer message{proto::make_header(kind, sizeof(proto::FdTransfer)), token, 0, bytes};
  int fds[1] = {fd};
  if (int err = proto::send_struct(socket_.get(), message, fds); err != 0) {
    log_error("passing a memory descriptor to the server failed: {}", strerror(err));
    return dead_result();
  }
  return CUDA_SUCCESS;
}

CUresult Session::receive_fd(proto::MessageKind kind, proto::UniqueFd& out) {
  proto::Received message;
  proto::FdTransfer transfer{};
  if (int err = proto::receive_message(socket_.get(), message); err != 0 || message.bytes.empty()) {
    log_error("receiving a memory descriptor from the server failed: {}",
              err != 0 ? strerror(err) : "it hung up");
    return dead_result();
  }
  if (message.bytes.size() != sizeof transfer || message.fds.size() != 1) {
    log_error("the server sent a malformed descriptor message ({} bytes, {} fds)",
              message.bytes.size(), message.fds.size());
    return CUDA_ERROR_MPS_RPC_FAILURE;
  }
  std::memcpy(&transfer, message.bytes.data(), sizeof transfer);
  if (transfer.header.magic != proto::kHelloMagic ||
      transfer.header.kind != static_cast<std::uint32_t>(kind)) {
    log_error("the server sent a descriptor of kind {}, expected {}", transfer.header.kind,
              static_cast<std::uint32_t>(kind));
    return CUDA_ERROR_MPS_RPC_FAILURE;
  }
  out = std::move(message.fds[0]);
  return CUDA_SUCCESS;
}

CUresult Session::wait_generation(proto::ChunkState* state, std::uint32_t generation) {
  // At or past: the chunk may already carry a later copy of another thread.
  auto reached = [generation](std::uint32_t done) {
    return static_cast<std::int32_t>(done - generation) >= 0;
  };
  auto done = [state, reached] {
    return reached(state->done_generation.load(std::memory_order_acquire));
  };
  if (done()) return CUDA_SUCCESS;
  wake_dozing_worker();  // the copy's record was one-way
  const SpinEnd spun =
      spin_until(current_wait_plan(crowded()), done, [this] { return peer_gone(); });
  if (spun == SpinEnd::kReady) return CUDA_SUCCESS;
  if (spun == SpinEnd::kGone) return dead_result();
  for (;;) {
    state->waiter.store(1, std::memory_order_seq_cst);
    std::uint32_t seen = state->done_generation.load(std::memory_order_seq_cst);
    if (reached(seen)) break;
    proto::futex_wait(&state->done_generation, seen, kSleepSliceNs);
    if (done()) break;
    if (peer_gone()) return dead_result();
  }
  state->waiter.store(0, std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

CUresult Session::acquire_chunk(Chunk& out) {
  std::uint32_t index;
  {
    std::unique_lock lock(chunk_mutex_);
    std::uint32_t count = view_.geometry.chunk_count;
    for (;;) {
      std::uint32_t i = 0;
      for (; i < count; ++i) {
        std::uint32_t candidate = (next_chunk_ + i) % count;
        if (!chunk_held_[candidate]) break;
      }
      if (i < count) {
        index = (next_chunk_ + i) % count;
        break;
      }
      // Every chunk is held by some thread; they are released within a copy's time.
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
    next_chunk_ = (index + 1) % count;
    chunk_held_[index] = true;
  }
  proto::ChunkState* state = view_.chunk_state(index);
  if (CUresult rc = wait_generation(state, chunk_generation_[index]); rc != CUDA_SUCCESS) {
    release_chunk({index, 0, nullptr});
    return rc;
  }
  out = {index, chunk_generation_[index] + 1, view_.chunk(index)};
  return CUDA_SUCCESS;
}

CUresult Session::wait_chunk(const Chunk& chunk) {
  proto::ChunkState* state = view_.chunk_state(chunk.index);
  if (CUresult rc = wait_generation(state, chunk.generation); rc != CUDA_SUCCESS) return rc;
  return static_cast<CUresult>(state->result.load(std::memory_order_relaxed));
}

void Session::release_chunk(const Chunk& chunk) {
  std::lock_guard lock(chunk_mutex_);
  chunk_held_[chunk.index] = false;
}

}  // namespace mpsshim::shim
