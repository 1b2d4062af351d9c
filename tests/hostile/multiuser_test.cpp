// Several users on one GPU's server with mpsshimd --multiuser. Creates two real users
// (useradd), runs clients as each (setpriv from util-linux), and removes the users at the end.
// Needs root, useradd and setpriv: otherwise exits 77 (meson: skipped).
//
// What it shows: clients of both uids share the server and both pass; a client of one uid
// cannot reach the other's memory or objects, through the raw protocol (hostile_client forge)
// or the CUDA API under the shim (cuMemcpy from its pointer, cuPointerGetAttribute, IPC
// handles, VMM export/import: e2e_client foreign); a genuine IPC handle of alice's is refused to
// bob and opens for another client of alice's (ipc_client; docs/ipc.md); a non-root user's
// mpsshimctl is refused every operator command and the other's client goes on; the runtime
// directory, socket and pid file have the documented owners and modes (docs/daemon.md).
#include <catch2/catch.hpp>

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <regex>

#include <nlohmann/json.hpp>

#include "baseline.hpp"
#include "catch2_session.hpp"

using namespace mpsshim::e2e;
using namespace mpsshim::hostile_test;
using namespace std::chrono_literals;

namespace {

constexpr int kSkipped = 77;

struct User {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
};
User g_alice, g_bob;

bool make_user(const std::string& name, User& out) {
  std::string command = "useradd --no-create-home --user-group --shell /usr/sbin/nologin " + name;
  if (std::system(command.c_str()) != 0) return false;
  passwd* pw = ::getpwnam(name.c_str());
  if (pw == nullptr) return false;
  out = User{name, pw->pw_uid, pw->pw_gid};
  return true;
}

void remove_user(const User& user) {
  if (user.name.empty()) return;
  std::string command = "userdel " + user.name + " 2>/dev/null";
  [[maybe_unused]] int rc = std::system(command.c_str());
}

// argv run as `user` (setpriv: real and effective uid and gid, no supplementary groups).
std::vector<std::string> as(const User& user, std::vector<std::string> argv) {
  std::vector<std::string> full = {"/usr/bin/setpriv", "--reuid=" + std::to_string(user.uid),
                                   "--regid=" + std::to_string(user.gid), "--clear-groups", "--"};
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

Outcome ctl_as(const User& user, const Daemon& daemon, std::vector<std::string> command) {
  std::vector<std::string> argv = {artefact("MPSSHIMCTL"), "--runtime-dir", daemon.dir()};
  argv.insert(argv.end(), command.begin(), command.end());
  Child child(as(user, argv), {});
  return child.wait(20s);
}

std::string mode_and_owner(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "missing";
  char text[64];
  std::snprintf(text, sizeof text, "%04o %u:%u", st.st_mode & 07777, st.st_uid, st.st_gid);
  return text;
}

}  // namespace

TEST_CASE("clients of two users share a server and cannot reach each other", "[multiuser]") {
  char pattern[] = "/tmp/mpsshim-mu-stats-XXXXXX";
  int fd = ::mkstemp(pattern);
  REQUIRE(fd >= 0);
  ::close(fd);
  const std::string stats_path = pattern;
  // Released as soon as no client is left, the primary context takes the green contexts the
  // server keeps for later clients with it: at rest the baseline holds none (hostile_test.cpp).
  Daemon daemon({"--multiuser", "--server-workers", "2", "--context-idle-timeout", "0"},
                stats_env(stats_path));
  REQUIRE(run_client(daemon, {artefact("E2E_CLIENT"), "basic"}).exit_code == 0);
  const Baseline baseline = take_baseline(daemon, stats_path);
  INFO(baseline.unsettled);
  REQUIRE(baseline.unsettled.empty());

  SECTION("the runtime directory, socket and pid file as documented") {
    CHECK(mode_and_owner(daemon.dir()) == "0755 0:0");
    CHECK(mode_and_owner(daemon.dir() + "/control") == "0666 0:0");
    // 0644 at most (the umask may take more): others can read the pid, nobody else can write.
    struct stat st {};
    REQUIRE(::stat((daemon.dir() + "/mpsshimd.pid").c_str(), &st) == 0);
    CHECK(st.st_uid == 0);
    CHECK((st.st_mode & 0133) == 0);
  }

  SECTION("a client of each user works at once, and ps names each one's uid") {
    Child a(as(g_alice, {artefact("E2E_CLIENT"), "stress", "0"}), daemon.client_env(), true);
    Child b(as(g_bob, {artefact("E2E_CLIENT"), "stress", "0"}), daemon.client_env(), true);
    REQUIRE(a.wait_for_output("READY", 60s));
    REQUIRE(b.wait_for_output("READY", 60s));
    auto ps = nlohmann::json::parse(daemon.ctl({"ps", "--json"}).out);
    INFO("ps: " << ps.dump() << " alice's client " << a.pid() << ", bob's " << b.pid());
    std::map<int, unsigned> uid_of_pid;
    for (const auto& c : ps["clients"]) uid_of_pid[c["pid"].get<int>()] = c["uid"].get<unsigned>();
    // setpriv execs the client: the pid is the client's.
    CHECK(uid_of_pid[a.pid()] == g_alice.uid);
    CHECK(uid_of_pid[b.pid()] == g_bob.uid);
    a.close_stdin();
    b.close_stdin();
    Outcome oa = a.wait(60s), ob = b.wait(60s);
    CHECK(oa.out.find("PASS stress") != std::string::npos);
    CHECK(ob.out.find("PASS stress") != std::string::npos);
  }

  SECTION("bob names alice's pointer and handles on the wire: refused, her bytes unchanged") {
    Child victim(as(g_alice, {artefact("HOSTILE_CLIENT"), daemon.dir(), "victim"}), {}, true);
    REQUIRE(victim.wait_for_output("VICTIM", 30s));
    std::smatch m;
    const std::string out = victim.out();
    REQUIRE(std::regex_search(out, m,
                              std::regex("dptr=(0x[0-9a-f]+) stream=(0x[0-9a-f]+) "
                                         "event=(0x[0-9a-f]+) ctx=(0x[0-9a-f]+)")));
    Child forger(
        as(g_bob, {artefact("HOSTILE_CLIENT"), daemon.dir(), "forge", m[1], m[2], m[3], m[4]}), {});
    const pid_t forger_pid = forger.pid();
    Outcome f = forger.wait(60s);
    INFO("forger: " << f.out << f.err);
    CHECK(f.out.find("PASS forge") != std::string::npos);
    CHECK(!log_line(daemon, forger_pid, "which is not one of its own; refused").empty());
    victim.close_stdin();
    Outcome v = victim.wait(60s);
    INFO("victim: " << v.out << v.err);
    CHECK(v.out.find("PASS victim") != std::string::npos);
  }

  SECTION("bob cannot see alice's memory through the CUDA API") {
    Child owner(as(g_alice, {artefact("E2E_CLIENT"), "pointer"}), daemon.client_env());
    REQUIRE(owner.wait_for_output("POINTER", 30s));
    std::smatch m;
    const std::string out = owner.out();
    REQUIRE(std::regex_search(out, m, std::regex("POINTER ([0-9]+)")));
    Outcome copy = [&] {
      Child c(as(g_bob, {artefact("E2E_CLIENT"), "forge", m[1]}), daemon.client_env());
      return c.wait(60s);
    }();
    INFO("forge: " << copy.out << copy.err);
    CHECK(copy.out.find("PASS forge") != std::string::npos);
    Outcome apis = [&] {
      Child c(as(g_bob, {artefact("E2E_CLIENT"), "foreign", m[1]}), daemon.client_env());
      return c.wait(60s);
    }();
    INFO("foreign: " << apis.out << apis.err);
    CHECK(apis.out.find("PASS foreign") != std::string::npos);
    owner.kill(SIGKILL);
    owner.wait(10s);
  }

  SECTION("alice's genuine IPC handle opens for her other client and is refused to bob") {
    Child exporter(as(g_alice, {artefact("E2E_IPC_CLIENT"), "export", "keep"}), daemon.client_env(),
                   true);
    REQUIRE(exporter.wait_for_output("EXPORTED", 30s));
    std::smatch m;
    const std::string out = exporter.out();
    REQUIRE(std::regex_search(out, m, std::regex("mem=([0-9a-f]+)")));
    auto open_as = [&](const auto& user) {
      Child c(as(user, {artefact("E2E_IPC_CLIENT"), "open", m[1]}), daemon.client_env());
      const pid_t pid = c.pid();
      return std::make_pair(c.wait(60s), pid);
    };
    auto [bob, bob_pid] = open_as(g_bob);
    INFO("bob: " << bob.out << bob.err << "\ndaemon log:\n" << daemon.log());
    CHECK(bob.out.find("OPEN result=400") != std::string::npos);  // CUDA_ERROR_INVALID_HANDLE
    CHECK(!log_line(daemon, bob_pid, "only clients of the same user may open").empty());
    auto [alice, alice_pid] = open_as(g_alice);
    INFO("alice: " << alice.out << alice.err);
    CHECK(alice.out.find("OPEN result=0") != std::string::npos);
    exporter.kill(SIGKILL);
    exporter.wait(10s);
  }

  SECTION("bob's mpsshimctl is refused every operator command; alice's client goes on") {
    Child a(as(g_alice, {artefact("E2E_CLIENT"), "stress", "0"}), daemon.client_env(), true);
    REQUIRE(a.wait_for_output("READY", 60s));
    const std::string pid = std::to_string(a.pid());
    for (const std::vector<std::string>& command : std::vector<std::vector<std::string>>{
             {"ps"},
             {"stats"},
             {"terminate_client", "0", pid},
             {"set_active_thread_percentage", "0", pid, "10"},
             {"set_device_pinned_mem_limit", "0", pid, "1M"},
             {"server_command", "0", "set_default_memory_limit 1"},
             {"quit"},
         }) {
      Outcome o = ctl_as(g_bob, daemon, command);
      INFO(command[0] << ": " << o.out << o.err);
      CHECK(o.exit_code == 1);
      CHECK((o.out + o.err).find("uid " + std::to_string(g_bob.uid)) != std::string::npos);
    }
    CHECK(daemon.log().find("mpsshimctl") != std::string::npos);
    a.close_stdin();
    Outcome oa = a.wait(60s);
    CHECK(oa.out.find("PASS stress") != std::string::npos);
    // The daemon still runs and answers root.
    CHECK(daemon.ctl({"server_list"}).exit_code == 0);
  }

  CHECK(differences_from(daemon, stats_path, baseline) == "");
  std::remove(stats_path.c_str());
}

int main(int argc, char** argv) {
  if (::geteuid() != 0 || ::access("/usr/sbin/useradd", X_OK) != 0 ||
      ::access("/usr/bin/setpriv", X_OK) != 0) {
    std::printf("SKIP: needs root, useradd and setpriv (util-linux) to create users\n");
    return kSkipped;
  }
  const std::string suffix = std::to_string(::getpid());
  if (!make_user("mpsa" + suffix, g_alice) || !make_user("mpsb" + suffix, g_bob)) {
    remove_user(g_alice);
    std::printf("SKIP: useradd failed\n");
    return kSkipped;
  }
  const int rc = mpsshim::test::run_catch2_session(argc, argv);
  remove_user(g_alice);
  remove_user(g_bob);
  return rc;
}
