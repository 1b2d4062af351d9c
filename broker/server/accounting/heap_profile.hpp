// Which operations grow the server's heap: with MPSSHIM_SERVER_HEAP_PROFILE=1 in the server's
// environment (mpsshimd passes its own on), the worker reads glibc's count of heap bytes in use
// (mallinfo2: every arena, and mmap'd chunks) before and after each record's handler and adds the
// difference to the session's figure for that opcode; the session's end logs the opcodes that grew
// the heap most.
//
// Why: the GPU soak's server RSS followed its live PyTorch sessions, in glibc arenas of the
// worker threads, and went back when they ended; this located it (image_cache.hpp, "Kept after
// the last client"). A handler's growth includes what the driver allocates inside it.
//
// A diagnostic, off by default: each mallinfo2 locks and walks every arena and its free chunks
// (its cost was not measured; it grows with the heap). It counts the whole process, so with
// several sessions busy at once another worker's allocations land in whichever handler runs;
// profile one client at a time for clean figures.
#pragma once

#include <cstdint>
#include <string>

namespace mpsshim::server {

struct SessionStats;

// Whether MPSSHIM_SERVER_HEAP_PROFILE is set to a value other than 0 (read once).
bool heap_profile_on();

// Heap bytes in use by this process as glibc counts them (mallinfo2: uordblks + hblkhd).
std::int64_t heap_in_use_bytes();

// "ImageLoad +212.4 MiB (4372), LibraryGetKernel +40.1 MiB (16746), ...": the `n` opcodes
// whose handlers grew the heap most, largest first; empty when none grew it.
std::string format_heap_growth(const SessionStats& stats, std::size_t n);

// "LaunchKernel 91234, ImageLoad 4372, ...": the `n` opcodes with the most records, most first
// (beside the heap growth, what a client's start asked of the server).
std::string format_record_counts(const SessionStats& stats, std::size_t n);

}  // namespace mpsshim::server
