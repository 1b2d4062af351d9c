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

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>

#include "broker/daemon/ctl_client.hpp"
#include "broker/daemon/paths.hpp"
#include "broker/daemon/runtime_dir.hpp"

namespace {

using namespace mpsshim::daemon;

constexpr int kOk = 0;
constexpr int kDaemonError = 1;
constexpr int kUnreachable = 2;
// The daemon gives its servers 2 s to answer; this leaves room for a loaded machine.
constexpr int kAnswerTimeoutSeconds = 15;
// suspend and resume copy a client's memory: the daemon waits up to 310 s for the server.
constexpr int kSuspendAnswerTimeoutSeconds = 320;

int answer_timeout_seconds(const std::string& line) {
  const std::string command = line.substr(0, line.find(' '));
  return command == "suspend" || command == "resume" ? kSuspendAnswerTimeoutSeconds
                                                     : kAnswerTimeoutSeconds;
}

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
  const std::string path = control_socket_path(dir.path);
  auto answer = ask_daemon(path, line, std::chrono::seconds(answer_timeout_seconds(line)));
  if (!answer) {
    const CtlFailure& failure = answer.error();
    switch (failure.kind) {
      case CtlFailure::Kind::kCannotConnect:
        fmt::print(stderr,
                   "mpsshimctl: cannot reach mpsshimd at {} (chosen by {}): {}\n"
                   "Is it running? Start it with `mpsshimd -d` or `systemctl start mpsshimd`, or "
                   "name its directory with --runtime-dir or CUDA_MPS_PIPE_DIRECTORY.\n",
                   path, dir.reason, std::strerror(failure.error));
        return kUnreachable;
      case CtlFailure::Kind::kNoAnswer:
        fmt::print(stderr, "mpsshimctl: {}\n", failure.message);
        return kUnreachable;
      case CtlFailure::Kind::kBadAnswer:
        fmt::print(stderr, "mpsshimctl: {}\n", failure.message);
        return kDaemonError;
    }
  }
  // A --json answer is for a script: stdout, ok or not (its "ok" says which).
  const bool json = (" " + line + " ").find(" --json ") != std::string::npos;
  std::fputs(answer->text.c_str(), answer->status == 0 || json ? stdout : stderr);
  std::fflush(nullptr);
  return answer->status == 0 ? kOk : kDaemonError;
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
