// Operator answers longer than one TextMessage (8 KiB: `ps` of 256 clients is ~25 KiB): the
// sender cuts the text into parts of the same message kind; every part but the last carries
// status kTextContinues, the last the answer's own status. Parts end at line ends wherever a
// line fits, so no line is split unless it alone is longer than a part. The receiver appends
// parts (TextAssembly) until a status other than kTextContinues ends the answer. Both hops use
// it: server -> daemon (ps, stats) and daemon -> mpsshimctl.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "proto/control.hpp"

namespace mpsshim::proto {

inline constexpr std::int32_t kTextContinues = std::numeric_limits<std::int32_t>::min();
// The most a receiver assembles; the rest is dropped and the answer says so.
inline constexpr std::size_t kMaxTextAnswer = std::size_t{4} << 20;

// The messages carrying `text`, in order (one when it fits).
std::vector<TextMessage> text_messages(MessageKind kind, std::int32_t status,
                                       std::string_view text);

class TextAssembly {
 public:
  // Adds one received part; true once the answer is complete (status() and text() valid).
  bool add(const TextMessage& part);
  std::int32_t status() const { return status_; }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  std::int32_t status_ = 0;
  bool overflowed_ = false;
};

}  // namespace mpsshim::proto
