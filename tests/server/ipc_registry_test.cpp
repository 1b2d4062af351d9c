// The server's registry of interprocess handles (broker/server/session/ipc_registry.hpp): the
// policy (same uid only, never one's own), forged and foreign handles, the lifetime of an export
// that others hold open, and opens and closes from several threads at once.
#include "broker/server/session/ipc_registry.hpp"

#include <catch2/catch.hpp>

#include <thread>
#include <vector>

namespace mpsshim::server {
namespace {

constexpr int kDevice = 0;
constexpr CUdeviceptr kBase = 0x7f0000000000;
constexpr std::uint64_t kBytes = 1 << 20;
constexpr IpcOwner kAlice{1000, 1};
constexpr IpcOwner kAlicesOtherClient{1000, 2};
constexpr IpcOwner kBob{1001, 3};

std::shared_ptr<IpcReturnedBytes> charge() {
  return std::make_shared<IpcReturnedBytes>();
}

TEST_CASE("a memory handle opens for another client of the same uid only", "[server][ipc]") {
  IpcRegistry sut(kDevice);
  auto [memory, handle] = sut.export_memory(kBase, kBytes, kAlice, charge());

  auto opened = sut.find_memory(handle, kAlicesOtherClient);
  REQUIRE(opened);
  CHECK((*opened)->base == kBase);
  CHECK((*opened)->bytes == kBytes);

  auto bob = sut.find_memory(handle, kBob);
  REQUIRE_FALSE(bob);
  CHECK(bob.error().result == CUDA_ERROR_INVALID_HANDLE);
  CHECK_THAT(bob.error().why, Catch::Contains("exported by uid 1000") &&
                                  Catch::Contains("only clients of the same user"));

  auto own = sut.find_memory(handle, kAlice);
  REQUIRE_FALSE(own);
  CHECK(own.error().result == CUDA_ERROR_INVALID_CONTEXT);
}

TEST_CASE("forged, garbled and foreign handles are refused, each with its reason",
          "[server][ipc]") {
  IpcRegistry sut(kDevice);
  auto [memory, handle] = sut.export_memory(kBase, kBytes, kAlice, charge());
  auto refused = [&](proto::IpcHandle h) {
    auto found = sut.find_memory(h, kAlicesOtherClient);
    REQUIRE_FALSE(found);
    return found.error();
  };

  proto::IpcHandle secret = handle;
  secret.secret[1] ^= 1;
  CHECK(refused(secret).result == CUDA_ERROR_INVALID_HANDLE);
  CHECK_THAT(refused(secret).why, Catch::Contains("secret does not match"));

  proto::IpcHandle token = handle;
  token.token += 1;
  CHECK(refused(token).result == CUDA_ERROR_INVALID_HANDLE);

  proto::IpcHandle other_gpu = handle;
  other_gpu.device = kDevice + 1;
  CHECK(refused(other_gpu).result == CUDA_ERROR_NOT_SUPPORTED);
  CHECK_THAT(refused(other_gpu).why, Catch::Contains("the client does not see GPU 1"));

  // The same GPU's handle, from a server since restarted.
  IpcRegistry earlier(kDevice);
  auto [gone, earlier_handle] = earlier.export_memory(kBase, kBytes, kAlice, charge());
  CHECK(earlier.server_id() != sut.server_id());
  CHECK(refused(earlier_handle).result == CUDA_ERROR_INVALID_HANDLE);

  proto::IpcHandle garbage{};
  garbage.token = handle.token;
  CHECK(refused(garbage).result == CUDA_ERROR_INVALID_VALUE);

  proto::IpcHandle kind = handle;
  kind.kind = static_cast<std::uint16_t>(proto::IpcKind::kEvent);
  CHECK(refused(kind).result == CUDA_ERROR_INVALID_VALUE);

  // Two exports never share a secret.
  auto [second, second_handle] = sut.export_memory(kBase + kBytes, kBytes, kAlice, charge());
  CHECK(
      (second_handle.secret[0] != handle.secret[0] || second_handle.secret[1] != handle.secret[1]));
}

TEST_CASE("an export that others hold open outlives its exporter; the last closer frees it",
          "[server][ipc]") {
  IpcRegistry sut(kDevice);
  auto [memory, handle] = sut.export_memory(kBase, kBytes, kAlice, charge());
  REQUIRE(sut.add_opener(*memory));
  REQUIRE(sut.add_opener(*memory));

  CHECK_FALSE(sut.unexport_memory(*memory));  // two openers: not the exporter's to free
  CHECK(sut.memory_entries() == 0);           // and no later open finds it
  CHECK(sut.find_memory(handle, kAlicesOtherClient).error().result == CUDA_ERROR_INVALID_HANDLE);
  CHECK_FALSE(sut.add_opener(*memory));

  CHECK_FALSE(sut.drop_opener(*memory));
  CHECK(sut.drop_opener(*memory));  // the last holder frees it

  auto [unopened, unused] = sut.export_memory(kBase + kBytes, kBytes, kAlice, charge());
  CHECK(sut.unexport_memory(*unopened));  // nobody opened it: the exporter frees it
}

TEST_CASE("an event handle names the shared event until its last holder lets go", "[server][ipc]") {
  IpcRegistry sut(kDevice);
  DriverTable no_driver;  // no driver event is adopted, so none is destroyed
  auto event = std::make_shared<IpcEvent>(sut, no_driver, CU_EVENT_DISABLE_TIMING);
  sut.export_event(event, kAlice);
  CHECK(sut.event_entries() == 1);

  auto found = sut.find_event(event->handle, kAlicesOtherClient);
  REQUIRE(found);
  CHECK(found->get() == event.get());
  CHECK(sut.find_event(event->handle, kBob).error().result == CUDA_ERROR_INVALID_HANDLE);
  CHECK(sut.find_memory(event->handle, kAlicesOtherClient).error().result ==
        CUDA_ERROR_INVALID_VALUE);

  const proto::IpcHandle handle = event->handle;
  found->reset();
  event.reset();
  CHECK(sut.event_entries() == 0);
  CHECK(sut.find_event(handle, kAlicesOtherClient).error().result == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("opens and closes from four workers at once leave exactly one last closer",
          "[server][ipc]") {
  constexpr int kWorkers = 4;
  constexpr int kRounds = 2000;
  IpcRegistry sut(kDevice);
  for (int round = 0; round < kRounds / 100; ++round) {
    auto [memory, handle] = sut.export_memory(kBase, kBytes, kAlice, charge());
    std::atomic<int> last_closers{0};
    std::atomic<int> exporter_frees{0};
    std::vector<std::thread> workers;
    for (int w = 0; w < kWorkers; ++w) {
      workers.emplace_back([&, w] {
        const IpcOwner opener{1000, static_cast<std::uint32_t>(10 + w)};
        for (int i = 0; i < 100; ++i) {
          auto found = sut.find_memory(handle, opener);
          if (!found || !sut.add_opener(**found)) return;  // the exporter let go meanwhile
          if (sut.drop_opener(**found)) last_closers.fetch_add(1);
        }
      });
    }
    if (sut.unexport_memory(*memory)) exporter_frees.fetch_add(1);
    for (auto& t : workers) t.join();
    // Whoever let go last freed it, exactly once.
    CHECK(last_closers.load() + exporter_frees.load() == 1);
    CHECK(memory->openers == 0);
  }
}

}  // namespace
}  // namespace mpsshim::server
