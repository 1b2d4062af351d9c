// Static SM partitions on the server side (admit.cpp, green_context.hpp, control.cpp): a client
// admitted into a partition runs on the partition's SMs only, so clients of different partitions
// never share an SM. Seen with the test driver's record_smid, whose block b reports the b-th SM
// (cyclically) of its stream's green context. The test driver lays its 132 SMs out in GPCs of
// 18, 18, 18, 18, 16, 16, 16 and 12 SMs, and a split in steps of 8 takes whole chunks of 8 within
// one GPC, as a real GPU's split does: 15 groups starting at the SMs of kGroupStart (the SMs a
// GPC has beyond a multiple of 8 are in none).
#include <catch2/catch.hpp>

#include <array>
#include <set>

#include "tests/server/launch_batch_fixture.hpp"

namespace mpsshim::server::test {
namespace {

using batch::Fixture;

constexpr unsigned kGroupSms = 8;  // the test driver's granularity
constexpr std::array<unsigned, 15> kGroupStart{0,  8,  18, 26, 36,  44,  54, 62,
                                               72, 80, 88, 96, 104, 112, 120};

proto::ServerAdmit pinned(int pid, std::uint32_t partition, unsigned first_group, unsigned groups,
                          int percentage = proto::kUnset) {
  proto::ClientHello hello = default_hello(pid, "pinned");
  hello.sm_partition = partition;
  hello.active_thread_percentage = percentage;
  proto::ServerAdmit admit = admission_of(hello);
  admit.sm_partition = partition;
  admit.partition_first_group = first_group;
  admit.partition_groups = groups;
  return admit;
}

// The distinct SMs a kernel of one block per SM of the device ran on.
std::set<unsigned> sms_used(Fixture& f) {
  auto smid = f.function("record_smid");
  const unsigned all_sms = f.h.gpu.snapshot.sm_count;
  const std::uint64_t stream = f.stream();
  const std::uint64_t ids = f.buffer(all_sms * 4);
  f.launch(smid, stream, all_sms, 1, ids);
  REQUIRE(f.synchronize(stream) == CUDA_SUCCESS);
  auto read = f.read<unsigned>(ids, all_sms);
  return {read.begin(), read.end()};
}

// The SMs of groups first .. first + count - 1 of the split.
std::set<unsigned> groups(unsigned first, unsigned count) {
  std::set<unsigned> out;
  for (unsigned g = first; g < first + count; ++g) {
    for (unsigned sm = kGroupStart[g]; sm < kGroupStart[g] + kGroupSms; ++sm) out.insert(sm);
  }
  return out;
}

TEST_CASE("clients of different partitions run on disjoint SMs, each on its partition's",
          "[server][partition]") {
  Harness h(test_driver(), {});
  {
    // Partition 1: groups 0-1 (SMs 0-15); partition 2: groups 4-7 (SMs 36-51 and 54-69), of
    // which the second client asks half.
    Fixture one(h, pinned(6001, 1, 0, 2));
    Fixture two(h, pinned(6002, 2, 4, 4, 50));
    Fixture unpinned(h, default_hello(6003, "anywhere"));

    CHECK(sms_used(one) == groups(0, 2));
    CHECK(sms_used(two) == groups(4, 2));                         // the first half of its partition
    CHECK(sms_used(unpinned).size() == h.gpu.snapshot.sm_count);  // outside partitions: all
    CHECK(h.server->stats_text(false).find("partition=2") != std::string::npos);

    // A live quota change keeps the client inside its partition: all of it, then a quarter.
    int status = 0;
    h.server->control_command("set_client_active_thread_percentage 6002 100", status);
    CHECK(status == 0);
    CHECK(sms_used(two) == groups(4, 4));
    h.server->control_command("set_client_active_thread_percentage 6002 25", status);
    CHECK(status == 0);
    CHECK(sms_used(two) == groups(4, 1));

    one.sut.hang_up();
    two.sut.hang_up();
    unpinned.sut.hang_up();
  }
  REQUIRE(h.pump_until([&] { return h.server->session_count() == 0; }));
}

TEST_CASE("the server counts the groups static partitions are made of", "[server][partition]") {
  Harness h(test_driver(), {});
  int status = 0;
  CHECK(h.server->control_command("sm_partition_groups", status) == "groups=15 granularity=8");
  CHECK(status == 0);
}

TEST_CASE("a partition that does not fit the device's split is refused at admission",
          "[server][partition]") {
  Harness h(test_driver(), {});
  TestClient client(h, pinned(6004, 9, 14, 2));  // groups 14-15: the device has 15 (0-14)
  CHECK_FALSE(client.connected());
  CHECK(h.logged("could not admit"));
}

}  // namespace
}  // namespace mpsshim::server::test
