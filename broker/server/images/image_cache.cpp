#include "broker/server/images/image_cache.hpp"

#include <openssl/evp.h>

#include <cstring>

#include "broker/server/driver/driver_table.hpp"
#include "common/log.hpp"

namespace mpsshim::server {

ImageDigest digest_image(std::span<const std::byte> image, std::uint32_t containers) {
  ImageDigest digest{};
  EVP_MD_CTX* context = EVP_MD_CTX_new();
  unsigned int length = 0;
  const bool ok = context != nullptr && EVP_DigestInit_ex(context, EVP_sha256(), nullptr) == 1 &&
                  EVP_DigestUpdate(context, &containers, sizeof containers) == 1 &&
                  EVP_DigestUpdate(context, image.data(), image.size()) == 1 &&
                  EVP_DigestFinal_ex(context, digest.data(), &length) == 1 &&
                  length == digest.size();
  EVP_MD_CTX_free(context);
  // Without a digest nothing may be shared: an all-zero digest is never published (below).
  if (!ok) digest.fill(0);
  return digest;
}

namespace {

bool usable(const ImageDigest& digest) {
  for (std::uint8_t b : digest) {
    if (b != 0) return true;
  }
  return false;
}

}  // namespace

SharedLibrary::SharedLibrary(const DriverTable& cu, CUlibrary library, const ImageDigest& digest,
                             ImageCache& cache, std::uint64_t bytes)
    : cu_(cu), library_(library), digest_(digest), cache_(cache), bytes_(bytes) {}

SharedLibrary::~SharedLibrary() {
  cache_.forget(digest_);
  if (CUresult r = cu_.cuLibraryUnload(library_); r != CUDA_SUCCESS) {
    log_warn("cuLibraryUnload of a shared library failed: error {}", static_cast<int>(r));
  }
}

std::size_t ImageCache::DigestHash::operator()(const ImageDigest& d) const {
  std::size_t h;
  std::memcpy(&h, d.data(), sizeof h);  // a SHA-256 is uniform already
  return h;
}

std::shared_ptr<SharedLibrary> ImageCache::find(const ImageDigest& digest) {
  if (!enabled_ || !usable(digest)) return nullptr;
  std::lock_guard lock(mutex_);
  auto it = entries_.find(digest);
  if (it == entries_.end()) return nullptr;
  std::shared_ptr<SharedLibrary> live = it->second.lock();
  if (live) {
    ++counts_.hits;
    counts_.hit_bytes += live->bytes();
    keep(live);
  }
  return live;
}

std::shared_ptr<SharedLibrary> ImageCache::publish(const ImageDigest& digest,
                                                   std::shared_ptr<SharedLibrary> fresh) {
  if (!enabled_ || !usable(digest)) return fresh;
  std::lock_guard lock(mutex_);
  std::weak_ptr<SharedLibrary>& entry = entries_[digest];
  if (std::shared_ptr<SharedLibrary> live = entry.lock()) {
    ++counts_.hits;
    counts_.hit_bytes += live->bytes();
    keep(live);
    return live;
  }
  entry = fresh;
  ++counts_.loads;
  keep(fresh);
  return fresh;
}

bool ImageCache::known_private(const ImageDigest& digest) {
  std::lock_guard lock(mutex_);
  auto it = verdicts_.find(digest);
  return it != verdicts_.end() && !it->second;
}

bool ImageCache::known_shareable(const ImageDigest& digest) {
  std::lock_guard lock(mutex_);
  auto it = verdicts_.find(digest);
  return it != verdicts_.end() && it->second;
}

void ImageCache::remember(const ImageDigest& digest, bool shareable) {
  if (!usable(digest)) return;
  std::lock_guard lock(mutex_);
  if (verdicts_.size() >= kMaxVerdicts && !verdicts_.contains(digest)) verdicts_.clear();
  verdicts_[digest] = shareable;
}

std::vector<ImageVerdict> ImageCache::verdicts() {
  std::lock_guard lock(mutex_);
  std::vector<ImageVerdict> out;
  out.reserve(verdicts_.size());
  for (const auto& [digest, shareable] : verdicts_) out.push_back({digest, shareable});
  return out;
}

void ImageCache::adopt(const std::vector<ImageVerdict>& verdicts) {
  // At most half the bound: the server's own verdicts must not reach it at once and clear all.
  std::size_t taken = 0;
  for (const ImageVerdict& verdict : verdicts) {
    if (taken == kMaxVerdicts / 2) break;
    if (!usable(verdict.digest)) continue;
    remember(verdict.digest, verdict.shareable);
    ++taken;
  }
  std::lock_guard lock(mutex_);
  counts_.adopted += taken;
}

void ImageCache::forget(const ImageDigest& digest) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(digest);
  // Expired: it named the library being unloaded (or an older one). Live: a session published a
  // newer load of the same bytes after the last holder let go of this one; keep it.
  if (it != entries_.end() && it->second.expired()) entries_.erase(it);
}

void ImageCache::keep(std::shared_ptr<SharedLibrary> library) {
  if (idle_timeout_ <= Clock::duration::zero()) return;
  Kept& kept = kept_[library->digest()];
  kept.library = std::move(library);
  kept.last_held = Clock::now();
}

std::vector<std::shared_ptr<SharedLibrary>> ImageCache::take_unused(Clock::time_point now,
                                                                    Clock::time_point held_after) {
  std::vector<std::shared_ptr<SharedLibrary>> unused;
  std::lock_guard lock(mutex_);
  for (auto it = kept_.begin(); it != kept_.end();) {
    // Only decrements race with this count (every new holder takes its reference under the
    // lock): a stale count above one keeps the library one look longer, never unloads it early.
    if (it->second.library.use_count() > 1) {
      it->second.last_held = now;
      ++it;
    } else if (it->second.last_held < held_after) {
      unused.push_back(std::move(it->second.library));
      it = kept_.erase(it);
    } else {
      ++it;
    }
  }
  return unused;
}

UnloadedImages ImageCache::unload(std::vector<std::shared_ptr<SharedLibrary>> unused) {
  UnloadedImages out{unused.size(), 0};
  for (const auto& library : unused) out.bytes += library->bytes();
  unused.clear();  // unloads, outside the lock (~SharedLibrary takes it to forget its entry)
  std::lock_guard lock(mutex_);
  counts_.expired += out.libraries;
  return out;
}

UnloadedImages ImageCache::unload_unused(Clock::time_point now) {
  if (idle_timeout_ <= Clock::duration::zero()) return {};
  return unload(take_unused(now, now - idle_timeout_));
}

UnloadedImages ImageCache::unload_all_unused() {
  return unload(take_unused(Clock::now(), Clock::time_point::max()));
}

ImageCache::~ImageCache() {
  std::vector<std::shared_ptr<SharedLibrary>> kept;
  {
    std::lock_guard lock(mutex_);
    for (auto& [digest, entry] : kept_) kept.push_back(std::move(entry.library));
    kept_.clear();
  }
  kept.clear();  // while entries_ and mutex_ are still alive: ~SharedLibrary forgets its entry
}

ImageCacheStats ImageCache::stats() {
  std::lock_guard lock(mutex_);
  ImageCacheStats out = counts_;
  out.private_loads = private_loads_.load(std::memory_order_relaxed);
  out.scans = scans_.load(std::memory_order_relaxed);
  out.live = 0;
  for (const auto& [digest, entry] : entries_) out.live += entry.expired() ? 0 : 1;
  for (const auto& [digest, entry] : kept_) {
    if (entry.library.use_count() == 1) {
      ++out.unused;
      out.unused_bytes += entry.library->bytes();
    }
  }
  return out;
}

}  // namespace mpsshim::server
