// Building and reading the proto/control.hpp messages the daemon and mpsshimctl exchange.
// A message may be longer than the struct we know (a peer with a newer minor version appends
// fields), never shorter.
#pragma once

#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "proto/control.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::daemon {

// The header of a received message, if it is long enough to have one.
std::optional<proto::HelloHeader> header_of(const proto::Received& message);

template <typename T>
std::optional<T> decode(const proto::Received& message) {
  static_assert(proto::kWireSafe<T>);
  if (message.bytes.size() < sizeof(T)) return std::nullopt;
  T value;
  std::memcpy(&value, message.bytes.data(), sizeof value);
  return value;
}

// A fixed char array from a peer may lack its terminator.
template <std::size_t N>
std::string bounded_string(const char (&chars)[N]) {
  return std::string(chars, strnlen(chars, N));
}

proto::Refused make_refused(int cuda_error, std::string_view message);
proto::TextMessage make_text(proto::MessageKind kind, int status, std::string_view text);
std::string text_of(const proto::TextMessage& message);

}  // namespace mpsshim::daemon
