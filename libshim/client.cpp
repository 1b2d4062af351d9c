// cuInit, the device table, and the per-device sessions.
#include "libshim/client.hpp"

#include <unistd.h>

#include <cstring>

#include "common/log.hpp"
#include "libshim/address_window.hpp"
#include "libshim/client_view.hpp"
#include "libshim/driver_version.hpp"
#include "proto/control.hpp"

namespace mpsshim::shim {

namespace {

struct ProcessState {
  std::mutex init_mutex;
  std::atomic<int> init_result{CUDA_ERROR_NOT_INITIALIZED};
  bool init_attempted = false;
  ClientConfig config;
  std::string socket_path;
  std::vector<proto::DeviceSnapshot> devices;

  std::mutex session_mutex;
  std::array<std::unique_ptr<Session>, kMaxDevices> sessions;
  std::array<std::atomic<Session*>, kMaxDevices> session_ptr{};
  std::array<CUresult, kMaxDevices> session_error{};
  // Sessions with GPUs this process does not see, by the daemon's ordinal (session_for_gpu),
  // under session_mutex; made on first use, never freed.
  std::array<std::unique_ptr<Session>, kMaxDevices> unseen_sessions;
};

// Never destroyed: other libraries' static destructors may still call the driver at exit.
ProcessState& state() noexcept {
  static ProcessState* s = new ProcessState();
  return *s;
}

// Asks the daemon for the device table. Returns the CUresult cuInit reports.
CUresult query_devices(ProcessState& s) {
  std::string tried;
  for (const std::string& path : s.config.socket_candidates) {
    int fd = proto::connect_seqpacket(path);
    if (fd < 0) {
      tried += fmt::format("{}{} ({})", tried.empty() ? "" : ", ", path, strerror(-fd));
      continue;
    }
    proto::UniqueFd socket(fd);
    proto::ClientHello hello = make_client_hello(proto::MessageKind::kClientQuery, -1, s.config);
    proto::Received reply;
    if (proto::send_struct(fd, hello) != 0 || proto::receive_message(fd, reply) != 0 ||
        reply.bytes.size() < sizeof(proto::HelloHeader)) {
      log_error("the mpsshim daemon at {} did not answer the device query", path);
      return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    proto::HelloHeader header;
    std::memcpy(&header, reply.bytes.data(), sizeof header);
    if (header.kind == static_cast<std::uint32_t>(proto::MessageKind::kRefused) &&
        reply.bytes.size() >= sizeof(proto::Refused)) {
      proto::Refused refused;
      std::memcpy(&refused, reply.bytes.data(), sizeof refused);
      refused.message[sizeof refused.message - 1] = '\0';
      log_error("the mpsshim daemon at {} refused this process: {}", path, refused.message);
      return refused.cuda_error != 0 ? static_cast<CUresult>(refused.cuda_error)
                                     : CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    proto::DaemonDevices table;
    if (header.magic != proto::kHelloMagic || header.abi_major != proto::kAbiMajor ||
        header.kind != static_cast<std::uint32_t>(proto::MessageKind::kDaemonDevices) ||
        reply.bytes.size() < sizeof table) {
      log_error("the mpsshim daemon at {} speaks ABI {}.{}; this library speaks {}.{}", path,
                header.abi_major, header.abi_minor, proto::kAbiMajor, proto::kAbiMinor);
      return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    if (s.config.own_isolation_group && header.abi_minor < proto::kAbiMinorIsolationGroups) {
      // That daemon would ignore the request and share this process's GPUs with others.
      log_error(
          "MPSSHIM_ISOLATION=own, but the mpsshim daemon at {} speaks ABI {}.{}, which has no "
          "isolation groups; not connecting (upgrade mpsshimd, or unset MPSSHIM_ISOLATION)",
          path, header.abi_major, header.abi_minor);
      return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    std::memcpy(&table, reply.bytes.data(), sizeof table);
    std::size_t expected =
        sizeof table + std::size_t{table.device_count} * sizeof(proto::DeviceSnapshot);
    if (table.device_count > kMaxDevices || reply.bytes.size() < expected) {
      log_error("the mpsshim daemon at {} sent a malformed device table", path);
      return CUDA_ERROR_MPS_CONNECTION_FAILED;
    }
    s.devices.resize(table.device_count);
    std::memcpy(s.devices.data(), reply.bytes.data() + sizeof table,
                table.device_count * sizeof(proto::DeviceSnapshot));
    s.socket_path = path;
    if (s.devices.empty()) {
      log_error(
          "the mpsshim daemon at {} has no GPU for this process (CUDA_VISIBLE_DEVICES"
          "='{}')",
          path, s.config.visible_devices);
      return CUDA_ERROR_NO_DEVICE;
    }
    set_server_driver_version(s.devices[0].driver_version);
    log_info("connected to the mpsshim daemon at {}: {} device(s), driver {}", path,
             s.devices.size(), s.devices[0].driver_version);
    return CUDA_SUCCESS;
  }
  log_error(
      "no mpsshim daemon found (tried {}). Start one with `mpsshimd` (or "
      "`systemctl start mpsshimd`), or set CUDA_MPS_PIPE_DIRECTORY to the runtime directory of a "
      "running one.",
      tried);
  return CUDA_ERROR_MPS_CONNECTION_FAILED;
}

}  // namespace

CUresult init_status() noexcept {
  return static_cast<CUresult>(state().init_result.load(std::memory_order_acquire));
}

CUresult initialize() noexcept {
  ProcessState& s = state();
  if (CUresult rc = init_status(); rc == CUDA_SUCCESS) return rc;
  std::lock_guard lock(s.init_mutex);
  if (s.init_attempted) return init_status();
  s.init_attempted = true;
  CUresult rc;
  try {
    s.config = read_client_config();
    reserve_address_windows();
    rc = query_devices(s);
  } catch (...) {
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  }
  s.init_result.store(rc, std::memory_order_release);
  return rc;
}

const ClientConfig& config() noexcept {
  return state().config;
}

CUresult session_for(int device, Session*& out) noexcept {
  ProcessState& s = state();
  if (device < 0 || device >= static_cast<int>(s.devices.size())) return CUDA_ERROR_INVALID_DEVICE;
  if (Session* session = s.session_ptr[device].load(std::memory_order_acquire)) {
    out = session;
    return CUDA_SUCCESS;
  }
  std::lock_guard lock(s.session_mutex);
  if (Session* session = s.session_ptr[device].load(std::memory_order_relaxed)) {
    out = session;
    return CUDA_SUCCESS;
  }
  if (s.session_error[device] != CUDA_SUCCESS) return s.session_error[device];
  try {
    proto::ClientHello hello =
        make_client_hello(proto::MessageKind::kClientAttach, device, s.config);
    CUresult rc = Session::attach(s.socket_path, hello, s.sessions[device]);
    if (rc != CUDA_SUCCESS) {
      s.session_error[device] = rc;
      return rc;
    }
  } catch (...) {
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Session* session = s.sessions[device].get();
  log_info("attached to GPU {} as client {}: {} SMs, memory limit {}", device, session->client_id(),
           session->sm_count(),
           session->memory_limit() ? fmt::format("{} bytes", session->memory_limit()) : "none");
  s.session_ptr[device].store(session, std::memory_order_release);
  out = session;
  return CUDA_SUCCESS;
}

CUresult session_for_gpu(int ordinal, Session*& out) noexcept {
  ProcessState& s = state();
  for (std::size_t d = 0; d < s.devices.size(); ++d) {
    if (s.devices[d].ordinal == ordinal) return session_for(static_cast<int>(d), out);
  }
  if (ordinal < 0 || ordinal >= kMaxDevices) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(s.session_mutex);
  std::unique_ptr<Session>& session = s.unseen_sessions[static_cast<std::size_t>(ordinal)];
  if (!session) {
    try {
      // The daemon resolves the device the hello names through its CUDA_VISIBLE_DEVICES: a
      // list of that one GPU makes device 0 the GPU wanted.
      ClientConfig config = s.config;
      config.visible_devices = std::to_string(ordinal);
      config.memory_limit.clear();
      proto::ClientHello hello = make_client_hello(proto::MessageKind::kClientAttach, 0, config);
      if (CUresult rc = Session::attach(s.socket_path, hello, session); rc != CUDA_SUCCESS) {
        session.reset();
        return rc;
      }
    } catch (...) {
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    log_info("attached to GPU {} (not among this process's devices) as client {}", ordinal,
             session->client_id());
  }
  out = session.get();
  return CUDA_SUCCESS;
}

int client_sm_count(int device) noexcept {
  Session* session = nullptr;
  if (session_for(device, session) == CUDA_SUCCESS) return session->sm_count();
  const proto::DeviceSnapshot* snapshot = device_snapshot(device);
  return snapshot ? static_cast<int>(snapshot->sm_count) : 0;
}

int visible_device_count() noexcept {
  if (init_status() != CUDA_SUCCESS) return 0;
  return static_cast<int>(state().devices.size());
}

const proto::DeviceSnapshot* device_snapshot(int ordinal) noexcept {
  if (init_status() != CUDA_SUCCESS) return nullptr;
  ProcessState& s = state();
  if (ordinal < 0 || ordinal >= static_cast<int>(s.devices.size())) return nullptr;
  return &s.devices[ordinal];
}

// ---- address book ----

void AddressBook::add_device(const DeviceRange& range) {
  std::unique_lock lock(mutex_);
  DeviceRange& kept = device_[range.base];
  kept = range;
  kept.id = ++last_device_id_;
}

bool AddressBook::remove_device(std::uint64_t base, DeviceRange* removed) {
  std::unique_lock lock(mutex_);
  auto it = device_.find(base);
  if (it == device_.end()) return false;
  if (removed) *removed = it->second;
  device_.erase(it);
  return true;
}

bool AddressBook::find_device(std::uint64_t address, DeviceRange* out) const {
  std::shared_lock lock(mutex_);
  auto it = device_.upper_bound(address);
  if (it == device_.begin()) return false;
  --it;
  if (address - it->second.base >= std::max<std::uint64_t>(it->second.bytes, 1)) return false;
  if (out) *out = it->second;
  return true;
}

bool AddressBook::others_within(std::uint64_t lo, std::uint64_t hi,
                                std::uint64_t except_base) const {
  std::shared_lock lock(mutex_);
  auto it = device_.upper_bound(lo);
  if (it != device_.begin()) --it;
  for (; it != device_.end() && it->first < hi; ++it) {
    const DeviceRange& range = it->second;
    if (range.base != except_base && range.base + std::max<std::uint64_t>(range.bytes, 1) > lo) {
      return true;
    }
  }
  return false;
}

std::vector<DeviceRange> AddressBook::device_ranges() const {
  std::shared_lock lock(mutex_);
  std::vector<DeviceRange> all;
  all.reserve(device_.size());
  for (const auto& [base, range] : device_) all.push_back(range);
  return all;
}

void AddressBook::add_pinned(const PinnedRange& range) {
  std::unique_lock lock(mutex_);
  pinned_[reinterpret_cast<std::uintptr_t>(range.base)] = range;
}

bool AddressBook::remove_pinned(const void* base, PinnedRange* removed) {
  std::unique_lock lock(mutex_);
  auto it = pinned_.find(reinterpret_cast<std::uintptr_t>(base));
  if (it == pinned_.end()) return false;
  if (removed) *removed = it->second;
  pinned_.erase(it);
  return true;
}

bool AddressBook::find_pinned(const void* address, PinnedRange* out) const {
  std::shared_lock lock(mutex_);
  auto a = reinterpret_cast<std::uintptr_t>(address);
  auto it = pinned_.upper_bound(a);
  if (it == pinned_.begin()) return false;
  --it;
  if (a - it->first >= it->second.bytes) return false;
  if (out) *out = it->second;
  return true;
}

bool AddressBook::add_pinned_elsewhere(const void* base, Session* session,
                                       proto::WireHandle region) {
  std::unique_lock lock(mutex_);
  auto it = pinned_.find(reinterpret_cast<std::uintptr_t>(base));
  if (it == pinned_.end()) return false;
  for (PinnedRange::Elsewhere& slot : it->second.elsewhere) {
    if (slot.session == nullptr) {
      slot = {session, region};
      return true;
    }
  }
  return false;
}

bool AddressBook::find_pinned_by_device(std::uint64_t address, PinnedRange* out) const {
  std::shared_lock lock(mutex_);
  for (const auto& [base, range] : pinned_) {
    if (address >= range.device_pointer && address - range.device_pointer < range.bytes) {
      if (out) *out = range;
      return true;
    }
  }
  return false;
}

AddressBook& address_book() noexcept {
  static AddressBook* book = new AddressBook();
  return *book;
}

}  // namespace mpsshim::shim
