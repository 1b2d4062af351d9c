// The trace file, $DARKTRACE_DIR/darktrace.<pid>.txt: one event per line, each line handed to
// the kernel by one write() so that lines from different threads never interleave and nothing
// is lost when the traced program dies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace darktrace {

// Appends `line` (without its newline) to this process's trace file; opens the file on first
// use and again in a forked child, whose pid names a file of its own.
void write_line(const std::string& line);

// printf-style formatting into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// "libfoo.so.1+0x1a2b" (or "libfoo.so.1+0x1a2b(symbol+0x10)" with `with_symbol`) for a code or
// data address; "?0x..." when no loaded object holds it.
std::string where(const void* address, bool with_symbol);

// The 64 bytes at each readable pointer: "6e16 3fbe..." hex of up to `n` bytes.
std::string hex(const unsigned char* bytes, std::size_t n);

// Identifies this thread in the trace (the kernel's tid).
std::uint64_t thread_id();

}  // namespace darktrace
