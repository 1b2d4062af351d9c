// Green contexts: SM resources, their split, descriptors, green contexts and their streams.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <type_traits>

#include "tests/testdriver/fault_injection.hpp"
#include "tests/testdriver/state.hpp"

namespace mpsshim::testdriver {
namespace {

constexpr std::uint32_t kResourceMagic = 0x4d505354;  // "MPST"
constexpr unsigned kCoscheduledUnit = 8;              // minSmPartitionSize / smCoscheduledAlignment
constexpr unsigned kIndependentUnit = 2;  // with CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING
constexpr unsigned kSplitFlags = CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING |
                                 CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE;

// What the driver keeps in a CUdevResource's opaque bytes.
struct ResourceTag {
  std::uint32_t magic;
  std::int32_t device;
  std::uint64_t split;  // 0: a device's whole SM resource; else the split call that made it
  SmSet sms;
};
static_assert(sizeof(ResourceTag) <= sizeof(CUdevResource::_internal_padding));
static_assert(std::is_trivially_copyable_v<ResourceTag>);

void write_resource(CUdevResource& r, const ResourceTag& tag, unsigned unit, unsigned alignment) {
  std::memset(&r, 0, sizeof r);
  r.type = CU_DEV_RESOURCE_TYPE_SM;
  r.sm.smCount = tag.sms.count();
  r.sm.minSmPartitionSize = unit;
  r.sm.smCoscheduledAlignment = alignment;
  std::memcpy(r._internal_padding, &tag, sizeof tag);
}

// The real driver fails a split made while another thread of the process splits
// (CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION; tools/probes/green_concurrency.cpp, H200). A split
// here takes a millisecond, so that a server whose threads split at once meets the failure in
// a test as it would on a GPU (the server serializes its builds: hold_green_builds()).
std::atomic<int> splits_in_flight{0};
constexpr std::chrono::milliseconds kSplitTime{1};

CUresult read_resource(const State& s, const CUdevResource& r, ResourceTag& tag) {
  if (r.type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
  std::memcpy(&tag, r._internal_padding, sizeof tag);
  if (tag.magic != kResourceMagic) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(s, tag.device)) return CUDA_ERROR_INVALID_DEVICE;
  return CUDA_SUCCESS;
}

// Groups of `size` SMs of `input`, built from chunks of `unit` SMs taken in SM order. Co-scheduled
// chunks (8) each lie within one GPC, so a GPC's SMs beyond a multiple of 8 are never grouped.
std::vector<SmSet> carve(const SmSet& input, unsigned size, unsigned unit, bool coscheduled) {
  std::vector<SmSet> chunks;
  SmSet chunk;
  unsigned first = 0;
  for (unsigned gpc = 0; gpc < kGpcSizes.size(); ++gpc) {
    for (unsigned sm = first; sm < first + kGpcSizes[gpc]; ++sm) {
      if (!input.has(sm)) continue;
      chunk.add(sm);
      if (chunk.count() == unit) {
        chunks.push_back(chunk);
        chunk = SmSet{};
      }
    }
    first += kGpcSizes[gpc];
    if (coscheduled) chunk = SmSet{};
  }
  std::vector<SmSet> groups;
  const unsigned per_group = size / unit;
  for (std::size_t c = 0; c + per_group <= chunks.size(); c += per_group) {
    SmSet group;
    for (unsigned i = 0; i < per_group; ++i) group |= chunks[c + i];
    groups.push_back(group);
  }
  return groups;
}

}  // namespace
}  // namespace mpsshim::testdriver

using namespace mpsshim::testdriver;

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDeviceGetDevResource(CUdevice dev,
                                                                  CUdevResource* resource,
                                                                  CUdevResourceType type) {
  return entry([&](State& s) {
    if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    write_resource(*resource, ResourceTag{kResourceMagic, dev, 0, SmSet::all()}, kCoscheduledUnit,
                   kCoscheduledUnit);
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDevSmResourceSplitByCount(
    CUdevResource* result, unsigned int* nbGroups, const CUdevResource* input,
    CUdevResource* remaining, unsigned int useFlags, unsigned int minCount) {
  if (splits_in_flight.fetch_add(1) != 0) {
    splits_in_flight.fetch_sub(1);
    return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  }
  std::this_thread::sleep_for(kSplitTime);
  struct Leave {
    ~Leave() { splits_in_flight.fetch_sub(1); }
  } leave;
  return entry([&](State& s) {
    if (nbGroups == nullptr || input == nullptr || (useFlags & ~kSplitFlags) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    ResourceTag in{};
    if (CUresult r = read_resource(s, *input, in); r != CUDA_SUCCESS) return r;
    // "The output results cannot be split again without first creating a descriptor and a green
    // context with that descriptor."
    if (in.split != 0) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    if (minCount > in.sms.count()) return CUDA_ERROR_INVALID_VALUE;
    if (result != nullptr && *nbGroups == 0) return CUDA_ERROR_INVALID_VALUE;

    const bool coscheduled = (useFlags & CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING) == 0;
    const unsigned unit = coscheduled ? kCoscheduledUnit : kIndependentUnit;
    const unsigned size = std::max(unit, (minCount + unit - 1) / unit * unit);
    const std::vector<SmSet> groups = carve(in.sms, size, unit, coscheduled);
    if (result == nullptr) {  // a simulation: how many groups there would be
      *nbGroups = static_cast<unsigned>(groups.size());
      return CUDA_SUCCESS;
    }
    const unsigned made = std::min<unsigned>(*nbGroups, static_cast<unsigned>(groups.size()));
    std::uint64_t split = 0;
    {
      std::lock_guard lock(s.mutex);
      split = s.next_split++;
    }
    // The outputs answer 0 in both size fields (H200, driver 580: tools/probes/green_nested.cu);
    // the unit is what the device's or a green context's resource says.
    SmSet rest = in.sms;
    for (unsigned i = 0; i < made; ++i) {
      write_resource(result[i], ResourceTag{kResourceMagic, in.device, split, groups[i]}, 0, 0);
      for (std::uint16_t sm : groups[i].ids()) rest.remove(sm);
    }
    if (remaining != nullptr) {
      write_resource(*remaining, ResourceTag{kResourceMagic, in.device, split, rest}, 0, 0);
    }
    *nbGroups = made;
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuDevResourceGenerateDesc(CUdevResourceDesc* phDesc,
                                                                     CUdevResource* resources,
                                                                     unsigned int nbResources) {
  return entry([&](State& s) {
    if (phDesc == nullptr || resources == nullptr || nbResources == 0)
      return CUDA_ERROR_INVALID_VALUE;
    ResourceTag first{};
    if (CUresult r = read_resource(s, resources[0], first); r != CUDA_SUCCESS) return r;
    SmSet sms = first.sms;
    for (unsigned i = 1; i < nbResources; ++i) {
      ResourceTag tag{};
      if (CUresult r = read_resource(s, resources[i], tag); r != CUDA_SUCCESS) return r;
      // Several resources must be outputs of one split call (cuda.h).
      if (tag.device != first.device || tag.split == 0 || tag.split != first.split)
        return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
      sms |= tag.sms;
    }
    if (sms.count() == 0) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    std::lock_guard lock(s.mutex);
    *phDesc = s.descs.add(std::make_shared<ResourceDesc>(ResourceDesc{first.device, sms}));
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGreenCtxCreate(CUgreenCtx* phCtx,
                                                            CUdevResourceDesc desc, CUdevice dev,
                                                            unsigned int flags) {
  return entry([&](State& s) {
    if (inject_failure("cuGreenCtxCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    if (phCtx == nullptr || flags != CU_GREEN_CTX_DEFAULT_STREAM) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(s, dev)) return CUDA_ERROR_INVALID_DEVICE;
    const ResourceDesc* d = s.descs.get(desc);
    if (d == nullptr || d->device != dev) return CUDA_ERROR_INVALID_VALUE;
    retain_primary(s, *s.devices[static_cast<std::size_t>(dev)]);  // released by cuGreenCtxDestroy
    auto green = std::make_shared<GreenContext>(GreenContext{dev, d->sms, false, nullptr});
    green->default_stream = std::make_unique<Stream>(
        Stream{dev, green->context(), nullptr,
               std::make_shared<const std::vector<std::uint16_t>>(d->sms.ids()),
               CU_STREAM_NON_BLOCKING, kStreamPriorityLeast, WorkQueue::start()});
    const CUcontext view = green->context();
    *phCtx = s.green_contexts.add(std::move(green));
    s.green_by_context.emplace(view, *phCtx);
    return CUDA_SUCCESS;
  });
}

// Streams made in it stay (and leak) until destroyed; they answer CUDA_ERROR_CONTEXT_IS_DESTROYED.
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGreenCtxDestroy(CUgreenCtx hCtx) {
  return entry([&](State& s) {
    std::unique_lock lock(s.mutex);
    std::shared_ptr<GreenContext> green = s.green_contexts.shared(hCtx);
    if (!green) return CUDA_ERROR_INVALID_CONTEXT;
    green->destroyed = true;
    retire_stream(s, *green->default_stream);
    s.green_by_context.erase(green->context());
    s.green_contexts.erase(hCtx);
    return release_primary(s, *s.devices[static_cast<std::size_t>(green->device)], lock);
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGreenCtxStreamCreate(CUstream* phStream,
                                                                  CUgreenCtx greenCtx,
                                                                  unsigned int flags,
                                                                  int priority) {
  return entry([&](State& s) {
    if (inject_failure("cuGreenCtxStreamCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard lock(s.mutex);
    if (phStream == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_ptr<GreenContext> green = s.green_contexts.shared(greenCtx);
    if (!green) return CUDA_ERROR_INVALID_CONTEXT;
    if (flags != CU_STREAM_NON_BLOCKING) return CUDA_ERROR_INVALID_VALUE;  // required by the API
    priority = std::clamp(priority, kStreamPriorityGreatest, kStreamPriorityLeast);
    auto sms = std::make_shared<const std::vector<std::uint16_t>>(green->sms.ids());
    *phStream = s.streams.add(
        std::make_shared<Stream>(Stream{green->device, green->context(), green, std::move(sms),
                                        flags, priority, WorkQueue::start()}));
    return CUDA_SUCCESS;
  });
}

MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuCtxFromGreenCtx(CUcontext* pContext, CUgreenCtx hCtx) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (pContext == nullptr) return CUDA_ERROR_INVALID_VALUE;
    GreenContext* green = s.green_contexts.get(hCtx);
    if (green == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    *pContext = green->context();
    return CUDA_SUCCESS;
  });
}

// A green context's own SMs as a resource that may be split again (as the device's is): the real
// driver answers the co-scheduling unit in both size fields and accepts its split
// (tools/probes/green_nested.cu, H200).
MPSSHIM_TESTDRIVER_EXPORT CUresult CUDAAPI cuGreenCtxGetDevResource(CUgreenCtx hCtx,
                                                                    CUdevResource* resource,
                                                                    CUdevResourceType type) {
  return entry([&](State& s) {
    std::lock_guard lock(s.mutex);
    if (resource == nullptr) return CUDA_ERROR_INVALID_VALUE;
    GreenContext* green = s.green_contexts.get(hCtx);
    if (green == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
    if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    write_resource(*resource, ResourceTag{kResourceMagic, green->device, 0, green->sms},
                   kCoscheduledUnit, kCoscheduledUnit);
    return CUDA_SUCCESS;
  });
}
