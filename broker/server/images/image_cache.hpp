// Libraries loaded once for every session that sends the same bytes. The driver keeps several
// bytes of host memory for every byte of a library image it loads (cuLibraryLoadData of
// libtorch_cuda.so's 444 containers, 284 MiB: +1.75 GiB RSS; a second load of the same bytes
// +1.0 GiB), and a PyTorch client told to load eagerly (CUDA_MODULE_LOADING=EAGER) loads
// thousands of images, so each such session cost the server ~2 GiB that its own process would
// have held natively (loading lazily, the default, it loads a few dozen). A green context uses the
// functions of a library loaded once for free (+0 MiB of GPU memory and +20 KiB of RSS for 4,484
// functions; tools/probes/library_sharing.cpp), so sessions can share one CUlibrary.
//
// Only images without state a session could change for another are shared: no __device__,
// __constant__ or __managed__ variables in any entry (image_globals.hpp decides). Identity is the
// SHA-256 of the bytes (with the container count), so a client cannot make another's image
// resolve to code of its own.
//
// Kept after the last client: a library no session holds any more stays loaded for
// `idle_timeout` (mpsshim-server --image-idle-timeout, 60 s by default), so that the next client
// sending the same bytes finds it. Measured on an H100 (driver 580, 2026-11-28,
// tools/probes/heap_profile.sh): the first PyTorch client's loads grew the server's heap by
// 1.74 GiB and its kernel lookups by 0.64 GiB (the driver's, once per library: a second
// client's grew it by 41 + 29 MiB); with the libraries unloaded when the last PyTorch client of
// the moment ended, a server whose PyTorch clients came and went loaded them all again each
// time: RSS swinging by gigabytes (the GPU soak), and that client's image loads took 14.6 s of
// the server's time against 4.2-5.7 s for clients that found them loaded
// (tools/probes/image_stats.sh).
//
// Ownership: the cache is the Server's and outlives every session. Each session's LibraryObj
// holds a strong reference; the cache holds a weak one, and while retention is on a strong one
// too (`kept`). The last holder to let go unloads the library: a worker freeing a retired
// bundle, behind its own fences (retention off), or the coordinator, when it finds a library
// held by nobody else for the idle timeout (unload_unused) or when the lease releases the
// primary context with no session left (unload_all_unused). One mutex guards the map, held
// only to look up, insert or erase, never across a driver call: what is unloaded is moved out
// under the lock and dropped after it.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

namespace mpsshim::server {

struct DriverTable;
class ImageCache;

using ImageDigest = std::array<std::uint8_t, 32>;

// SHA-256 over the container count and the bytes.
ImageDigest digest_image(std::span<const std::byte> image, std::uint32_t containers);

// One loaded library that sessions share.
class SharedLibrary {
 public:
  SharedLibrary(const DriverTable& cu, CUlibrary library, const ImageDigest& digest,
                ImageCache& cache, std::uint64_t bytes);
  ~SharedLibrary();  // unloads; forgets its cache entry unless a newer one took its place
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  CUlibrary library() const { return library_; }
  std::uint64_t bytes() const { return bytes_; }
  const ImageDigest& digest() const { return digest_; }

 private:
  const DriverTable& cu_;
  CUlibrary library_;
  ImageDigest digest_;
  ImageCache& cache_;
  std::uint64_t bytes_;
};

struct ImageCacheStats {
  std::uint64_t loads = 0;          // images loaded into a new shared library
  std::uint64_t hits = 0;           // loads answered with a library another session loaded
  std::uint64_t hit_bytes = 0;      // image bytes those hits did not load again
  std::uint64_t private_loads = 0;  // images loaded for one session (globals, or sharing off)
  std::uint64_t live = 0;           // shared libraries loaded now
  std::uint64_t unused = 0;         // of those, kept with no session holding them
  std::uint64_t unused_bytes = 0;   // their image bytes
  std::uint64_t expired = 0;        // kept libraries unloaded when no session held them
  std::uint64_t scans = 0;          // images scanned for variables (image_globals.hpp)
  std::uint64_t adopted = 0;        // verdicts an earlier server kept (image_verdicts.hpp)
};

// What the scan found for one image: whether it may be shared.
struct ImageVerdict {
  ImageDigest digest{};
  bool shareable = false;
  friend bool operator==(const ImageVerdict&, const ImageVerdict&) = default;
};

// What unload_unused / unload_all_unused unloaded.
struct UnloadedImages {
  std::size_t libraries = 0;
  std::uint64_t bytes = 0;  // their image bytes
};

// How long a library no session holds stays loaded by default (ServerSettings::image_idle_timeout).
inline constexpr std::chrono::seconds kDefaultImageIdleTimeout{60};

class ImageCache {
 public:
  using Clock = std::chrono::steady_clock;

  // A zero `idle_timeout` unloads a library with its last holder.
  explicit ImageCache(bool enabled, Clock::duration idle_timeout = Clock::duration::zero())
      : enabled_(enabled), idle_timeout_(idle_timeout) {}
  ~ImageCache();  // unloads what it kept; the sessions are gone by then
  ImageCache(const ImageCache&) = delete;
  ImageCache& operator=(const ImageCache&) = delete;

  bool enabled() const { return enabled_; }

  // The live shared library of these bytes, or null. Counts a hit.
  std::shared_ptr<SharedLibrary> find(const ImageDigest& digest);
  // Makes `fresh` the shared library of its digest, unless another session published one
  // meanwhile: then that one is returned (and `fresh`, dropped by the caller, unloads).
  std::shared_ptr<SharedLibrary> publish(const ImageDigest& digest,
                                         std::shared_ptr<SharedLibrary> fresh);
  void count_private_load() { private_loads_.fetch_add(1, std::memory_order_relaxed); }
  // The scan's verdicts (image_globals.hpp), so that the next load of the same bytes is not
  // scanned again: found unfit for sharing (private) or fit (shareable; a shared library of
  // them may be unloaded meanwhile). Bounded: all forgotten at once past kMaxVerdicts.
  bool known_private(const ImageDigest& digest);
  bool known_shareable(const ImageDigest& digest);
  void remember_private(const ImageDigest& digest) { remember(digest, false); }
  void remember_shareable(const ImageDigest& digest) { remember(digest, true); }
  void count_scan() { scans_.fetch_add(1, std::memory_order_relaxed); }
  static constexpr std::size_t kMaxVerdicts = 65536;
  // Every verdict, to be kept across a restart (image_verdicts.hpp), and the ones an earlier
  // server kept, taken at the start.
  std::vector<ImageVerdict> verdicts();
  void adopt(const std::vector<ImageVerdict>& verdicts);

  // Coordinator: unloads the kept libraries that no session held at any look since `now` -
  // idle_timeout (a look with a holder marks it held).
  UnloadedImages unload_unused(Clock::time_point now);
  // Unloads every kept library no session holds (before the lease releases the primary
  // context: memory at rest goes back to what it was before the first client).
  UnloadedImages unload_all_unused();

  ImageCacheStats stats();

 private:
  friend class SharedLibrary;
  void forget(const ImageDigest& digest);
  void remember(const ImageDigest& digest, bool shareable);
  // Under mutex_: keeps `library` loaded, marked held now.
  void keep(std::shared_ptr<SharedLibrary> library);
  // Moves out of `kept_` the unheld libraries last held before `held_after`; the caller drops
  // them after the lock.
  std::vector<std::shared_ptr<SharedLibrary>> take_unused(Clock::time_point now,
                                                          Clock::time_point held_after);
  // Drops what take_unused took (unloading it, outside the lock) and counts it.
  UnloadedImages unload(std::vector<std::shared_ptr<SharedLibrary>> unused);

  struct DigestHash {
    std::size_t operator()(const ImageDigest& d) const;
  };

  struct Kept {
    std::shared_ptr<SharedLibrary> library;
    Clock::time_point last_held;
  };

  const bool enabled_;
  const Clock::duration idle_timeout_;
  std::mutex mutex_;
  std::unordered_map<ImageDigest, std::weak_ptr<SharedLibrary>, DigestHash> entries_;
  std::unordered_map<ImageDigest, Kept, DigestHash> kept_;      // retention on only
  std::unordered_map<ImageDigest, bool, DigestHash> verdicts_;  // true: shareable
  ImageCacheStats counts_;  // under mutex_, but for private_loads_ and scans_
  std::atomic<std::uint64_t> private_loads_{0};
  std::atomic<std::uint64_t> scans_{0};
};

}  // namespace mpsshim::server
