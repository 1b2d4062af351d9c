// What the launch-batching tests share (launch_batch_test.cpp, launch_batch_property_test.cpp,
// launch_batch_session_end_test.cpp): the test driver's graph hooks, a client of a server on a
// driver table with its module's functions, a library's kernels, streams and buffers, the
// session's batching figures, and the settings that turn batching on or off.
#pragma once

#include <dlfcn.h>

#include <catch2/catch.hpp>

#include <array>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "broker/server/accounting/session_stats.hpp"
#include "broker/server/driver/driver.hpp"
#include "tests/server/harness.hpp"

namespace mpsshim::server::test::batch {

template <typename T>
T driver_hook(const char* name) {
  void* lib = ::dlopen(std::getenv("MPSSHIM_TESTDRIVER_LIB"), RTLD_NOW | RTLD_NOLOAD);
  void* symbol = lib != nullptr ? ::dlsym(lib, name) : nullptr;
  if (symbol == nullptr) throw std::runtime_error(std::string("test driver lacks ") + name);
  return reinterpret_cast<T>(symbol);
}
inline unsigned long long instantiations() {
  return driver_hook<unsigned long long (*)()>("mpsshim_testdriver_graph_instantiations")();
}
inline int graph_objects() {  // graphs and executable graphs alive
  return driver_hook<int (*)()>("mpsshim_testdriver_graph_objects")();
}
inline unsigned long long node_updates() {
  return driver_hook<unsigned long long (*)()>("mpsshim_testdriver_graph_node_updates")();
}
inline unsigned long long node_toggles() {  // cuGraphNodeSetEnabled calls
  return driver_hook<unsigned long long (*)()>("mpsshim_testdriver_graph_node_toggles")();
}

inline std::vector<std::byte> fatbin() {
  std::vector<std::byte> bytes(16 + 64);
  const std::uint32_t magic = 0xBA55ED50u;
  const std::uint16_t version = 1, header_size = 16;
  const std::uint64_t fat_size = 64;
  std::memcpy(bytes.data(), &magic, 4);
  std::memcpy(bytes.data() + 4, &version, 2);
  std::memcpy(bytes.data() + 6, &header_size, 2);
  std::memcpy(bytes.data() + 8, &fat_size, 8);
  return bytes;
}

inline std::uint32_t bits(float f) {
  return std::bit_cast<std::uint32_t>(f);
}

// The session's figures, from its stats line and its ps line.
struct Figures {
  std::uint64_t batches = 0;
  std::uint64_t batched = 0;
  std::uint64_t launches = 0;
};
inline std::uint64_t field(const std::string& text, const std::string& key) {
  const std::size_t at = text.find(" " + key + "=");
  if (at == std::string::npos) throw std::runtime_error("no " + key + "= in: " + text);
  return std::stoull(text.substr(at + key.size() + 2));
}
inline Figures figures(Harness& h) {
  const std::string stats = h.server->stats_text(true);
  const std::string ps = h.server->stats_text(false);
  return Figures{field(stats, "batches"), field(stats, "batched"), field(ps, "launches")};
}

// A client of a server on `driver` with one context, its module's functions and a library's
// kernels, streams and device buffers.
struct Fixture {
  explicit Fixture(const DriverTable& driver, ServerSettings settings = {},
                   proto::ClientHello hello = default_hello())
      : owned_(std::make_unique<Harness>(driver, settings)), h(*owned_), sut(h, hello) {
    admitted();
  }
  // A client admitted as given (a Kubernetes allocation's fields, say).
  Fixture(const DriverTable& driver, ServerSettings settings, const proto::ServerAdmit& admit)
      : owned_(std::make_unique<Harness>(driver, settings)), h(*owned_), sut(h, admit) {
    admitted();
  }
  // A client of the server of an existing harness, which has no other client: the destructor
  // waits until the server holds no session.
  explicit Fixture(Harness& harness, proto::ClientHello hello = default_hello())
      : h(harness), sut(h, hello) {
    admitted();
  }
  // The same, admitted as given (a static SM partition's fields, say).
  Fixture(Harness& harness, const proto::ServerAdmit& admit) : h(harness), sut(h, admit) {
    admitted();
  }
  ~Fixture() {
    sut.hang_up();
    if (owned_) {
      h.pump_until([&] { return h.logged("freed") || h.logged("nothing to free"); });
    } else {
      h.pump_until([&] { return h.server->session_count() == 0; });
    }
  }
  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;

 private:
  void admitted() {
    if (!sut.connected()) {
      std::string log;
      for (const std::string& line : h.log_lines()) log += line + "\n";
      INFO("server log:\n" << log);
      REQUIRE(sut.connected());
    }
    ctx = sut.create_context();
  }
  std::unique_ptr<Harness> owned_;  // first: made before, and destroyed after, the client

 public:
  std::uint64_t load(proto::ImageKind kind) {
    auto image = fatbin();
    const std::uint32_t token = next_token++;
    sut.send_memfd(proto::MessageKind::kModuleImage, token, image.size(), image);
    auto reply = sut.call(proto::Op::kImageLoad,
                          proto::ImageLoadReq{ctx.ctx, image.size(), token, kind, 0, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::ImageLoadRep>().handle;
  }
  // A module function (kind kModule) or a library kernel (kLibrary) by name.
  proto::FunctionRep function(const std::string& name,
                              proto::ImageKind kind = proto::ImageKind::kModule) {
    std::uint64_t& owner = kind == proto::ImageKind::kModule ? module : library;
    if (owner == 0) owner = load(kind);
    std::vector<std::byte> bytes(name.size());
    std::memcpy(bytes.data(), name.data(), name.size());
    auto reply =
        sut.call(kind == proto::ImageKind::kModule ? proto::Op::kModuleGetFunction
                                                   : proto::Op::kLibraryGetKernel,
                 proto::NamedLookupReq{owner, static_cast<std::uint32_t>(name.size()), 0}, bytes);
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::FunctionRep>();
  }
  std::uint64_t stream(std::uint32_t flags = CU_STREAM_NON_BLOCKING) {
    auto reply = sut.call(proto::Op::kStreamCreate, proto::StreamCreateReq{ctx.ctx, flags, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::StreamCreateRep>().stream;
  }
  std::uint64_t event() {
    auto reply = sut.call(proto::Op::kEventCreate,
                          proto::EventCreateReq{ctx.ctx, CU_EVENT_DISABLE_TIMING, 0});
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::EventCreateRep>().event;
  }
  std::uint64_t buffer(std::uint64_t bytes) {
    CUresult r = CUDA_SUCCESS;
    std::uint64_t p = sut.alloc(ctx.ctx, bytes, &r);
    REQUIRE(r == CUDA_SUCCESS);
    return p;
  }

  // A launch record: `args` packed at the function's parameter offsets.
  template <typename... Args>
  void launch(const proto::FunctionRep& f, std::uint64_t stream, unsigned grid, unsigned block,
              Args... args) {
    launch_shaped(f, stream, {grid, 1, 1}, {block, 1, 1}, 0, args...);
  }
  template <typename... Args>
  void launch_shaped(const proto::FunctionRep& f, std::uint64_t stream,
                     std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
                     std::uint32_t shared, Args... args) {
    std::vector<std::byte> packed(f.args_bytes);
    std::size_t i = 0;
    auto put = [&](auto value) {
      REQUIRE(i < f.param_count);
      REQUIRE(f.params[i].size == sizeof value);
      std::memcpy(packed.data() + f.params[i].offset, &value, sizeof value);
      ++i;
    };
    (put(args), ...);
    REQUIRE(i == f.param_count);
    proto::LaunchReq req{};
    req.function = f.function;
    req.stream = stream;
    std::memcpy(req.grid, grid.data(), sizeof req.grid);
    std::memcpy(req.block, block.data(), sizeof req.block);
    req.shared_bytes = shared;
    req.args_bytes = static_cast<std::uint32_t>(packed.size());
    sut.send(proto::Op::kLaunchKernel, req, proto::kNoReply, packed);
  }
  void memset(std::uint64_t stream, std::uint64_t dst, std::uint32_t value, std::uint64_t words) {
    sut.send(proto::Op::kMemset, proto::MemsetReq{stream, dst, 0, words, 1, value, 4});
  }
  CUresult synchronize(std::uint64_t stream) {
    return sut.call(proto::Op::kStreamSynchronize, proto::HandleReq{stream}).result;
  }
  // `words` 32-bit words at dptr, through a staged copy on the default stream.
  template <typename T = std::uint32_t>
  std::vector<T> read(std::uint64_t dptr, std::size_t count) {
    const std::uint32_t generation = ++read_generation;
    sut.send(proto::Op::kCopyDtoH,
             proto::CopyHostReq{ctx.default_stream, dptr, count * sizeof(T),
                                proto::HostRef{1, 0, proto::HostKind::kStagingChunk, generation}});
    REQUIRE(h.pump_until(
        [&] { return sut.view().chunk_state(1)->done_generation.load() == generation; }));
    REQUIRE(sut.view().chunk_state(1)->result.load() == CUDA_SUCCESS);
    std::vector<T> out(count);
    std::memcpy(out.data(), sut.view().chunk(1), count * sizeof(T));
    return out;
  }
  CUresult async_error() { return static_cast<CUresult>(sut.control()->async_error.exchange(0)); }

  Harness& h;
  TestClient sut;
  proto::CtxCreateRep ctx{};
  std::uint64_t module = 0;
  std::uint64_t library = 0;
  std::uint32_t next_token = 1;
  std::uint32_t read_generation = 0;
};

// Batching on, with runs of 2 launches and more going out as graphs (the tests' expectations
// count batches that way, whatever the server's default minimum), and without the ramp after an
// idle stream (its own tests turn it on), so that a burst queued on a fresh stream is one batch,
// and without graphs prepared at the first launch (they would count as built).
// In power-of-two runs unless `graphs` says otherwise: most expectations count graph launches
// that way; the server's default, padded graphs, has its own tests and property runs.
inline ServerSettings batching(
    std::size_t max = 64, std::size_t eager_sightings = 1,
    LaunchBatchSettings::Graphs graphs = LaunchBatchSettings::Graphs::kRuns) {
  ServerSettings s;
  s.launch_batch.ramp_last = 0;
  s.launch_batch.prepare_graphs = false;
  s.launch_batch.min_launches = 2;
  s.launch_batch.max_launches = max;
  s.launch_batch.eager_sightings = eager_sightings;
  s.launch_batch.graphs = graphs;
  return s;
}

// One graph launch per batch, of the batch's exact length.
inline ServerSettings exact_batching(std::size_t max = 64, std::size_t eager_sightings = 1) {
  return batching(max, eager_sightings, LaunchBatchSettings::Graphs::kExact);
}

// One graph launch per batch, of the next power-of-two length, the nodes past its end disabled.
inline ServerSettings padded_batching(std::size_t max = 64, std::size_t eager_sightings = 1) {
  return batching(max, eager_sightings, LaunchBatchSettings::Graphs::kPadded);
}

inline ServerSettings no_batching() {
  return batching(0);
}

}  // namespace mpsshim::server::test::batch
