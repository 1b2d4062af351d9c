// mpsshimctl: sends operator commands to mpsshimd and prints the answers. See docs/daemon.md.
//
//   mpsshimctl server_list            one command
//   mpsshimctl ps --json              one command, its answer as JSON (any command takes it)
//   mpsshimctl --json ps              the same
//   echo quit | mpsshimctl            commands from stdin, one per line
//
// Exit status: 0 all answered ok, 1 the daemon answered with an error (or refused us), 2 the
// daemon could not be reached.
#include <fmt/format.h>
#include <getopt.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include "broker/daemon/paths.hpp"
#include "broker/daemon/runtime_dir.hpp"
#include "broker/daemon/wire.hpp"
#include "proto/control.hpp"
#include "proto/text_parts.hpp"
#include "proto/unix_socket.hpp"

namespace {

using namespace mpsshim::daemon;
namespace proto = mpsshim::proto;

constexpr int kOk = 0;
constexpr int kDaemonError = 1;
constexpr int kUnreachable = 2;
// The daemon gives its servers 2 s to answer; this leaves room for a loaded machine.
constexpr int kAnswerTimeoutSeconds = 15;

constexpr const char* kUsage = R"(usage: mpsshimctl [--runtime-dir DIR] [command [arguments...]]

Sends one command to mpsshimd and prints its answer; without a command, reads commands from
stdin, one per line (echo quit | mpsshimctl). `mpsshimctl help` lists the commands, e.g.
`ps` (who runs where, what each client used) and `stats` (server time and delays per client).
Every command takes `--json`: its answer as one JSON object, on stdout even when it failed.

  --runtime-dir DIR  the daemon's runtime directory (default: $CUDA_MPS_PIPE_DIRECTORY, else
                     /run/mpsshim for root, else /tmp/mpsshim-$UID)
  --json             add --json to every command
  -h, --help         this text

Exit status: 0 ok, 1 the daemon answered with an error, 2 the daemon could not be reached.
)";

int send_command(const RuntimeDir& dir, const std::string& line) {
  std::string path = control_socket_path(dir.path);
  int fd = proto::connect_seqpacket(path);
  if (fd < 0) {
    fmt::print(stderr,
               "mpsshimctl: cannot reach mpsshimd at {} (chosen by {}): {}\n"
               "Is it running? Start it with `mpsshimd -d` or `systemctl start mpsshimd`, or name "
               "its directory with --runtime-dir or CUDA_MPS_PIPE_DIRECTORY.\n",
               path, dir.reason, std::strerror(-fd));
    return kUnreachable;
  }
  proto::UniqueFd socket(fd);
  timeval timeout{kAnswerTimeoutSeconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (int error = proto::send_struct(fd, make_text(proto::MessageKind::kCtlRequest, 0, line));
      error != 0) {
    fmt::print(stderr, "mpsshimctl: cannot send to mpsshimd at {}: {}\n", path,
               std::strerror(error));
    return kUnreachable;
  }
  // A long answer comes in parts (proto/text_parts.hpp).
  proto::TextAssembly assembly;
  for (;;) {
    proto::Received answer;
    int error = proto::receive_message(fd, answer);
    if (error == EAGAIN || error == EWOULDBLOCK) {
      fmt::print(stderr, "mpsshimctl: mpsshimd at {} did not answer `{}` within {} s\n", path, line,
                 kAnswerTimeoutSeconds);
      return kUnreachable;
    }
    auto header = error == 0 ? header_of(answer) : std::nullopt;
    if (!header || header->magic != proto::kHelloMagic) {
      fmt::print(stderr, "mpsshimctl: mpsshimd at {} closed the connection without answering{}\n",
                 path, error != 0 ? fmt::format(" ({})", std::strerror(error)) : "");
      return kDaemonError;
    }
    auto kind = static_cast<proto::MessageKind>(header->kind);
    if (kind == proto::MessageKind::kRefused) {
      auto refused = decode<proto::Refused>(answer);
      fmt::print(stderr, "mpsshimctl: mpsshimd refused: {}\n",
                 refused ? bounded_string(refused->message) : "(no reason given)");
      return kDaemonError;
    }
    auto reply = decode<proto::TextMessage>(answer);
    if (kind != proto::MessageKind::kCtlReply || !reply) {
      fmt::print(stderr, "mpsshimctl: mpsshimd answered with message kind {}, not a reply\n",
                 header->kind);
      return kDaemonError;
    }
    if (assembly.add(*reply)) break;
  }
  // A --json answer is for a script: stdout, ok or not (its "ok" says which).
  const bool json = (" " + line + " ").find(" --json ") != std::string::npos;
  std::fputs(assembly.text().c_str(), assembly.status() == 0 || json ? stdout : stderr);
  std::fflush(nullptr);
  return assembly.status() == 0 ? kOk : kDaemonError;
}

}  // namespace

int main(int argc, char** argv) {
  static const option kLong[] = {
      {"runtime-dir", required_argument, nullptr, 'r'},
      {"help", no_argument, nullptr, 'h'},
      {"json", no_argument, nullptr, 'j'},
      {nullptr, 0, nullptr, 0},
  };
  std::optional<std::string> runtime_dir;
  bool json = false;
  ::opterr = 0;
  // '+': options end at the command, so its own arguments are never taken for ours.
  for (int c; (c = ::getopt_long(argc, argv, "+:h", kLong, nullptr)) != -1;) {
    switch (c) {
      case 'r':
        runtime_dir = absolute_path(::optarg);
        break;
      case 'h':
        std::fputs(kUsage, stdout);
        return kOk;
      case 'j':
        json = true;
        break;
      default:
        fmt::print(stderr, "mpsshimctl: bad option {}\n{}", argv[::optind - 1], kUsage);
        return kUnreachable;
    }
  }
  RuntimeDir dir = choose_runtime_dir(runtime_dir);
  if (::optind < argc) {
    std::string line;
    for (int i = ::optind; i < argc; ++i) line += (i > ::optind ? " " : "") + std::string(argv[i]);
    return send_command(dir, json ? line + " --json" : line);
  }
  int worst = kOk;
  for (std::string line; std::getline(std::cin, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    int status = send_command(dir, json ? line + " --json" : line);
    if (status == kUnreachable) return status;
    worst = std::max(worst, status);
  }
  return worst;
}
