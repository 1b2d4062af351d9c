// Filler for the slots of served tables whose meaning is unknown (docs/private-tables.md,
// "Table layout"): the real driver has a function there, so the shim puts a trap that names
// table and slot in the log and returns CUDA_ERROR_NOT_SUPPORTED, turning a would-be crash into
// a diagnosable error.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <utility>

#include "common/log.hpp"

namespace mpsshim::shim::darkapi {

// A slot of unknown signature. Callers pass arguments such a function does not declare; the C
// calling convention leaves them unread and the caller cleans up, so that is harmless.
using SlotFn = CUresult (*)() noexcept;

enum class TableId {
  kCudartInterface,
  kCallbackHooks,
  kToolsTls,
  kContextChecks,
  kIntegrityCheck,
  kToolsContext,
  kToolsModule,
};

constexpr const char* table_name(TableId id) noexcept {
  switch (id) {
    case TableId::kCudartInterface:
      return "CUDART_INTERFACE (6bd5fb6c)";
    case TableId::kCallbackHooks:
      return "TOOLS_RUNTIME_CALLBACK_HOOKS (a094798c)";
    case TableId::kToolsTls:
      return "TOOLS_TLS (42d85a81)";
    case TableId::kContextChecks:
      return "CONTEXT_CHECKS (263e8860)";
    case TableId::kIntegrityCheck:
      return "INTEGRITY_CHECK (d4082055)";
    case TableId::kToolsContext:
      return "TOOLS_CONTEXT (21318c60)";
    case TableId::kToolsModule:
      return "TOOLS_MODULE (6e163fbe)";
  }
  return "?";
}

// One function per (table, slot), so that the log can name it without any argument.
template <TableId Table, std::size_t Slot>
CUresult trap_slot() noexcept {
  static constinit std::atomic<bool> logged{false};
  log_once(logged, LogLevel::kWarn,
           "dark API {} slot {} was called; its meaning is unknown, returning "
           "CUDA_ERROR_NOT_SUPPORTED",
           table_name(Table), Slot);
  return CUDA_ERROR_NOT_SUPPORTED;
}

// Traps for slots First .. First + Count - 1.
template <TableId Table, std::size_t First, std::size_t Count>
constexpr std::array<SlotFn, Count> trap_slots() noexcept {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return std::array<SlotFn, Count>{&trap_slot<Table, First + I>...};
  }
  (std::make_index_sequence<Count>{});
}

// Slot 0 of every table but CONTEXT_LOCAL_STORAGE: the table's size in bytes.
constexpr std::size_t table_size_word(std::size_t slots) noexcept {
  return slots * sizeof(void*);
}

}  // namespace mpsshim::shim::darkapi
