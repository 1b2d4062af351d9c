// Unmodified CUDA runtime programs (nvcc, static cudart) under LD_PRELOAD=libmpsshim.so on the
// CPU: the runtime's dlopen("libcuda.so.1") gets the shim, whose private tables and integrity
// check the runtime accepts, and whose driver calls reach the host-memory test driver through
// mpsshimd and mpsshim-server. Exits 77 (meson: SKIP) when nvcc was not found at configure time.
#include <elf.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "catch2_session.hpp"
#include "harness.hpp"

using namespace mpsshim::e2e;
using namespace std::chrono_literals;

namespace {

constexpr const char* kPrograms[] = {"CUDART_VECADD",      "CUDART_STREAMS", "CUDART_RDC",
                                     "CUDART_PER_THREAD",  "CUDART_COPIES",  "CUDART_GRAPH",
                                     "CUDART_ASYNC_ALLOC", "CUDART_VMM"};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// DT_NEEDED entries of a 64-bit ELF executable, read from its section headers.
std::vector<std::string> needed_libraries(const std::string& path) {
  const std::string image = read_text(path);
  std::vector<std::string> out;
  if (image.size() < sizeof(Elf64_Ehdr)) return out;
  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof eh);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64)
    return out;
  auto section = [&](std::size_t i) {
    Elf64_Shdr sh{};
    std::size_t at = eh.e_shoff + i * eh.e_shentsize;
    if (at + sizeof sh <= image.size()) std::memcpy(&sh, image.data() + at, sizeof sh);
    return sh;
  };
  for (std::size_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr dyn = section(i);
    if (dyn.sh_type != SHT_DYNAMIC) continue;
    Elf64_Shdr strtab = section(dyn.sh_link);
    for (std::size_t at = dyn.sh_offset; at + sizeof(Elf64_Dyn) <= dyn.sh_offset + dyn.sh_size;
         at += sizeof(Elf64_Dyn)) {
      Elf64_Dyn d;
      std::memcpy(&d, image.data() + at, sizeof d);
      if (d.d_tag == DT_NULL) break;
      if (d.d_tag == DT_NEEDED && strtab.sh_offset + d.d_un.d_val < image.size()) {
        out.emplace_back(image.c_str() + strtab.sh_offset + d.d_un.d_val);
      }
    }
  }
  return out;
}

// Runs `program` under the shim with an info-level shim log; checks PASS and a log free of calls
// into unimplemented entry points or unknown private-table slots.
Outcome run_and_check(const Daemon& daemon, const char* variable,
                      std::vector<std::string> args = {}) {
  static int run = 0;
  const std::string log_path =
      daemon.dir() + "/shim-" + variable + "-" + std::to_string(++run) + ".log";
  std::vector<std::string> argv = {artefact(variable)};
  argv.insert(argv.end(), args.begin(), args.end());
  Outcome o =
      run_client(daemon, argv, {{"MPSSHIM_LOG_LEVEL", "info"}, {"MPSSHIM_LOG_FILE", log_path}});
  const std::string shim_log = read_text(log_path);
  INFO("program: " << argv[0] << "\nstdout: " << o.out << "\nstderr: " << o.err << "\nshim log:\n"
                   << shim_log << "\ndaemon log:\n"
                   << daemon.log());
  CHECK(o.exit_code == 0);
  CHECK(o.out.find("PASS") != std::string::npos);
  CHECK(shim_log.find("is not implemented by mpsshim") == std::string::npos);
  CHECK(shim_log.find("its meaning is unknown") == std::string::npos);
  CHECK(shim_log.find("unknown table") == std::string::npos);
  CHECK(shim_log.find("connected to the mpsshim daemon") != std::string::npos);
  return o;
}

}  // namespace

TEST_CASE("the programs are plain nvcc outputs: static cudart, nothing of mpsshim linked",
          "[cudart]") {
  for (const char* variable : kPrograms) {
    const std::vector<std::string> needed = needed_libraries(artefact(variable));
    std::string list;
    for (const auto& n : needed) list += n + " ";
    INFO(variable << " DT_NEEDED: " << list);
    CHECK(!needed.empty());
    for (const auto& n : needed) {
      CHECK(n.find("libcuda") == std::string::npos);
      CHECK(n.find("libcudart") == std::string::npos);
      CHECK(n.find("mpsshim") == std::string::npos);
    }
  }
}

TEST_CASE("a cudart vector add runs under the shim", "[cudart]") {
  Daemon daemon;
  run_and_check(daemon, "CUDART_VECADD");
  run_and_check(daemon, "CUDART_VECADD", {"1"});
  run_and_check(daemon, "CUDART_VECADD", {"1000003"});
}

TEST_CASE("an expandable allocator's VMM calls reach the server through cuGetProcAddress",
          "[cudart][vmm]") {
  Daemon daemon;
  Outcome o = run_and_check(daemon, "CUDART_VMM");
  CHECK(o.out.find("chunks=8 granularity=2097152 wrong=0 copy_wrong=0 retain_same=1 access=3 "
                   "prop_ok=1") != std::string::npos);
  run_and_check(daemon, "CUDART_VMM", {"5"});
}

TEST_CASE("a device-linked (-rdc) program runs under the shim, also after cudaDeviceReset",
          "[cudart]") {
  Daemon daemon;
  run_and_check(daemon, "CUDART_RDC");
  run_and_check(daemon, "CUDART_RDC", {"3"});
}

TEST_CASE("cudart streams, pinned memory, events and memset run under the shim", "[cudart]") {
  Daemon daemon;
  run_and_check(daemon, "CUDART_STREAMS");
  run_and_check(daemon, "CUDART_STREAMS", {"777"});
}

TEST_CASE("four threads use their per-thread default streams at once under the shim", "[cudart]") {
  Daemon daemon;
  Outcome o = run_and_check(daemon, "CUDART_PER_THREAD");
  // In an atexit handler, after glibc destroyed the main thread's thread_local objects, the
  // per-thread stream is the one main used and computes (libshim/context.cpp, ThreadState).
  CHECK(o.out.find("exit handler: same_stream=1 wrong=0 PASS") != std::string::npos);
  run_and_check(daemon, "CUDART_PER_THREAD", {"1"});
  run_and_check(daemon, "CUDART_PER_THREAD", {"300001"});
}

TEST_CASE("cudart 2D/3D copies, arrays, peer copies and texture objects run under the shim",
          "[cudart]") {
  Daemon daemon;
  run_and_check(daemon, "CUDART_COPIES");
  run_and_check(daemon, "CUDART_COPIES", {"3"});
}

TEST_CASE("a cudart program captures, replays, updates and builds graphs under the shim",
          "[cudart][graph]") {
  Daemon daemon;
  // Where the real driver would capture a node reading pageable memory, the shim refuses.
  CHECK_THAT(run_and_check(daemon, "CUDART_GRAPH").out,
             Catch::Contains("pageable_capture=cudaErrorStreamCaptureUnsupported"));
  run_and_check(daemon, "CUDART_GRAPH", {"1000", "3"});
}

TEST_CASE("cudaMallocAsync, pools and host functions on two streams run under the shim",
          "[cudart]") {
  Daemon daemon;
  // Exportable pools (POSIX fds) are made, as by the real driver.
  CHECK_THAT(run_and_check(daemon, "CUDART_ASYNC_ALLOC").out, Catch::Contains("ipc=cudaSuccess"));
  run_and_check(daemon, "CUDART_ASYNC_ALLOC", {"1"});
  run_and_check(daemon, "CUDART_ASYNC_ALLOC", {"70001"});
}

TEST_CASE("four cudart programs at once each get their own correct results", "[cudart]") {
  Daemon daemon;
  std::vector<std::unique_ptr<Child>> clients;
  for (int i = 0; i < 4; ++i) {
    const char* variable = kPrograms[i % 3];
    clients.push_back(std::make_unique<Child>(
        std::vector<std::string>{artefact(variable), std::to_string(20000 + 1000 * i)},
        daemon.client_env()));
  }
  for (auto& c : clients) {
    Outcome o = c->wait(120s);
    INFO("stdout: " << o.out << "\nstderr: " << o.err << "\ndaemon log:\n" << daemon.log());
    CHECK(o.exit_code == 0);
    CHECK(o.out.find("PASS") != std::string::npos);
  }
}

TEST_CASE("without a daemon the runtime reports an error instead of hanging", "[cudart]") {
  std::map<std::string, std::string> env = {{"CUDA_MPS_PIPE_DIRECTORY", "/nonexistent/mpsshim"},
                                            {"LD_PRELOAD", shim_preload()}};
  Child c({artefact("CUDART_VECADD"), "16"}, env);
  Outcome o = c.wait(60s);
  INFO("stdout: " << o.out << "\nstderr: " << o.err);
  CHECK(o.exit_code == 1);
  CHECK(o.out.find("FAIL") != std::string::npos);
  CHECK(o.err.find("mpsshimd") != std::string::npos);
}

int main(int argc, char** argv) {
  for (const char* variable : kPrograms) {
    if (std::getenv(variable) == nullptr) {
      std::printf("cudart suite skipped: %s is not set (nvcc was not found when configuring)\n",
                  variable);
      return 77;
    }
  }
  return mpsshim::test::run_catch2_session(argc, argv);
}
