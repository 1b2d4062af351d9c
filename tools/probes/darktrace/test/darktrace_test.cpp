// darktrace on the fake driver: darktrace_client runs with LD_PRELOAD=libdarktrace.so, checks
// every answer it gets (arguments and return values pass through the wrappers), and this test
// reads the trace file and checks what it says about the tables, slots, calls and memory.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  REQUIRE(value != nullptr);
  return value;
}

struct Run {
  int status = -1;
  std::string out;                 // the client's stdout
  std::vector<std::string> trace;  // the lines of its trace file
  std::size_t trace_files = 0;

  std::vector<std::string> lines_starting(const std::string& prefix) const {
    std::vector<std::string> found;
    for (const auto& line : trace) {
      if (line.starts_with(prefix)) found.push_back(line);
    }
    return found;
  }
  bool has(const std::string& text) const {
    for (const auto& line : trace) {
      if (line.find(text) != std::string::npos) return true;
    }
    return false;
  }
  // The client's printed "name=value".
  std::string printed(const std::string& name) const {
    std::smatch m;
    const std::regex re(name + "=(0x[0-9a-f]+)");
    return std::regex_search(out, m, re) ? m[1].str() : "";
  }
};

// Runs darktrace_client HOW under darktrace with DARKTRACE_TABLES=tables ("" = unset).
Run run_client(const std::string& how, const std::string& tables, const std::string& traced) {
  char dir_template[] = "/tmp/darktrace-test.XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  std::string command = "env -u DARKTRACE_TABLES LD_PRELOAD=" + env("DARKTRACE_LIB") +
                        " DARKTRACE_DIR=" + dir + " DARKTRACE_EXPECT_TRACED=" + traced;
  if (!tables.empty()) command += " DARKTRACE_TABLES=" + tables;
  command += " " + env("DARKTRACE_CLIENT") + " " + how + " " + env("DARKTRACE_FAKE_DRIVER");
  Run run;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) run.out += buffer;
  run.status = pclose(pipe);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++run.trace_files;
    std::ifstream file(entry.path());
    for (std::string line; std::getline(file, line);) run.trace.push_back(line);
  }
  std::filesystem::remove_all(dir);
  INFO(command);
  INFO(run.out);
  REQUIRE(run.status == 0);
  REQUIRE(run.out.find("darktrace_client: PASS") != std::string::npos);
  REQUIRE(run.trace_files == 1);
  return run;
}

std::string hex_run(const char* byte, int count) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    if (i != 0 && i % 8 == 0) out += '_';
    out += byte;
  }
  return out;
}

}  // namespace

TEST_CASE("darktrace: named tables through cuGetProcAddress are traced slot by slot") {
  const Run sut = run_client("procaddress", "6e163fbe,C693336E", "6e163fbe,c693336e");
  INFO(sut.out);

  // The census of the sized table: size word, NULL and data slots named, code slots placed.
  CHECK(sut.has("table uuid=6e163fbeb958444d835ce182aff1991e"));
  CHECK(sut.has("layout=sized size=40 slots=5"));
  CHECK(sut.has("slot uuid=6e163fbe index=1"));
  bool sum_named = false;
  for (const auto& line : sut.lines_starting("slot uuid=6e163fbe index=1 ")) {
    sum_named = line.find("kind=code") != std::string::npos &&
                line.find("(fake_sum8+0x0)") != std::string::npos;
  }
  CHECK(sum_named);
  CHECK(sut.lines_starting("slot uuid=6e163fbe index=2 ")[0].find("kind=null") !=
        std::string::npos);
  CHECK(sut.lines_starting("slot uuid=6e163fbe index=4 ")[0].find("kind=data") !=
        std::string::npos);
  CHECK(sut.has("traced uuid=6e163fbe"));
  CHECK(sut.lines_starting("traced uuid=6e163fbe")[0].find("wrapped=2") != std::string::npos);
  CHECK(sut.has("layout=headerless size=0 slots=3"));
  CHECK(sut.lines_starting("traced uuid=c693336e")[0].find("wrapped=2") != std::string::npos);

  // The 8-argument call: every argument, the caller, the return value.
  CHECK(sut.has("uuid=6e163fbe slot=1 caller=darktrace_client+0x"));
  CHECK(sut.has("args=0x11,0x22,0x33,0x44,0x55,0x66,0x77,0x88"));
  CHECK(sut.has("uuid=6e163fbe slot=1 rv=0x264"));
  CHECK(sut.has("uuid=c693336e slot=0 rv=0x2a"));
  CHECK(sut.has("uuid=c693336e slot=1 rv=0xfffffffffffffffb"));

  // 64 bytes at the buffer, before and after fill.
  const std::string buffer = sut.printed("buffer");
  REQUIRE_FALSE(buffer.empty());
  CHECK(sut.has("when=before arg=0 addr=" + buffer + " n=64 hex=" + hex_run("5a", 64)));
  CHECK(sut.has("when=after arg=0 addr=" + buffer + " n=64 hex=" + hex_run("ab", 64)));

  // 16 readable bytes before a PROT_NONE page; nothing of the page itself (and no fault).
  const std::string edge = sut.printed("edge");
  const std::string guard = sut.printed("guard");
  CHECK(sut.has("arg=0 addr=" + edge + " n=16 hex=" + hex_run("e7", 16)));
  CHECK_FALSE(sut.has("addr=" + guard));

  // Sequence numbers count per thread: three threads called slot 1; each numbers from 1.
  std::map<std::string, std::vector<int>> seqs;
  const std::regex call_re("^call tid=([0-9]+) seq=([0-9]+) ");
  for (const auto& line : sut.lines_starting("call ")) {
    std::smatch m;
    REQUIRE(std::regex_search(line, m, call_re));
    seqs[m[1]].push_back(std::stoi(m[2]));
  }
  CHECK(seqs.size() == 3);
  for (const auto& [tid, numbers] : seqs) {
    for (std::size_t i = 0; i < numbers.size(); ++i) CHECK(numbers[i] == int(i + 1));
  }
  CHECK(sut.lines_starting("ret ").size() == sut.lines_starting("call ").size());

  // Tables not named are the driver's own, listed but not traced; refusals are logged.
  CHECK(sut.has("table uuid=6bd5fb6c"));
  CHECK_FALSE(sut.has("traced uuid=6bd5fb6c"));
  CHECK(sut.has("ask uuid=0123456789abcdef0123456789abcdef result=1 real=(nil) given=(nil)"));
}

TEST_CASE("darktrace: 'all' through dlsym leaves the integrity-checked runtime table alone") {
  const Run sut = run_client("dlsym", "all", "6e163fbe,c693336e");
  CHECK(sut.has("traced uuid=6e163fbe"));
  CHECK(sut.has("traced uuid=c693336e"));
  CHECK_FALSE(sut.has("traced uuid=6bd5fb6c"));
  CHECK(sut.has("args=0x11,0x22,0x33,0x44,0x55,0x66,0x77,0x88"));
}

TEST_CASE("darktrace: a runtime table named explicitly is traced, with a warning") {
  const Run sut = run_client("dlsym", "6bd5fb6c", "6bd5fb6c");
  CHECK(sut.has("traced uuid=6bd5fb6c"));
  CHECK(sut.has("warning uuid=6bd5fb6c"));
  CHECK_FALSE(sut.has("traced uuid=6e163fbe"));
}

TEST_CASE("darktrace: a program linked against the driver, nothing named: a census only") {
  const Run sut = run_client("linked", "", "");
  CHECK(sut.has("table uuid=6e163fbeb958444d835ce182aff1991e"));
  CHECK(sut.has("ask uuid=6e163fbeb958444d835ce182aff1991e result=0"));
  CHECK(sut.lines_starting("traced ").empty());
  CHECK(sut.lines_starting("call ").empty());
}
