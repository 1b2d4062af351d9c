#include "tests/hostile/wire_client.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <thread>

#include "proto/futex.hpp"

namespace mpsshim::hostile {
namespace {

using Clock = std::chrono::steady_clock;

bool hung_up(int socket) {
  pollfd p{socket, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
}

}  // namespace

proto::ClientHello attach_hello(const char* program) {
  proto::ClientHello hello{};
  hello.header = proto::make_header(proto::MessageKind::kClientAttach, sizeof hello);
  hello.pid = static_cast<std::int32_t>(::getpid());
  hello.device = 0;
  hello.active_thread_percentage = proto::kUnset;
  hello.priority = proto::kUnset;
  std::strncpy(hello.program, program, sizeof hello.program - 1);
  return hello;
}

HelloAnswer send_first_message(const std::string& socket_path, std::span<const std::byte> bytes,
                               std::span<const int> fds) {
  proto::UniqueFd fd(proto::connect_seqpacket(socket_path));
  if (!fd) throw std::runtime_error("cannot connect to " + socket_path);
  HelloAnswer answer;
  if (proto::send_message(fd.get(), bytes, fds) != 0) return answer;
  proto::Received received;
  if (proto::receive_message(fd.get(), received) != 0 ||
      received.bytes.size() < sizeof(proto::HelloHeader)) {
    return answer;
  }
  proto::HelloHeader header;
  std::memcpy(&header, received.bytes.data(), sizeof header);
  answer.kind = header.kind;
  answer.welcomed = header.kind == static_cast<std::uint32_t>(proto::MessageKind::kSessionWelcome);
  if (header.kind == static_cast<std::uint32_t>(proto::MessageKind::kRefused) &&
      received.bytes.size() >= sizeof(proto::Refused)) {
    proto::Refused refused;
    std::memcpy(&refused, received.bytes.data(), sizeof refused);
    answer.cuda_error = refused.cuda_error;
    answer.message.assign(refused.message, ::strnlen(refused.message, sizeof refused.message));
  }
  return answer;
}

WireClient::WireClient(const std::string& socket_path, const char* program) {
  socket_.reset(proto::connect_seqpacket(socket_path));
  if (!socket_) throw std::runtime_error("cannot connect to " + socket_path);
  proto::ClientHello hello = attach_hello(program);
  if (proto::send_struct(socket_.get(), hello) != 0) throw std::runtime_error("hello not sent");
  proto::Received welcome;
  if (proto::receive_message(socket_.get(), welcome) != 0 ||
      welcome.bytes.size() < sizeof(proto::SessionWelcome) || welcome.fds.size() < 2) {
    throw std::runtime_error("no welcome from the server");
  }
  proto::SessionWelcome w;
  std::memcpy(&w, welcome.bytes.data(), sizeof w);
  doorbell_ = std::move(welcome.fds[1]);
  mapping_bytes_ = w.segment_bytes;
  mapping_ =
      ::mmap(nullptr, mapping_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, welcome.fds[0].get(), 0);
  if (mapping_ == MAP_FAILED) throw std::runtime_error("cannot map the segment");
  view_.base = static_cast<std::byte*>(mapping_);
  std::memcpy(&view_.geometry, view_.base, sizeof view_.geometry);
  if (!proto::segment_header_valid(view_.geometry, mapping_bytes_)) {
    throw std::runtime_error("the segment header is not valid");
  }
  producer_ = proto::RingProducer(view_.ring(), view_.geometry.ring_capacity);
}

WireClient::~WireClient() {
  if (mapping_ != nullptr && mapping_ != MAP_FAILED) ::munmap(mapping_, mapping_bytes_);
}

void WireClient::ring_doorbell() {
  std::uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(doorbell_.get(), &one, sizeof one);
}

bool WireClient::post(std::uint16_t opcode, std::span<const std::byte> payload, std::uint32_t slot,
                      std::uint32_t declared_size, std::chrono::milliseconds patience) {
  const std::uint32_t bytes = proto::record_bytes(payload.size());
  const auto deadline = Clock::now() + patience;
  std::byte* at = nullptr;
  while ((at = producer_.try_reserve(bytes)) == nullptr) {
    if (Clock::now() > deadline) return false;
    ring_doorbell();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  proto::RecordHeader header{declared_size != 0 ? declared_size : bytes, opcode, 0, slot, 0};
  std::memcpy(at, &header, sizeof header);
  if (!payload.empty()) std::memcpy(at + sizeof header, payload.data(), payload.size());
  proto::stamp_record(at);
  if (slot != proto::kNoReply && slot < view_.geometry.slot_count) {
    view_.slot(slot)->state.store(proto::kSlotPending, std::memory_order_relaxed);
  }
  if (producer_.commit()) ring_doorbell();
  return true;
}

std::optional<Reply> WireClient::wait_reply(std::chrono::milliseconds timeout) {
  proto::ResponseSlot* slot = view_.slot(0);
  const auto deadline = Clock::now() + timeout;
  while (slot->state.load(std::memory_order_acquire) != proto::kSlotReady) {
    if (Clock::now() > deadline) return std::nullopt;
    if (view_.control()->fault.load(std::memory_order_acquire) != 0) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  Reply reply;
  reply.result = static_cast<CUresult>(slot->result);
  const auto* payload = reinterpret_cast<const std::byte*>(slot->payload);
  reply.payload.assign(payload, payload + std::min(slot->payload_bytes, proto::kSlotPayloadBytes));
  slot->state.store(proto::kSlotIdle, std::memory_order_relaxed);
  return reply;
}

Reply WireClient::call_bytes(proto::Op op, std::span<const std::byte> payload) {
  if (!post(static_cast<std::uint16_t>(op), payload, 0)) return Reply{CUDA_ERROR_TIMEOUT, {}};
  if (auto reply = wait_reply()) return *reply;
  return Reply{CUDA_ERROR_MPS_CONNECTION_FAILED, {}};
}

bool WireClient::send_fd(proto::MessageKind kind, std::uint32_t token, int fd,
                         std::uint64_t bytes) {
  proto::FdTransfer message{proto::make_header(kind, sizeof(proto::FdTransfer)), token, 0, bytes};
  const int fds[1] = {fd};
  return proto::send_struct(socket_.get(), message, fds) == 0;
}

void WireClient::create_context() {
  Reply reply = call(proto::Op::kCtxCreate, proto::CtxCreateReq{0, 0});
  if (reply.result != CUDA_SUCCESS) throw std::runtime_error("CtxCreate failed");
  auto rep = reply.as<proto::CtxCreateRep>();
  ctx_ = rep.ctx;
  stream_ = rep.default_stream;
}

CUresult WireClient::copy_in(std::uint64_t device, std::span<const std::byte> bytes) {
  std::memcpy(view_.chunk(0), bytes.data(), bytes.size());
  const std::uint32_t generation = ++chunk_generation_;
  proto::CopyHostReq req{stream_, device, bytes.size(),
                         proto::HostRef{0, 0, proto::HostKind::kStagingChunk, generation}};
  if (!one_way(proto::Op::kCopyHtoD, req)) return CUDA_ERROR_TIMEOUT;
  proto::ChunkState* state = view_.chunk_state(0);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (state->done_generation.load(std::memory_order_acquire) != generation) {
    if (Clock::now() > deadline || view_.control()->fault.load() != 0) return CUDA_ERROR_TIMEOUT;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return static_cast<CUresult>(state->result.load());
}

CUresult WireClient::copy_out(std::uint64_t device, std::span<std::byte> bytes) {
  const std::uint32_t generation = ++chunk_generation_;
  proto::CopyHostReq req{stream_, device, bytes.size(),
                         proto::HostRef{0, 0, proto::HostKind::kStagingChunk, generation}};
  if (!one_way(proto::Op::kCopyDtoH, req)) return CUDA_ERROR_TIMEOUT;
  proto::ChunkState* state = view_.chunk_state(0);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (state->done_generation.load(std::memory_order_acquire) != generation) {
    if (Clock::now() > deadline || view_.control()->fault.load() != 0) return CUDA_ERROR_TIMEOUT;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  std::memcpy(bytes.data(), view_.chunk(0), bytes.size());
  return static_cast<CUresult>(state->result.load());
}

std::optional<CUresult> WireClient::wait_for_end(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (std::uint32_t fault = view_.control()->fault.load(std::memory_order_acquire); fault != 0) {
      return static_cast<CUresult>(fault);
    }
    if (hung_up(socket_.get())) return CUDA_ERROR_MPS_CONNECTION_FAILED;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return std::nullopt;
}

}  // namespace mpsshim::hostile
