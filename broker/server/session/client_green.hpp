// What a client may build green contexts of its own from (ops/green_context.cpp,
// docs/green-contexts.md): the SM resources the server handed it, and the descriptors it made.
//
// A CUdevResource's opaque bytes name SMs, and the driver takes any it is given: a resource the
// client wrote itself could name SMs outside its quota. So a resource comes back only if its
// 144 bytes are ones this session was handed (its quota's, a context's, a split's output);
// after a live SM quota change none of the earlier ones are (forget_all). Owned by the session's
// worker, like the rest of the session.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace mpsshim::server {

class ClientGreen {
 public:
  // Bounds a client cannot grow the server past (a split is ~1 ms; a descriptor is driver memory
  // the API never frees).
  static constexpr std::size_t kMaxResources = 4096;
  static constexpr std::size_t kMaxDescs = 1024;

  bool issued(const CUdevResource& resource) const;
  // False when the session holds kMaxResources already.
  bool issue(const CUdevResource& resource);

  // 0 when the session holds kMaxDescs already.
  std::uint64_t add_desc(CUdevResourceDesc desc);
  // nullptr when `id` names none (or one from before forget_all).
  CUdevResourceDesc desc(std::uint64_t id) const;

  // A split's outputs, kept so that the pages of a split longer than one answer are of one
  // driver call (a descriptor combines outputs of one split only). The last kKeptSplits of
  // different arguments are kept, so that threads paging splits of their own at once each find
  // theirs (the driver splits alike every time, so one of the same arguments serves all).
  static constexpr std::size_t kKeptSplits = 8;
  struct Split {
    std::string input;
    unsigned groups = 0;
    unsigned min_count = 0;
    unsigned flags = 0;
    std::vector<CUdevResource> outputs;  // the groups made
    CUdevResource remaining{};
  };
  // A kept split of these arguments; nullptr when none.
  const Split* kept_split(const CUdevResource& input, unsigned groups, unsigned min_count,
                          unsigned flags) const;
  // Kept in place of one of the same arguments, else of the least recent.
  void keep_split(Split split);
  static std::string key(const CUdevResource& resource);

  // A live SM quota change: what was handed out before named the old quota's SMs.
  void forget_all();

 private:
  std::unordered_set<std::string> issued_;
  std::unordered_map<std::uint64_t, CUdevResourceDesc> descs_;
  std::uint64_t next_desc_ = 1;
  std::deque<Split> splits_;  // most recent first
};

}  // namespace mpsshim::server
