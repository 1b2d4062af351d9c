// The image scan's verdicts kept across server restarts (mpsshim-server --image-verdict-dir).
//
// The first client after a server starts waits while each library image it loads is scanned for
// variables (image_globals.hpp): about 2 s of a PyTorch client's first inference on an H200,
// for images whose verdict cannot change. The verdict is a function of the bytes, the GPU's
// compute capability and the scan's rules, so a server keeps its verdicts in a file named after
// the compute capability, writes them at its orderly end and reads them at its start; a file
// written under other rules (kScanRules) is ignored.
//
// A verdict says whether clients may share the image's variables, so the file is trusted only
// when the server's own user wrote it and no one else may change it: a file another user owns
// or may write, or a symbolic link, is ignored. Writes go to a temporary file (mode 0600: the
// digests say which images clients loaded), flushed and renamed over the old one, merged with
// what the file held under an flock of FILE.lock, so servers of GPUs of one compute capability
// and of isolation groups add to one another's verdicts and a reader never sees half a file.
//
// kScanRules must change with every change to image_globals.cpp, or stale verdicts would skip
// a scan that now refuses what it once allowed: image_verdicts_test pins the rules to a SHA-256
// of that file and fails until both are raised together.
//
// Format, text: the line "mpsshim image verdicts rules=N", then one line per image: 64
// lowercase hex digits of its digest (image_cache.hpp), a space, "shared" or "private".
#pragma once

#include <string>
#include <vector>

#include <tl/expected.hpp>

#include "broker/server/driver/gpu.hpp"
#include "broker/server/images/image_cache.hpp"
#include "broker/server/images/image_globals.hpp"

namespace mpsshim::server {

// Raised whenever a change to image_globals.cpp can change a verdict.
inline constexpr int kScanRules = 2;
// A file with more lines than this is not one a server wrote (ImageCache::kMaxVerdicts).
inline constexpr std::size_t kMaxVerdictLines = ImageCache::kMaxVerdicts;

// The GPU's compute capability, from the snapshot taken at start: which entries of an image
// the scan reads, and which verdicts apply.
DeviceArch device_arch(const Gpu& gpu);

// `dir`/image-verdicts-sm<major><minor>.
std::string verdict_file(const std::string& dir, DeviceArch device);

// The verdicts the file holds; an empty list when it does not exist; why not when it is not a
// file this server may trust or not one a server wrote.
tl::expected<std::vector<ImageVerdict>, std::string> read_verdicts(const std::string& path);

// Writes `verdicts` and those the file holds now (which a new verdict overrides); the number
// written, or why not.
tl::expected<std::size_t, std::string> write_verdicts(const std::string& path,
                                                      const std::vector<ImageVerdict>& verdicts);

// At a server's start: adopts into `cache` the verdicts kept in `dir` for `device`, and logs how
// many (or why none). Nothing when `dir` is empty or sharing is off.
void adopt_kept_verdicts(ImageCache& cache, const std::string& dir, DeviceArch device);
// At its orderly end: writes the cache's verdicts there, and logs how many (or why not).
void keep_verdicts(ImageCache& cache, const std::string& dir, DeviceArch device) noexcept;

}  // namespace mpsshim::server
