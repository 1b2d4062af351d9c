// One client session with one GPU's server: the socket, the shared segment, the request ring,
// the reply slots and the staging chunks. Every thread of the process shares it; the ring has
// one producer at a time (a process-local mutex orders the threads, which also preserves the
// order the application gave its threads with its own locks).
#pragma once

#include <boost/interprocess/mapped_region.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "libshim/answer_trace.hpp"
#include "libshim/api.hpp"
#include "proto/control.hpp"
#include "proto/ops.hpp"
#include "proto/segment.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::shim {

class Session {
 public:
  // Attaches to the server of `visible_ordinal` through the daemon at `socket_path`.
  static CUresult attach(const std::string& socket_path, const proto::ClientHello& hello,
                         std::unique_ptr<Session>& out);
  ~Session();

  int sm_count() const { return welcome_.sm_count; }
  std::uint64_t memory_limit() const { return welcome_.memory_limit; }
  std::uint32_t client_id() const { return welcome_.client_id; }

  // A request answered in a reply slot. `reply` receives up to reply_bytes of the payload.
  CUresult call(proto::Op op, const void* request, std::size_t request_bytes,
                std::span<const std::byte> trailing, void* reply, std::size_t reply_bytes,
                std::uint16_t flags = 0);
  template <typename Req, typename Rep>
  CUresult call(proto::Op op, const Req& request, Rep* reply) {
    return call(op, &request, sizeof request, {}, reply, reply ? sizeof(Rep) : 0);
  }

  // A one-way request. Its errors surface later through take_async_error().
  CUresult post(proto::Op op, const void* request, std::size_t request_bytes,
                std::span<const std::byte> trailing = {}, std::uint16_t flags = 0);
  template <typename Req>
  CUresult post(proto::Op op, const Req& request) {
    return post(op, &request, sizeof request);
  }

  // Reserves a record of `payload` bytes and hands the caller the space to fill in place (the
  // launch path writes arguments straight into the ring). Holds the producer lock until
  // commit_record(), which stamps the record's send time and publishes it; returns nullptr (lock
  // released) when the session is dead.
  std::byte* begin_record(proto::Op op, std::uint32_t payload, std::uint16_t flags = 0);
  // Returns when it committed (CLOCK_MONOTONIC ns) under MPSSHIM_TRACE_ANSWERS, else 0.
  // `awaited`: the caller waits for the server's answer next (a call); a one-way record does
  // not wake a dozing worker (proto::kConsumerDozing), which collects it when its doze ends.
  std::uint64_t commit_record(bool awaited = false);
  // How many records this process has sent so far, one-way or not (counted at each commit, under
  // the producer lock). Unchanged between two looks: nothing was sent in between.
  std::uint64_t records_committed() const {
    return records_committed_.load(std::memory_order_acquire);
  }

  // Sends a descriptor the next record refers to by token.
  CUresult send_fd(proto::MessageKind kind, int fd, std::uint64_t bytes, std::uint32_t& token);
  // Receives the descriptor the server sent on the socket before answering a call (kPeerExport).
  // The caller holds fd_receive_mutex() from before that call until here, so that two threads
  // never take each other's descriptors.
  CUresult receive_fd(proto::MessageKind kind, proto::UniqueFd& out);
  std::mutex& fd_receive_mutex() { return fd_receive_mutex_; }

  // The first error of a one-way call since the last look, or the session's sticky fault.
  CUresult take_async_error();
  CUresult fault() const;
  // True once the server is gone or the session faulted (polls the socket: not for hot paths).
  bool gone() { return peer_gone(); }
  const proto::SegmentView& view() const { return view_; }

  // Staging chunks for pageable copies.
  struct Chunk {
    std::uint32_t index;
    std::uint32_t generation;
    std::byte* data;
  };
  // Takes a chunk for this thread once the previous copy through it has finished; the chunk's
  // generation is the one the next copy through it will complete.
  CUresult acquire_chunk(Chunk& out);
  // Records that a copy with chunk.generation was posted (so later users wait for it).
  void chunk_posted(const Chunk& chunk) { chunk_generation_[chunk.index] = chunk.generation; }
  // Waits until the server finished the copy that used `chunk`, and returns its result.
  CUresult wait_chunk(const Chunk& chunk);
  // Lets other threads take the chunk (after its data was copied out, or once posted).
  void release_chunk(const Chunk& chunk);
  std::uint64_t chunk_bytes() const { return view_.geometry.chunk_bytes; }
  std::uint32_t chunk_count() const { return view_.geometry.chunk_count; }

 private:
  Session() = default;
  bool peer_gone();
  // peer_gone() for a producer waiting for ring space; wakes a dozing worker first.
  bool ring_full_gone();
  void ring_doorbell();
  // Rings the doorbell when the worker announced its sleep (RingControl::consumer_waiting), and
  // takes the announcement back, so that the records that follow before the worker is up (an
  // early answer's caller launching again at once, the process's other threads) ring no more:
  // one eventfd write per sleep instead of one per record.
  void wake_sleeping_worker();
  // Before a wait for the server's work that no call of this thread asked for (a staged copy's
  // chunk, ring space): a dozing worker would collect the record only when its doze ends.
  void wake_dozing_worker();
  // The server's hint that waiting threads should not spin long (proto::SessionControl).
  // proto::SessionControl::crowded: 0, proto::kCrowded or proto::kCrowdedPastCpus.
  std::uint32_t crowded() const { return view_.control()->crowded.load(std::memory_order_relaxed); }
  // How a wait for a slot's answer ended: the answer came, or (early answers) the call's fence
  // landed first; else the session is dead.
  enum class SlotEnd { kAnswered, kLanded };
  CUresult wait_slot(proto::ResponseSlot* slot, std::uint16_t op, SlotEnd& end,
                     std::chrono::nanoseconds& slept);
  // One look of a spinning wait at its slot's fence watch (proto::ResponseSlot::watch): true
  // when the named fence has landed. Then rings the doorbell if the worker sleeps, once per
  // watch (`rung`), so the worker sleeps through the GPU's work instead of polling it.
  bool look_at_watch(const proto::ResponseSlot& slot, std::uint64_t& rung);
  CUresult wait_generation(proto::ChunkState* state, std::uint32_t generation);
  CUresult dead_result() const;
  // Logs once that the server's sticky fault `fault` ends this session, naming the client whose
  // work returned it first (its likely cause) as the server recorded.
  void note_fault(std::uint32_t fault) const;
  std::uint32_t acquire_slot();
  void release_slot(std::uint32_t index);
  // A slot whose call returned on an early answer: back in circulation once the server's answer
  // has come (reclaim_owed_locked, under slot_mutex_).
  void owe_slot(std::uint32_t index);
  void reclaim_owed_locked();

  proto::UniqueFd socket_;
  proto::UniqueFd doorbell_;
  boost::interprocess::mapped_region mapping_;
  proto::SegmentView view_;
  // The watch page (ABI 1.28): the session's host-fence words, mapped read-only; nullptr from
  // an older server.
  boost::interprocess::mapped_region watch_mapping_;
  const std::uint32_t* watch_words_ = nullptr;
  // The server's watches are early answers (ABI 1.29): a call returns when its fence lands.
  bool early_answers_ = false;
  proto::SessionWelcome welcome_{};

  std::mutex producer_mutex_;
  proto::RingProducer producer_;
  std::byte* open_record_ = nullptr;  // the record between begin_record and commit_record
  std::atomic<std::uint64_t> records_committed_{0};  // written under producer_mutex_
  // MPSSHIM_TRACE_ANSWERS (answer_trace.hpp): the trace (nullptr: off, the usual case; looked
  // up once, so the launch path pays one load), and when the last kernel launch was committed
  // (written under producer_mutex_, read by threads that trace an answer).
  AnswerTrace* const trace_ = AnswerTrace::get();
  std::atomic<std::uint64_t> last_launch_commit_ns_{0};

  std::mutex slot_mutex_;
  std::condition_variable slot_freed_;
  std::uint64_t free_slots_ = 0;  // bit i set = slot i free (slot_count <= 64)
  std::uint64_t owed_slots_ = 0;  // bit i set = slot i awaits the answer to an early-answered call

  std::mutex chunk_mutex_;
  std::uint32_t next_chunk_ = 0;
  std::vector<std::uint32_t> chunk_generation_;  // last generation issued per chunk
  std::vector<bool> chunk_held_;

  std::mutex fd_receive_mutex_;
  std::atomic<std::uint32_t> next_token_{1};
  std::atomic<bool> dead_{false};
  mutable std::atomic<bool> fault_noted_{false};
};

}  // namespace mpsshim::shim
