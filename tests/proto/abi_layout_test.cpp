// Pins the layout of everything in proto/ to the ABI version. If this fails, a struct that
// crosses the process boundary changed: bump proto::kAbiMajor (incompatible) or kAbiMinor
// (additive), then record the new fingerprint below for that version.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "proto/abi.hpp"
#include "proto/control.hpp"
#include "proto/device_snapshot.hpp"
#include "proto/ops.hpp"
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
#include "proto/ring.hpp"
#include "proto/segment.hpp"

using namespace mpsshim::proto;

namespace {

// FNV-1a over every size and field offset, in a fixed order.
struct Fingerprint {
  std::uint64_t h = 1469598103934665603ull;
  void add(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
};

#define SIZE(T) f.add(sizeof(T)), f.add(alignof(T))
#define FIELD(T, m) f.add(offsetof(T, m))

std::uint64_t layout_fingerprint() {
  Fingerprint f;
  SIZE(HelloHeader);
  FIELD(HelloHeader, magic);
  FIELD(HelloHeader, abi_major);
  FIELD(HelloHeader, abi_minor);
  FIELD(HelloHeader, size);
  FIELD(HelloHeader, kind);
  SIZE(ClientHello);
  FIELD(ClientHello, pid);
  FIELD(ClientHello, device);
  FIELD(ClientHello, active_thread_percentage);
  FIELD(ClientHello, priority);
  FIELD(ClientHello, device_memory_limit);
  FIELD(ClientHello, flags);
  FIELD(ClientHello, sm_partition);
  FIELD(ClientHello, visible_devices);
  FIELD(ClientHello, program);
  FIELD(ClientHello, allocation_token);
  SIZE(ClientViewRequest);
  FIELD(ClientViewRequest, memory_limit_by_ordinal);
  SIZE(Refused);
  FIELD(Refused, cuda_error);
  FIELD(Refused, message);
  SIZE(DaemonDevices);
  FIELD(DaemonDevices, device_count);
  SIZE(SessionWelcome);
  FIELD(SessionWelcome, client_id);
  FIELD(SessionWelcome, sm_count);
  FIELD(SessionWelcome, segment_bytes);
  FIELD(SessionWelcome, memory_limit);
  FIELD(SessionWelcome, physical_ordinal);
  FIELD(SessionWelcome, priority);
  SIZE(ServerReady);
  FIELD(ServerReady, ordinal);
  FIELD(ServerReady, device_count);
  FIELD(ServerReady, status);
  FIELD(ServerReady, message);
  FIELD(ServerReady, snapshot);
  SIZE(ServerAdmit);
  FIELD(ServerAdmit, peer_pid);
  FIELD(ServerAdmit, allocation_id);
  FIELD(ServerAdmit, hello);
  FIELD(ServerAdmit, allocation_memory_limit);
  FIELD(ServerAdmit, allocation_sm_slot);
  FIELD(ServerAdmit, allocation_sm_slots);
  FIELD(ServerAdmit, sm_partition);
  FIELD(ServerAdmit, partition_first_group);
  FIELD(ServerAdmit, partition_groups);
  SIZE(FdTransfer);
  FIELD(FdTransfer, token);
  FIELD(FdTransfer, bytes);
  SIZE(TextMessage);
  FIELD(TextMessage, status);
  FIELD(TextMessage, length);
  FIELD(TextMessage, text);
  SIZE(DeviceSnapshot);
  FIELD(DeviceSnapshot, name);
  FIELD(DeviceSnapshot, uuid);
  FIELD(DeviceSnapshot, total_memory);
  FIELD(DeviceSnapshot, driver_version);
  FIELD(DeviceSnapshot, sm_count);
  FIELD(DeviceSnapshot, attribute_count);
  FIELD(DeviceSnapshot, attributes);
  FIELD(DeviceSnapshot, stream_priority_least);
  FIELD(DeviceSnapshot, arena_base);
  FIELD(DeviceSnapshot, arena_bytes);
  FIELD(DeviceSnapshot, peer_access_mask);
  FIELD(DeviceSnapshot, peer_atomics_mask);
  FIELD(DeviceSnapshot, peer_array_mask);
  SIZE(RecordHeader);
  FIELD(RecordHeader, size);
  FIELD(RecordHeader, opcode);
  FIELD(RecordHeader, flags);
  FIELD(RecordHeader, reply_slot);
  FIELD(RecordHeader, send_stamp);
  SIZE(RingControl);
  FIELD(RingControl, head);
  FIELD(RingControl, tail);
  FIELD(RingControl, consumer_waiting);
  FIELD(RingControl, producer_waiting);
  FIELD(RingControl, capacity);
  SIZE(SegmentHeader);
  FIELD(SegmentHeader, ring_offset);
  FIELD(SegmentHeader, slots_offset);
  FIELD(SegmentHeader, chunk_states_offset);
  FIELD(SegmentHeader, staging_offset);
  FIELD(SegmentHeader, chunk_bytes);
  FIELD(SegmentHeader, callback_cell_count);
  FIELD(SegmentHeader, callbacks_offset);
  SIZE(SessionControl);
  FIELD(SessionControl, fault);
  FIELD(SessionControl, async_error);
  FIELD(SessionControl, records_executed);
  FIELD(SessionControl, crowded);
  FIELD(SessionControl, fault_pid);
  FIELD(SessionControl, fault_program);
  SIZE(ResponseSlot);
  FIELD(ResponseSlot, state);
  FIELD(ResponseSlot, waiter);
  FIELD(ResponseSlot, result);
  FIELD(ResponseSlot, payload_bytes);
  FIELD(ResponseSlot, payload);
  SIZE(ChunkState);
  FIELD(ChunkState, done_generation);
  FIELD(ChunkState, result);
  SIZE(CtxCreateReq);
  SIZE(CtxCreateRep);
  SIZE(CtxReq);
  SIZE(CtxLimitReq);
  SIZE(CtxLimitRep);
  SIZE(MemAllocReq);
  SIZE(MemAllocRep);
  SIZE(MemAllocPitchReq);
  SIZE(MemAllocPitchRep);
  SIZE(MemFreeReq);
  SIZE(MemGetInfoRep);
  SIZE(HostRegisterReq);
  SIZE(HostRegisterRep);
  SIZE(HostUnregisterReq);
  SIZE(HostRef);
  FIELD(HostRef, kind);
  FIELD(HostRef, generation);
  SIZE(CopyHostReq);
  FIELD(CopyHostReq, host);
  SIZE(CopyDtoDReq);
  SIZE(MemsetReq);
  FIELD(MemsetReq, value);
  FIELD(MemsetReq, element_bytes);
  SIZE(ImageLoadReq);
  FIELD(ImageLoadReq, token);
  FIELD(ImageLoadReq, containers);
  FIELD(ImageLoadReq, flags);
  SIZE(ImageLoadRep);
  SIZE(LibraryLoadRep);
  FIELD(LibraryLoadRep, names_known);
  FIELD(LibraryLoadRep, names);
  SIZE(HandleReq);
  SIZE(NamedLookupReq);
  SIZE(ParamSlot);
  SIZE(FunctionRep);
  FIELD(FunctionRep, params);
  SIZE(ModuleFunctionsReq);
  FIELD(ModuleFunctionsReq, first);
  SIZE(ModuleFunctionsRep);
  FIELD(ModuleFunctionsRep, names);
  SIZE(GlobalRep);
  SIZE(AttributeReq);
  SIZE(AttributeRep);
  SIZE(WireLaunchAttribute);
  SIZE(LaunchReq);
  FIELD(LaunchReq, grid);
  FIELD(LaunchReq, block);
  FIELD(LaunchReq, shared_bytes);
  FIELD(LaunchReq, args_bytes);
  FIELD(LaunchReq, attribute_count);
  SIZE(StreamCreateReq);
  SIZE(StreamCreateRep);
  SIZE(StreamWaitEventReq);
  SIZE(EventCreateReq);
  SIZE(EventCreateRep);
  SIZE(EventRecordReq);
  SIZE(ElapsedReq);
  SIZE(ElapsedRep);
  SIZE(OccupancyReq);
  SIZE(OccupancyRep);
  SIZE(ClusterOccupancyReq);
  SIZE(CopySide);
  FIELD(CopySide, offset);
  FIELD(CopySide, pitch);
  FIELD(CopySide, height);
  FIELD(CopySide, kind);
  FIELD(CopySide, generation);
  SIZE(Copy3DReq);
  FIELD(Copy3DReq, width_bytes);
  FIELD(Copy3DReq, src);
  FIELD(Copy3DReq, dst);
  SIZE(ArrayDescriptor);
  FIELD(ArrayDescriptor, format);
  FIELD(ArrayDescriptor, channels);
  FIELD(ArrayDescriptor, flags);
  SIZE(ArrayCreateReq);
  SIZE(ArrayCreateRep);
  SIZE(WireResourceDesc);
  FIELD(WireResourceDesc, handle);
  FIELD(WireResourceDesc, format);
  FIELD(WireResourceDesc, size_bytes);
  FIELD(WireResourceDesc, pitch);
  SIZE(WireTextureDesc);
  FIELD(WireTextureDesc, filter_mode);
  FIELD(WireTextureDesc, mipmap_level_bias);
  FIELD(WireTextureDesc, border_color);
  SIZE(WireResourceViewDesc);
  FIELD(WireResourceViewDesc, width);
  FIELD(WireResourceViewDesc, first_mipmap_level);
  SIZE(TexObjectCreateReq);
  FIELD(TexObjectCreateReq, resource);
  FIELD(TexObjectCreateReq, texture);
  FIELD(TexObjectCreateReq, view);
  SIZE(SurfObjectCreateReq);
  SIZE(TexObjectRep);
  f.add(static_cast<std::uint64_t>(Op::kCopy3D));
  f.add(static_cast<std::uint64_t>(Op::kSurfObjectDestroy));
  SIZE(BeginCaptureReq);
  FIELD(BeginCaptureReq, mode);
  SIZE(EndCaptureRep);
  SIZE(CaptureInfoRep);
  FIELD(CaptureInfoRep, id);
  FIELD(CaptureInfoRep, graph);
  FIELD(CaptureInfoRep, dependency_count);
  SIZE(GraphCreateReq);
  SIZE(GraphRep);
  SIZE(GraphInstantiateReq);
  FIELD(GraphInstantiateReq, upload_stream);
  FIELD(GraphInstantiateReq, flags);
  SIZE(GraphInstantiateRep);
  FIELD(GraphInstantiateRep, result);
  SIZE(GraphLaunchReq);
  SIZE(GraphExecUpdateReq);
  SIZE(GraphExecUpdateRep);
  SIZE(GraphGetNodesReq);
  SIZE(GraphGetNodesRep);
  FIELD(GraphGetNodesRep, count);
  FIELD(GraphGetNodesRep, nodes);
  SIZE(StreamCaptureDepsReq);
  FIELD(StreamCaptureDepsReq, first);
  SIZE(StreamUpdateCaptureDepsReq);
  FIELD(StreamUpdateCaptureDepsReq, flags);
  FIELD(StreamUpdateCaptureDepsReq, count);
  SIZE(GraphAddNodeHeader);
  FIELD(GraphAddNodeHeader, dependency_count);
  SIZE(GraphKernelNodeReq);
  FIELD(GraphKernelNodeReq, function);
  FIELD(GraphKernelNodeReq, grid);
  FIELD(GraphKernelNodeReq, block);
  FIELD(GraphKernelNodeReq, shared_bytes);
  FIELD(GraphKernelNodeReq, args_bytes);
  SIZE(GraphMemsetNodeReq);
  FIELD(GraphMemsetNodeReq, dst);
  FIELD(GraphMemsetNodeReq, value);
  FIELD(GraphMemsetNodeReq, element_bytes);
  SIZE(GraphCopyNodeReq);
  FIELD(GraphCopyNodeReq, src);
  FIELD(GraphCopyNodeReq, bytes);
  SIZE(GraphAddDependenciesReq);
  SIZE(BeginCaptureToGraphReq);
  FIELD(BeginCaptureToGraphReq, graph);
  FIELD(BeginCaptureToGraphReq, mode);
  FIELD(BeginCaptureToGraphReq, dependency_count);
  SIZE(GraphGetEdgesReq);
  FIELD(GraphGetEdgesReq, first);
  SIZE(WireEdge);
  FIELD(WireEdge, to);
  FIELD(WireEdge, from_port);
  FIELD(WireEdge, to_port);
  FIELD(WireEdge, type);
  SIZE(GraphGetEdgesRep);
  FIELD(GraphGetEdgesRep, count);
  FIELD(GraphGetEdgesRep, edges);
  SIZE(GraphExecKernelNodeReq);
  FIELD(GraphExecKernelNodeReq, node);
  FIELD(GraphExecKernelNodeReq, function);
  FIELD(GraphExecKernelNodeReq, grid);
  FIELD(GraphExecKernelNodeReq, block);
  FIELD(GraphExecKernelNodeReq, shared_bytes);
  FIELD(GraphExecKernelNodeReq, args_bytes);
  SIZE(GraphChildNodeReq);
  FIELD(GraphChildNodeReq, child);
  SIZE(GraphExecChildNodeReq);
  FIELD(GraphExecChildNodeReq, node);
  FIELD(GraphExecChildNodeReq, child);
  SIZE(HostCallbackControl);
  FIELD(HostCallbackControl, posted);
  FIELD(HostCallbackControl, cell_count);
  SIZE(HostCallbackCell);
  FIELD(HostCallbackCell, requested);
  FIELD(HostCallbackCell, done);
  FIELD(HostCallbackCell, flags);
  FIELD(HostCallbackCell, status);
  FIELD(HostCallbackCell, callback_id);
  SIZE(HostFuncReq);
  FIELD(HostFuncReq, callback_id);
  FIELD(HostFuncReq, kind);
  SIZE(MemPoolCreateReq);
  FIELD(MemPoolCreateReq, usage);
  SIZE(MemPoolCreateRep);
  SIZE(MemPoolAttributeReq);
  FIELD(MemPoolAttributeReq, attribute);
  FIELD(MemPoolAttributeReq, value);
  SIZE(MemPoolAttributeRep);
  SIZE(MemPoolTrimReq);
  SIZE(MemAllocAsyncReq);
  FIELD(MemAllocAsyncReq, stream);
  FIELD(MemAllocAsyncReq, bytes);
  SIZE(MemFreeAsyncReq);
  FIELD(MemFreeAsyncReq, stream);
  SIZE(VmmProp);
  FIELD(VmmProp, handle_types);
  FIELD(VmmProp, location_type);
  FIELD(VmmProp, compression);
  FIELD(VmmProp, rdma_capable);
  FIELD(VmmProp, usage);
  SIZE(VmmGranularityReq);
  FIELD(VmmGranularityReq, option);
  SIZE(VmmGranularityRep);
  SIZE(VmmCreateReq);
  FIELD(VmmCreateReq, bytes);
  FIELD(VmmCreateReq, flags);
  SIZE(VmmHandleRep);
  SIZE(VmmReserveReq);
  FIELD(VmmReserveReq, alignment);
  FIELD(VmmReserveReq, address);
  FIELD(VmmReserveReq, flags);
  SIZE(VmmAddressRep);
  SIZE(VmmRangeReq);
  FIELD(VmmRangeReq, bytes);
  SIZE(VmmMapReq);
  FIELD(VmmMapReq, bytes);
  FIELD(VmmMapReq, offset);
  FIELD(VmmMapReq, handle);
  FIELD(VmmMapReq, flags);
  SIZE(VmmAccessDesc);
  FIELD(VmmAccessDesc, flags);
  SIZE(VmmSetAccessReq);
  FIELD(VmmSetAccessReq, bytes);
  FIELD(VmmSetAccessReq, count);
  SIZE(VmmGetAccessReq);
  FIELD(VmmGetAccessReq, location_type);
  SIZE(VmmGetAccessRep);
  SIZE(VmmRetainReq);
  SIZE(GraphNodeTypeRep);
  SIZE(IpcHandle);
  FIELD(IpcHandle, kind);
  FIELD(IpcHandle, device);
  FIELD(IpcHandle, server_id);
  FIELD(IpcHandle, token);
  FIELD(IpcHandle, secret);
  FIELD(IpcHandle, offset);
  FIELD(IpcHandle, bytes);
  SIZE(IpcGetMemHandleReq);
  SIZE(IpcOpenReq);
  FIELD(IpcOpenReq, ctx);
  FIELD(IpcOpenReq, flags);
  SIZE(IpcOpenMemRep);
  SIZE(IpcCloseRep);
  f.add(kIpcHandleMagic);
  f.add(kMaxVmmAccessDescs);
  f.add(static_cast<std::uint64_t>(Op::kCount));
  f.add(static_cast<std::uint64_t>(MessageKind::kServerTerminateClient));
  f.add(kSlotBytes);
  f.add(kMaxDeviceAttributes);
  SIZE(PeerExportReq);
  SIZE(PeerExportRep);
  FIELD(PeerExportRep, bytes);
  SIZE(PeerImportReq);
  FIELD(PeerImportReq, bytes);
  FIELD(PeerImportReq, token);
  SIZE(PeerReleaseReq);
  SIZE(VmmImportReq);
  f.add(static_cast<std::uint64_t>(Op::kVmmImport));
  f.add(static_cast<std::uint64_t>(MessageKind::kPeerMemory));
  f.add(static_cast<std::uint64_t>(MessageKind::kServerFault));
  FIELD(HostRegisterRep, host_address);
  SIZE(TensorMapEncodeReq);
  FIELD(TensorMapEncodeReq, global_address);
  FIELD(TensorMapEncodeReq, pixels_per_column);
  SIZE(TensorMapRep);
  SIZE(TensorMapReplaceReq);
  f.add(static_cast<std::uint64_t>(Op::kTensorMapReplaceAddress));
  SIZE(VmmOpenReq);
  SIZE(VmmOpenRep);
  FIELD(VmmOpenRep, bytes);
  f.add(static_cast<std::uint64_t>(IpcKind::kVmm));
  SIZE(StreamMemOpReq);
  FIELD(StreamMemOpReq, value);
  FIELD(StreamMemOpReq, flags);
  f.add(static_cast<std::uint64_t>(Op::kStreamMemOp));
  SIZE(StreamAttributeReq);
  FIELD(StreamAttributeReq, attribute);
  f.add(static_cast<std::uint64_t>(Op::kStreamAttribute));
  SIZE(GraphEventNodeReq);
  FIELD(GraphEventNodeReq, kind);
  SIZE(GraphHostNodeReq);
  SIZE(GraphMemAllocNodeReq);
  SIZE(GraphMemAllocRep);
  FIELD(GraphMemAllocRep, dptr);
  SIZE(GraphMemFreeNodeReq);
  SIZE(GraphNodeParamsReq);
  FIELD(GraphNodeParamsReq, param);
  FIELD(GraphNodeParamsReq, set);
  SIZE(GraphNodeValueRep);
  SIZE(GraphFindInCloneReq);
  SIZE(DeviceGraphMemReq);
  FIELD(DeviceGraphMemReq, value);
  f.add(static_cast<std::uint64_t>(Op::kDeviceGraphMem));
  SIZE(GraphMemsetNodeSetReq);
  FIELD(GraphMemsetNodeSetReq, element_bytes);
  SIZE(GraphCopyNodeSetReq);
  FIELD(GraphCopyNodeSetReq, bytes);
  f.add(static_cast<std::uint64_t>(Op::kOccupancyMaxPotentialClusterSize));
  // 1.23: the JIT linker, conditional and batch memory operation nodes, kernel node attributes,
  // array queries, dma-buf handles and driver settings.
  SIZE(WireJitOption);
  SIZE(LinkCreateReq);
  SIZE(LinkAddReq);
  FIELD(LinkAddReq, option_count);
  SIZE(LinkLogRep);
  FIELD(LinkLogRep, text);
  SIZE(GraphConditionalHandleReq);
  SIZE(GraphConditionalNodeReq);
  FIELD(GraphConditionalRep, bodies);
  SIZE(GraphBatchMemOpNodeReq);
  SIZE(GraphBatchMemOpSetReq);
  SIZE(GraphKernelNodeAttributeReq);
  FIELD(GraphKernelNodeAttributeReq, attribute);
  SIZE(ArrayQueryReq);
  SIZE(ArrayQueryRep);
  FIELD(ArrayQueryRep, flags);
  SIZE(MemRangeHandleReq);
  SIZE(DriverSettingReq);
  f.add(static_cast<std::uint64_t>(Op::kDriverSetting));
  // 1.24: cuCtxRecordEvent / cuCtxWaitEvent, mipmapped arrays.
  SIZE(CtxEventReq);
  f.add(static_cast<std::uint64_t>(Op::kCtxEvent));
  SIZE(ArrayLevelReq);
  SIZE(ArrayLevelRep);
  FIELD(ArrayQueryReq, mipmapped);
  f.add(static_cast<std::uint64_t>(Op::kMipmappedArrayDestroy));
  // 1.26: a client's own green contexts.
  SIZE(DevResource);
  SIZE(GreenResourceReq);
  SIZE(GreenSplitReq);
  FIELD(GreenSplitReq, first);
  SIZE(GreenSplitRep);
  FIELD(GreenSplitRep, result);
  SIZE(GreenDescReq);
  SIZE(GreenDescRep);
  SIZE(GreenCtxCreateReq);
  SIZE(GreenCtxCreateRep);
  f.add(static_cast<std::uint64_t>(Op::kGreenCtxCreate));
  SIZE(MemDecompressReq);
  SIZE(WireDecompressParams);
  FIELD(WireDecompressParams, algo);
  SIZE(MemDecompressRep);
  f.add(static_cast<std::uint64_t>(Op::kMemDecompress));
  SIZE(MemMapArrayReq);
  SIZE(WireArrayMapInfo);
  FIELD(WireArrayMapInfo, allocation);
  FIELD(WireArrayMapInfo, device_mask);
  f.add(static_cast<std::uint64_t>(Op::kMemMapArray));
  return f.h;
}

// One line per released ABI version: {major, minor, fingerprint}.
struct Pinned {
  std::uint16_t major, minor;
  std::uint64_t fingerprint;
};
constexpr Pinned kPinned[] = {
    {1, 0, 0x4ba4610596c1d0e0},  // the first release
    {1, 1, 0x9d5d8b4305593426},  // graphs, pools, 2D/3D copies, arrays and textures
    {1, 2, 0x6e7139ba53bf4a0a},  // RecordHeader::send_stamp
    {1, 3, 0xbba53bc6836c29be},  // virtual memory management
    {1, 4, 0x2f5f5e6d8e27a8c6},  // allocation token in the hello, allocation fields in ServerAdmit
    {1, 5, 0x818acb60df98e984},  // ModuleFunctionNames (op 89)
    {1, 6,
     0xa59cccc35b43d57f},  // static SM partitions: sm_partition in the hello and in ServerAdmit
    {1, 7, 0xb4bbd7546a9072ee},   // capture into a graph, edges, exec kernel node params (90..92)
    {1, 8, 0x9798731fda2bcab7},   // child graph nodes (93..95)
    {1, 9, 0x3ba939ee2016bf96},   // a graph node's type (96)
    {1, 10, 0x1754e4691ab97c14},  // interprocess memory and event handles (97..101)
    {1, 11, 0xdf08b8e22f429f7a},  // a capture's dependency nodes and their update (102..103)
    {1, 12, 0x4c05f8dfe4b6cf2a},  // SessionControl::crowded: waiting clients sleep
    {1, 13, 0x79cc48d8c6abeef2},  // a library's kernel names in its load's reply; op 104
    {1, 14, 0xe296eb60097e11a4},  // arena, peer masks, peer blocks and VMM fds (105..109)
    {1, 15, 0xda4cc82ecab3f3f5},  // pinned window (HostRegisterRep::host_address), TMA (110..111)
    {1, 16,
     0x704d5b9c24f0bf7d},  // VMM sharing under a policy (112..114), stream memory operations (115)
    {1, 17, 0x3f1baaa7d081c004},  // stream attributes (116)
    {1, 18, 0x3f1baaa7d081c004},  // kHelloOwnIsolationGroup (a flag bit; no layout change)
    {1, 19, 0x165814a35afcbbb0},  // a fault's culprit: SessionControl fields, kServerFault
    {1, 20, 0x1f5ea2c8603a2b64},  // graph nodes: events, host, memory, shape changes (117..126)
    {1, 21, 0x1f5ea2c8603a2b64},  // exec 0 in GraphExecKernelNodeReq (no layout change)
    {1, 22, 0x6a45e896646beb38},  // memset and memcpy node setters, potential cluster size
    {1, 23, 0x7af0510687ea5eec},  // JIT linker, conditional and batch nodes, driver extras
    {1, 24, 0x90fc4a286b1527fb},  // cuCtxRecordEvent / cuCtxWaitEvent, mipmapped arrays
    {1, 25, 0xbda9c8c4036f0efe},  // the NVML view's ClientViewRequest
    {1, 26, 0xb2d071842a220784},  // own green contexts (146..149), cuMemBatchDecompressAsync (150)
    {1, 27, 0x50a5e9343726d2fc},  // cuMemMapArrayAsync (151)
    {1, 28, 0x50a5e9343726d2fc},  // fence watches: ResponseSlot::watch (was reserved), the page
    {1, 29, 0x50a5e9343726d2fc},  // early answers: a landed ResponseSlot::watch answers the call
    {1, 30, 0x50a5e9343726d2fc},  // dozing workers: RingControl::consumer_waiting may be 2
    {1, 31, 0x50a5e9343726d2fc},  // SessionControl::crowded may be kCrowdedPastCpus
};

}  // namespace

TEST_CASE("the wire layout matches the fingerprint pinned for this ABI version", "[abi]") {
  const std::uint64_t actual = layout_fingerprint();
  const Pinned* pinned = nullptr;
  for (const Pinned& p : kPinned) {
    if (p.major == kAbiMajor && p.minor == kAbiMinor) pinned = &p;
  }
  INFO("ABI " << kAbiMajor << "." << kAbiMinor << " layout fingerprint is 0x" << std::hex << actual
              << ". If you changed a struct in proto/, bump kAbiMajor/kAbiMinor in "
              << "proto/abi.hpp and add a line for the new version to kPinned.");
  REQUIRE(pinned != nullptr);
  REQUIRE(pinned->fingerprint == actual);
}

TEST_CASE("the frozen hello header never changes", "[abi]") {
  STATIC_REQUIRE(sizeof(HelloHeader) == 16);
  constexpr HelloHeader h = make_header(MessageKind::kClientQuery, 368);
  STATIC_REQUIRE(h.magic == 0x4853504d);
  STATIC_REQUIRE(static_cast<std::uint32_t>(MessageKind::kClientQuery) == 1);
  STATIC_REQUIRE(static_cast<std::uint32_t>(MessageKind::kRefused) == 5);
}

TEST_CASE("a planned segment keeps every part inside and the staging area page-aligned", "[abi]") {
  SegmentGeometry g;
  SegmentHeader h = plan_segment(g);
  CHECK(segment_header_valid(h, h.segment_bytes));
  CHECK(h.staging_offset % kPage == 0);
  CHECK(h.ring_offset % kCacheLine == 0);
  CHECK(h.slots_offset % kCacheLine == 0);
  CHECK(h.callbacks_offset % kPage == 0);
  CHECK(h.callbacks_offset >= h.chunk_states_offset + h.chunk_count * sizeof(ChunkState));
  CHECK(h.callbacks_offset + callback_region_bytes(h.callback_cell_count) <= h.staging_offset);
  CHECK(callback_region_bytes(SegmentGeometry{}.callback_cells) == kPage);
  SegmentHeader corrupt = h;
  corrupt.staging_offset = h.segment_bytes - 4096;
  CHECK_FALSE(segment_header_valid(corrupt, h.segment_bytes));
  corrupt = h;
  corrupt.ring_capacity = (1u << 20) + 16;
  CHECK_FALSE(segment_header_valid(corrupt, h.segment_bytes));
  corrupt = h;
  corrupt.callbacks_offset = h.segment_bytes - 64;  // the cells would run past the mapping
  CHECK_FALSE(segment_header_valid(corrupt, h.segment_bytes));
  corrupt = h;
  corrupt.callback_cell_count = kMaxCallbackCells + 1;
  CHECK_FALSE(segment_header_valid(corrupt, h.segment_bytes));
  corrupt = h;
  corrupt.callback_cell_count = 0;  // a 1.0 server: valid, without host functions
  CHECK(segment_header_valid(corrupt, h.segment_bytes));
}
