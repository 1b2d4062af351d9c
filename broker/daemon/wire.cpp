#include "broker/daemon/wire.hpp"

#include <algorithm>

namespace mpsshim::daemon {

std::optional<proto::HelloHeader> header_of(const proto::Received& message) {
  return decode<proto::HelloHeader>(message);
}

proto::Refused make_refused(int cuda_error, std::string_view message) {
  proto::Refused refused{};
  refused.header = proto::make_header(proto::MessageKind::kRefused, sizeof refused);
  refused.cuda_error = cuda_error;
  std::size_t n = std::min(message.size(), sizeof refused.message - 1);
  std::memcpy(refused.message, message.data(), n);
  return refused;
}

proto::TextMessage make_text(proto::MessageKind kind, int status, std::string_view text) {
  proto::TextMessage message{};
  message.header = proto::make_header(kind, sizeof message);
  message.status = status;
  std::size_t n = std::min(text.size(), sizeof message.text);
  std::memcpy(message.text, text.data(), n);
  message.length = static_cast<std::uint32_t>(n);
  return message;
}

std::string text_of(const proto::TextMessage& message) {
  std::size_t n = std::min<std::size_t>(message.length, sizeof message.text);
  return std::string(message.text, n);
}

}  // namespace mpsshim::daemon
