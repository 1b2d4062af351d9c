// mpsshimd --config FILE: the options and classes read from TOML, and the mistakes refused
// with their line (docs/config.md).
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>

#include "broker/daemon/config_file.hpp"
#include "broker/daemon/sizes.hpp"

using namespace mpsshim::daemon;

namespace {

// A file with `text`, removed at the end of the test.
struct ConfigText {
  std::string path;
  explicit ConfigText(const std::string& text) {
    char pattern[] = "/tmp/mpsshimd-config-XXXXXX";
    const int fd = ::mkstemp(pattern);
    REQUIRE(fd >= 0);
    ::close(fd);
    path = pattern;
    std::ofstream(path) << text;
  }
  ~ConfigText() { ::unlink(path.c_str()); }
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("a config file's options become command-line words; its classes are read in order",
          "[config]") {
  ConfigText file(R"(
isolation = "user"
default-memory-limit = "4G"
busy-time = "on"
multiuser = true
require-allocation-token = false
server-workers = 4
client-limit = ["streams=64", "pinned=1G"]

[[class]]
name = "batch"
uids = [1000, 1001]
cgroups = ["/kubepods/besteffort"]
max_sm_percentage = 25
memory_limit = "2G"
max_memory_limit = "8G"
max_priority = "below-normal"
isolation = "class"

[[class]]
name = "everyone"
sm_percentage = 50
)");
  auto config = read_config_file(file.path);
  INFO((config ? "" : config.error()));
  REQUIRE(config);
  // In the order TOML's table gives them (by key); a list keeps its own order.
  CHECK(config->arguments ==
        std::vector<std::string>{"--busy-time", "on", "--client-limit", "streams=64",
                                 "--client-limit", "pinned=1G", "--default-memory-limit", "4G",
                                 "--isolation", "user", "--multiuser", "--server-workers", "4"});
  REQUIRE(config->classes.size() == 2);
  const ClientClass& batch = config->classes[0];
  CHECK(batch.name == "batch");
  CHECK(batch.line == 10);
  CHECK(batch.uids == std::vector<uid_t>{1000, 1001});
  CHECK(batch.max_sm_percentage == 25);
  CHECK(batch.memory_limit == std::uint64_t{2} << 30);
  CHECK(batch.max_memory_limit == std::uint64_t{8} << 30);
  CHECK(batch.below_normal_only);
  CHECK(batch.isolated);
  CHECK(config->classes[1].sm_percentage == 50);
}

TEST_CASE("a mistake in a config file is refused with its line and the reason", "[config]") {
  struct Case {
    const char* text;
    const char* expected;
  };
  for (const Case& c : {
           Case{"isolation = \"pods\"\n",
                ":1: --isolation takes shared, user, allocation or client"},
           Case{"\n\nserver-workers = 300\n", ":3: --server-workers 300: expected a whole number from 0"},
           Case{"no-such-option = 1\n", ":1: "},
           Case{"config = \"/etc/x.toml\"\n", ":1: `config` belongs on the command line"},
           Case{"isolation = \n", ":1: "},  // TOML itself
           Case{"[[class]]\nname = \"a\"\nmax_sm_percentage = 101\n",
                ":1: max_sm_percentage: expected a whole number from 1 to 100"},
           Case{"[[class]]\nname = \"a\"\nuid = [1]\n", ":1: unknown key `uid` in a [[class]]"},
           Case{"[[class]]\nuids = [1]\n", ":1: a [[class]] needs a name"},
           Case{"[[class]]\nname = \"a\"\n[[class]]\nname = \"a\"\n",
                ":3: a second class named `a` (the first is on line 1)"},
           Case{"[[class]]\nname = \"a\"\nsm_percentage = 50\nmax_sm_percentage = 20\n",
                ":1: sm_percentage is above max_sm_percentage"},
       }) {
    ConfigText file(c.text);
    auto config = read_config_file(file.path);
    INFO("file:\n" << c.text);
    REQUIRE_FALSE(config);
    INFO("error: " << config.error());
    CHECK(contains(config.error(), file.path + c.expected));
  }
  auto missing = read_config_file("/nonexistent/mpsshimd.toml");
  REQUIRE_FALSE(missing);
  CHECK(contains(missing.error(), "/nonexistent/mpsshimd.toml"));
}

TEST_CASE("the first class a client matches applies: defaults fill, maximums clamp", "[config]") {
  ClientClass batch;
  batch.name = "batch";
  batch.uids = {1000};
  batch.cgroups = {"/kubepods/besteffort"};
  batch.max_sm_percentage = 25;
  batch.max_memory_limit = std::uint64_t{8} << 30;
  batch.below_normal_only = true;
  ClientClass pods;
  pods.name = "pods";
  pods.allocations = true;
  pods.sm_percentage = 40;
  ClientClass rest;
  rest.name = "rest";
  const std::vector<ClientClass> classes{batch, pods, rest};
  const mpsshim::proto::PeerCredentials alice{10, 1000, 1000}, bob{11, 2000, 2000};

  CHECK(class_of(classes, alice, "/user.slice", false)->name == "batch");
  CHECK(class_of(classes, bob, "/kubepods/besteffort/pod1/c", false)->name == "batch");
  CHECK(class_of(classes, bob, "/kubepods/besteffortx", false)->name == "rest");  // whole parts
  CHECK(class_of(classes, bob, "/user.slice", true)->name == "pods");
  CHECK(class_of(classes, bob, "/user.slice", false)->name == "rest");
  CHECK(class_of({batch}, bob, "", false) == nullptr);

  mpsshim::proto::ClientHello asked{};
  asked.active_thread_percentage = 60;
  asked.device_memory_limit = std::uint64_t{16} << 30;
  asked.priority = 0;
  auto lowered = apply_class(batch, asked);
  CHECK(asked.active_thread_percentage == 25);
  CHECK(asked.device_memory_limit == std::uint64_t{8} << 30);
  CHECK(asked.priority == 1);
  REQUIRE(lowered.size() == 3);
  CHECK(contains(lowered[0], "asked for 60% of the SMs; its class `batch` allows 25%"));

  mpsshim::proto::ClientHello silent{};
  silent.active_thread_percentage = mpsshim::proto::kUnset;
  silent.priority = mpsshim::proto::kUnset;
  CHECK(apply_class(batch, silent).empty());  // nothing asked, nothing refused: bounded quietly
  CHECK(silent.active_thread_percentage == 25);
  CHECK(silent.device_memory_limit == std::uint64_t{8} << 30);
  CHECK(silent.priority == 1);

  mpsshim::proto::ClientHello modest{};
  modest.active_thread_percentage = mpsshim::proto::kUnset;
  modest.priority = mpsshim::proto::kUnset;
  CHECK(apply_class(pods, modest).empty());
  CHECK(modest.active_thread_percentage == 40);  // the class's default
  CHECK(modest.device_memory_limit == 0);
  CHECK(modest.priority == mpsshim::proto::kUnset);
}
