// The ids a client uses to name its objects on the server.
//
// id = generation << 32 | (index + 1). 0 never names anything. Freeing a slot gives it a new
// generation, so a stale id stops working instead of naming whatever took the slot next.
// Each table starts its generations at a per-client salt, so an id copied from another
// client's session does not name this client's objects either (barring a 1-in-2^32 match of
// generation and index). Every lookup checks kind and generation.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace mpsshim::server {

template <typename... Kinds>
class HandleTable {
 public:
  // max_entries bounds what one client can make the server remember.
  explicit HandleTable(std::uint32_t salt = 1, std::size_t max_entries = std::size_t{1} << 22)
      : salt_(salt == 0 ? 1 : salt), max_entries_(max_entries) {}

  // The new object's id, or 0 when the table is full.
  template <typename T>
  std::uint64_t insert(T value) {
    std::uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      if (slots_.size() >= max_entries_) return 0;
      index = static_cast<std::uint32_t>(slots_.size());
      slots_.push_back(Slot{salt_, {}});
    }
    Slot& slot = slots_[index];
    slot.value = std::move(value);
    ++live_;
    ++live_by_kind_[slot.value.index()];
    return (std::uint64_t{slot.generation} << 32) | (std::uint64_t{index} + 1);
  }

  // The object named by id if it is live and of kind T, else nullptr. The pointer stays valid
  // until that object is erased (later inserts do not move it).
  template <typename T>
  T* get(std::uint64_t id) {
    Slot* slot = find(id);
    return slot == nullptr ? nullptr : std::get_if<T>(&slot->value);
  }

  // Removes and returns the object if id names a live T.
  template <typename T>
  std::optional<T> take(std::uint64_t id) {
    Slot* slot = find(id);
    if (slot == nullptr || !std::holds_alternative<T>(slot->value)) return std::nullopt;
    T out = std::move(std::get<T>(slot->value));
    release(index_of(id));
    return out;
  }

  // Ids of the live objects of kind T for which pred(const T&) holds, in slot order.
  template <typename T, typename Pred>
  std::vector<std::uint64_t> ids_where(Pred&& pred) const {
    std::vector<std::uint64_t> ids;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      const T* value = std::get_if<T>(&slots_[i].value);
      if (value != nullptr && pred(*value)) {
        ids.push_back((std::uint64_t{slots_[i].generation} << 32) | (std::uint64_t{i} + 1));
      }
    }
    return ids;
  }
  template <typename T>
  std::vector<std::uint64_t> ids() const {
    return ids_where<T>([](const T&) { return true; });
  }

  std::size_t size() const { return live_; }
  // Live objects of kind T: what the per-client caps count (client_limits.hpp).
  template <typename T>
  std::size_t count() const {
    return live_by_kind_[kind_index<T>()];
  }

 private:
  struct Slot {
    std::uint32_t generation;
    std::variant<std::monostate, Kinds...> value;
  };

  // T's index in the slots' variant (0 is the empty slot).
  template <typename T>
  static constexpr std::size_t kind_index() {
    constexpr bool matches[] = {std::is_same_v<T, Kinds>...};
    for (std::size_t i = 0; i < sizeof...(Kinds); ++i) {
      if (matches[i]) return i + 1;
    }
    return 0;
  }

  static std::uint32_t index_of(std::uint64_t id) {
    return static_cast<std::uint32_t>(id & 0xffffffffu) - 1;
  }

  Slot* find(std::uint64_t id) {
    std::uint32_t low = static_cast<std::uint32_t>(id & 0xffffffffu);
    if (low == 0 || low > slots_.size()) return nullptr;
    Slot& slot = slots_[low - 1];
    if (slot.generation != static_cast<std::uint32_t>(id >> 32)) return nullptr;
    if (std::holds_alternative<std::monostate>(slot.value)) return nullptr;
    return &slot;
  }

  void release(std::uint32_t index) {
    Slot& slot = slots_[index];
    --live_by_kind_[slot.value.index()];
    slot.value = std::monostate{};
    slot.generation = slot.generation + 1 == 0 ? 1 : slot.generation + 1;
    free_.push_back(index);
    --live_;
  }

  std::uint32_t salt_;
  std::size_t max_entries_;
  std::deque<Slot> slots_;  // a deque: growing it never moves a live object
  std::vector<std::uint32_t> free_;
  std::size_t live_ = 0;
  std::array<std::size_t, sizeof...(Kinds) + 1> live_by_kind_{};
};

}  // namespace mpsshim::server
