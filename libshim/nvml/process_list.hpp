// One rule for every process list the share answers: the public calls (entry.cpp) and the lists
// of nvidia-smi's private table (export_table.cpp). The real call checks the device first, so a
// bad handle fails as it does natively; then a compute list holds the share's processes and a
// graphics or MPS list none (the scope's clients are compute clients of mpsshim's servers); an
// array too short gets NVML_ERROR_INSUFFICIENT_SIZE with the count needed, as NVML answers. A
// device without a share keeps the real list.
#pragma once

#include "libshim/nvml/nvml_api.hpp"
#include "libshim/nvml/share_view.hpp"

namespace mpsshim::nvml {

// `fill(entry, process)` writes one entry of the list's own layout.
template <typename Entry, typename Fill>
Return answer_process_list(Return (*real_list)(Device, unsigned*, Entry*), Device device,
                           unsigned* count, Entry* entries, bool compute, Fill fill) {
  if (real_list == nullptr) return kErrorFunctionNotFound;
  auto share = count != nullptr ? share_of_device(device) : std::nullopt;
  if (!share) return real_list(device, count, entries);
  unsigned probe = 0;
  if (Return r = real_list(device, &probe, nullptr); r != kSuccess && r != kErrorInsufficientSize) {
    return r;
  }
  const auto needed = compute ? static_cast<unsigned>(share->processes.size()) : 0u;
  if (*count < needed) {
    *count = needed;
    return kErrorInsufficientSize;
  }
  if (needed > 0 && entries == nullptr) return kErrorInvalidArgument;
  for (unsigned i = 0; i < needed; ++i) fill(entries[i], share->processes[i]);
  *count = needed;
  return kSuccess;
}

}  // namespace mpsshim::nvml
