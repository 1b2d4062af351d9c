#include "libshim/managed_advice.hpp"

#include <iterator>

namespace mpsshim::shim {

namespace {
constexpr std::uint64_t kPage = 4096;
}  // namespace

AdviceSpans::AdviceSpans(std::uint64_t pages) : pages_(pages) {
  runs_.emplace(0, PageAdvice{});
}

void AdviceSpans::update(std::uint64_t first, std::uint64_t last,
                         const std::function<void(PageAdvice&)>& change) {
  if (first > last || last >= pages_) return;
  // Split so that runs start at `first` and at `last + 1`, change the runs between, then merge
  // neighbours that became equal.
  auto split = [this](std::uint64_t page) {
    if (page >= pages_) return runs_.end();
    auto it = std::prev(runs_.upper_bound(page));
    if (it->first == page) return it;
    return runs_.emplace_hint(std::next(it), page, it->second);
  };
  auto begin = split(first);
  auto end = split(last + 1);
  for (auto it = begin; it != end; ++it) change(it->second);
  const std::uint64_t stop = last + 1;  // the run starting there may now equal the one before
  auto it = begin == runs_.begin() ? begin : std::prev(begin);
  for (auto next = std::next(it); next != runs_.end() && next->first <= stop;
       next = std::next(it)) {
    if (next->second == it->second) {
      runs_.erase(next);
    } else {
      it = next;
    }
  }
}

PageAdvice AdviceSpans::combined(std::uint64_t first, std::uint64_t last) const {
  auto it = std::prev(runs_.upper_bound(first));
  PageAdvice out = it->second;
  for (++it; it != runs_.end() && it->first <= last; ++it) {
    const PageAdvice& a = it->second;
    out.read_mostly = out.read_mostly && a.read_mostly;
    if (!(out.preferred == a.preferred)) out.preferred = Location{};
    if (!(out.last_prefetch == a.last_prefetch)) out.last_prefetch = Location{};
    out.accessed_by &= a.accessed_by;
  }
  return out;
}

void ManagedAdvice::add(std::uint64_t base, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  allocations_.insert_or_assign(base, AdviceSpans((bytes + kPage - 1) / kPage));
}

void ManagedAdvice::remove(std::uint64_t base) {
  std::lock_guard lock(mutex_);
  allocations_.erase(base);
}

void ManagedAdvice::update(std::uint64_t base, std::uint64_t address, std::uint64_t bytes,
                           const std::function<void(PageAdvice&)>& change) {
  if (bytes == 0 || address < base) return;
  std::lock_guard lock(mutex_);
  auto it = allocations_.find(base);
  if (it == allocations_.end()) return;
  it->second.update((address - base) / kPage, (address - base + bytes - 1) / kPage, change);
}

PageAdvice ManagedAdvice::combined(std::uint64_t base, std::uint64_t address,
                                   std::uint64_t bytes) const {
  if (bytes == 0 || address < base) return {};
  std::lock_guard lock(mutex_);
  auto it = allocations_.find(base);
  if (it == allocations_.end()) return {};
  return it->second.combined((address - base) / kPage, (address - base + bytes - 1) / kPage);
}

ManagedAdvice& managed_advice() noexcept {
  static ManagedAdvice* advice = new ManagedAdvice();
  return *advice;
}

}  // namespace mpsshim::shim
