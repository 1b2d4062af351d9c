// Libraries loaded once for every session that sends the same bytes. The driver keeps several
// bytes of host memory for every byte of a library image it loads (cuLibraryLoadData of
// libtorch_cuda.so's 444 containers, 284 MiB: +1.75 GiB RSS; a second load of the same bytes
// +1.0 GiB), and a PyTorch client loads thousands of images, so each PyTorch session cost the
// server ~2 GiB that its own process would have held natively. A green context uses the
// functions of a library loaded once for free (+0 MiB of GPU memory and +20 KiB of RSS for 4,484
// functions; tools/probes/library_sharing.cpp), so sessions can share one CUlibrary.
//
// Only images without state a session could change for another are shared: no __device__,
// __constant__ or __managed__ variables in any entry (image_globals.hpp decides). Identity is the
// SHA-256 of the bytes (with the container count), so a client cannot make another's image
// resolve to code of its own.
//
// Ownership: the cache is the Server's and outlives every session; it holds only weak
// references. Each session's LibraryObj holds a strong one; the last holder to let go (a worker
// freeing a retired bundle, behind its own fences) unloads the library. One mutex guards the
// map, held only to look up, insert or erase, never across a driver call.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <unordered_set>

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
};

class ImageCache {
 public:
  explicit ImageCache(bool enabled) : enabled_(enabled) {}
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
  // Images found unfit for sharing (image_globals.hpp), so that the next load of the same bytes
  // is not scanned again. Bounded: forgotten all at once past kMaxKnownPrivate.
  bool known_private(const ImageDigest& digest);
  void remember_private(const ImageDigest& digest);
  static constexpr std::size_t kMaxKnownPrivate = 65536;

  ImageCacheStats stats();

 private:
  friend class SharedLibrary;
  void forget(const ImageDigest& digest);

  struct DigestHash {
    std::size_t operator()(const ImageDigest& d) const;
  };

  const bool enabled_;
  std::mutex mutex_;
  std::unordered_map<ImageDigest, std::weak_ptr<SharedLibrary>, DigestHash> entries_;
  std::unordered_set<ImageDigest, DigestHash> known_private_;
  ImageCacheStats counts_;  // under mutex_, but for private_loads_
  std::atomic<std::uint64_t> private_loads_{0};
};

}  // namespace mpsshim::server
