// Opcodes of the request ring and their payloads.
//
// A record is RecordHeader + the opcode's request struct (+ trailing bytes where noted). A
// record with reply_slot != kNoReply is answered in that ResponseSlot with a CUresult and the
// opcode's reply struct. Records without a reply slot are one-way: an error they raise is
// stored in SessionControl::async_error.
//
// Handles on the wire are server-issued 64-bit ids, valid only within their session; 0 is "no
// handle". Device pointers are real device addresses, checked by the server against the
// client's own allocations.
#pragma once

#include <cstdint>

#include "proto/abi.hpp"
#include "proto/ring.hpp"
#include "proto/segment.hpp"

namespace mpsshim::proto {

using WireHandle = std::uint64_t;

// Values are part of the ABI: append only.
enum class Op : std::uint16_t {
  kPad = kPadOpcode,
  kGoodbye = 1,
  kPing = 2,
  kCtxCreate = 3,
  kCtxDestroy = 4,
  kCtxSynchronize = 5,
  kCtxSetLimit = 6,
  kCtxGetLimit = 7,
  kMemAlloc = 8,
  kMemAllocPitch = 9,
  kMemFree = 10,
  kMemGetInfo = 11,
  kHostRegister = 12,
  kHostUnregister = 13,
  kCopyHtoD = 14,
  kCopyDtoH = 15,
  kCopyDtoD = 16,
  kMemset = 17,
  kImageLoad = 18,
  kModuleUnload = 19,
  kModuleGetFunction = 20,
  kModuleGetGlobal = 21,
  kLibraryUnload = 22,
  kLibraryGetKernel = 23,
  kLibraryGetModule = 24,
  kLibraryGetGlobal = 25,
  kKernelGetFunction = 26,
  kFuncGetAttribute = 27,
  kFuncSetAttribute = 28,
  kFuncSetCacheConfig = 29,
  kKernelGetAttribute = 30,
  kKernelSetAttribute = 31,
  kLaunchKernel = 32,
  kStreamCreate = 33,
  kStreamDestroy = 34,
  kStreamQuery = 35,
  kStreamSynchronize = 36,
  kStreamWaitEvent = 37,
  kEventCreate = 38,
  kEventDestroy = 39,
  kEventRecord = 40,
  kEventQuery = 41,
  kEventSynchronize = 42,
  kEventElapsedTime = 43,
  kOccupancyMaxActiveBlocks = 44,
  kOccupancyMaxActiveClusters = 45,
  kOccupancyAvailableDynamicSmem = 46,
  // Stream capture and graphs (libshim/graph.cpp, broker/server/ops/graph.cpp).
  kStreamBeginCapture = 47,
  kStreamEndCapture = 48,
  kStreamCaptureInfo = 49,
  kGraphCreate = 50,
  kGraphDestroy = 51,
  kGraphInstantiate = 52,
  kGraphExecDestroy = 53,
  kGraphLaunch = 54,
  kGraphUpload = 55,
  kGraphExecUpdate = 56,
  kGraphGetNodes = 57,
  kGraphAddKernelNode = 58,
  kGraphAddMemsetNode = 59,
  kGraphAddCopyNode = 60,
  kGraphAddEmptyNode = 61,
  kGraphAddDependencies = 62,
  // 2D/3D copies, CUDA arrays, texture and surface objects (proto/ops_copies.hpp).
  kCopy3D = 63,
  kArrayCreate = 64,
  kArrayDestroy = 65,
  kTexObjectCreate = 66,
  kTexObjectDestroy = 67,
  kSurfObjectCreate = 68,
  kSurfObjectDestroy = 69,
  // Host functions and stream-ordered allocation (ops/host_function.cpp, ops/memory_pool.cpp).
  kHostFunc = 70,
  kMemPoolCreate = 71,
  kMemPoolDestroy = 72,
  kMemPoolSetAttribute = 73,
  kMemPoolGetAttribute = 74,
  kMemPoolTrimTo = 75,
  kMemAllocAsync = 76,
  kMemFreeAsync = 77,
  // Virtual memory management: physical allocations, address reservations, mappings
  // (proto/ops_vmm.hpp, broker/server/ops/vmm.cpp, libshim/vmm.cpp).
  kVmmGranularity = 78,
  kVmmCreate = 79,
  kVmmRelease = 80,
  kVmmReserve = 81,
  kVmmAddressFree = 82,
  kVmmMap = 83,
  kVmmUnmap = 84,
  kVmmSetAccess = 85,
  kVmmGetAccess = 86,
  kVmmGetProperties = 87,
  kVmmRetain = 88,
  // The names of a module's functions (cuModuleEnumerateFunctions, the ToolsModule table).
  kModuleFunctionNames = 89,
  // Capture into an existing graph (cuStreamBeginCaptureToGraph) and a graph's edges
  // (cuGraphGetEdges), libshim/graph.cpp, broker/server/ops/graph.cpp.
  kStreamBeginCaptureToGraph = 90,
  kGraphGetEdges = 91,
  // New parameters for a kernel node of an executable graph (cuGraphExecKernelNodeSetParams).
  kGraphExecKernelNodeSetParams = 92,
  // Child graph nodes (cuGraphAddChildGraphNode, cuGraphChildGraphNodeGetGraph,
  // cuGraphExecChildGraphNodeSetParams): XLA nests command buffers this way.
  kGraphAddChildGraphNode = 93,
  kGraphChildGraphNodeGetGraph = 94,  // HandleReq (the node) -> GraphRep (the embedded graph)
  kGraphExecChildGraphNodeSetParams = 95,
  // A node's type (cuGraphNodeGetType): XLA asks it of a captured graph's dependencies.
  kGraphNodeGetType = 96,  // HandleReq (the node) -> GraphNodeTypeRep
  // Interprocess memory and event handles between clients of one server (proto/ops_ipc.hpp,
  // broker/server/ops/ipc.cpp, libshim/ipc.cpp; docs/ipc.md).
  kIpcGetMemHandle = 97,      // IpcGetMemHandleReq -> IpcHandle
  kIpcOpenMemHandle = 98,     // IpcOpenReq -> IpcOpenMemRep
  kIpcCloseMemHandle = 99,    // MemFreeReq (the opened base) -> IpcCloseRep
  kIpcGetEventHandle = 100,   // HandleReq (the event) -> IpcHandle
  kIpcOpenEventHandle = 101,  // IpcOpenReq -> EventCreateRep
  // A capture's dependency nodes (cuStreamGetCaptureInfo's array) and their replacement
  // (cuStreamUpdateCaptureDependencies): NCCL adds its own nodes to a capture this way.
  kStreamCaptureDependencies = 102,        // StreamCaptureDepsReq -> GraphGetNodesRep
  kStreamUpdateCaptureDependencies = 103,  // StreamUpdateCaptureDepsReq + node ids -> nothing
  // The names of a library's kernels from `first` on, where they did not all fit in the load's
  // reply (LibraryLoadRep): ModuleFunctionsReq (the library) -> ModuleFunctionsRep.
  kLibraryKernelNames = 104,
  // Several GPUs (docs/architecture.md, "Peer access"): the physical block holding one of the
  // client's allocations, as a POSIX fd sent back on the client's socket (FdTransfer,
  // kPeerMemory) before the answer; and that block mapped, at its own address, into the server
  // of another GPU that the client uses.
  kPeerExport = 105,   // PeerExportReq -> PeerExportRep
  kPeerImport = 106,   // PeerImportReq (the fd sent before it, by token) -> nothing
  kPeerRelease = 107,  // PeerReleaseReq -> nothing
  // VMM shareable handles (cuMemExportToShareableHandle / cuMemImportFromShareableHandle, POSIX
  // fd): the physical allocation's fd comes back on the client's socket (FdTransfer,
  // kPeerMemory) before the answer; an fd the client sent is imported as a new handle.
  kVmmExport = 108,  // HandleReq -> nothing
  kVmmImport = 109,  // VmmImportReq (the fd sent before it, by token) -> VmmHandleRep
  // Hopper's TMA descriptors (proto/ops_tensor_map.hpp): encoded by the server's driver.
  kTensorMapEncode = 110,          // TensorMapEncodeReq -> TensorMapRep
  kTensorMapReplaceAddress = 111,  // TensorMapReplaceReq -> TensorMapRep
  // VMM shareable handles between clients (proto/ops_vmm_share.hpp, docs/vmm.md): what an
  // application exports is a sealed memfd naming a registry entry, not the driver's fd; its
  // opener's server checks the policy and hands the driver's fd over.
  kVmmShare = 112,  // HandleReq (the memfd sent before the answer) -> nothing
  kVmmOpen = 113,   // VmmOpenReq (the driver's fd sent before the answer) -> VmmOpenRep
  kVmmClose = 114,  // HandleReq (an open's id) -> nothing
  // Stream memory operations (cuStreamWaitValue*, cuStreamWriteValue*, cuStreamBatchMemOp, one
  // record per operation; proto/ops_stream_mem.hpp).
  kStreamMemOp = 115,  // StreamMemOpReq -> nothing
  // cuStreamGetAttribute / cuStreamSetAttribute / cuStreamCopyAttributes on the server's driver
  // (proto/ops_stream_attributes.hpp).
  kStreamAttribute = 116,  // StreamAttributeReq -> WireLaunchAttribute (get) or nothing
  // Graph nodes beyond kernels, memsets and copies, and changes to a graph's shape
  // (proto/ops_graph_nodes.hpp, broker/server/ops/graph_nodes.cpp, libshim/graph_nodes.cpp).
  kGraphAddEventNode = 117,        // GraphEventNodeReq + deps -> GraphRep
  kGraphAddHostNode = 118,         // GraphHostNodeReq + deps -> GraphRep
  kGraphAddMemAllocNode = 119,     // GraphMemAllocNodeReq + deps -> GraphMemAllocRep
  kGraphAddMemFreeNode = 120,      // GraphMemFreeNodeReq + deps -> GraphRep
  kGraphNodeParams = 121,          // GraphNodeParamsReq -> GraphNodeValueRep
  kGraphDestroyNode = 122,         // HandleReq (the node) -> nothing
  kGraphRemoveDependencies = 123,  // GraphAddDependenciesReq + (from, to) pairs -> nothing
  kGraphClone = 124,               // HandleReq (the graph) -> GraphRep
  kGraphNodeFindInClone = 125,     // GraphFindInCloneReq -> GraphRep
  kDeviceGraphMem = 126,           // DeviceGraphMemReq -> GraphNodeValueRep
  // New parameters for a memset or memcpy node of a graph, or of an executable graph made from it
  // (XLA points its command buffers' memsets and copies at new buffers so).
  kGraphMemsetNodeSetParams = 127,  // GraphMemsetNodeSetReq -> nothing
  kGraphCopyNodeSetParams = 128,    // GraphCopyNodeSetReq -> nothing
  // The largest cluster a launch configuration may use (cuOccupancyMaxPotentialClusterSize).
  kOccupancyMaxPotentialClusterSize = 129,  // ClusterOccupancyReq + attributes -> OccupancyRep
  // The driver's JIT linker (cuLink*; proto/ops_link.hpp, broker/server/ops/link.cpp): each
  // input travels as a memfd (FdTransfer kModuleImage); the linked image comes back as one
  // (FdTransfer kPeerMemory) before the answer.
  kLinkCreate = 130,    // LinkCreateReq + options -> GraphRep (the link)
  kLinkAdd = 131,       // LinkAddReq + name + options -> LinkLogRep
  kLinkComplete = 132,  // HandleReq (the link) -> LinkLogRep
  kLinkDestroy = 133,   // HandleReq (the link) -> nothing
  // Conditional nodes, batch memory operation nodes and kernel node attributes
  // (proto/ops_graph_nodes.hpp).
  kGraphConditionalHandleCreate = 134,  // GraphConditionalHandleReq -> GraphNodeValueRep
  kGraphAddConditionalNode = 135,       // GraphConditionalNodeReq + deps -> GraphConditionalRep
  kGraphAddBatchMemOpNode = 136,        // GraphBatchMemOpNodeReq + deps + ops -> GraphRep
  kGraphBatchMemOpNodeSetParams = 137,  // GraphBatchMemOpSetReq + ops -> nothing
  kGraphKernelNodeAttribute = 138,      // GraphKernelNodeAttributeReq -> WireLaunchAttribute
  // The driver's smaller queries and settings (proto/ops_driver_extras.hpp).
  kArrayQuery = 139,      // ArrayQueryReq -> ArrayQueryRep
  kMemRangeHandle = 140,  // MemRangeHandleReq (the dma-buf fd sent before the answer) -> nothing
  kDriverSetting = 141,   // DriverSettingReq -> GraphNodeValueRep
  // cuCtxRecordEvent / cuCtxWaitEvent: every stream of a context at once.
  kCtxEvent = 142,  // CtxEventReq -> nothing
  // Mipmapped arrays (proto/ops_copies.hpp).
  kMipmappedArrayCreate = 143,   // ArrayCreateReq (desc.reserved: the levels) -> ArrayCreateRep
  kMipmappedArrayLevel = 144,    // ArrayLevelReq -> ArrayLevelRep
  kMipmappedArrayDestroy = 145,  // HandleReq -> nothing
  // A client's own green contexts, carved out of its SM quota (proto/ops_green.hpp,
  // broker/server/ops/green_context.cpp, libshim/green_context.cpp; docs/green-contexts.md).
  kGreenResource = 146,   // GreenResourceReq -> DevResource
  kGreenSplit = 147,      // GreenSplitReq -> GreenSplitRep
  kGreenDesc = 148,       // GreenDescReq + resources -> GreenDescRep
  kGreenCtxCreate = 149,  // GreenCtxCreateReq -> GreenCtxCreateRep
  // cuMemBatchDecompressAsync (proto/ops_driver_extras.hpp): the copy engines' decompression.
  kMemDecompress = 150,  // MemDecompressReq + WireDecompressParams -> MemDecompressRep
  // cuMemMapArrayAsync (proto/ops_sparse_array.hpp): tiles of sparse arrays.
  kMemMapArray = 151,  // MemMapArrayReq + WireArrayMapInfo -> nothing
  kCount
};

// RecordHeader::flags
inline constexpr std::uint16_t kFlagReplyWhenDone = 1u << 0;  // answer once the stream work ran

// ---- context ----
struct CtxCreateReq {
  std::uint32_t flags;
  std::uint32_t reserved;
};
struct CtxCreateRep {
  WireHandle ctx;
  WireHandle default_stream;
};
struct CtxReq {
  WireHandle ctx;
};
// kCtxEvent: record `event` after the work queued so far on every stream of `ctx` (wait = 0),
// or make every stream of `ctx` wait for it (wait = 1).
struct CtxEventReq {
  WireHandle ctx;
  WireHandle event;
  std::uint32_t wait;
  std::uint32_t reserved;
};
struct CtxLimitReq {
  std::uint32_t limit;
  std::uint32_t reserved;
  std::uint64_t value;
};
struct CtxLimitRep {
  std::uint64_t value;
};

// ---- memory ----
struct MemAllocReq {
  WireHandle ctx;
  std::uint64_t bytes;
};
struct MemAllocRep {
  std::uint64_t dptr;
};
struct MemAllocPitchReq {
  WireHandle ctx;
  std::uint64_t width_bytes;
  std::uint64_t height;
  std::uint32_t element_bytes;
  std::uint32_t reserved;
};
struct MemAllocPitchRep {
  std::uint64_t dptr;
  std::uint64_t pitch;
};
struct MemFreeReq {
  std::uint64_t dptr;
};
struct MemGetInfoRep {
  std::uint64_t free_bytes;
  std::uint64_t total_bytes;
};

// Pinned host memory: a memfd sent on the socket (FdTransfer with `token`), mapped by the
// server at `client_address` when that address is free there (so host and device pointers
// agree as under UVA), then registered with the driver.
struct HostRegisterReq {
  // The client's mapping of the memfd, or 0: the server maps it in its slice of the pinned
  // window (proto/address_arenas.hpp) and answers where, for the client to map it there too.
  std::uint64_t client_address;
  std::uint64_t bytes;
  std::uint32_t token;
  std::uint32_t flags;  // CU_MEMHOSTALLOC_*
};
struct HostRegisterRep {
  WireHandle region;
  std::uint64_t device_pointer;
  // Where the server mapped it when the client asked it to choose (client_address 0); 0 when
  // it had no pinned window and mapped it elsewhere.
  std::uint64_t host_address;
};
struct HostUnregisterReq {
  WireHandle region;
};

// Where host bytes of a copy are.
enum class HostKind : std::uint32_t { kPinnedRegion = 1, kStagingChunk = 2 };
struct HostRef {
  std::uint64_t handle;  // region id, or chunk index
  std::uint64_t offset;  // into the region or chunk
  HostKind kind;
  std::uint32_t generation;  // staging chunks: the generation this use completes
};
struct CopyHostReq {  // kCopyHtoD and kCopyDtoH
  WireHandle stream;
  std::uint64_t device;
  std::uint64_t bytes;
  HostRef host;
};
struct CopyDtoDReq {
  WireHandle stream;
  std::uint64_t dst;
  std::uint64_t src;
  std::uint64_t bytes;
};
struct MemsetReq {
  WireHandle stream;
  std::uint64_t dst;
  std::uint64_t pitch;   // bytes between rows; 0 for 1-D
  std::uint64_t width;   // elements per row
  std::uint64_t height;  // rows; 1 for 1-D
  std::uint32_t value;
  std::uint32_t element_bytes;  // 1, 2 or 4
};

// ---- modules and libraries ----
enum class ImageKind : std::uint32_t { kModule = 1, kLibrary = 2 };
// The image travels as a memfd (FdTransfer kModuleImage, `token`). For a v2 fat-binary
// wrapper the memfd holds the containers back to back and `containers` counts them.
struct ImageLoadReq {
  WireHandle ctx;
  std::uint64_t bytes;
  std::uint32_t token;
  ImageKind kind;
  std::uint32_t containers;  // 0: a plain image
  std::uint32_t flags;       // kImageLoad* below (was reserved, 0)
};
// A library's load answers with LibraryLoadRep: its kernels' names ride in the reply, so the
// shim hands out a CUkernel without a round trip and looks it up on the server at its first use
// (libshim/kernel_lookup.hpp).
inline constexpr std::uint32_t kImageLoadKernelNames = 1u << 0;
struct ImageLoadRep {
  WireHandle handle;
};
struct HandleReq {
  WireHandle handle;
};
// Followed by name_bytes bytes of name (no terminator needed).
struct NamedLookupReq {
  WireHandle handle;
  std::uint32_t name_bytes;
  std::uint32_t reserved;
};
inline constexpr std::uint32_t kMaxNameBytes = 4096;

struct ParamSlot {
  std::uint32_t offset;
  std::uint32_t size;
};
// Reply of GetFunction/GetKernel/KernelGetFunction: the handle and its parameter layout.
struct FunctionRep {
  WireHandle function;
  std::uint32_t param_count;
  std::uint32_t args_bytes;  // end of the last parameter
  ParamSlot params[(kSlotPayloadBytes - 16) / sizeof(ParamSlot)];
};
// ModuleFunctionNames: the names of the module's functions from index `first` on, in the
// driver's order (cuModuleEnumerateFunctions), as many as fit in one reply.
struct ModuleFunctionsReq {
  WireHandle module;
  std::uint32_t first;
  std::uint32_t reserved;
};
struct ModuleFunctionsRep {
  std::uint32_t total;  // functions in the module
  std::uint32_t count;  // names in `names`, from `first` on
  std::uint32_t bytes;  // of `names` used: each name ends with a NUL
  std::uint32_t reserved;
  char names[kSlotPayloadBytes - 16];
};
// ImageLoad of a library with kImageLoadKernelNames: the handle, then the library's kernel
// names from the first on (cuLibraryEnumerateKernels' order, as LibraryKernelNames pages them).
// names_known 0: the server's driver could not list them (the shim looks each name up).
struct LibraryLoadRep {
  WireHandle handle;
  std::uint32_t names_known;
  std::uint32_t total;  // kernels in the library
  std::uint32_t count;  // names in `names`, from the first on
  std::uint32_t bytes;  // of `names` used: each name ends with a NUL
  char names[kSlotPayloadBytes - 24];
};
static_assert(sizeof(LibraryLoadRep) == kSlotPayloadBytes);
struct GlobalRep {
  std::uint64_t dptr;
  std::uint64_t bytes;
};
struct AttributeReq {
  WireHandle handle;
  std::int32_t attribute;
  std::int32_t value;
  std::int32_t device;
  std::uint32_t reserved;
};
struct AttributeRep {
  std::int32_t value;
  std::uint32_t reserved;
};

// ---- launches ----
struct WireLaunchAttribute {
  std::uint32_t id;
  std::uint32_t reserved;
  std::uint8_t value[64];
};
// Followed by attribute_count WireLaunchAttributes, then args_bytes of arguments packed at
// their parameter offsets (the CU_LAUNCH_PARAM_BUFFER_POINTER layout).
struct LaunchReq {
  WireHandle function;
  WireHandle stream;
  std::uint32_t grid[3];
  std::uint32_t block[3];
  std::uint32_t shared_bytes;
  std::uint32_t args_bytes;
  std::uint32_t attribute_count;
  std::uint32_t reserved;
};
inline constexpr std::uint32_t kMaxLaunchAttributes = 16;
inline constexpr std::uint32_t kMaxArgsBytes = 32764;

// ---- streams and events ----
struct StreamCreateReq {
  WireHandle ctx;
  std::uint32_t flags;
  std::int32_t priority;
};
struct StreamCreateRep {
  WireHandle stream;
};
struct StreamWaitEventReq {
  WireHandle stream;
  WireHandle event;
  std::uint32_t flags;
  std::uint32_t reserved;
};
struct EventCreateReq {
  WireHandle ctx;
  std::uint32_t flags;
  std::uint32_t reserved;
};
struct EventCreateRep {
  WireHandle event;
};
struct EventRecordReq {
  WireHandle event;
  WireHandle stream;
  std::uint32_t flags;
  std::uint32_t reserved;
};
struct ElapsedReq {
  WireHandle start;
  WireHandle end;
};
struct ElapsedRep {
  float milliseconds;
  std::uint32_t reserved;
};

// ---- occupancy ----
struct OccupancyReq {
  WireHandle function;
  std::int32_t block_size;
  std::uint32_t flags;
  std::uint64_t dynamic_smem;
};
struct OccupancyRep {
  std::int64_t value;
};
// Followed by attribute_count WireLaunchAttributes.
struct ClusterOccupancyReq {
  WireHandle function;
  std::uint32_t grid[3];
  std::uint32_t block[3];
  std::uint32_t shared_bytes;
  std::uint32_t attribute_count;
};

// ---- stream capture and graphs ----
// Capture runs on the server's real stream; the server always captures in
// CU_STREAM_CAPTURE_MODE_RELAXED (one server thread serves every client, so a global-mode
// capture would forbid other clients' calls) and the client emulates its own mode.
struct BeginCaptureReq {
  WireHandle stream;
  std::uint32_t mode;  // CUstreamCaptureMode the client asked for
  std::uint32_t reserved;
};
struct EndCaptureRep {
  WireHandle graph;  // 0 when the capture was invalidated
};
struct CaptureInfoRep {
  std::uint32_t status;  // CUstreamCaptureStatus
  std::uint32_t reserved;
  std::uint64_t id;
  WireHandle graph;                // ACTIVE only: the graph being captured into
  std::uint64_t dependency_count;  // ACTIVE only
};
struct GraphCreateReq {
  WireHandle ctx;
  std::uint32_t flags;
  std::uint32_t reserved;
};
struct GraphRep {
  WireHandle handle;  // a graph, an executable graph or a node
};
struct GraphNodeTypeRep {
  std::uint32_t type;  // CUgraphNodeType
  std::uint32_t reserved;
};
struct GraphInstantiateReq {
  WireHandle graph;
  WireHandle upload_stream;  // 0: none (CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD not set)
  std::uint64_t flags;       // CUgraphInstantiate_flags
};
struct GraphInstantiateRep {
  WireHandle exec;
  std::uint32_t result;  // CUgraphInstantiateResult
  std::uint32_t reserved;
};
struct GraphLaunchReq {  // kGraphLaunch and kGraphUpload
  WireHandle exec;
  WireHandle stream;
};
struct GraphExecUpdateReq {
  WireHandle exec;
  WireHandle graph;
};
struct GraphExecUpdateRep {
  std::uint32_t result;  // CUgraphExecUpdateResult
  std::uint32_t reserved;
};
// Nodes are listed a page at a time: the reply holds up to kNodesPerReply ids from `first`.
struct GraphGetNodesReq {
  WireHandle graph;
  std::uint64_t first;
};
struct GraphGetNodesRep {
  std::uint64_t total;
  std::uint64_t count;  // ids below
  WireHandle nodes[(kSlotPayloadBytes - 16) / sizeof(WireHandle)];
};
inline constexpr std::uint32_t kNodesPerReply = (kSlotPayloadBytes - 16) / sizeof(WireHandle);
inline constexpr std::uint32_t kMaxNodeDependencies = 512;
// A capturing stream's dependency nodes, a page from `first` (the reply: GraphGetNodesRep, ids
// of nodes of the graph the capture builds, which kStreamCaptureInfo names).
struct StreamCaptureDepsReq {
  WireHandle stream;
  std::uint64_t first;
};
// Followed by `count` node ids (WireHandle) of the capture's graph; flags:
// CU_STREAM_ADD_CAPTURE_DEPENDENCIES or CU_STREAM_SET_CAPTURE_DEPENDENCIES.
struct StreamUpdateCaptureDepsReq {
  WireHandle stream;
  std::uint32_t flags;
  std::uint32_t count;  // at most kMaxNodeDependencies
};
// Every kGraphAdd*Node request is followed by dependency_count node ids (WireHandle), then
// what the node kind states (kernel: its arguments, packed as for LaunchReq).
struct GraphAddNodeHeader {
  WireHandle graph;
  std::uint32_t dependency_count;
  std::uint32_t reserved;
};
struct GraphKernelNodeReq {
  GraphAddNodeHeader node;
  WireHandle function;
  std::uint32_t grid[3];
  std::uint32_t block[3];
  std::uint32_t shared_bytes;
  std::uint32_t args_bytes;
};
struct GraphMemsetNodeReq {
  GraphAddNodeHeader node;
  std::uint64_t dst;
  std::uint64_t pitch;
  std::uint64_t width;   // elements per row
  std::uint64_t height;  // rows
  std::uint32_t value;
  std::uint32_t element_bytes;
};
struct GraphCopyNodeReq {  // device to device, one-dimensional
  GraphAddNodeHeader node;
  std::uint64_t dst;
  std::uint64_t src;
  std::uint64_t bytes;
};
// The driver clones `child` into the node; followed by the dependency ids.
struct GraphChildNodeReq {
  GraphAddNodeHeader node;
  WireHandle child;  // a graph of the same session
};
// The child graph node `node` of the graph `exec` was made from takes `child`'s parameters.
struct GraphExecChildNodeReq {
  WireHandle exec;
  WireHandle node;
  WireHandle child;
};
// Followed by `count` (from, to) pairs of node ids.
struct GraphAddDependenciesReq {
  WireHandle graph;
  std::uint64_t count;
};
// Followed by dependency_count node ids of `graph`: the captured work goes after them. Only
// default edges cross the wire (the shim refuses edge data it cannot forward).
struct BeginCaptureToGraphReq {
  WireHandle stream;
  WireHandle graph;
  std::uint32_t mode;  // CUstreamCaptureMode the client asked for
  std::uint32_t dependency_count;
};
// Edges are listed a page at a time, as nodes are: up to kEdgesPerReply from `first`.
struct GraphGetEdgesReq {
  WireHandle graph;
  std::uint64_t first;
};
struct WireEdge {
  WireHandle from;
  WireHandle to;
  std::uint8_t from_port;  // CUgraphEdgeData, as the driver gave it
  std::uint8_t to_port;
  std::uint8_t type;
  std::uint8_t reserved[5];
};
struct GraphGetEdgesRep {
  std::uint64_t total;
  std::uint64_t count;  // edges below
  WireEdge edges[(kSlotPayloadBytes - 16) / sizeof(WireEdge)];
};
inline constexpr std::uint32_t kEdgesPerReply = (kSlotPayloadBytes - 16) / sizeof(WireEdge);
// Followed by args_bytes of arguments, packed as for GraphKernelNodeReq.
struct GraphExecKernelNodeReq {
  WireHandle exec;
  WireHandle node;  // a node of the graph `exec` was made from
  WireHandle function;
  std::uint32_t grid[3];
  std::uint32_t block[3];
  std::uint32_t shared_bytes;
  std::uint32_t args_bytes;
};
// ---- host functions (cuLaunchHostFunc, cuStreamAddCallback) ----
// The callback runs in the client: the server queues a host function of its own on the real
// stream that publishes callback_id in the segment's HostCallbackCells and waits for the
// client to report it done (proto/segment.hpp).
enum class HostFuncKind : std::uint32_t {
  kLaunchHostFunc = 1,     // fn(userData)
  kStreamAddCallback = 2,  // callback(hStream, status, userData)
};
struct HostFuncReq {
  WireHandle stream;
  std::uint64_t callback_id;  // the client's own name for (fn, userData); never 0
  HostFuncKind kind;
  std::uint32_t reserved;
};

// ---- stream-ordered allocation and memory pools ----
// Pool handle 0 names the session's own default pool of its device (created on first use).
struct MemPoolCreateReq {
  std::uint64_t max_bytes;  // CUmemPoolProps::maxSize; 0 = no bound but the client's limit
  std::uint32_t usage;      // CUmemPoolProps::usage
  std::uint32_t reserved;
};
struct MemPoolCreateRep {
  WireHandle pool;
};
struct MemPoolAttributeReq {  // kMemPoolSetAttribute and kMemPoolGetAttribute
  WireHandle pool;
  std::uint32_t attribute;  // CUmemPool_attribute
  std::uint32_t reserved;
  std::uint64_t value;  // set: the value (int attributes in the low 32 bits)
};
struct MemPoolAttributeRep {
  std::uint64_t value;
};
struct MemPoolTrimReq {
  WireHandle pool;
  std::uint64_t keep_bytes;
};
struct MemAllocAsyncReq {
  WireHandle pool;
  WireHandle stream;
  std::uint64_t bytes;
};
// Reply: MemAllocRep.
struct MemFreeAsyncReq {
  std::uint64_t dptr;
  WireHandle stream;
};

// Every payload above is plain bytes and fits a response slot.
#define MPSSHIM_WIRE_CHECK(T)                                    \
  static_assert(kWireSafe<T>, #T " must be trivially copyable"); \
  static_assert(sizeof(T) % 8 == 0 || sizeof(T) < 8, #T " must pad to 8 bytes");
MPSSHIM_WIRE_CHECK(CtxCreateReq)
MPSSHIM_WIRE_CHECK(CtxCreateRep)
MPSSHIM_WIRE_CHECK(CtxReq)
MPSSHIM_WIRE_CHECK(CtxLimitReq)
MPSSHIM_WIRE_CHECK(CtxEventReq)
MPSSHIM_WIRE_CHECK(MemAllocReq)
MPSSHIM_WIRE_CHECK(MemAllocPitchReq)
MPSSHIM_WIRE_CHECK(HostRegisterReq)
MPSSHIM_WIRE_CHECK(HostRef)
MPSSHIM_WIRE_CHECK(CopyHostReq)
MPSSHIM_WIRE_CHECK(CopyDtoDReq)
MPSSHIM_WIRE_CHECK(MemsetReq)
MPSSHIM_WIRE_CHECK(ImageLoadReq)
MPSSHIM_WIRE_CHECK(NamedLookupReq)
MPSSHIM_WIRE_CHECK(FunctionRep)
MPSSHIM_WIRE_CHECK(ModuleFunctionsReq)
MPSSHIM_WIRE_CHECK(ModuleFunctionsRep)
MPSSHIM_WIRE_CHECK(AttributeReq)
MPSSHIM_WIRE_CHECK(WireLaunchAttribute)
MPSSHIM_WIRE_CHECK(LaunchReq)
MPSSHIM_WIRE_CHECK(StreamCreateReq)
MPSSHIM_WIRE_CHECK(StreamWaitEventReq)
MPSSHIM_WIRE_CHECK(EventRecordReq)
MPSSHIM_WIRE_CHECK(ElapsedReq)
MPSSHIM_WIRE_CHECK(OccupancyReq)
MPSSHIM_WIRE_CHECK(ClusterOccupancyReq)
MPSSHIM_WIRE_CHECK(BeginCaptureReq)
MPSSHIM_WIRE_CHECK(EndCaptureRep)
MPSSHIM_WIRE_CHECK(CaptureInfoRep)
MPSSHIM_WIRE_CHECK(GraphCreateReq)
MPSSHIM_WIRE_CHECK(GraphRep)
MPSSHIM_WIRE_CHECK(GraphNodeTypeRep)
MPSSHIM_WIRE_CHECK(GraphInstantiateReq)
MPSSHIM_WIRE_CHECK(GraphInstantiateRep)
MPSSHIM_WIRE_CHECK(GraphLaunchReq)
MPSSHIM_WIRE_CHECK(GraphExecUpdateReq)
MPSSHIM_WIRE_CHECK(GraphExecUpdateRep)
MPSSHIM_WIRE_CHECK(GraphGetNodesReq)
MPSSHIM_WIRE_CHECK(GraphGetNodesRep)
MPSSHIM_WIRE_CHECK(StreamCaptureDepsReq)
MPSSHIM_WIRE_CHECK(StreamUpdateCaptureDepsReq)
MPSSHIM_WIRE_CHECK(GraphAddNodeHeader)
MPSSHIM_WIRE_CHECK(GraphKernelNodeReq)
MPSSHIM_WIRE_CHECK(GraphMemsetNodeReq)
MPSSHIM_WIRE_CHECK(GraphCopyNodeReq)
MPSSHIM_WIRE_CHECK(GraphAddDependenciesReq)
MPSSHIM_WIRE_CHECK(BeginCaptureToGraphReq)
MPSSHIM_WIRE_CHECK(GraphGetEdgesReq)
MPSSHIM_WIRE_CHECK(WireEdge)
MPSSHIM_WIRE_CHECK(GraphGetEdgesRep)
MPSSHIM_WIRE_CHECK(GraphExecKernelNodeReq)
MPSSHIM_WIRE_CHECK(GraphChildNodeReq)
MPSSHIM_WIRE_CHECK(GraphExecChildNodeReq)
MPSSHIM_WIRE_CHECK(HostFuncReq)
MPSSHIM_WIRE_CHECK(MemPoolCreateReq)
MPSSHIM_WIRE_CHECK(MemPoolCreateRep)
MPSSHIM_WIRE_CHECK(MemPoolAttributeReq)
MPSSHIM_WIRE_CHECK(MemPoolAttributeRep)
MPSSHIM_WIRE_CHECK(MemPoolTrimReq)
MPSSHIM_WIRE_CHECK(MemAllocAsyncReq)
MPSSHIM_WIRE_CHECK(MemFreeAsyncReq)
#undef MPSSHIM_WIRE_CHECK
static_assert(sizeof(FunctionRep) <= kSlotPayloadBytes);
static_assert(sizeof(WireLaunchAttribute) == 72, "CUlaunchAttribute is 72 bytes");
static_assert(sizeof(LaunchReq) == 56);
static_assert(sizeof(HostRef) == 24);
static_assert(sizeof(CopyHostReq) == 48);
static_assert(sizeof(MemsetReq) == 48);
static_assert(sizeof(GraphGetNodesRep) <= kSlotPayloadBytes);
static_assert(sizeof(GraphAddNodeHeader) == 16);
static_assert(sizeof(GraphKernelNodeReq) == 56);
static_assert(sizeof(GraphMemsetNodeReq) == 56);
static_assert(sizeof(GraphCopyNodeReq) == 40);
static_assert(sizeof(BeginCaptureToGraphReq) == 24);
static_assert(sizeof(WireEdge) == 24);
static_assert(sizeof(GraphExecKernelNodeReq) == 56);
static_assert(sizeof(GraphChildNodeReq) == 24);
static_assert(sizeof(GraphExecChildNodeReq) == 24);
static_assert(sizeof(GraphGetEdgesRep) <= kSlotPayloadBytes);
static_assert(sizeof(HostFuncReq) == 24);
static_assert(sizeof(MemPoolAttributeReq) == 24);
static_assert(sizeof(MemAllocAsyncReq) == 24);
static_assert(sizeof(MemFreeAsyncReq) == 16);

// ---- peers ----
struct PeerExportReq {
  std::uint64_t address;  // inside one of the client's cuMemAlloc allocations
};
struct PeerExportRep {
  std::uint64_t base;  // the physical block holding it, whole
  std::uint64_t bytes;
};
struct PeerImportReq {
  std::uint64_t base;  // where the exporting server maps it: the importer maps it there too
  std::uint64_t bytes;
  std::uint32_t token;  // of the kPeerMemory fd transfer
  std::uint32_t reserved;
};
struct PeerReleaseReq {
  std::uint64_t base;
};
static_assert(kWireSafe<PeerExportReq> && sizeof(PeerExportReq) == 8);
static_assert(kWireSafe<PeerExportRep> && sizeof(PeerExportRep) == 16);
static_assert(kWireSafe<PeerImportReq> && sizeof(PeerImportReq) == 24);
static_assert(kWireSafe<PeerReleaseReq> && sizeof(PeerReleaseReq) == 8);

}  // namespace mpsshim::proto
