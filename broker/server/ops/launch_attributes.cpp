#include "broker/server/ops/launch_attributes.hpp"

#include <cstring>

#include "broker/server/ops/call.hpp"

namespace mpsshim::server {

static_assert(sizeof(CUlaunchAttribute) == sizeof(proto::WireLaunchAttribute));
static_assert(offsetof(CUlaunchAttribute, value) == offsetof(proto::WireLaunchAttribute, value));

CUresult convert_launch_attributes(const Session& session, std::span<const std::byte> wire,
                                   std::uint32_t count, CUlaunchAttribute* out) {
  for (std::uint32_t i = 0; i < count; ++i) {
    proto::WireLaunchAttribute attribute;
    std::memcpy(&attribute, wire.data() + std::size_t{i} * sizeof attribute, sizeof attribute);
    CUlaunchAttribute& a = out[i];
    std::memset(&a, 0, sizeof a);
    a.id = static_cast<CUlaunchAttributeID>(attribute.id);
    std::memcpy(&a.value, attribute.value, sizeof attribute.value);
    switch (a.id) {
      case CU_LAUNCH_ATTRIBUTE_COOPERATIVE:
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
      case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
      case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN:
      case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN_MAP:
      case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        break;
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
        a.value.priority = effective_priority(session, a.value.priority);
        break;
      case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW: {
        // A cache hint, but it carries a pointer: it must name the client's own memory.
        const CUaccessPolicyWindow& w = a.value.accessPolicyWindow;
        if (!session.memory.contains(reinterpret_cast<std::uint64_t>(w.base_ptr), w.num_bytes)) {
          return CUDA_ERROR_INVALID_VALUE;
        }
        break;
      }
      default:
        return CUDA_ERROR_NOT_SUPPORTED;
    }
  }
  return CUDA_SUCCESS;
}

}  // namespace mpsshim::server
