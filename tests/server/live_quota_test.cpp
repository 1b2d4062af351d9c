// Quotas changed while the client runs (broker/server/session/sm_quota_change.hpp, control.cpp), on
// the test driver, whose kernels run on the SMs of their stream's green context (record_smid) and
// whose streams run in order: the SM quota moves the client's later work to a green context of
// the new size while its earlier work is still running, its results stay right; a memory limit
// lowered below what it uses refuses its next allocation, naming the command that set it; a
// suspended client's records wait while its memory is parked, and come back to the same bytes
// (session/suspension.hpp).
#include <catch2/catch.hpp>

#include <cstring>
#include <set>
#include <span>

#include "proto/ops_green.hpp"
#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {
namespace {

using batch::bits;
using batch::field;
using batch::Fixture;
using proto::Op;

constexpr int kPid = 4123;  // default_hello's
constexpr int kWords = 4096;

std::string operator_says(Harness& h, const std::string& command, int& status) {
  status = 0;
  return h.server->control_command(command, status);
}

std::set<unsigned> distinct(const std::vector<unsigned>& ids) {
  return {ids.begin(), ids.end()};
}

TEST_CASE("an SM quota changed mid-stream moves later work and keeps the stream's order",
          "[server][quota][live]") {
  Fixture f(test_driver());
  auto sleeper = f.function("sleep_kernel");
  auto fill = f.function("fill_u32");
  auto scale_add = f.function("scale_add");
  auto smid = f.function("record_smid");
  const std::uint64_t stream = f.stream();
  const std::uint64_t event = f.event();
  const unsigned all_sms = f.h.gpu.snapshot.sm_count;
  const std::uint64_t y = f.buffer(kWords * 4);
  const std::uint64_t x = f.buffer(kWords * 4);
  const std::uint64_t before_ids = f.buffer(all_sms * 4);
  const std::uint64_t after_ids = f.buffer(all_sms * 4);
  f.launch(fill, f.ctx.default_stream, 8, 256, x, bits(3.0f), kWords);
  f.launch(smid, stream, all_sms, 1, before_ids);
  REQUIRE(f.synchronize(f.ctx.default_stream) == CUDA_SUCCESS);
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);

  // Work queued and still running when the quota changes: y = 1 after a 200 ms kernel.
  f.launch(sleeper, stream, 1, 1, 200'000);
  f.launch(fill, stream, 8, 256, y, bits(1.0f), kWords);
  f.sut.send(Op::kEventRecord, proto::EventRecordReq{event, stream, 0, 0});
  f.h.pump(4);
  int status = -1;
  const std::string answer =
      operator_says(f.h, fmt::format("set_client_active_thread_percentage {} 25", kPid), status);
  INFO(answer);
  CHECK(status == 0);
  CHECK(answer.find("25% of the SMs") != std::string::npos);

  // Later work on the same stream: runs after the fill (y = 2 * 3 + 1), on the new SMs.
  f.launch(scale_add, stream, 8, 256, y, x, 2.0f, kWords);
  f.launch(smid, stream, all_sms, 1, after_ids);
  // An event made before the change still records (it gets an event of the new context), and
  // a wait on its earlier record still works.
  const std::uint64_t other = f.stream();
  f.sut.send(Op::kStreamWaitEvent, proto::StreamWaitEventReq{other, event, 0, 0});
  f.sut.send(Op::kEventRecord, proto::EventRecordReq{event, stream, 0, 0});
  REQUIRE(f.sut.call(Op::kEventSynchronize, proto::HandleReq{event}).result == CUDA_SUCCESS);
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);
  REQUIRE(f.synchronize(other) == CUDA_SUCCESS);
  CHECK(f.async_error() == CUDA_SUCCESS);

  for (float value : f.read<float>(y, kWords)) REQUIRE(value == 7.0f);
  const std::uint64_t granted = field(f.h.server->stats_text(false), "sms");
  CHECK(granted < all_sms);
  CHECK(field(f.h.server->stats_text(false), "sm_percentage") == 25);
  CHECK(distinct(f.read<unsigned>(before_ids, all_sms)).size() == all_sms);
  CHECK(distinct(f.read<unsigned>(after_ids, all_sms)).size() == granted);
  CHECK(f.h.logged("SM quota changed by the operator to 25%"));

  // And back to the whole device: the streams move again.
  CHECK(operator_says(f.h, fmt::format("set_client_active_thread_percentage {} 100", kPid), status)
            .find("100% of the SMs") != std::string::npos);
  f.launch(smid, stream, all_sms, 1, after_ids);
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);
  CHECK(distinct(f.read<unsigned>(after_ids, all_sms)).size() == all_sms);
}

TEST_CASE("an SM quota changed live keeps an allocation's client in its slot of the device",
          "[server][quota][live][allocation]") {
  proto::ServerAdmit admit = admission_of(default_hello());
  admit.allocation_id = 3;
  admit.allocation_sm_slot = 2;  // the third of four parts: it starts half way
  admit.allocation_sm_slots = 4;
  Fixture f(test_driver(), {}, admit);
  auto smid = f.function("record_smid");
  const std::uint64_t stream = f.stream();
  const unsigned all_sms = f.h.gpu.snapshot.sm_count;
  const std::uint64_t ids = f.buffer(all_sms * 4);

  int status = -1;
  const std::string answer =
      operator_says(f.h, fmt::format("set_client_active_thread_percentage {} 25", kPid), status);
  INFO(answer);
  REQUIRE(status == 0);
  f.launch(smid, stream, all_sms, 1, ids);
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);

  const std::uint64_t granted = field(f.h.server->stats_text(false), "sms");
  const std::set<unsigned> used = distinct(f.read<unsigned>(ids, all_sms));
  CHECK(used.size() == granted);
  // Without its slot the split would take the device's first `granted` SMs.
  CHECK(*used.begin() >= granted);
}

TEST_CASE("an SM quota change waits for the client's capture to end", "[server][quota][live]") {
  Fixture f(test_driver());
  auto fill = f.function("fill_u32");
  auto smid = f.function("record_smid");
  const std::uint64_t stream = f.stream();
  const unsigned all_sms = f.h.gpu.snapshot.sm_count;
  const std::uint64_t y = f.buffer(kWords * 4);
  const std::uint64_t ids = f.buffer(all_sms * 4);
  REQUIRE(f.sut.call(Op::kStreamBeginCapture, proto::BeginCaptureReq{stream, 0, 0}).result ==
          CUDA_SUCCESS);

  int status = -1;
  const std::string answer =
      operator_says(f.h, fmt::format("set_client_active_thread_percentage {} 25", kPid), status);

  CHECK(status == 0);
  CHECK(answer.find("once its stream capture ends") != std::string::npos);
  f.launch(fill, stream, 8, 256, y, 5u, kWords);
  auto end = f.sut.call(Op::kStreamEndCapture, proto::HandleReq{stream});
  REQUIRE(end.result == CUDA_SUCCESS);
  f.h.pump(4);
  CHECK(field(f.h.server->stats_text(false), "sm_percentage") == 25);
  f.launch(smid, stream, all_sms, 1, ids);
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);
  CHECK(distinct(f.read<unsigned>(ids, all_sms)).size() ==
        field(f.h.server->stats_text(false), "sms"));
}

TEST_CASE("a memory limit lowered below use refuses allocations until use falls under it",
          "[server][quota][live]") {
  Fixture f(test_driver());
  const std::uint64_t big = f.buffer(2 << 20);

  int status = -1;
  const std::string answer =
      operator_says(f.h, fmt::format("set_client_memory_limit {} {}", kPid, 1 << 20), status);

  CHECK(status == 0);
  CHECK(answer.find("refused until it uses less") != std::string::npos);
  CUresult refused = CUDA_SUCCESS;
  f.sut.alloc(f.ctx.ctx, 4096, &refused);
  CHECK(refused == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(f.h.logged("set by the operator with mpsshimctl set_device_pinned_mem_limit"));
  CHECK(field(f.h.server->stats_text(false), "mem_limit") == 1 << 20);

  REQUIRE(f.sut.call(Op::kMemFree, proto::MemFreeReq{big}).result == CUDA_SUCCESS);
  CUresult allowed = CUDA_ERROR_UNKNOWN;
  f.sut.alloc(f.ctx.ctx, 4096, &allowed);
  CHECK(allowed == CUDA_SUCCESS);
}

TEST_CASE("after an SM quota change the resources handed out before name no SMs the client has",
          "[server][quota][live][green]") {
  Fixture f(test_driver());
  auto resource_of = [&](std::uint64_t ctx) {
    return f.sut.call(Op::kGreenResource, proto::GreenResourceReq{ctx, CU_DEV_RESOURCE_TYPE_SM, 0});
  };
  auto split = [&](const proto::DevResource& input, std::uint32_t groups) {
    return f.sut.call(Op::kGreenSplit, proto::GreenSplitReq{input, groups, 8, 0, 0});
  };
  auto desc_of = [&](proto::DevResource resource) {
    return f.sut.call(Op::kGreenDesc, proto::GreenDescReq{1, 0},
                      std::as_bytes(std::span(&resource, 1)));
  };
  auto create = [&](std::uint64_t desc) {
    return f.sut.call(Op::kGreenCtxCreate,
                      proto::GreenCtxCreateReq{desc, CU_GREEN_CTX_DEFAULT_STREAM, 0});
  };
  auto sm_count = [](const proto::DevResource& r) {
    CUdevResource resource{};
    std::memcpy(&resource, r.bytes, sizeof resource);
    return resource.sm.smCount;
  };
  auto old_quota = resource_of(0);
  REQUIRE(old_quota.result == CUDA_SUCCESS);
  const proto::DevResource quota = old_quota.as<proto::DevResource>();
  auto halves = split(quota, 2);
  REQUIRE(halves.result == CUDA_SUCCESS);
  const proto::DevResource half = halves.as<proto::GreenSplitRep>().result[0];
  auto made_desc = desc_of(half);
  REQUIRE(made_desc.result == CUDA_SUCCESS);
  const std::uint64_t old_desc = made_desc.as<proto::GreenDescRep>().desc;
  auto made = create(old_desc);
  REQUIRE(made.result == CUDA_SUCCESS);
  const std::uint64_t old_green = made.as<proto::GreenCtxCreateRep>().ctx;

  int status = -1;
  const std::string answer =
      operator_says(f.h, fmt::format("set_client_active_thread_percentage {} 25", kPid), status);
  INFO(answer);
  REQUIRE(status == 0);

  // Everything handed out before named the old quota's SMs: refused as resources the client
  // made up, and a descriptor made before names nothing.
  CHECK(split(quota, 2).result == CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  CHECK(split(half, 2).result == CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  CHECK(desc_of(half).result == CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  CHECK(create(old_desc).result == CUDA_ERROR_INVALID_VALUE);
  // The green context made before keeps its SMs and says so, but its resource is not handed
  // out to be split again.
  auto kept = resource_of(old_green);
  REQUIRE(kept.result == CUDA_SUCCESS);
  CHECK(sm_count(kept.as<proto::DevResource>()) == sm_count(half));
  CHECK(split(kept.as<proto::DevResource>(), 2).result ==
        CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
  // The new quota's resource is the client's to split.
  auto new_quota = resource_of(0);
  REQUIRE(new_quota.result == CUDA_SUCCESS);
  CHECK(sm_count(new_quota.as<proto::DevResource>()) < sm_count(quota));
  CHECK(split(new_quota.as<proto::DevResource>(), 2).result == CUDA_SUCCESS);
}

TEST_CASE("a live quota for a pid without a client, or a bad value, is refused",
          "[server][quota][live]") {
  Fixture f(test_driver());
  int status = 0;
  CHECK(operator_says(f.h, "set_client_active_thread_percentage 999 50", status) ==
        "no client with pid 999 on GPU 0");
  CHECK(status == 1);
  operator_says(f.h, fmt::format("set_client_active_thread_percentage {} 0", kPid), status);
  CHECK(status == 1);
  operator_says(f.h, fmt::format("set_client_memory_limit {} lots", kPid), status);
  CHECK(status == 1);
}

TEST_CASE("a suspended client's records wait, and its memory comes back with its bytes",
          "[server][suspend]") {
  Fixture f(test_driver());
  auto fill = f.function("fill_u32");
  const std::uint64_t y = f.buffer(kWords * 4);
  f.launch(fill, f.ctx.default_stream, 8, 256, y, bits(1.0f), kWords);
  REQUIRE(f.synchronize(f.ctx.default_stream) == CUDA_SUCCESS);

  int status = -1;
  std::string said = operator_says(f.h, fmt::format("suspend_client {}", kPid), status);
  INFO(said);
  REQUIRE(status == 0);
  CHECK(said.find("suspended; 2 MiB parked on the host") != std::string::npos);
  CHECK(f.h.server->gpu().heap->figures().parked_bytes == 2u << 20);
  // A read of the buffer is not served while the client is suspended, however many passes run.
  const std::uint32_t generation = ++f.read_generation;
  f.sut.send(Op::kCopyDtoH,
             proto::CopyHostReq{f.ctx.default_stream, y, kWords * 4,
                                proto::HostRef{1, 0, proto::HostKind::kStagingChunk, generation}});
  f.h.pump(64);
  CHECK(f.sut.view().chunk_state(1)->done_generation.load() != generation);
  operator_says(f.h, fmt::format("suspend_client {}", kPid), status);
  CHECK(status == 1);  // suspended already

  said = operator_says(f.h, fmt::format("resume_client {}", kPid), status);
  REQUIRE(status == 0);
  CHECK(said.find("resumed; 2 MiB back on the GPU") != std::string::npos);
  CHECK(f.h.server->gpu().heap->figures().parked_bytes == 0);
  REQUIRE(f.h.pump_until(
      [&] { return f.sut.view().chunk_state(1)->done_generation.load() == generation; }));
  std::vector<std::uint32_t> words(kWords);
  std::memcpy(words.data(), f.sut.view().chunk(1), kWords * 4);
  CHECK(std::all_of(words.begin(), words.end(), [](std::uint32_t w) { return w == bits(1.0f); }));
  operator_says(f.h, fmt::format("resume_client {}", kPid), status);
  CHECK(status == 1);  // not suspended
  operator_says(f.h, "suspend_client someone", status);
  CHECK(status == 1);
}

}  // namespace
}  // namespace mpsshim::server::test
