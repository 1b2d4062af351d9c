// The real driver's cuGetProcAddress table (procaddr-<driver>.tsv), compiled into the shim by
// generate_entry_points.py as proc_address_table.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace mpsshim::shim::entry {

// An exported entry point with its signature erased; cast to void* to hand it out.
using EntryPoint = int (*)();

// From `min_version` on, a lookup of `name` with `flags` returns `function`, until the next
// row of the same (name, flags). A name that has rows has them for flags 0, 1 and 2.
struct ProcAddressRow {
  std::string_view name;
  std::uint8_t flags;
  std::int32_t min_version;
  EntryPoint function;
};

// Sorted by (name, flags, min_version).
std::span<const ProcAddressRow> proc_address_rows() noexcept;

}  // namespace mpsshim::shim::entry
