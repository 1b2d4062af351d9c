#include "broker/server/images/image_verdicts.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <new>
#include <string_view>

#include "common/log.hpp"
#include "proto/unix_socket.hpp"

namespace mpsshim::server {
namespace {

constexpr std::string_view kShared = "shared";
constexpr std::string_view kPrivate = "private";

std::string header_line() {
  return fmt::format("mpsshim image verdicts rules={}", kScanRules);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// One line without its newline; false when it is not "<64 hex> shared|private".
bool parse_line(std::string_view line, ImageVerdict& out) {
  constexpr std::size_t kHex = 2 * std::tuple_size_v<ImageDigest>;
  if (line.size() <= kHex + 1 || line[kHex] != ' ') return false;
  for (std::size_t i = 0; i < out.digest.size(); ++i) {
    const int high = hex_value(line[2 * i]);
    const int low = hex_value(line[2 * i + 1]);
    if (high < 0 || low < 0) return false;
    out.digest[i] = static_cast<std::uint8_t>(high << 4 | low);
  }
  const std::string_view word = line.substr(kHex + 1);
  if (word != kShared && word != kPrivate) return false;
  out.shareable = word == kShared;
  return true;
}

std::string read_all(int fd, std::size_t limit, bool& too_long) {
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > limit) {
      too_long = true;
      break;
    }
  }
  return text;
}

}  // namespace

DeviceArch device_arch(const Gpu& gpu) {
  const auto& attributes = gpu.snapshot.attributes;
  return DeviceArch{attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR],
                    attributes[CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR]};
}

std::string verdict_file(const std::string& dir, DeviceArch device) {
  return fmt::format("{}/image-verdicts-sm{}{}", dir, device.major, device.minor);
}

tl::expected<std::vector<ImageVerdict>, std::string> read_verdicts(const std::string& path) {
  proto::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) {
    if (errno == ENOENT) return std::vector<ImageVerdict>{};
    return tl::unexpected(fmt::format("cannot open it: {}", std::strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    return tl::unexpected(fmt::format("cannot stat it: {}", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return tl::unexpected(std::string("not a regular file"));
  if (st.st_uid != ::geteuid()) {
    return tl::unexpected(fmt::format("owned by uid {}, not this server's", st.st_uid));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return tl::unexpected(fmt::format("others may write it (mode {:o})", st.st_mode & 07777));
  }
  const std::size_t line_bytes = 2 * std::tuple_size_v<ImageDigest> + 1 + kPrivate.size() + 1;
  bool too_long = false;
  const std::string text = read_all(fd.get(), (kMaxVerdictLines + 1) * line_bytes, too_long);
  if (too_long) return tl::unexpected(std::string("longer than a server writes"));
  std::vector<ImageVerdict> out;
  std::size_t at = 0;
  bool first = true;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) return tl::unexpected(std::string("its last line is cut short"));
    std::string_view line(text.data() + at, end - at);
    const std::size_t number = out.size() + 2;
    at = end + 1;
    if (first) {
      if (line != header_line()) {
        return tl::unexpected(
            fmt::format("not written under this server's rules (\"{}\")", line.substr(0, 60)));
      }
      first = false;
      continue;
    }
    ImageVerdict verdict;
    if (!parse_line(line, verdict))
      return tl::unexpected(fmt::format("line {} is malformed", number));
    out.push_back(verdict);
  }
  if (first) return tl::unexpected(std::string("it is empty"));
  return out;
}

tl::expected<std::size_t, std::string> write_verdicts(const std::string& path,
                                                      const std::vector<ImageVerdict>& verdicts) {
  // Servers of GPUs of one compute capability share the file and end together when the daemon
  // stops: one at a time reads, merges and renames, so none loses another's verdicts.
  const std::string lock_path = path + ".lock";
  proto::UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock) {
    return tl::unexpected(fmt::format("cannot open {}: {}", lock_path, std::strerror(errno)));
  }
  while (::flock(lock.get(), LOCK_EX) != 0) {
    if (errno != EINTR) {
      return tl::unexpected(fmt::format("cannot lock {}: {}", lock_path, std::strerror(errno)));
    }
  }
  std::map<ImageDigest, bool> all;
  if (auto kept = read_verdicts(path)) {
    for (const ImageVerdict& verdict : *kept) all[verdict.digest] = verdict.shareable;
  }
  for (const ImageVerdict& verdict : verdicts) all[verdict.digest] = verdict.shareable;
  while (all.size() > kMaxVerdictLines) all.erase(all.begin());
  std::string text = header_line() + "\n";
  text.reserve(text.size() + all.size() * 72);
  for (const auto& [digest, shareable] : all) {
    for (std::uint8_t b : digest) fmt::format_to(std::back_inserter(text), "{:02x}", b);
    text += ' ';
    text += shareable ? kShared : kPrivate;
    text += '\n';
  }
  std::string temporary = path + ".XXXXXX";
  proto::UniqueFd fd(::mkostemp(temporary.data(), O_CLOEXEC));
  if (!fd)
    return tl::unexpected(fmt::format("cannot create {}: {}", temporary, std::strerror(errno)));
  auto fail = [&](const char* what, int error) {
    std::string why = fmt::format("{} {}: {}", what, temporary, std::strerror(error));
    ::unlink(temporary.c_str());
    return tl::unexpected(why);
  };
  // Only the server reads it: the digests say which images its clients loaded.
  if (::fchmod(fd.get(), 0600) != 0) return fail("cannot chmod", errno);
  std::size_t written = 0;
  while (written < text.size()) {
    ssize_t n = ::write(fd.get(), text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("cannot write", errno);
    if (n == 0) return fail("cannot write", EIO);
    written += static_cast<std::size_t>(n);
  }
  // A file cut short by a crash would be refused whole: flushed before it replaces the last.
  if (::fsync(fd.get()) != 0) return fail("cannot flush", errno);
  if (::rename(temporary.c_str(), path.c_str()) != 0) return fail("cannot rename", errno);
  return all.size();
}

void adopt_kept_verdicts(ImageCache& cache, const std::string& dir, DeviceArch device) {
  if (dir.empty() || !cache.enabled()) return;
  const std::string path = verdict_file(dir, device);
  auto kept = read_verdicts(path);
  if (!kept) {
    log_warn(
        "image verdicts: {} ignored ({}); every image is scanned, and the server replaces the "
        "file with its own verdicts at its orderly end",
        path, kept.error());
    return;
  }
  cache.adopt(*kept);
  log_info("image verdicts: {} read from {}", kept->size(), path);
}

void keep_verdicts(ImageCache& cache, const std::string& dir, DeviceArch device) noexcept {
  if (dir.empty() || !cache.enabled()) return;
  const std::string path = verdict_file(dir, device);
  tl::expected<std::size_t, std::string> written = tl::unexpected(std::string("out of memory"));
  try {
    written = write_verdicts(path, cache.verdicts());
  } catch (const std::bad_alloc&) {
    // At the server's end: a cache not kept, never a crash.
  }
  if (!written) {
    log_warn("image verdicts: not kept: {}", written.error());
    return;
  }
  log_info("image verdicts: {} kept in {}", *written, path);
}

}  // namespace mpsshim::server
