// SO_PEERCRED policy against a peer of another uid. Needs root (to become uid 65534 in a
// child); otherwise it reports itself skipped (exit 77).
#include <cuda.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <string>

#include "broker/daemon/wire.hpp"
#include "tests/daemon/harness.hpp"

using namespace mpsshim;
using namespace mpsshim::daemon_test;
using proto::MessageKind;

namespace {

constexpr int kSkipped = 77;
constexpr uid_t kNobody = 65534;

// What a peer running as `uid` gets back for its first message: the kind and, for a refusal,
// its CUresult and text. Runs in a child that gives up root first.
struct Answer {
  std::uint32_t kind = 0;
  int cuda_error = 0;
  std::string message;
};

Answer as_other_user(const std::string& socket_path, const void* bytes, std::size_t size) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) throw std::runtime_error("pipe");
  pid_t child = ::fork();
  if (child == 0) {
    ::close(pipe_fds[0]);
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) ::_exit(3);
    proto::Received received = exchange(socket_path, bytes, size);
    auto header = daemon::header_of(received);
    auto refused = daemon::decode<proto::Refused>(received);
    std::string line =
        fmt::format("{} {} {}", header ? header->kind : 0, refused ? refused->cuda_error : 0,
                    refused ? daemon::bounded_string(refused->message) : "");
    if (::write(pipe_fds[1], line.data(), line.size()) < 0) ::_exit(4);
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string text;
  char buffer[1024];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error(
        fmt::format("the uid {} child failed (status {:#x})", kNobody, status));
  }
  Answer answer;
  std::size_t first = text.find(' '), second = text.find(' ', first + 1);
  answer.kind = static_cast<std::uint32_t>(std::stoul(text.substr(0, first)));
  answer.cuda_error = std::stoi(text.substr(first + 1, second - first - 1));
  answer.message = text.substr(second + 1);
  return answer;
}

// The test's directories are root's 0700; uid 65534 needs to reach the socket.
void open_to_everyone(const DaemonUnderTest& daemon) {
  ::chmod(daemon.base().c_str(), 0755);
  ::chmod(daemon.runtime_dir().c_str(), 0755);
  ::chmod(daemon.socket_path().c_str(), 0666);
}

int failures = 0;
void check(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  if (!ok) ++failures;
}

}  // namespace

int main() {
  if (::geteuid() != 0) {
    std::printf("skipped: needs root to connect as another uid\n");
    return kSkipped;
  }
  try {
    proto::ClientHello hello = make_hello(MessageKind::kClientQuery);
    proto::TextMessage command = daemon::make_text(MessageKind::kCtlRequest, 0, "server_list");
    {
      DaemonUnderTest sut({.gpus = 1});
      open_to_everyone(sut);
      Answer answer = as_other_user(sut.socket_path(), &hello, sizeof hello);
      check(answer.kind == static_cast<std::uint32_t>(MessageKind::kRefused),
            "single-user: a client of another uid is refused");
      check(answer.cuda_error == CUDA_ERROR_MPS_CONNECTION_FAILED,
            "single-user: with CUDA_ERROR_MPS_CONNECTION_FAILED");
      check(answer.message.find("serves only uid 0, not uid 65534") != std::string::npos &&
                answer.message.find("--multiuser") != std::string::npos,
            "single-user: the message says why and what to do: " + answer.message);
      check(sut.log().find("client ") != std::string::npos &&
                sut.log().find("uid 65534) refused") != std::string::npos,
            "single-user: the refusal is logged");
    }
    {
      DaemonUnderTest sut({.gpus = 1, .args = {"--multiuser"}});
      struct stat st {};
      ::stat(sut.runtime_dir().c_str(), &st);
      check((st.st_mode & 07777) == 0755, "multi-user: the runtime directory is 0755");
      ::chmod(sut.base().c_str(), 0755);
      Answer answer = as_other_user(sut.socket_path(), &hello, sizeof hello);
      check(answer.kind == static_cast<std::uint32_t>(MessageKind::kDaemonDevices),
            "multi-user: a client of another uid gets its devices");
      Answer ctl = as_other_user(sut.socket_path(), &command, sizeof command);
      check(ctl.kind == static_cast<std::uint32_t>(MessageKind::kRefused) &&
                ctl.message.find("operator commands are taken from uid 0") != std::string::npos,
            "multi-user: operator commands from another uid are refused");
      // Live quota changes are operator commands like the others: refused, never passed on.
      for (const char* line :
           {"set_active_thread_percentage 0 4242 10", "set_device_pinned_mem_limit 0 4242 1M"}) {
        proto::TextMessage live = daemon::make_text(MessageKind::kCtlRequest, 0, line);
        Answer refused = as_other_user(sut.socket_path(), &live, sizeof live);
        check(
            refused.kind == static_cast<std::uint32_t>(MessageKind::kRefused) &&
                refused.message.find("operator commands are taken from uid 0") != std::string::npos,
            fmt::format("multi-user: `{}` from another uid is refused", line));
      }
      Outcome state = sut.ctl({"server_command", "0", "show_state"});
      check(state.exit_code == 0 && state.out.find("set_client") == std::string::npos,
            "multi-user: the server never got a refused live quota change");
    }
  } catch (const std::exception& e) {
    std::printf("FAILED: %s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
