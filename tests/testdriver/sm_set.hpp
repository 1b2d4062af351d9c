// The SMs a resource, green context or stream may run on, and the SM layout of the modelled
// device (H100/H200: 132 SMs).
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <vector>

namespace mpsshim::testdriver {

inline constexpr unsigned kSmCount = 132;

// SMs sit in GPCs of unequal size, and a co-scheduled group of 8 never straddles two GPCs: that is
// why the real driver splits 132 SMs into 15 groups of 8 plus 12 (measured), not 16 plus 4.
// With CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING the hierarchy is ignored (16 groups of 8).
inline constexpr std::array<unsigned, 8> kGpcSizes{18, 18, 18, 18, 16, 16, 16, 12};

// Trivially copyable on purpose: it is stored inside the opaque bytes of a CUdevResource.
struct SmSet {
  std::array<std::uint64_t, 3> words{};

  static SmSet all() {
    SmSet s;
    for (unsigned sm = 0; sm < kSmCount; ++sm) s.add(sm);
    return s;
  }
  void add(unsigned sm) { words[sm / 64] |= std::uint64_t{1} << (sm % 64); }
  void remove(unsigned sm) { words[sm / 64] &= ~(std::uint64_t{1} << (sm % 64)); }
  bool has(unsigned sm) const { return (words[sm / 64] >> (sm % 64)) & 1; }
  unsigned count() const {
    unsigned n = 0;
    for (auto w : words) n += static_cast<unsigned>(std::popcount(w));
    return n;
  }
  SmSet& operator|=(const SmSet& o) {
    for (unsigned i = 0; i < words.size(); ++i) words[i] |= o.words[i];
    return *this;
  }
  // The SM ids in increasing order: block b of a launch runs on ids()[b % size].
  std::vector<std::uint16_t> ids() const {
    std::vector<std::uint16_t> out;
    for (unsigned sm = 0; sm < kSmCount; ++sm)
      if (has(sm)) out.push_back(static_cast<std::uint16_t>(sm));
    return out;
  }
  bool operator==(const SmSet&) const = default;
};

}  // namespace mpsshim::testdriver
