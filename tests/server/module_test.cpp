// Images, functions, kernels, attributes and launches.
#include <fmt/format.h>

#include <catch2/catch.hpp>

#include "tests/server/harness.hpp"

namespace mpsshim::server::test {
namespace {

using proto::Op;

std::vector<std::byte> fatbin(std::uint64_t fat_size) {
  std::vector<std::byte> bytes(16 + fat_size);
  const std::uint32_t magic = 0xBA55ED50u;
  const std::uint16_t version = 1, header_size = 16;
  std::memcpy(bytes.data(), &magic, 4);
  std::memcpy(bytes.data() + 4, &version, 2);
  std::memcpy(bytes.data() + 6, &header_size, 2);
  std::memcpy(bytes.data() + 8, &fat_size, 8);
  return bytes;
}

std::vector<std::byte> name(const std::string& s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

std::uint64_t load(TestClient& client, std::uint64_t ctx, proto::ImageKind kind,
                   std::uint32_t token, CUresult* result = nullptr) {
  auto image = fatbin(64);
  client.send_memfd(proto::MessageKind::kModuleImage, token, image.size(), image);
  auto reply =
      client.call(Op::kImageLoad, proto::ImageLoadReq{ctx, image.size(), token, kind, 0, 0});
  if (result != nullptr) *result = reply.result;
  return reply.result == CUDA_SUCCESS ? reply.as<proto::ImageLoadRep>().handle : 0;
}

proto::FunctionRep lookup(TestClient& client, Op op, std::uint64_t owner, const std::string& n,
                          CUresult* result = nullptr) {
  auto bytes = name(n);
  auto reply =
      client.call(op, proto::NamedLookupReq{owner, static_cast<std::uint32_t>(n.size()), 0}, bytes);
  if (result != nullptr) *result = reply.result;
  return reply.as<proto::FunctionRep>();
}

std::vector<std::byte> launch_record(std::uint64_t function, std::uint64_t stream,
                                     std::span<const proto::WireLaunchAttribute> attributes,
                                     std::span<const std::byte> args, proto::LaunchReq* out) {
  proto::LaunchReq req{};
  req.function = function;
  req.stream = stream;
  req.grid[0] = req.grid[1] = req.grid[2] = 1;
  req.block[0] = 32;
  req.block[1] = req.block[2] = 1;
  req.args_bytes = static_cast<std::uint32_t>(args.size());
  req.attribute_count = static_cast<std::uint32_t>(attributes.size());
  *out = req;
  std::vector<std::byte> trailing(attributes.size_bytes() + args.size());
  if (!attributes.empty()) std::memcpy(trailing.data(), attributes.data(), attributes.size_bytes());
  if (!args.empty())
    std::memcpy(trailing.data() + attributes.size_bytes(), args.data(), args.size());
  return trailing;
}

TEST_CASE("a module's functions come with their parameter layout", "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t module = load(sut, ctx.ctx, proto::ImageKind::kModule, 1);
  REQUIRE(module != 0);
  CHECK(fake_gpu().modules_live == 1);

  CUresult result = CUDA_SUCCESS;
  auto function = lookup(sut, Op::kModuleGetFunction, module, "vector_add", &result);
  REQUIRE(result == CUDA_SUCCESS);
  CHECK(lookup(sut, Op::kModuleGetFunction, module, "vector_add").function == function.function);
  CHECK(function.param_count == 3);
  CHECK(function.args_bytes == 24);
  CHECK(function.params[2].offset == 16);

  lookup(sut, Op::kModuleGetFunction, module, "missing", &result);
  CHECK(result == CUDA_ERROR_NOT_FOUND);
  CHECK(lookup(sut, Op::kModuleGetFunction, ctx.ctx, "vector_add", &result).function == 0);
  CHECK(result == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("a launch carries its packed arguments to the driver", "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t module = load(sut, ctx.ctx, proto::ImageKind::kModule, 1);
  auto function = lookup(sut, Op::kModuleGetFunction, module, "vector_add");
  std::vector<std::byte> args(24);
  for (std::size_t i = 0; i < args.size(); ++i) args[i] = static_cast<std::byte>(i);
  proto::LaunchReq req;
  auto trailing = launch_record(function.function, ctx.default_stream, {}, args, &req);

  sut.send(Op::kLaunchKernel, req, proto::kNoReply, trailing);
  h.pump();

  CHECK(fake_gpu().launches == 1);
  CHECK(fake_gpu().last_launch_args == args);
  CHECK(sut.control()->async_error.load() == 0);
  CHECK(h.server->stats_text().find("launches=1 ") != std::string::npos);
}

TEST_CASE("a synchronize posted while a waiting launch goes out is served in the same pass",
          "[server][module][launch_batch]") {
  Harness h;  // launch batching on: a lone launch waits in the batch until the ring runs dry
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t module = load(sut, ctx.ctx, proto::ImageKind::kModule, 1);
  auto function = lookup(sut, Op::kModuleGetFunction, module, "vector_add");
  proto::LaunchReq req;
  auto trailing =
      launch_record(function.function, ctx.default_stream, {}, std::vector<std::byte>(24), &req);
  // The client posts its synchronize while the driver takes the launch, as a real one does.
  fake_gpu().on_launch = [&] {
    fake_gpu().on_launch = nullptr;
    sut.send(Op::kStreamSynchronize, proto::HandleReq{ctx.default_stream}, 0);
  };
  const int writes = fake_gpu().value_writes;

  sut.send(Op::kLaunchKernel, req, proto::kNoReply, trailing);
  h.server->do_work();  // one pass

  CHECK(fake_gpu().launches == 1);
  CHECK(fake_gpu().value_writes == writes + 1);  // the synchronize was fenced in that pass
  REQUIRE(h.pump_until([&] { return sut.slot_ready(0); }));
  CHECK(sut.view().slot(0)->result == CUDA_SUCCESS);
}

TEST_CASE("launch attributes that carry handles are refused", "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t module = load(sut, ctx.ctx, proto::ImageKind::kModule, 1);
  auto function = lookup(sut, Op::kModuleGetFunction, module, "f");
  proto::WireLaunchAttribute event_attribute{};
  event_attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT;
  proto::WireLaunchAttribute cooperative{};
  cooperative.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
  proto::LaunchReq req;

  auto refused = launch_record(function.function, ctx.default_stream,
                               std::span(&event_attribute, 1), {}, &req);
  sut.send(Op::kLaunchKernel, req, proto::kNoReply, refused);
  h.pump();
  CHECK(fake_gpu().launches == 0);
  CHECK(sut.control()->async_error.exchange(0) == CUDA_ERROR_NOT_SUPPORTED);

  auto allowed =
      launch_record(function.function, ctx.default_stream, std::span(&cooperative, 1), {}, &req);
  sut.send(Op::kLaunchKernel, req, proto::kNoReply, allowed);
  h.pump();
  CHECK(fake_gpu().launches == 1);
  CHECK(fake_gpu().last_launch_attribute_count == 1);
  CHECK(sut.control()->async_error.load() == 0);
}

TEST_CASE("a library's kernels use the kernel parameter query and launch", "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t library = load(sut, ctx.ctx, proto::ImageKind::kLibrary, 5);
  REQUIRE(library != 0);

  auto kernel = lookup(sut, Op::kLibraryGetKernel, library, "k");
  CHECK(kernel.param_count == 2);
  CHECK(kernel.args_bytes == 12);
  CHECK(lookup(sut, Op::kLibraryGetKernel, library, "k").function == kernel.function);

  auto attribute =
      sut.call(Op::kKernelGetAttribute,
               proto::AttributeReq{kernel.function, CU_FUNC_ATTRIBUTE_NUM_REGS, 0, 0, 0});
  CHECK(attribute.as<proto::AttributeRep>().value == 7);
  auto function = sut.call(Op::kKernelGetFunction, proto::HandleReq{kernel.function});
  CHECK(function.result == CUDA_SUCCESS);
  CHECK(function.as<proto::FunctionRep>().param_count == 3);

  proto::LaunchReq req;
  std::vector<std::byte> args(12);
  auto trailing = launch_record(kernel.function, ctx.default_stream, {}, args, &req);
  sut.send(Op::kLaunchKernel, req, proto::kNoReply, trailing);
  h.pump();
  CHECK(fake_gpu().launches == 1);

  auto module = sut.call(Op::kLibraryGetModule, proto::HandleReq{library});
  REQUIRE(module.result == CUDA_SUCCESS);
  CHECK(sut.call(Op::kModuleUnload, proto::HandleReq{module.as<proto::ImageLoadRep>().handle})
            .result == CUDA_ERROR_NOT_PERMITTED);

  CHECK(sut.call(Op::kLibraryUnload, proto::HandleReq{library}).result == CUDA_SUCCESS);
  CHECK(h.pump_until([&] { return fake_gpu().libraries_live == 0; }));
  CHECK(sut.call(Op::kKernelGetFunction, proto::HandleReq{kernel.function}).result ==
        CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("a global's range becomes the client's memory", "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t module = load(sut, ctx.ctx, proto::ImageKind::kModule, 1);
  std::uint64_t dptr = sut.alloc(ctx.ctx, 1024);
  auto bytes = name("counter");

  auto global = sut.call(Op::kModuleGetGlobal, proto::NamedLookupReq{module, 7, 0}, bytes)
                    .as<proto::GlobalRep>();
  REQUIRE(global.bytes == 64);

  CHECK(sut.call(Op::kCopyDtoD, proto::CopyDtoDReq{ctx.default_stream, global.dptr, dptr, 64})
            .result == CUDA_SUCCESS);
  CHECK(sut.call(Op::kCopyDtoD, proto::CopyDtoDReq{ctx.default_stream, global.dptr, dptr, 65})
            .result == CUDA_ERROR_INVALID_VALUE);
  CHECK(sut.call(Op::kMemFree, proto::MemFreeReq{global.dptr}).result == CUDA_ERROR_INVALID_VALUE);

  sut.call(Op::kModuleUnload, proto::HandleReq{module});
  CHECK(sut.call(Op::kCopyDtoD, proto::CopyDtoDReq{ctx.default_stream, global.dptr, dptr, 64})
            .result == CUDA_ERROR_INVALID_VALUE);
  CHECK(h.pump_until([&] { return fake_gpu().modules_live == 0; }));
}

TEST_CASE("an image longer than what was sent is refused", "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  auto image = fatbin(64);
  sut.send_memfd(proto::MessageKind::kModuleImage, 9, image.size(), image);

  auto reply = sut.call(Op::kImageLoad, proto::ImageLoadReq{ctx.ctx, image.size() - 8, 9,
                                                            proto::ImageKind::kModule, 0, 0});

  CHECK(reply.result == CUDA_ERROR_INVALID_IMAGE);
  CHECK(fake_gpu().modules_live == 0);
  CHECK(h.logged("say it is 80 bytes long"));
}

TEST_CASE("a library outlives the context it was loaded from; a module does not",
          "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto first = sut.create_context();
  std::uint64_t library = load(sut, first.ctx, proto::ImageKind::kLibrary, 7);
  load(sut, first.ctx, proto::ImageKind::kModule, 8);
  REQUIRE(library != 0);

  sut.send(Op::kCtxDestroy, proto::CtxReq{first.ctx});
  CHECK(h.pump_until([&] { return fake_gpu().modules_live == 0; }));

  // As after cudaDeviceReset: the runtime's kernels are used from the next context.
  auto second = sut.create_context();
  CHECK(fake_gpu().libraries_live == 1);
  CUresult result = CUDA_ERROR_UNKNOWN;
  lookup(sut, Op::kLibraryGetKernel, library, "vector_add", &result);
  CHECK(result == CUDA_SUCCESS);
  CHECK(second.ctx != 0);

  CHECK(sut.call_empty(Op::kGoodbye).result == CUDA_SUCCESS);
  CHECK(h.pump_until([&] { return fake_gpu().libraries_live == 0; }));
}

TEST_CASE("a device-linked library is re-wrapped over its containers for the driver",
          "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  // Three containers back to back; each one's fat_size differs so the driver's view shows
  // which container it was given where.
  std::vector<std::byte> image;
  for (std::uint64_t fat_size : {64, 32, 16}) {
    auto container = fatbin(fat_size);
    image.insert(image.end(), container.begin(), container.end());
  }
  sut.send_memfd(proto::MessageKind::kModuleImage, 9, image.size(), image);

  auto reply = sut.call(Op::kImageLoad, proto::ImageLoadReq{ctx.ctx, image.size(), 9,
                                                            proto::ImageKind::kLibrary, 3, 0});

  REQUIRE(reply.result == CUDA_SUCCESS);
  CHECK(fake_gpu().libraries_live == 1);
  CHECK(fake_gpu().last_wrapper_version == 2);
  CHECK(fake_gpu().last_wrapper_containers == std::vector<std::uint64_t>{64, 32, 16});
}

TEST_CASE("a device-linked library that is not its stated containers is refused",
          "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  auto image = fatbin(64);
  sut.send_memfd(proto::MessageKind::kModuleImage, 9, image.size(), image);

  auto reply = sut.call(Op::kImageLoad, proto::ImageLoadReq{ctx.ctx, image.size(), 9,
                                                            proto::ImageKind::kLibrary, 3, 0});

  CHECK(reply.result == CUDA_ERROR_INVALID_IMAGE);
  CHECK(fake_gpu().libraries_live == 0);
  CHECK(h.logged("is not 3 whole fat-binary containers"));
}

TEST_CASE("occupancy queries answer for functions and kernels", "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t library = load(sut, ctx.ctx, proto::ImageKind::kLibrary, 1);
  auto kernel = lookup(sut, Op::kLibraryGetKernel, library, "k");

  auto blocks =
      sut.call(Op::kOccupancyMaxActiveBlocks, proto::OccupancyReq{kernel.function, 128, 0, 0});
  CHECK(blocks.as<proto::OccupancyRep>().value == 4);
  proto::ClusterOccupancyReq clusters{};
  clusters.function = kernel.function;
  CHECK(sut.call(Op::kOccupancyMaxActiveClusters, clusters).as<proto::OccupancyRep>().value == 2);
  auto smem =
      sut.call(Op::kOccupancyAvailableDynamicSmem, proto::OccupancyReq{kernel.function, 128, 2, 0});
  CHECK(smem.as<proto::OccupancyRep>().value == 1024);
}

TEST_CASE("context limits can be raised, never lowered", "[server][module]") {
  Harness h;
  TestClient sut(h);
  sut.create_context();
  auto set = [&](CUlimit limit, std::uint64_t value) {
    return sut.call(Op::kCtxSetLimit, proto::CtxLimitReq{limit, 0, value}).result;
  };
  auto get = [&](CUlimit limit) {
    return sut.call(Op::kCtxGetLimit, proto::CtxLimitReq{limit, 0, 0})
        .as<proto::CtxLimitRep>()
        .value;
  };

  CHECK(set(CU_LIMIT_STACK_SIZE, 4096) == CUDA_SUCCESS);
  CHECK(set(CU_LIMIT_STACK_SIZE, 1024) == CUDA_SUCCESS);
  CHECK(get(CU_LIMIT_STACK_SIZE) == 4096);
  CHECK(set(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 1 << 20) == CUDA_ERROR_NOT_SUPPORTED);
}

// A library's load asking for its kernels' names (libshim/kernel_lookup.hpp).
Reply load_listing(TestClient& client, std::uint64_t ctx, std::uint32_t token,
                   std::uint32_t flags = proto::kImageLoadKernelNames) {
  auto image = fatbin(64);
  client.send_memfd(proto::MessageKind::kModuleImage, token, image.size(), image);
  return client.call(Op::kImageLoad, proto::ImageLoadReq{ctx, image.size(), token,
                                                         proto::ImageKind::kLibrary, 0, flags});
}

std::vector<std::string> names_of(const char* page, std::uint32_t count, std::uint32_t bytes) {
  std::vector<std::string> out;
  std::string_view text(page, bytes);
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t end = text.find('\0');
    REQUIRE(end != std::string_view::npos);
    out.emplace_back(text.substr(0, end));
    text.remove_prefix(end + 1);
  }
  CHECK(text.empty());
  return out;
}

TEST_CASE("a library's load lists its kernels' names in the driver's order", "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  fake_gpu().library_kernel_names = {"vector_add", "k", "_Z6kernelPfi"};
  Reply loaded = load_listing(sut, ctx.ctx, 3);
  REQUIRE(loaded.result == CUDA_SUCCESS);
  auto rep = loaded.as<proto::LibraryLoadRep>();
  CHECK(rep.handle != 0);
  CHECK(rep.names_known == 1);
  CHECK(rep.total == 3);
  CHECK(loaded.payload.size() == offsetof(proto::LibraryLoadRep, names) + rep.bytes);
  CHECK(names_of(rep.names, rep.count, rep.bytes) ==
        std::vector<std::string>{"vector_add", "k", "_Z6kernelPfi"});
  // The listing looked nothing up: the kernel is found by name, with its layout, when asked.
  CUresult result = CUDA_ERROR_UNKNOWN;
  auto kernel = lookup(sut, Op::kLibraryGetKernel, rep.handle, "k", &result);
  CHECK(result == CUDA_SUCCESS);
  CHECK(kernel.param_count == 2);

  SECTION("without the flag the load answers with the handle alone") {
    Reply plain = load_listing(sut, ctx.ctx, 4, 0);
    REQUIRE(plain.result == CUDA_SUCCESS);
    CHECK(plain.payload.size() == sizeof(proto::ImageLoadRep));
  }
  SECTION("a module's load ignores the flag") {
    auto image = fatbin(64);
    sut.send_memfd(proto::MessageKind::kModuleImage, 5, image.size(), image);
    Reply module = sut.call(
        Op::kImageLoad, proto::ImageLoadReq{ctx.ctx, image.size(), 5, proto::ImageKind::kModule, 0,
                                            proto::kImageLoadKernelNames});
    REQUIRE(module.result == CUDA_SUCCESS);
    CHECK(module.payload.size() == sizeof(proto::ImageLoadRep));
  }
}

TEST_CASE("a library's kernel names that do not fit in the load's reply are paged",
          "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::vector<std::string> expected;
  for (int i = 0; i < 300; ++i) {  // ~31 KiB of names: eight replies or so
    expected.push_back(fmt::format("_ZN5torch6kernel{:03}{}", i, std::string(80, 'x')));
  }
  fake_gpu().library_kernel_names = expected;
  Reply loaded = load_listing(sut, ctx.ctx, 6);
  REQUIRE(loaded.result == CUDA_SUCCESS);
  auto rep = loaded.as<proto::LibraryLoadRep>();
  REQUIRE(rep.names_known == 1);
  CHECK(rep.total == 300);
  REQUIRE(rep.count > 0);
  REQUIRE(rep.count < 300);
  std::vector<std::string> got = names_of(rep.names, rep.count, rep.bytes);
  int replies = 1;
  while (got.size() < rep.total) {
    Reply page =
        sut.call(Op::kLibraryKernelNames,
                 proto::ModuleFunctionsReq{rep.handle, static_cast<std::uint32_t>(got.size()), 0});
    REQUIRE(page.result == CUDA_SUCCESS);
    auto names = page.as<proto::ModuleFunctionsRep>();
    CHECK(names.total == 300);
    REQUIRE(names.count > 0);
    for (auto& n : names_of(names.names, names.count, names.bytes)) got.push_back(n);
    ++replies;
  }
  CHECK(got == expected);
  CHECK(replies > 2);
  // Past the end is refused; exactly at the end is an empty page.
  CHECK(sut.call(Op::kLibraryKernelNames, proto::ModuleFunctionsReq{rep.handle, 301, 0}).result ==
        CUDA_ERROR_INVALID_VALUE);
  Reply end = sut.call(Op::kLibraryKernelNames, proto::ModuleFunctionsReq{rep.handle, 300, 0});
  CHECK(end.result == CUDA_SUCCESS);
  CHECK(end.as<proto::ModuleFunctionsRep>().count == 0);
  // Another client's library, or no library, is not this client's to list.
  CHECK(sut.call(Op::kLibraryKernelNames, proto::ModuleFunctionsReq{rep.handle + 1000, 0, 0})
            .result == CUDA_ERROR_INVALID_HANDLE);
}

TEST_CASE("a library whose kernels the driver cannot list still loads, unlisted",
          "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  fake_gpu().library_kernel_count_result = CUDA_ERROR_NOT_SUPPORTED;
  Reply loaded = load_listing(sut, ctx.ctx, 7);
  REQUIRE(loaded.result == CUDA_SUCCESS);
  auto rep = loaded.as<proto::LibraryLoadRep>();
  CHECK(rep.handle != 0);
  CHECK(rep.names_known == 0);
  CHECK(rep.count == 0);
  CHECK(lookup(sut, Op::kLibraryGetKernel, rep.handle, "k").param_count == 2);
}

TEST_CASE("an image load with an unknown flag ends the session", "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  auto image = fatbin(64);
  sut.send_memfd(proto::MessageKind::kModuleImage, 8, image.size(), image);
  sut.send(Op::kImageLoad,
           proto::ImageLoadReq{ctx.ctx, image.size(), 8, proto::ImageKind::kLibrary, 0, 1u << 5},
           0);
  CHECK(h.pump_until([&] { return h.logged("unknown flags 0x20"); }));
  CHECK(h.pump_until([&] { return h.server->find_session(sut.welcome().client_id) == nullptr; }));
}

TEST_CASE("a library unloaded one-way is freed, and a failure is logged, not posted",
          "[server][module]") {
  Harness h;
  TestClient sut(h);
  auto ctx = sut.create_context();
  std::uint64_t library = load(sut, ctx.ctx, proto::ImageKind::kLibrary, 9);
  REQUIRE(library != 0);
  REQUIRE(fake_gpu().libraries_live == 1);
  sut.send(Op::kLibraryUnload, proto::HandleReq{library}, proto::kNoReply);
  CHECK(h.pump_until([&] { return fake_gpu().libraries_live == 0; }));
  // Its handle is gone; a second one-way unload of it fails on the server only.
  sut.send(Op::kLibraryUnload, proto::HandleReq{library}, proto::kNoReply);
  CHECK(h.pump_until([&] { return h.logged("unloading library"); }));
  CHECK(sut.control()->async_error.load() == 0);
  // The session goes on.
  CHECK(load(sut, ctx.ctx, proto::ImageKind::kLibrary, 10) != 0);
}

}  // namespace
}  // namespace mpsshim::server::test
