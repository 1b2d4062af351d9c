// Private driver tables ("export tables") handed out in place of the driver's: a copy whose
// every code slot is a logging wrapper around the driver's function.
#pragma once

#include <cstdint>

namespace darktrace {

// The table a cuGetExportTable caller receives for `uuid` (16 raw bytes), given the driver's
// answer `real` (nullptr when the driver refused). Logs the request; the first time a UUID is
// asked also logs its size word and every slot. Returns `real` itself for tables not selected
// by DARKTRACE_TABLES, else the same traced copy on every call (callers may compare or hash
// table addresses).
const void* table_for_caller(const unsigned char* uuid, const void* real, int result,
                             const void* caller);

}  // namespace darktrace
