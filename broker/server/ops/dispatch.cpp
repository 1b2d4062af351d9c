#include "broker/server/ops/dispatch.hpp"

#include <fmt/format.h>

#include <array>
#include <cstring>

#include "broker/server/accounting/heap_profile.hpp"
#include "broker/server/driver/driver.hpp"
#include "broker/server/launch/launch_batch.hpp"
#include "broker/server/ops/call.hpp"
#include "broker/server/ops/ops.hpp"
#include "proto/ops_copies.hpp"
#include "proto/ops_driver_extras.hpp"
#include "proto/ops_graph_nodes.hpp"
#include "proto/ops_green.hpp"
#include "proto/ops_ipc.hpp"
#include "proto/ops_link.hpp"
#include "proto/ops_sparse_array.hpp"
#include "proto/ops_stream_attributes.hpp"
#include "proto/ops_stream_mem.hpp"
#include "proto/ops_tensor_map.hpp"
#include "proto/ops_vmm.hpp"
#include "proto/ops_vmm_share.hpp"

namespace mpsshim::server {
namespace {

using proto::Op;

struct OpSpec {
  const char* name = nullptr;
  OpResult (*run)(Call&) = nullptr;
  std::uint32_t request_bytes = 0;  // the payload holds at least this much
  bool needs_reply = false;  // returns data or must order with the caller: a slot is required
};

constexpr std::size_t kOpCount = static_cast<std::size_t>(Op::kCount);

std::array<OpSpec, kOpCount> make_specs() {
  std::array<OpSpec, kOpCount> s{};
  auto set = [&](Op op, const char* name, OpResult (*run)(Call&), std::uint32_t bytes, bool reply) {
    s[static_cast<std::size_t>(op)] = OpSpec{name, run, bytes, reply};
  };
  using namespace proto;
  set(Op::kGoodbye, "Goodbye", op_goodbye, 0, false);
  set(Op::kPing, "Ping", op_ping, 0, true);
  set(Op::kCtxCreate, "CtxCreate", op_ctx_create, sizeof(CtxCreateReq), true);
  set(Op::kCtxDestroy, "CtxDestroy", op_ctx_destroy, sizeof(CtxReq), false);
  set(Op::kCtxSynchronize, "CtxSynchronize", op_ctx_synchronize, sizeof(CtxReq), true);
  set(Op::kCtxSetLimit, "CtxSetLimit", op_ctx_set_limit, sizeof(CtxLimitReq), false);
  set(Op::kCtxGetLimit, "CtxGetLimit", op_ctx_get_limit, sizeof(CtxLimitReq), true);
  set(Op::kMemAlloc, "MemAlloc", op_mem_alloc, sizeof(MemAllocReq), true);
  set(Op::kMemAllocPitch, "MemAllocPitch", op_mem_alloc_pitch, sizeof(MemAllocPitchReq), true);
  set(Op::kMemFree, "MemFree", op_mem_free, sizeof(MemFreeReq), false);
  set(Op::kMemGetInfo, "MemGetInfo", op_mem_get_info, 0, true);
  set(Op::kHostRegister, "HostRegister", op_host_register, sizeof(HostRegisterReq), true);
  set(Op::kHostUnregister, "HostUnregister", op_host_unregister, sizeof(HostUnregisterReq), false);
  set(Op::kCopyHtoD, "CopyHtoD", op_copy_htod, sizeof(CopyHostReq), false);
  set(Op::kCopyDtoH, "CopyDtoH", op_copy_dtoh, sizeof(CopyHostReq), false);
  set(Op::kCopyDtoD, "CopyDtoD", op_copy_dtod, sizeof(CopyDtoDReq), false);
  set(Op::kMemset, "Memset", op_memset, sizeof(MemsetReq), false);
  set(Op::kImageLoad, "ImageLoad", op_image_load, sizeof(ImageLoadReq), true);
  set(Op::kModuleUnload, "ModuleUnload", op_module_unload, sizeof(HandleReq), false);
  set(Op::kModuleGetFunction, "ModuleGetFunction", op_module_get_function, sizeof(NamedLookupReq),
      true);
  set(Op::kModuleGetGlobal, "ModuleGetGlobal", op_module_get_global, sizeof(NamedLookupReq), true);
  set(Op::kModuleFunctionNames, "ModuleFunctionNames", op_module_function_names,
      sizeof(ModuleFunctionsReq), true);
  set(Op::kLibraryUnload, "LibraryUnload", op_library_unload, sizeof(HandleReq), false);
  set(Op::kLibraryGetKernel, "LibraryGetKernel", op_library_get_kernel, sizeof(NamedLookupReq),
      true);
  set(Op::kLibraryKernelNames, "LibraryKernelNames", op_library_kernel_names,
      sizeof(ModuleFunctionsReq), true);
  set(Op::kPeerExport, "PeerExport", op_peer_export, sizeof(PeerExportReq), true);
  set(Op::kPeerImport, "PeerImport", op_peer_import, sizeof(PeerImportReq), true);
  set(Op::kPeerRelease, "PeerRelease", op_peer_release, sizeof(PeerReleaseReq), true);
  set(Op::kVmmExport, "VmmExport", op_vmm_export, sizeof(HandleReq), true);
  set(Op::kVmmImport, "VmmImport", op_vmm_import, sizeof(VmmImportReq), true);
  set(Op::kVmmShare, "VmmShare", op_vmm_share, sizeof(HandleReq), true);
  set(Op::kVmmOpen, "VmmOpen", op_vmm_open, sizeof(VmmOpenReq), true);
  set(Op::kVmmClose, "VmmClose", op_vmm_close, sizeof(HandleReq), true);
  set(Op::kStreamMemOp, "StreamMemOp", op_stream_mem_op, sizeof(StreamMemOpReq), false);
  set(Op::kStreamAttribute, "StreamAttribute", op_stream_attribute, sizeof(StreamAttributeReq),
      true);
  set(Op::kGraphAddEventNode, "GraphAddEventNode", op_graph_add_event_node,
      sizeof(GraphEventNodeReq), true);
  set(Op::kGraphAddHostNode, "GraphAddHostNode", op_graph_add_host_node, sizeof(GraphHostNodeReq),
      true);
  set(Op::kGraphAddMemAllocNode, "GraphAddMemAllocNode", op_graph_add_mem_alloc_node,
      sizeof(GraphMemAllocNodeReq), true);
  set(Op::kGraphAddMemFreeNode, "GraphAddMemFreeNode", op_graph_add_mem_free_node,
      sizeof(GraphMemFreeNodeReq), true);
  set(Op::kGraphNodeParams, "GraphNodeParams", op_graph_node_params, sizeof(GraphNodeParamsReq),
      true);
  set(Op::kGraphDestroyNode, "GraphDestroyNode", op_graph_destroy_node, sizeof(HandleReq), true);
  set(Op::kGraphRemoveDependencies, "GraphRemoveDependencies", op_graph_remove_dependencies,
      sizeof(GraphAddDependenciesReq), true);
  set(Op::kGraphClone, "GraphClone", op_graph_clone, sizeof(HandleReq), true);
  set(Op::kGraphNodeFindInClone, "GraphNodeFindInClone", op_graph_node_find_in_clone,
      sizeof(GraphFindInCloneReq), true);
  set(Op::kDeviceGraphMem, "DeviceGraphMem", op_device_graph_mem, sizeof(DeviceGraphMemReq), true);
  set(Op::kGraphMemsetNodeSetParams, "GraphMemsetNodeSetParams", op_graph_memset_node_set_params,
      sizeof(GraphMemsetNodeSetReq), true);
  set(Op::kGraphCopyNodeSetParams, "GraphCopyNodeSetParams", op_graph_copy_node_set_params,
      sizeof(GraphCopyNodeSetReq), true);
  set(Op::kOccupancyMaxPotentialClusterSize, "OccupancyMaxPotentialClusterSize",
      op_occupancy_max_potential_cluster_size, sizeof(ClusterOccupancyReq), true);
  set(Op::kLinkCreate, "LinkCreate", op_link_create, sizeof(LinkCreateReq), true);
  set(Op::kLinkAdd, "LinkAdd", op_link_add, sizeof(LinkAddReq), true);
  set(Op::kLinkComplete, "LinkComplete", op_link_complete, sizeof(HandleReq), true);
  set(Op::kLinkDestroy, "LinkDestroy", op_link_destroy, sizeof(HandleReq), true);
  set(Op::kGraphConditionalHandleCreate, "GraphConditionalHandleCreate",
      op_graph_conditional_handle_create, sizeof(GraphConditionalHandleReq), true);
  set(Op::kGraphAddConditionalNode, "GraphAddConditionalNode", op_graph_add_conditional_node,
      sizeof(GraphConditionalNodeReq), true);
  set(Op::kGraphAddBatchMemOpNode, "GraphAddBatchMemOpNode", op_graph_add_batch_mem_op_node,
      sizeof(GraphBatchMemOpNodeReq), true);
  set(Op::kGraphBatchMemOpNodeSetParams, "GraphBatchMemOpNodeSetParams",
      op_graph_batch_mem_op_node_set_params, sizeof(GraphBatchMemOpSetReq), true);
  set(Op::kGraphKernelNodeAttribute, "GraphKernelNodeAttribute", op_graph_kernel_node_attribute,
      sizeof(GraphKernelNodeAttributeReq), true);
  set(Op::kArrayQuery, "ArrayQuery", op_array_query, sizeof(ArrayQueryReq), true);
  set(Op::kMemRangeHandle, "MemRangeHandle", op_mem_range_handle, sizeof(MemRangeHandleReq), true);
  set(Op::kDriverSetting, "DriverSetting", op_driver_setting, sizeof(DriverSettingReq), true);
  set(Op::kCtxEvent, "CtxEvent", op_ctx_event, sizeof(CtxEventReq), true);
  set(Op::kMipmappedArrayCreate, "MipmappedArrayCreate", op_mipmapped_array_create,
      sizeof(ArrayCreateReq), true);
  set(Op::kMipmappedArrayLevel, "MipmappedArrayLevel", op_mipmapped_array_level,
      sizeof(ArrayLevelReq), true);
  set(Op::kMipmappedArrayDestroy, "MipmappedArrayDestroy", op_mipmapped_array_destroy,
      sizeof(HandleReq), false);
  set(Op::kGreenResource, "GreenResource", op_green_resource, sizeof(GreenResourceReq), true);
  set(Op::kGreenSplit, "GreenSplit", op_green_split, sizeof(GreenSplitReq), true);
  set(Op::kGreenDesc, "GreenDesc", op_green_desc, sizeof(GreenDescReq), true);
  set(Op::kGreenCtxCreate, "GreenCtxCreate", op_green_ctx_create, sizeof(GreenCtxCreateReq), true);
  set(Op::kMemDecompress, "MemDecompress", op_mem_decompress, sizeof(MemDecompressReq), true);
  set(Op::kMemMapArray, "MemMapArray", op_mem_map_array, sizeof(MemMapArrayReq), true);
  set(Op::kTensorMapEncode, "TensorMapEncode", op_tensor_map_encode, sizeof(TensorMapEncodeReq),
      true);
  set(Op::kTensorMapReplaceAddress, "TensorMapReplaceAddress", op_tensor_map_replace_address,
      sizeof(TensorMapReplaceReq), true);
  set(Op::kLibraryGetModule, "LibraryGetModule", op_library_get_module, sizeof(HandleReq), true);
  set(Op::kLibraryGetGlobal, "LibraryGetGlobal", op_library_get_global, sizeof(NamedLookupReq),
      true);
  set(Op::kKernelGetFunction, "KernelGetFunction", op_kernel_get_function, sizeof(HandleReq), true);
  set(Op::kFuncGetAttribute, "FuncGetAttribute", op_function_get_attribute, sizeof(AttributeReq),
      true);
  set(Op::kFuncSetAttribute, "FuncSetAttribute", op_function_set_attribute, sizeof(AttributeReq),
      false);
  set(Op::kFuncSetCacheConfig, "FuncSetCacheConfig", op_function_set_cache_config,
      sizeof(AttributeReq), false);
  set(Op::kKernelGetAttribute, "KernelGetAttribute", op_function_get_attribute,
      sizeof(AttributeReq), true);
  set(Op::kKernelSetAttribute, "KernelSetAttribute", op_function_set_attribute,
      sizeof(AttributeReq), false);
  set(Op::kLaunchKernel, "LaunchKernel", op_launch_kernel, sizeof(LaunchReq), false);
  set(Op::kStreamCreate, "StreamCreate", op_stream_create, sizeof(StreamCreateReq), true);
  set(Op::kStreamDestroy, "StreamDestroy", op_stream_destroy, sizeof(HandleReq), false);
  set(Op::kStreamQuery, "StreamQuery", op_stream_query, sizeof(HandleReq), true);
  set(Op::kStreamSynchronize, "StreamSynchronize", op_stream_synchronize, sizeof(HandleReq), true);
  set(Op::kStreamWaitEvent, "StreamWaitEvent", op_stream_wait_event, sizeof(StreamWaitEventReq),
      false);
  set(Op::kEventCreate, "EventCreate", op_event_create, sizeof(EventCreateReq), true);
  set(Op::kEventDestroy, "EventDestroy", op_event_destroy, sizeof(HandleReq), false);
  set(Op::kEventRecord, "EventRecord", op_event_record, sizeof(EventRecordReq), false);
  set(Op::kEventQuery, "EventQuery", op_event_query, sizeof(HandleReq), true);
  set(Op::kEventSynchronize, "EventSynchronize", op_event_synchronize, sizeof(HandleReq), true);
  set(Op::kEventElapsedTime, "EventElapsedTime", op_event_elapsed_time, sizeof(ElapsedReq), true);
  set(Op::kOccupancyMaxActiveBlocks, "OccupancyMaxActiveBlocks", op_occupancy_max_active_blocks,
      sizeof(OccupancyReq), true);
  set(Op::kOccupancyMaxActiveClusters, "OccupancyMaxActiveClusters",
      op_occupancy_max_active_clusters, sizeof(ClusterOccupancyReq), true);
  set(Op::kOccupancyAvailableDynamicSmem, "OccupancyAvailableDynamicSmem",
      op_occupancy_available_dynamic_smem, sizeof(OccupancyReq), true);
  set(Op::kCopy3D, "Copy3D", op_copy_3d, sizeof(Copy3DReq), false);
  set(Op::kArrayCreate, "ArrayCreate", op_array_create, sizeof(ArrayCreateReq), true);
  set(Op::kArrayDestroy, "ArrayDestroy", op_array_destroy, sizeof(HandleReq), false);
  set(Op::kTexObjectCreate, "TexObjectCreate", op_tex_object_create, sizeof(TexObjectCreateReq),
      true);
  set(Op::kTexObjectDestroy, "TexObjectDestroy", op_tex_object_destroy, sizeof(HandleReq), false);
  set(Op::kSurfObjectCreate, "SurfObjectCreate", op_surf_object_create, sizeof(SurfObjectCreateReq),
      true);
  set(Op::kSurfObjectDestroy, "SurfObjectDestroy", op_surf_object_destroy, sizeof(HandleReq),
      false);
  set(Op::kStreamBeginCapture, "StreamBeginCapture", op_stream_begin_capture,
      sizeof(BeginCaptureReq), true);
  set(Op::kStreamEndCapture, "StreamEndCapture", op_stream_end_capture, sizeof(HandleReq), true);
  set(Op::kStreamCaptureInfo, "StreamCaptureInfo", op_stream_capture_info, sizeof(HandleReq), true);
  set(Op::kStreamCaptureDependencies, "StreamCaptureDependencies", op_stream_capture_dependencies,
      sizeof(StreamCaptureDepsReq), true);
  set(Op::kStreamUpdateCaptureDependencies, "StreamUpdateCaptureDependencies",
      op_stream_update_capture_dependencies, sizeof(StreamUpdateCaptureDepsReq), true);
  set(Op::kGraphCreate, "GraphCreate", op_graph_create, sizeof(GraphCreateReq), true);
  set(Op::kGraphDestroy, "GraphDestroy", op_graph_destroy, sizeof(HandleReq), false);
  set(Op::kGraphInstantiate, "GraphInstantiate", op_graph_instantiate, sizeof(GraphInstantiateReq),
      true);
  set(Op::kGraphExecDestroy, "GraphExecDestroy", op_graph_exec_destroy, sizeof(HandleReq), false);
  set(Op::kGraphLaunch, "GraphLaunch", op_graph_launch, sizeof(GraphLaunchReq), false);
  set(Op::kGraphUpload, "GraphUpload", op_graph_launch, sizeof(GraphLaunchReq), false);
  set(Op::kGraphExecUpdate, "GraphExecUpdate", op_graph_exec_update, sizeof(GraphExecUpdateReq),
      true);
  set(Op::kGraphGetNodes, "GraphGetNodes", op_graph_get_nodes, sizeof(GraphGetNodesReq), true);
  set(Op::kGraphAddKernelNode, "GraphAddKernelNode", op_graph_add_kernel_node,
      sizeof(GraphKernelNodeReq), true);
  set(Op::kGraphAddMemsetNode, "GraphAddMemsetNode", op_graph_add_memset_node,
      sizeof(GraphMemsetNodeReq), true);
  set(Op::kGraphAddCopyNode, "GraphAddCopyNode", op_graph_add_copy_node, sizeof(GraphCopyNodeReq),
      true);
  set(Op::kGraphAddEmptyNode, "GraphAddEmptyNode", op_graph_add_empty_node,
      sizeof(GraphAddNodeHeader), true);
  set(Op::kGraphAddDependencies, "GraphAddDependencies", op_graph_add_dependencies,
      sizeof(GraphAddDependenciesReq), true);
  set(Op::kStreamBeginCaptureToGraph, "StreamBeginCaptureToGraph", op_stream_begin_capture_to_graph,
      sizeof(BeginCaptureToGraphReq), true);
  set(Op::kGraphGetEdges, "GraphGetEdges", op_graph_get_edges, sizeof(GraphGetEdgesReq), true);
  set(Op::kGraphExecKernelNodeSetParams, "GraphExecKernelNodeSetParams",
      op_graph_exec_kernel_node_set_params, sizeof(GraphExecKernelNodeReq), true);
  set(Op::kGraphAddChildGraphNode, "GraphAddChildGraphNode", op_graph_add_child_graph_node,
      sizeof(GraphChildNodeReq), true);
  set(Op::kGraphChildGraphNodeGetGraph, "GraphChildGraphNodeGetGraph",
      op_graph_child_graph_node_get_graph, sizeof(HandleReq), true);
  set(Op::kGraphExecChildGraphNodeSetParams, "GraphExecChildGraphNodeSetParams",
      op_graph_exec_child_graph_node_set_params, sizeof(GraphExecChildNodeReq), true);
  set(Op::kGraphNodeGetType, "GraphNodeGetType", op_graph_node_get_type, sizeof(HandleReq), true);
  set(Op::kHostFunc, "HostFunc", op_host_func, sizeof(HostFuncReq), false);
  set(Op::kIpcGetMemHandle, "IpcGetMemHandle", op_ipc_get_mem_handle, sizeof(IpcGetMemHandleReq),
      true);
  set(Op::kIpcOpenMemHandle, "IpcOpenMemHandle", op_ipc_open_mem_handle, sizeof(IpcOpenReq), true);
  set(Op::kIpcCloseMemHandle, "IpcCloseMemHandle", op_ipc_close_mem_handle, sizeof(MemFreeReq),
      true);
  set(Op::kIpcGetEventHandle, "IpcGetEventHandle", op_ipc_get_event_handle, sizeof(HandleReq),
      true);
  set(Op::kIpcOpenEventHandle, "IpcOpenEventHandle", op_ipc_open_event_handle, sizeof(IpcOpenReq),
      true);
  set(Op::kMemPoolCreate, "MemPoolCreate", op_mem_pool_create, sizeof(MemPoolCreateReq), true);
  set(Op::kMemPoolDestroy, "MemPoolDestroy", op_mem_pool_destroy, sizeof(HandleReq), false);
  set(Op::kMemPoolSetAttribute, "MemPoolSetAttribute", op_mem_pool_set_attribute,
      sizeof(MemPoolAttributeReq), true);
  set(Op::kMemPoolGetAttribute, "MemPoolGetAttribute", op_mem_pool_get_attribute,
      sizeof(MemPoolAttributeReq), true);
  set(Op::kMemPoolTrimTo, "MemPoolTrimTo", op_mem_pool_trim_to, sizeof(MemPoolTrimReq), false);
  set(Op::kMemAllocAsync, "MemAllocAsync", op_mem_alloc_async, sizeof(MemAllocAsyncReq), true);
  set(Op::kMemFreeAsync, "MemFreeAsync", op_mem_free_async, sizeof(MemFreeAsyncReq), false);
  // Every VMM call answers: the client needs its result before it uses the memory.
  set(Op::kVmmGranularity, "VmmGranularity", op_vmm_granularity, sizeof(VmmGranularityReq), true);
  set(Op::kVmmCreate, "VmmCreate", op_vmm_create, sizeof(VmmCreateReq), true);
  set(Op::kVmmRelease, "VmmRelease", op_vmm_release, sizeof(HandleReq), true);
  set(Op::kVmmReserve, "VmmReserve", op_vmm_reserve, sizeof(VmmReserveReq), true);
  set(Op::kVmmAddressFree, "VmmAddressFree", op_vmm_address_free, sizeof(VmmRangeReq), true);
  set(Op::kVmmMap, "VmmMap", op_vmm_map, sizeof(VmmMapReq), true);
  set(Op::kVmmUnmap, "VmmUnmap", op_vmm_unmap, sizeof(VmmRangeReq), true);
  set(Op::kVmmSetAccess, "VmmSetAccess", op_vmm_set_access, sizeof(VmmSetAccessReq), true);
  set(Op::kVmmGetAccess, "VmmGetAccess", op_vmm_get_access, sizeof(VmmGetAccessReq), true);
  set(Op::kVmmGetProperties, "VmmGetProperties", op_vmm_get_properties, sizeof(HandleReq), true);
  set(Op::kVmmRetain, "VmmRetain", op_vmm_retain, sizeof(VmmRetainReq), true);
  return s;
}

const std::array<OpSpec, kOpCount>& specs() {
  static const std::array<OpSpec, kOpCount> table = make_specs();
  return table;
}

const OpSpec* find_spec(std::uint16_t opcode) {
  if (opcode >= kOpCount) return nullptr;
  const OpSpec& spec = specs()[opcode];
  return spec.run == nullptr ? nullptr : &spec;
}

// Records after which a cached launch graph, or a function's limits that launch batching read,
// may no longer hold: a function's attributes (its shared memory limit, cache configuration), an
// unloaded module or library (whose CUfunction handles the driver may hand out again for other
// code), a destroyed context, a context limit (stack size). All rare.
// A function's attribute may change the limits a batched launch is checked against; the cached
// graphs do not depend on it (every launch of one sets each node's function).
bool invalidates_launch_limits(Op op) {
  return op == Op::kFuncSetAttribute || op == Op::kFuncSetCacheConfig ||
         op == Op::kKernelSetAttribute;
}

// The driver may hand out an unloaded module's handles again for other code; the graphs' nodes
// may name its functions, and a context limit applies to what the graphs were made for.
bool invalidates_launch_cache(Op op) {
  switch (op) {
    case Op::kModuleUnload:
    case Op::kLibraryUnload:
    case Op::kCtxDestroy:
    case Op::kCtxSetLimit:
      return true;
    default:
      return false;
  }
}

// A record that breaks the protocol: the client is told its connection failed.
DispatchOutcome end_session(std::string why, CUresult notify = CUDA_ERROR_MPS_RPC_FAILURE) {
  DispatchOutcome outcome;
  outcome.kind = DispatchOutcome::Kind::kEndSession;
  outcome.why = std::move(why);
  outcome.notify = notify;
  return outcome;
}

}  // namespace

const char* op_name(proto::Op op) {
  const OpSpec* spec = find_spec(static_cast<std::uint16_t>(op));
  return spec == nullptr ? "unknown operation" : spec->name;
}

DispatchOutcome dispatch_record(Session& session, std::span<const std::byte> record) {
  // The client can rewrite shared bytes at any moment: everything below reads a private copy,
  // one per worker thread.
  alignas(16) thread_local std::byte buffer[kMaxRecordBytes];
  if (record.size() < sizeof(proto::RecordHeader) || record.size() > kMaxRecordBytes) {
    return end_session(
        fmt::format("sent a {}-byte record, more than any operation needs", record.size()));
  }
  std::memcpy(buffer, record.data(), record.size());
  proto::RecordHeader header;
  std::memcpy(&header, buffer, sizeof header);
  header.size = static_cast<std::uint32_t>(record.size());

  const OpSpec* spec = find_spec(header.opcode);
  if (spec == nullptr) return end_session(fmt::format("sent unknown opcode {}", header.opcode));
  std::span<const std::byte> payload(buffer + sizeof header, record.size() - sizeof header);
  if (payload.size() < spec->request_bytes) {
    return end_session(fmt::format("sent a {} record with {} payload bytes; it needs {}",
                                   spec->name, payload.size(), spec->request_bytes));
  }
  const std::uint32_t slot_count = session.segment.geometry().slot_count;
  if (header.reply_slot != proto::kNoReply) {
    if (header.reply_slot >= slot_count) {
      return end_session(fmt::format("named reply slot {} of a {} with only {} slots",
                                     header.reply_slot, spec->name, slot_count));
    }
    if (session.slot_busy[header.reply_slot] != 0) {
      return end_session(
          fmt::format("reused reply slot {} for a {} while its previous answer "
                      "was still owed",
                      header.reply_slot, spec->name));
    }
  } else if (spec->needs_reply) {
    return end_session(fmt::format("sent a {} without a reply slot", spec->name));
  }

  const auto op = static_cast<Op>(header.opcode);
  if (op != Op::kLaunchKernel) {
    // Launches waiting in the session's batch go out before anything else the client sent after
    // them (op_launch_kernel decides for launches itself).
    if (CUresult r = flush_launches(session); r != CUDA_SUCCESS) {
      DispatchOutcome outcome;
      outcome.kind = DispatchOutcome::Kind::kSticky;
      outcome.sticky = r;
      outcome.op = Op::kLaunchKernel;
      outcome.reply_slot = header.reply_slot;  // this record never ran: answered with the fault
      return outcome;
    }
    if (invalidates_launch_cache(op)) {
      session.launch_batch.forget(session.cu());
    } else if (invalidates_launch_limits(op)) {
      session.launch_batch.forget_limits();
    }
  }

  Call call(session, header, payload);
  const std::uint64_t started = SessionStats::now_ns();
  session.stamps.record_taken_ns = started;
  const bool profile_heap = heap_profile_on();  // one branch per record when off
  const std::int64_t heap_before = profile_heap ? heap_in_use_bytes() : 0;
  OpResult result = spec->run(call);
  if (profile_heap) {
    session.stats.heap_growth[header.opcode] += heap_in_use_bytes() - heap_before;
  }
  session.stats.record(static_cast<Op>(header.opcode), SessionStats::now_ns() - started,
                       SessionStats::delay_ns(header.send_stamp, started));
  ++session.records;
  session.control()->records_executed.fetch_add(1, std::memory_order_relaxed);

  if (is_sticky(result.status, false)) {
    // Answered by the server once every client's session holds the fault.
    DispatchOutcome outcome;
    outcome.kind = DispatchOutcome::Kind::kSticky;
    outcome.sticky = result.status;
    outcome.op = call.op();
    outcome.reply_slot = header.reply_slot;
    return outcome;
  }
  switch (result.kind) {
    case OpResult::Kind::kMalformed:
      return end_session(std::move(result.why));
    case OpResult::Kind::kDeferred:
      break;
    case OpResult::Kind::kDone:
    case OpResult::Kind::kEnd:
      if (call.has_reply_slot()) {
        session.answer(header.reply_slot, result.status,
                       std::span<const std::byte>(call.reply_buffer, result.reply_bytes), started);
      } else if (result.status != CUDA_SUCCESS && result.post_async_error) {
        session.post_async_error(result.status);
      }
      break;
  }
  if (result.kind == OpResult::Kind::kEnd) return end_session(std::move(result.why), CUDA_SUCCESS);
  if (!session.life.end_requested.empty()) {
    return end_session(session.life.end_requested, session.life.end_notify);
  }
  return {};
}

}  // namespace mpsshim::server
