#include "proto/text_parts.hpp"

#include <algorithm>
#include <cstring>

namespace mpsshim::proto {

std::vector<TextMessage> text_messages(MessageKind kind, std::int32_t status,
                                       std::string_view text) {
  constexpr std::size_t kRoom = sizeof(TextMessage{}.text);
  std::vector<TextMessage> parts;
  do {
    std::size_t take = std::min(text.size(), kRoom);
    if (take < text.size()) {
      // End the part after the last whole line that fits, if there is one.
      std::size_t line_end = text.substr(0, take).rfind('\n');
      if (line_end != std::string_view::npos) take = line_end + 1;
    }
    TextMessage& part = parts.emplace_back();
    part.header = make_header(kind, sizeof part);
    std::memcpy(part.text, text.data(), take);
    part.length = static_cast<std::uint32_t>(take);
    text.remove_prefix(take);
    part.status = text.empty() ? status : kTextContinues;
  } while (!text.empty());
  return parts;
}

bool TextAssembly::add(const TextMessage& part) {
  const std::size_t n = std::min<std::size_t>(part.length, sizeof part.text);
  if (text_.size() + n <= kMaxTextAnswer) {
    text_.append(part.text, n);
  } else if (!overflowed_) {
    overflowed_ = true;
    text_ += "... (answer cut: longer than " + std::to_string(kMaxTextAnswer >> 20) + " MiB)\n";
  }
  if (part.status == kTextContinues) return false;
  status_ = part.status;
  return true;
}

}  // namespace mpsshim::proto
