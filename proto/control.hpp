// Socket messages (SOCK_SEQPACKET: one message per datagram, boundaries kept).
//
//   client --kClientQuery-->  daemon --kDaemonDevices--> client        (cuInit)
//   client --kClientAttach--> daemon --kServerAdmit + client fd--> server
//   server --kSessionWelcome + segment memfd + doorbell eventfd--> client
//   server --kServerReady--> daemon                                    (server start)
//   client --kHostMemory / kModuleImage + memfd--> server              (during a session)
//
// Any refusal is a kRefused carrying the CUresult the client should return and a sentence for
// the operator.
#pragma once

#include <cstdint>

#include "proto/abi.hpp"
#include "proto/device_snapshot.hpp"

namespace mpsshim::proto {

inline constexpr char kControlSocketName[] = "control";  // in the runtime directory
inline constexpr std::int32_t kUnset = -1;

// What a client asks for, read from its environment at cuInit.
struct ClientHello {
  HelloHeader header;  // kClientQuery or kClientAttach
  std::int32_t pid;
  std::int32_t device;                    // attach: ordinal among the client's visible devices
  std::int32_t active_thread_percentage;  // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, kUnset if absent
  std::int32_t priority;                  // CUDA_MPS_CLIENT_PRIORITY, kUnset if absent
  std::uint64_t device_memory_limit;      // bytes for this device, 0 = no limit asked
  std::uint32_t flags;                    // kHelloIgnoreSmCoscheduling | kHelloNoLaunchBatching
  // ABI 1.5 (was reserved, 0): CUDA_MPS_SM_PARTITION, the id of the static SM partition the
  // client is pinned to (mpsshimctl sm_partition add); 0 = none, kBadSmPartition = the variable
  // is set but names no id (refused by the daemon).
  std::uint32_t sm_partition;
  char visible_devices[256];  // CUDA_VISIBLE_DEVICES as given ("" if unset)
  char program[64];           // the client's program name, for logs and mpsshimctl ps
  // ABI 1.4: MPSSHIM_ALLOCATION_TOKEN, the token mpsshimd gave the Kubernetes device plugin for
  // this pod's allocation ("" if none; docs/kubernetes.md). The daemon holds the quota it names.
  char allocation_token[64];
};
static_assert(kWireSafe<ClientHello>);
static_assert(sizeof(ClientHello) == 432);
static_assert(offsetof(ClientHello, visible_devices) == 48);
static_assert(offsetof(ClientHello, allocation_token) == 368);
// A 1.0-1.3 client's hello ends before allocation_token; the daemon reads it as "no token".
inline constexpr std::size_t kClientHelloSizeBeforeTokens = 368;
inline constexpr std::uint32_t kHelloIgnoreSmCoscheduling = 1u << 0;
// MPSSHIM_LAUNCH_BATCHING=off: the server issues this client's launches one by one.
inline constexpr std::uint32_t kHelloNoLaunchBatching = 1u << 1;
// ABI 1.18: MPSSHIM_ISOLATION=own, the client wants server processes of its own (an isolation
// group of one; docs/isolation.md).
inline constexpr std::uint32_t kHelloOwnIsolationGroup = 1u << 2;
inline constexpr std::uint32_t kBadSmPartition = 0xffffffffu;

// kClientView: the hello a client would send (header.kind kClientView, device -1), and its
// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT per visible ordinal (0: hello.device_memory_limit applies), so
// the daemon answers each GPU with the limit an attach to it would get.
inline constexpr int kViewOrdinals = 16;
struct ClientViewRequest {
  ClientHello hello;
  std::uint64_t memory_limit_by_ordinal[kViewOrdinals];
};
static_assert(kWireSafe<ClientViewRequest>);
static_assert(sizeof(ClientViewRequest) == 560);

struct Refused {
  HelloHeader header;  // kRefused
  std::int32_t cuda_error;
  std::uint32_t reserved;
  char message[496];
};
static_assert(kWireSafe<Refused>);
static_assert(sizeof(Refused) == 520);

// Followed by device_count DeviceSnapshots, in the client's visible order.
struct DaemonDevices {
  HelloHeader header;  // kDaemonDevices
  std::uint32_t device_count;
  std::uint32_t reserved;
};
static_assert(kWireSafe<DaemonDevices>);
static_assert(sizeof(DaemonDevices) == 24);

// Sent with two fds: [0] the sealed segment memfd, [1] the doorbell eventfd the client writes
// when the server sleeps.
struct SessionWelcome {
  HelloHeader header;  // kSessionWelcome
  std::uint32_t client_id;
  std::uint32_t sm_count;  // SMs in this client's green context
  std::uint64_t segment_bytes;
  std::uint64_t memory_limit;  // bytes; 0 = the whole device
  std::int32_t physical_ordinal;
  std::int32_t priority;  // effective stream priority bias
};
static_assert(kWireSafe<SessionWelcome>);
static_assert(sizeof(SessionWelcome) == 48);

struct ServerReady {
  HelloHeader header;  // kServerReady
  std::int32_t ordinal;
  std::int32_t device_count;
  std::int32_t pid;
  std::int32_t status;  // CUresult of the server's start; not 0 = it could not start
  char message[256];
  DeviceSnapshot snapshot;
};
static_assert(kWireSafe<ServerReady>);
static_assert(offsetof(ServerReady, snapshot) == 288);

// Sent with one fd: the client's connection. The hello's quota fields are what the daemon
// decided (a client with an allocation token gets at most the token's quota).
struct ServerAdmit {
  HelloHeader header;     // kServerAdmit
  std::int32_t peer_pid;  // from SO_PEERCRED, not from the hello
  std::uint32_t peer_uid;
  std::uint32_t peer_gid;
  // ABI 1.4: the allocation (Kubernetes pod) the client belongs to, 0 = none. Every session of
  // one allocation on this GPU shares allocation_memory_limit (0 = no shared limit).
  std::uint32_t allocation_id;
  ClientHello hello;
  std::uint64_t allocation_memory_limit;
  // Where the allocation's SMs lie: slot allocation_sm_slot of allocation_sm_slots equal parts
  // of the device (its replica), so different allocations get different SMs; slots 0 = no
  // placement (the device's first SMs, as for every client without one).
  std::uint32_t allocation_sm_slot;
  std::uint32_t allocation_sm_slots;
  // ABI 1.5: the static SM partition the client is pinned to (0 = none; docs/daemon.md): the
  // partition's groups of the device's SM resource split in steps of the hardware granularity,
  // first group and count. Its clients never share SMs with another partition's.
  std::uint32_t sm_partition;
  std::uint32_t partition_first_group;
  std::uint32_t partition_groups;
  std::uint32_t reserved;
};
static_assert(kWireSafe<ServerAdmit>);
static_assert(sizeof(ServerAdmit) == 496);

// Sent by a client during a session, with one memfd; the ring record that uses it names the
// same token.
struct FdTransfer {
  HelloHeader header;  // kHostMemory, kModuleImage or kPeerMemory
  std::uint32_t token;
  std::uint32_t reserved;
  std::uint64_t bytes;
};
static_assert(kWireSafe<FdTransfer>);
static_assert(sizeof(FdTransfer) == 32);

// mpsshimctl <-> daemon and daemon <-> server operator traffic: one line of text each way.
struct TextMessage {
  HelloHeader header;    // kCtlRequest / kCtlReply / kServerStatsQuery / kServerStats /
                         // kServerTerminateClient / kServerFault
  std::int32_t status;   // 0 = ok
  std::uint32_t length;  // bytes of text used
  char text[8168];
};
static_assert(kWireSafe<TextMessage>);
static_assert(sizeof(TextMessage) == 8192);

}  // namespace mpsshim::proto
