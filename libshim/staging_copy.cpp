#include "libshim/staging_copy.hpp"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "common/log.hpp"
#include "libshim/copy_pool.hpp"

namespace mpsshim::shim {
namespace {

bool streaming_wanted() {
  const char* value = std::getenv("MPSSHIM_STAGING_STORES");
  const std::string_view mode = value != nullptr ? value : "";
  if (!mode.empty() && mode != "streaming" && mode != "cached") {
    log_warn("MPSSHIM_STAGING_STORES={}: expected streaming or cached", mode);
  }
#if defined(__x86_64__)
  return mode != "cached";
#else
  if (mode == "streaming") log_warn("MPSSHIM_STAGING_STORES=streaming: x86-64 only");
  return false;
#endif
}

#if defined(__x86_64__)
// SSE2 is part of x86-64: no run-time check needed.
void copy_streaming(std::byte* dst, const std::byte* src, std::size_t bytes) {
  // Streaming stores need 16-byte aligned destinations: the head goes the ordinary way.
  std::size_t head = (16 - (reinterpret_cast<std::uintptr_t>(dst) & 15)) & 15;
  if (head > bytes) head = bytes;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  bytes -= head;
  for (; bytes >= 64; bytes -= 64, dst += 64, src += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 48), d);
  }
  std::memcpy(dst, src, bytes);
  // Streaming stores are weakly ordered: the fence makes them visible before the record that
  // hands the chunk to the server (or before the copy returns to the application).
  _mm_sfence();
}
#endif

void copy_cached(std::byte* dst, const std::byte* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
}

}  // namespace

void staging_copy(void* dst, const void* src, std::size_t bytes) {
  static const bool streaming = streaming_wanted();
  CopyFunction copy = copy_cached;
#if defined(__x86_64__)
  if (streaming && bytes >= kStreamingMinBytes) copy = copy_streaming;
#endif
  parallel_copy(static_cast<std::byte*>(dst), static_cast<const std::byte*>(src), bytes, copy);
}

}  // namespace mpsshim::shim
