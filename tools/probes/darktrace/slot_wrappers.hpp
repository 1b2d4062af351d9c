// One distinct function per (traced table, slot): a wrapper has no closure, so which table and
// slot it stands for must be baked into its code. Generated from a template, kMaxTables x
// kMaxSlots of them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace darktrace {

inline constexpr std::size_t kMaxTables = 16;  // about 14 private tables exist on driver 580
inline constexpr std::size_t kMaxSlots = 128;  // the largest known (21318c60) has 93-95

// A slot seen as taking 8 integer words: the 6 argument registers of the x86-64 SysV ABI and
// the first 2 stack words, so that a callee taking up to 8 integer arguments gets them all.
using SlotFn = std::uint64_t (*)(std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t,
                                 std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t);

// Logs the call, calls the driver's function for (table, slot) and logs its return.
std::uint64_t traced_call(std::size_t table, std::size_t slot, const void* caller,
                          const std::array<std::uint64_t, 8>& args);

template <std::size_t Table, std::size_t Slot>
std::uint64_t slot_wrapper(std::uint64_t a0, std::uint64_t a1, std::uint64_t a2, std::uint64_t a3,
                           std::uint64_t a4, std::uint64_t a5, std::uint64_t a6, std::uint64_t a7) {
  return traced_call(Table, Slot, __builtin_return_address(0), {a0, a1, a2, a3, a4, a5, a6, a7});
}

namespace detail {
template <std::size_t Table, std::size_t... Slots>
constexpr std::array<SlotFn, kMaxSlots> wrapper_row(std::index_sequence<Slots...>) {
  return {&slot_wrapper<Table, Slots>...};
}
template <std::size_t... Tables>
constexpr std::array<std::array<SlotFn, kMaxSlots>, kMaxTables> wrapper_grid(
    std::index_sequence<Tables...>) {
  return {wrapper_row<Tables>(std::make_index_sequence<kMaxSlots>())...};
}
}  // namespace detail

// kSlotWrappers[t][s]: the wrapper of slot s of the t-th traced table.
inline constexpr auto kSlotWrappers = detail::wrapper_grid(std::make_index_sequence<kMaxTables>());

}  // namespace darktrace
