// The versioned ABI of everything that crosses a process boundary in mpsshim.
//
// Bump kAbiMajor when a change breaks an existing peer (a struct in proto/ changes size or
// layout, an opcode changes meaning). Bump kAbiMinor when a change only adds (a new opcode, a
// new trailing field a peer may ignore). tests/proto/abi_layout_test.cpp pins every size and
// offset together with the version: editing a struct without bumping fails that test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace mpsshim::proto {

inline constexpr std::uint32_t kHelloMagic = 0x4853504d;  // "MPSH" in memory order
inline constexpr std::uint16_t kAbiMajor = 1;
// Minor 1: stream capture and graphs, host functions and memory pools, 2D/3D copies, arrays and
// texture objects (ops 47..77), host-callback cells in the segment.
// Minor 2: RecordHeader::send_stamp (was reserved, 0): when the client committed the record,
// for the server's per-client delay figures (mpsshimctl stats). A 0 stamp is not measured.
// Minor 3: virtual memory management (ops 78..88, proto/ops_vmm.hpp).
// Minor 4: ClientHello::allocation_token (appended; a shorter 1.2/1.3 hello means no token) and
// ServerAdmit::allocation_id / allocation_memory_limit / allocation_sm_slot(s) (per-pod quotas,
// docs/kubernetes.md).
// Minor 5: ModuleFunctionNames (op 89): the names of a module's functions, for
// cuModuleEnumerateFunctions and the ToolsModule private table cuFFT needs.
// Minor 6: ClientHello::sm_partition (was reserved, 0: no partition) and
// ServerAdmit::sm_partition / partition_first_group / partition_groups (static SM partitions,
// mpsshimctl sm_partition; docs/daemon.md).
// Minor 7: capture into an existing graph, a graph's edges and new kernel node parameters of an
// executable graph (ops 90..92: BeginCaptureToGraphReq, GraphGetEdgesReq/Rep, WireEdge,
// GraphExecKernelNodeReq).
// Minor 8: child graph nodes (ops 93..95: GraphChildNodeReq, GraphExecChildNodeReq).
// Minor 9: a graph node's type (op 96: GraphNodeTypeRep).
// Minor 10: interprocess memory and event handles (ops 97..101, proto/ops_ipc.hpp: IpcHandle,
// IpcGetMemHandleReq, IpcOpenReq, IpcOpenMemRep).
// Minor 11: a capture's dependency nodes and their update (ops 102..103: StreamCaptureDepsReq,
// StreamUpdateCaptureDepsReq).
// Minor 12: SessionControl::crowded (was padding): waiting clients sleep instead of spinning.
// Minor 13: ImageLoadReq::flags (was reserved, 0) and kImageLoadKernelNames: a library's load
// answers with LibraryLoadRep, its kernels' names; LibraryKernelNames (op 104) pages the rest.
// Minor 14: one device address space and peers: DeviceSnapshot's arena and peer masks (were
// reserved, 0), MessageKind::kPeerMemory, ops 105..107 (PeerExportReq, PeerExportRep,
// PeerImportReq, PeerReleaseReq); VMM shareable handles, ops 108..109 (VmmImportReq).
// Minor 15: HostRegisterRep::host_address (appended) and HostRegisterReq::client_address 0: the
// server places pinned host memory in its slice of the pinned window; TMA descriptors (ops
// 110..111, proto/ops_tensor_map.hpp).
// Minor 16: VMM shareable handles between clients under a policy (ops 112..114,
// proto/ops_vmm_share.hpp: VmmOpenReq, VmmOpenRep; IpcKind::kVmm) and stream memory operations
// (op 115, proto/ops_stream_mem.hpp: StreamMemOpReq).
// Minor 17: stream attributes on the server (op 116, proto/ops_stream_attributes.hpp:
// StreamAttributeReq).
// Minor 18: ClientHello::flags kHelloOwnIsolationGroup (MPSSHIM_ISOLATION=own), which a daemon
// of minor 17 or older would ignore: such a client refuses that daemon.
// Minor 19: naming a fault's likely culprit: SessionControl::fault_pid and fault_program (were
// padding, 0) and MessageKind::kServerFault (server -> daemon, before it exits with a fault).
// Minor 20: graph nodes beyond kernels, memsets and copies (ops 117..126,
// proto/ops_graph_nodes.hpp).
// Minor 21: GraphExecKernelNodeReq::exec 0 names the graph's own kernel node
// (cuGraphKernelNodeSetParams); no layout change.
// Minor 22: memset and memcpy nodes' new parameters (ops 127..128: GraphMemsetNodeSetReq,
// GraphCopyNodeSetReq) and cuOccupancyMaxPotentialClusterSize (op 129).
// Minor 23: the JIT linker (ops 130..133, proto/ops_link.hpp), conditional and batch memory
// operation nodes and kernel node attributes (ops 134..138), array queries, dma-buf handles and
// driver settings (ops 139..141, proto/ops_driver_extras.hpp).
// Minor 24: cuCtxRecordEvent / cuCtxWaitEvent (op 142, CtxEventReq); pool memory is exported by
// kIpcGetMemHandle too (cuMemPoolExportPointer; no layout change); mipmapped arrays (ops
// 143..145, ArrayLevelReq/Rep; ArrayQueryReq::mipmapped was reserved, 0).
// Minor 25: a client's view of its share for NVML (kClientView, ClientViewRequest, answered
// with kClientViewReply text parts; docs/nvml.md). No session layout change.
// Minor 26: a client's own green contexts (ops 146..149, proto/ops_green.hpp) and
// cuMemBatchDecompressAsync (op 150, MemDecompressReq).
// Minor 27: cuMemMapArrayAsync (op 151, proto/ops_sparse_array.hpp); sparse arrays are made
// (ArrayDescriptor::flags may hold CUDA_ARRAY3D_SPARSE; no layout change there).
// Minor 28: fence watches. The server's welcome to a client of minor 28 or later carries a third
// descriptor, the session's watch page (its host-fence words, read-only for the client), and
// ResponseSlot::watch (was reserved, 0) names the word that finishes the call's GPU work
// (proto/segment.hpp).
// Minor 29: early answers. The server names a deferred call's fence in ResponseSlot::watch as
// soon as it defers the answer, and the fence landing means the call succeeded: a client of a
// minor-29 server may return as soon as it sees the word land, and takes the slot again only
// once the late answer has come (proto/segment.hpp). No layout change.
// Minor 30: dozing workers. RingControl::consumer_waiting may hold kConsumerDozing: a client of
// minor 30 or later then rings the doorbell only for a record it waits on (proto/ring.hpp); the
// server dozes only while its sessions' clients are of minor 30 or later. No layout change.
// Minor 31: SessionControl::crowded may hold kCrowdedPastCpus (more clients than the server's
// CPUs); at kCrowded a client of minor 31 or later paces its long waits (proto/segment.hpp). No
// layout change.
inline constexpr std::uint16_t kAbiMinor = 31;
// The first minor whose daemon honours kHelloOwnIsolationGroup.
inline constexpr std::uint16_t kAbiMinorIsolationGroups = 18;
// The first minor whose clients take the watch page.
inline constexpr std::uint16_t kAbiMinorFenceWatch = 28;
// The first minor whose server's watches are early answers.
inline constexpr std::uint16_t kAbiMinorEarlyAnswers = 29;
// The first minor whose clients let a dozing worker collect their one-way records.
inline constexpr std::uint16_t kAbiMinorDoze = 30;

// FROZEN FOREVER. Every message on every mpsshim socket starts with this header, so that any two
// versions of mpsshim can at least tell each other which versions they are. Never change it.
struct HelloHeader {
  std::uint32_t magic;      // kHelloMagic
  std::uint16_t abi_major;  // sender's kAbiMajor
  std::uint16_t abi_minor;  // sender's kAbiMinor
  std::uint32_t size;       // bytes of the whole message, this header included
  std::uint32_t kind;       // MessageKind
};
static_assert(sizeof(HelloHeader) == 16);
static_assert(offsetof(HelloHeader, magic) == 0);
static_assert(offsetof(HelloHeader, abi_major) == 4);
static_assert(offsetof(HelloHeader, abi_minor) == 6);
static_assert(offsetof(HelloHeader, size) == 8);
static_assert(offsetof(HelloHeader, kind) == 12);

// Socket message kinds. Values are never reused.
enum class MessageKind : std::uint32_t {
  kClientQuery = 1,     // client -> daemon: which devices are there?
  kDaemonDevices = 2,   // daemon -> client: device table
  kClientAttach = 3,    // client -> daemon: open a session on one device
  kSessionWelcome = 4,  // server -> client: session accepted (+ segment memfd, doorbell eventfd)
  kRefused = 5,         // anyone -> client: refused, with a message that says why
  kServerReady = 6,     // server -> daemon: device snapshot, device count
  kServerAdmit = 7,     // daemon -> server: a client connection (+ its fd)
  kHostMemory = 8,      // client -> server: a memfd backing pinned host memory
  kModuleImage = 9,     // client -> server: a memfd holding a module/library image
  kCtlRequest = 10,     // mpsshimctl -> daemon: a text command
  kCtlReply = 11,       // daemon -> mpsshimctl: text answer
  kServerStats = 12,    // server -> daemon: per-client accounting (answer to kServerStatsQuery)
  kServerStatsQuery = 13,
  kServerTerminateClient = 14,
  kPeerMemory = 15,   // server <-> client: a GPU memory block's POSIX fd (kPeerExport, kPeerImport)
  kServerFault = 16,  // server -> daemon: TextMessage naming a sticky fault's likely culprit
  kClientView = 17,   // NVML view -> daemon: ClientViewRequest, what share do I see?
  kClientViewReply = 18,  // daemon -> NVML view: TextMessage parts, JSON (docs/nvml.md)
};

constexpr HelloHeader make_header(MessageKind kind, std::uint32_t size) {
  return HelloHeader{kHelloMagic, kAbiMajor, kAbiMinor, size, static_cast<std::uint32_t>(kind)};
}

// A struct may cross the boundary only if its bytes are all it is.
template <typename T>
inline constexpr bool kWireSafe = std::is_trivially_copyable_v<T>&& std::is_standard_layout_v<T>;

}  // namespace mpsshim::proto
