#include "broker/server/session/client_green.hpp"

namespace mpsshim::server {

std::string ClientGreen::key(const CUdevResource& resource) {
  return std::string(reinterpret_cast<const char*>(&resource), sizeof resource);
}

bool ClientGreen::issued(const CUdevResource& resource) const {
  return issued_.contains(key(resource));
}

bool ClientGreen::issue(const CUdevResource& resource) {
  std::string k = key(resource);
  if (issued_.contains(k)) return true;
  if (issued_.size() >= kMaxResources) return false;
  issued_.insert(std::move(k));
  return true;
}

std::uint64_t ClientGreen::add_desc(CUdevResourceDesc desc) {
  if (descs_.size() >= kMaxDescs) return 0;
  const std::uint64_t id = next_desc_++;
  descs_.emplace(id, desc);
  return id;
}

CUdevResourceDesc ClientGreen::desc(std::uint64_t id) const {
  auto it = descs_.find(id);
  return it == descs_.end() ? nullptr : it->second;
}

const ClientGreen::Split* ClientGreen::kept_split(const CUdevResource& input, unsigned groups,
                                                  unsigned min_count, unsigned flags) const {
  const std::string input_key = key(input);
  for (const Split& s : splits_) {
    if (s.groups == groups && s.min_count == min_count && s.flags == flags && s.groups != 0 &&
        s.input == input_key) {
      return &s;
    }
  }
  return nullptr;
}

void ClientGreen::keep_split(Split split) {
  std::erase_if(splits_, [&](const Split& s) {
    return s.groups == split.groups && s.min_count == split.min_count && s.flags == split.flags &&
           s.input == split.input;
  });
  splits_.push_front(std::move(split));
  if (splits_.size() > kKeptSplits) splits_.pop_back();
}

void ClientGreen::forget_all() {
  issued_.clear();
  splits_.clear();
  descs_.clear();  // the driver keeps them: the API has no call that frees a descriptor
}

}  // namespace mpsshim::server
