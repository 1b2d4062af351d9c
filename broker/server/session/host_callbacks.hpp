// Host functions (cuLaunchHostFunc, cuStreamAddCallback) run in the CLIENT, in stream order.
//
// The server queues a host function of its own on the client's real stream. When the driver
// runs it (on the driver's callback thread, never the server loop), it publishes the client's
// callback id in a cell of the session segment (proto/segment.hpp), wakes the client's callback
// thread, and waits until the client reports the callback done, so the stream goes on only
// after the client's callback returned. Session end releases every waiting host function at
// once, and so does the client's death, seen on the channel's own copy of the client's socket:
// the worker that would end the session may itself be waiting for the stream (a cuMemFree of any
// client synchronizes the device), so a host function must not wait for the worker to notice. The
// channel is shared with every queued host function, so it (and its own mapping of the cells)
// outlives the session for as long as the driver may still run one.
#pragma once

#include <cuda.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "proto/segment.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::server {

class HostCallbackChannel {
 public:
  // Maps the callback region of the session's memfd on its own and keeps a duplicate of the
  // client's socket to see its hang-up. nullptr when the segment has no callback cells or the
  // mapping or the duplicate fails (*error says why).
  static std::shared_ptr<HostCallbackChannel> open(int memfd, const proto::SegmentHeader& geometry,
                                                   int client_socket, std::string who,
                                                   std::string* error);
  ~HostCallbackChannel();
  HostCallbackChannel(const HostCallbackChannel&) = delete;
  HostCallbackChannel& operator=(const HostCallbackChannel&) = delete;

  // On the driver's callback thread: has the client run `callback_id` and waits until it has,
  // until the session ends, or until the client hangs up (then ends the channel). flags:
  // proto::kCallbackKeep for a captured (replayable) call.
  void run(std::uint64_t callback_id, CUresult status, std::uint32_t flags);

  // The session ended: every waiting and every later run() returns at once.
  void end();
  bool ended() const { return ended_.load(std::memory_order_acquire); }

  // Calls the driver may run again and again (captured into a graph) live until drop_kept().
  struct Call;
  void keep(std::unique_ptr<Call> call);
  void drop_kept();  // session free: no stream or graph of the session can run them any more

  std::size_t waiting() const;  // host functions waiting for the client right now (tests)

  // Host functions the driver holds for the session: queued one-shot calls not yet run, and
  // the calls its graphs keep (the per-client cap `host-functions`, client_limits.hpp).
  // queued() is called by the session's worker before it hands the driver a one-shot call;
  // the driver's callback thread counts it off once the call ran.
  void queued() { one_shot_held_.fetch_add(1, std::memory_order_relaxed); }
  void ran_one_shot() { one_shot_held_.fetch_sub(1, std::memory_order_relaxed); }
  std::size_t held() const;

 private:
  HostCallbackChannel() = default;
  std::uint32_t acquire_cell();  // kNoCell once ended
  void release_cell(std::uint32_t cell);
  bool client_hung_up() const;  // a look at client_socket_, never a wait

  static constexpr std::uint32_t kNoCell = 0xffffffffu;

  void* mapping_ = nullptr;
  std::size_t mapping_bytes_ = 0;
  proto::HostCallbackControl* control_ = nullptr;
  proto::HostCallbackCell* cells_ = nullptr;
  std::uint32_t cell_count_ = 0;
  std::string who_;
  proto::UniqueFd client_socket_;  // our own duplicate: the session closes its copy at its end

  mutable std::mutex mutex_;  // server-private: never shared with the client
  std::condition_variable cell_freed_;
  std::vector<std::uint32_t> tickets_;  // ticket of the request in each cell; 0 = free
  std::uint32_t next_ticket_ = 0;
  std::vector<std::unique_ptr<Call>> kept_;
  std::atomic<bool> ended_{false};
  std::atomic<std::size_t> one_shot_held_{0};
};

// The user data of one server host function on the real driver.
struct HostCallbackChannel::Call {
  std::shared_ptr<HostCallbackChannel> channel;
  std::uint64_t callback_id = 0;
  bool one_shot = true;  // freed after it ran; false: captured, run at every graph replay
};

// The functions the driver calls (CUhostFn and CUstreamCallback).
void CUDA_CB run_host_function(void* user_data);
void CUDA_CB run_stream_callback(CUstream stream, CUresult status, void* user_data);

}  // namespace mpsshim::server
