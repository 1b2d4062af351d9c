// broker/server/images/image_cache: one library per distinct image, unloaded by whoever lets go
// last, or kept for an idle timeout after the last holder; and through the server, sessions sending
// the same bytes share one driver library, images with device variables do not, and a library
// no client holds stays for the next one until its timeout or the primary context's release.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "broker/server/driver/driver_table.hpp"
#include "broker/server/images/image_cache.hpp"
#include "tests/server/fatbin_builder.hpp"
#include "tests/server/harness.hpp"
#include "tests/server/library_load.hpp"

namespace mpsshim::server::test {
namespace {

int unloads = 0;

DriverTable counting_driver() {
  DriverTable cu{};
  cu.cuLibraryUnload = [](CUlibrary) {
    ++unloads;
    return CUDA_SUCCESS;
  };
  return cu;
}

CUlibrary fake_library(std::uintptr_t n) {
  return reinterpret_cast<CUlibrary>(n);
}

std::span<const std::byte> bytes_of(const char* text) {
  return {reinterpret_cast<const std::byte*>(text), std::strlen(text)};
}

}  // namespace

TEST_CASE("the image digest tells bytes and container counts apart", "[image_cache]") {
  const ImageDigest a = digest_image(bytes_of("abc"), 1);
  CHECK(a == digest_image(bytes_of("abc"), 1));
  CHECK(a != digest_image(bytes_of("abd"), 1));
  CHECK(a != digest_image(bytes_of("abc"), 2));
  CHECK(a != ImageDigest{});
}

TEST_CASE("a published library is found until its last holder lets go, then unloaded once",
          "[image_cache]") {
  unloads = 0;
  DriverTable cu = counting_driver();
  ImageCache cache(true);
  const ImageDigest digest = digest_image(bytes_of("image"), 1);
  CHECK(cache.find(digest) == nullptr);

  auto first = cache.publish(
      digest, std::make_shared<SharedLibrary>(cu, fake_library(1), digest, cache, 100));
  REQUIRE(first != nullptr);
  auto second = cache.find(digest);
  CHECK(second == first);
  CHECK(cache.stats().hits == 1);
  CHECK(cache.stats().hit_bytes == 100);
  CHECK(cache.stats().live == 1);

  first.reset();
  CHECK(unloads == 0);
  second.reset();
  CHECK(unloads == 1);
  CHECK(cache.find(digest) == nullptr);
  CHECK(cache.stats().live == 0);

  // The same bytes again: a new load is published in its place.
  auto again = cache.publish(
      digest, std::make_shared<SharedLibrary>(cu, fake_library(2), digest, cache, 100));
  CHECK(again->library() == fake_library(2));
  CHECK(cache.stats().loads == 2);
}

TEST_CASE("two sessions loading the same bytes at once keep one library", "[image_cache]") {
  unloads = 0;
  DriverTable cu = counting_driver();
  ImageCache cache(true);
  const ImageDigest digest = digest_image(bytes_of("image"), 1);
  auto winner = cache.publish(
      digest, std::make_shared<SharedLibrary>(cu, fake_library(1), digest, cache, 10));
  // The second load finished after the first was published: it gets the first, and its own
  // library is unloaded when the caller drops it, without taking the entry with it.
  auto loser = std::make_shared<SharedLibrary>(cu, fake_library(2), digest, cache, 10);
  auto got = cache.publish(digest, loser);
  CHECK(got == winner);
  loser.reset();
  CHECK(unloads == 1);
  CHECK(cache.find(digest) == winner);
}

TEST_CASE("with sharing off nothing is found or kept", "[image_cache]") {
  unloads = 0;
  DriverTable cu = counting_driver();
  ImageCache cache(false);
  const ImageDigest digest = digest_image(bytes_of("image"), 1);
  auto fresh = std::make_shared<SharedLibrary>(cu, fake_library(1), digest, cache, 10);
  CHECK(cache.publish(digest, fresh) == fresh);
  CHECK(cache.find(digest) == nullptr);
  fresh.reset();
  CHECK(unloads == 1);
}

TEST_CASE("a library no session holds stays for the idle timeout after its last use, then goes",
          "[image_cache]") {
  unloads = 0;
  DriverTable cu = counting_driver();
  ImageCache cache(true, std::chrono::seconds(60));
  const ImageDigest digest = digest_image(bytes_of("image"), 1);
  const auto published = ImageCache::Clock::now();
  auto holder = cache.publish(
      digest, std::make_shared<SharedLibrary>(cu, fake_library(1), digest, cache, 100));
  holder.reset();
  CHECK(unloads == 0);
  CHECK(cache.stats().live == 1);
  CHECK(cache.stats().unused == 1);
  CHECK(cache.stats().unused_bytes == 100);

  // The next client finds it; its use restarts the timeout.
  const auto found_at = ImageCache::Clock::now();
  holder = cache.find(digest);
  REQUIRE(holder != nullptr);
  CHECK(holder->library() == fake_library(1));
  CHECK(cache.stats().unused == 0);
  // While held it stays, however late the look.
  CHECK(cache.unload_unused(found_at + std::chrono::hours(2)).libraries == 0);
  holder.reset();
  // That look marked it held two hours on: the timeout counts from there.
  CHECK(
      cache.unload_unused(found_at + std::chrono::hours(2) + std::chrono::seconds(59)).libraries ==
      0);
  const UnloadedImages gone =
      cache.unload_unused(found_at + std::chrono::hours(2) + std::chrono::seconds(61));
  CHECK(gone.libraries == 1);
  CHECK(gone.bytes == 100);
  CHECK(unloads == 1);
  CHECK(cache.find(digest) == nullptr);
  CHECK(cache.stats().live == 0);
  CHECK(cache.stats().expired == 1);
  CHECK(published <= found_at);
}

TEST_CASE("every unheld library goes at once when asked, a held one stays", "[image_cache]") {
  unloads = 0;
  DriverTable cu = counting_driver();
  ImageCache cache(true, std::chrono::seconds(60));
  const ImageDigest a = digest_image(bytes_of("a"), 1);
  const ImageDigest b = digest_image(bytes_of("b"), 1);
  cache.publish(a, std::make_shared<SharedLibrary>(cu, fake_library(1), a, cache, 10));
  auto held = cache.publish(b, std::make_shared<SharedLibrary>(cu, fake_library(2), b, cache, 20));
  const UnloadedImages gone = cache.unload_all_unused();
  CHECK(gone.libraries == 1);
  CHECK(gone.bytes == 10);
  CHECK(unloads == 1);
  CHECK(cache.find(a) == nullptr);
  CHECK(cache.find(b) == held);
  held.reset();
  CHECK(unloads == 1);  // kept again by its last use
}

TEST_CASE("the cache's end unloads what it kept", "[image_cache]") {
  unloads = 0;
  DriverTable cu = counting_driver();
  {
    ImageCache cache(true, std::chrono::seconds(60));
    const ImageDigest digest = digest_image(bytes_of("image"), 1);
    cache.publish(digest, std::make_shared<SharedLibrary>(cu, fake_library(1), digest, cache, 100));
    CHECK(unloads == 0);
  }
  CHECK(unloads == 1);
}

TEST_CASE("the scan's verdicts are remembered, within a bound", "[image_cache]") {
  ImageCache cache(true);
  const ImageDigest with_globals = digest_image(bytes_of("with globals"), 1);
  const ImageDigest clean = digest_image(bytes_of("clean"), 1);
  CHECK_FALSE(cache.known_private(with_globals));
  CHECK_FALSE(cache.known_shareable(with_globals));
  cache.remember_private(with_globals);
  cache.remember_shareable(clean);
  CHECK(cache.known_private(with_globals));
  CHECK_FALSE(cache.known_shareable(with_globals));
  CHECK(cache.known_shareable(clean));
  CHECK_FALSE(cache.known_private(clean));
  std::vector<ImageVerdict> all = cache.verdicts();
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.digest < b.digest; });
  std::vector<ImageVerdict> expected{{with_globals, false}, {clean, true}};
  std::sort(expected.begin(), expected.end(), [](auto& a, auto& b) { return a.digest < b.digest; });
  CHECK(all == expected);
  for (std::size_t i = 0; i < ImageCache::kMaxVerdicts; ++i) {
    const std::string text = "image " + std::to_string(i);
    cache.remember_private(digest_image(bytes_of(text.c_str()), 1));
  }
  CHECK_FALSE(cache.known_private(with_globals));  // forgotten with the rest at the bound
  CHECK(cache.verdicts().size() < ImageCache::kMaxVerdicts);
}

TEST_CASE("verdicts an earlier server kept are adopted, the all-zero digest never",
          "[image_cache]") {
  ImageCache cache(true);
  const ImageDigest clean = digest_image(bytes_of("clean"), 1);
  cache.adopt({{clean, true}, {ImageDigest{}, true}});
  CHECK(cache.known_shareable(clean));
  CHECK_FALSE(cache.known_shareable(ImageDigest{}));
  CHECK(cache.stats().adopted == 1);
}

TEST_CASE("concurrent finds, publishes and drops unload every library exactly once",
          "[image_cache]") {
  // With retention, a coordinator thread also unloads whatever nobody holds, as fast as it can:
  // no library may be unloaded while a thread holds it, and none twice.
  const bool retention = GENERATE(false, true);
  INFO("retention " << retention);
  std::atomic<int> loads{0};
  std::atomic<int> nulls{0};
  std::atomic<int> unloaded_while_held{0};
  static std::mutex unloaded_mutex;
  static std::set<CUlibrary> unloaded;
  static std::atomic<int> concurrent_unloads{0};
  static std::atomic<int> double_unloads{0};
  concurrent_unloads = 0;
  double_unloads = 0;
  unloaded.clear();
  DriverTable cu{};
  cu.cuLibraryUnload = [](CUlibrary library) {
    concurrent_unloads.fetch_add(1);
    std::lock_guard lock(unloaded_mutex);
    if (!unloaded.insert(library).second) double_unloads.fetch_add(1);
    return CUDA_SUCCESS;
  };
  auto was_unloaded = [](CUlibrary library) {
    std::lock_guard lock(unloaded_mutex);
    return unloaded.contains(library);
  };
  ImageCache cache(true, retention ? std::chrono::seconds(60) : std::chrono::seconds(0));
  std::vector<ImageDigest> digests;
  for (int i = 0; i < 4; ++i) {
    const std::string text = "image " + std::to_string(i);
    digests.push_back(digest_image(bytes_of(text.c_str()), 1));
  }
  std::atomic<bool> done{false};
  std::thread coordinator([&] {
    for (int i = 0; retention && !done.load(); ++i) {
      if (i % 2 == 0) {
        cache.unload_unused(ImageCache::Clock::now() + std::chrono::hours(1));
      } else {
        cache.unload_all_unused();
      }
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const ImageDigest& digest = digests[(i + t) % digests.size()];
        std::shared_ptr<SharedLibrary> held = cache.find(digest);
        if (!held) {
          const int n = loads.fetch_add(1) + 1;
          held = cache.publish(
              digest, std::make_shared<SharedLibrary>(
                          cu, fake_library(static_cast<std::uintptr_t>(n)), digest, cache, 1));
        }
        // Catch's checks are for the main thread.
        if (held == nullptr) {
          nulls.fetch_add(1);
        } else if (was_unloaded(held->library())) {
          unloaded_while_held.fetch_add(1);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  done = true;
  coordinator.join();
  cache.unload_all_unused();
  CHECK(nulls.load() == 0);
  CHECK(unloaded_while_held.load() == 0);
  CHECK(double_unloads.load() == 0);
  CHECK(concurrent_unloads.load() == loads.load());
  CHECK(cache.stats().live == 0);
}

TEST_CASE("sessions sending the same library image share one driver library",
          "[server][image_cache]") {
  Harness h;  // the default settings: a library no session holds is kept for 60 s
  const auto clean = make_container({{kElf, clean_elf()}});
  const auto with_globals = make_container({{kElf, elf_with(".nv.global", SHT_NOBITS)}});
  TestClient a(h), b(h);
  auto ctx_a = a.create_context();
  auto ctx_b = b.create_context();
  const int before = fake_gpu().libraries_live;

  const std::uint64_t lib_a = load_library_image(a, ctx_a.ctx, clean, 1);
  const std::uint64_t lib_b = load_library_image(b, ctx_b.ctx, clean, 1);
  CHECK(fake_gpu().libraries_live == before + 1);
  const std::uint64_t own_a = load_library_image(a, ctx_a.ctx, with_globals, 2);
  load_library_image(b, ctx_b.ctx, with_globals, 2);
  CHECK(fake_gpu().libraries_live == before + 3);
  CHECK(h.server->image_cache().stats().hits == 1);
  CHECK(h.server->image_cache().stats().private_loads == 2);
  // Each session counts what it shares and what it loaded alone (mpsshimctl stats IMAGES).
  for (TestClient* client : {&a, &b}) {
    const Session* session = h.server->find_session(client->welcome().client_id);
    REQUIRE(session != nullptr);
    CHECK(session->stats.images_shared == 1);
    CHECK(session->stats.images_shared_bytes == clean.size());
    CHECK(session->stats.images_private == 1);
    CHECK(session->stats.images_private_bytes == with_globals.size());
  }
  const std::string stats = h.server->stats_text(true);
  INFO(stats);
  CHECK(stats.find(fmt::format(
            "images_shared=1 images_shared_bytes={} images_private=1 images_private_bytes={} ",
            clean.size(), with_globals.size())) != std::string::npos);

  // A shared library's string literals have no address for anyone; its other symbols do.
  auto global = [&](const std::string& name) {
    std::vector<std::byte> bytes(name.size());
    std::memcpy(bytes.data(), name.data(), name.size());
    return a
        .call(proto::Op::kLibraryGetGlobal,
              proto::NamedLookupReq{lib_a, static_cast<std::uint32_t>(name.size()), 0}, bytes)
        .result;
  };
  CHECK(global("$str$1") == CUDA_ERROR_NOT_FOUND);
  CHECK(global("__unnamed_1") == CUDA_ERROR_NOT_FOUND);
  CHECK(global("table") == CUDA_SUCCESS);

  // A shared kernel's dynamic shared-memory allowance only grows: b asking for less than a did
  // must not make a's launches fail. A kernel of a session's own library follows each setting.
  // (The fake driver names a kernel by its name alone: the private library's is another name.)
  auto kernel_of = [](TestClient& client, std::uint64_t library, const std::string& name) {
    std::vector<std::byte> bytes(name.size());
    std::memcpy(bytes.data(), name.data(), name.size());
    auto reply = client.call(
        proto::Op::kLibraryGetKernel,
        proto::NamedLookupReq{library, static_cast<std::uint32_t>(name.size()), 0}, bytes);
    REQUIRE(reply.result == CUDA_SUCCESS);
    return reply.as<proto::FunctionRep>().function;
  };
  auto set_smem = [](TestClient& client, std::uint64_t kernel, int bytes) {
    return client
        .call(proto::Op::kKernelSetAttribute,
              proto::AttributeReq{kernel, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes, 0,
                                  0})
        .result;
  };
  const std::uint64_t kernel_a = kernel_of(a, lib_a, "k");
  const std::uint64_t kernel_b = kernel_of(b, lib_b, "k");
  CHECK(set_smem(a, kernel_a, 100 << 10) == CUDA_SUCCESS);
  CHECK(fake_gpu().kernel_dynamic_smem == 100 << 10);
  CHECK(set_smem(b, kernel_b, 64 << 10) == CUDA_SUCCESS);
  CHECK(fake_gpu().kernel_dynamic_smem == 100 << 10);
  CHECK(set_smem(b, kernel_b, 120 << 10) == CUDA_SUCCESS);
  CHECK(fake_gpu().kernel_dynamic_smem == 120 << 10);
  const std::uint64_t own_kernel = kernel_of(a, own_a, "own");
  CHECK(set_smem(a, own_kernel, 32 << 10) == CUDA_SUCCESS);
  CHECK(fake_gpu().kernel_dynamic_smem == 32 << 10);

  // The first session's unload leaves the library to the second; the second's end leaves it to
  // the cache, for the next client, and frees its own.
  CHECK(a.call(proto::Op::kLibraryUnload, proto::HandleReq{lib_a}).result == CUDA_SUCCESS);
  h.pump();
  CHECK(fake_gpu().libraries_live == before + 3);
  b.hang_up();
  CHECK(h.pump_until([&] { return fake_gpu().libraries_live == before + 2; }));
  a.hang_up();
  CHECK(h.pump_until([&] { return fake_gpu().libraries_live == before + 1; }));
  CHECK(h.server->image_cache().stats().unused == 1);

  // A later client sending the same bytes gets it without a load.
  TestClient c(h);
  auto ctx_c = c.create_context();
  load_library_image(c, ctx_c.ctx, clean, 1);
  CHECK(fake_gpu().libraries_live == before + 1);
  CHECK(h.server->image_cache().stats().hits == 2);
  c.hang_up();
  h.pump();
  CHECK(fake_gpu().libraries_live == before + 1);
  // Past the idle timeout it goes.
  const auto later = ImageCache::Clock::now() + std::chrono::seconds(61);
  CHECK(h.server->image_cache().unload_unused(later).libraries == 1);
  CHECK(fake_gpu().libraries_live == before);
  CHECK(h.server->image_cache().stats().live == 0);
}

TEST_CASE("with an idle timeout of 0 a library goes with its last client",
          "[server][image_cache]") {
  ServerSettings settings;
  settings.image_idle_timeout = std::chrono::seconds(0);
  Harness h(settings);
  const auto clean = make_container({{kElf, clean_elf()}});
  const int before = fake_gpu().libraries_live;
  TestClient a(h);
  auto ctx = a.create_context();
  load_library_image(a, ctx.ctx, clean, 1);
  CHECK(fake_gpu().libraries_live == before + 1);
  a.hang_up();
  CHECK(h.pump_until([&] { return fake_gpu().libraries_live == before; }));
}

TEST_CASE("kept libraries go with the primary context when no client is left",
          "[server][image_cache]") {
  ServerSettings settings;
  settings.context_idle_timeout = std::chrono::milliseconds(0);
  Harness h(settings);
  const auto clean = make_container({{kElf, clean_elf()}});
  const int before = fake_gpu().libraries_live;
  TestClient a(h);
  auto ctx = a.create_context();
  load_library_image(a, ctx.ctx, clean, 1);
  a.hang_up();
  CHECK(h.pump_until([&] { return !h.server->context_held(); }));
  CHECK(h.pump_until([&] { return fake_gpu().libraries_live == before; }));
  CHECK(h.logged("unloaded 1 shared library image(s)"));
  CHECK(h.server->image_cache().stats().expired == 1);
}

}  // namespace mpsshim::server::test
